"""`replay --index redis` on a Redis Cluster whose nodes need a password, and over TLS
(deploy/redis-local's secure mode, securekit_redis.py): the decisions are the memory
index's; a wrong password or an untrusted certificate is one line and an exit within
seconds; the password is in no output of a run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis
from redis.cluster import RedisCluster
from securekit_redis import SecureRedis

from stream_dedup.cli.sample import write_sample

pytestmark = pytest.mark.redis


@pytest.fixture(scope="module")
def crawl(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("crawl")
    write_sample(directory)
    return directory / "sample.jsonl"


def _replay(crawl: Path, out: Path, *flags: str, env: dict[str, str] | None = None
            ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "stream_dedup", "replay", str(crawl), "-o",
                           str(out), "--summary-json", str(out.with_suffix(".summary")),
                           *flags], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})})


def _decided(path: Path) -> list[tuple[str, str, str]]:
    return [(d["url"], d["decision"], d["reason"])
            for d in map(json.loads, path.read_text().splitlines())]


def _empty(sr: SecureRedis) -> None:
    client = RedisCluster.from_url(sr.url, username=sr.username, password=sr.password)
    try:
        client.flushall(target_nodes=RedisCluster.PRIMARIES)
    finally:
        client.close()


def _outputs(run: subprocess.CompletedProcess[str], out: Path) -> str:
    files = [p.read_text() for p in (out, out.with_suffix(".summary")) if p.exists()]
    return "\n".join([run.stdout, run.stderr, *files])


def test_a_password_in_the_url_decides_as_the_memory_index(
        secure_redis: SecureRedis, crawl: Path, tmp_path: Path) -> None:
    """The held-out check's first half."""
    memory = _replay(crawl, tmp_path / "memory.jsonl")
    assert memory.returncode == 0, memory.stderr
    _empty(secure_redis)
    url = secure_redis.url.replace("redis://", f"redis://{secure_redis.username}:"
                                                f"{secure_redis.password}@")
    run = _replay(crawl, tmp_path / "redis.jsonl", "--index", "redis", "--redis-url", url,
                  "--no-verify-exact")
    assert run.returncode == 0, run.stderr
    assert _decided(tmp_path / "redis.jsonl") == _decided(tmp_path / "memory.jsonl")
    assert secure_redis.password not in _outputs(run, tmp_path / "redis.jsonl")


def test_over_tls_with_the_password_from_a_file(secure_redis: SecureRedis, crawl: Path,
                                                 tmp_path: Path) -> None:
    memory = _replay(crawl, tmp_path / "memory.jsonl")
    _empty(secure_redis)
    secret = tmp_path / "password"
    secret.write_text(secure_redis.password + "\n")
    run = _replay(crawl, tmp_path / "tls.jsonl", "--index", "redis", "--redis-url",
                  secure_redis.tls_url, "--redis-username", secure_redis.username,
                  "--redis-ssl-cafile", secure_redis.ca_cert, "--no-verify-exact",
                  env={"STREAM_DEDUP_REDIS_PASSWORD_FILE": str(secret)})
    assert run.returncode == 0 and memory.returncode == 0, run.stderr
    assert _decided(tmp_path / "tls.jsonl") == _decided(tmp_path / "memory.jsonl")
    assert secure_redis.password not in _outputs(run, tmp_path / "tls.jsonl")


@pytest.mark.parametrize("case", ["wrong password", "no password", "unknown CA"])
def test_a_refusal_is_one_line_and_an_exit_within_ten_seconds(
        secure_redis: SecureRedis, crawl: Path, tmp_path: Path, case: str) -> None:
    """The held-out check's second half, and an untrusted certificate."""
    wrong = secure_redis.password[::-1]
    url, flags, expected = {
        "wrong password": (secure_redis.url.replace(
            "redis://", f"redis://{secure_redis.username}:{wrong}@"), [],
            ("authentication failed", "redis_password")),
        "no password": (secure_redis.url, [], ("authentication failed", "redis_password")),
        "unknown CA": (secure_redis.tls_url, ["--redis-ssl-cafile", secure_redis.other_ca_cert],
                       ("not signed by a CA trusted here", "redis_ssl_cafile")),
    }[case]
    started = time.monotonic()
    run = _replay(crawl, tmp_path / "out.jsonl", "--index", "redis", "--redis-url", url,
                  "--no-verify-exact", *flags,
                  env={"STREAM_DEDUP_REDIS_USERNAME": secure_redis.username,
                               "STREAM_DEDUP_REDIS_PASSWORD": secure_redis.password}
                  if case == "unknown CA" else None)
    assert time.monotonic() - started < 10
    assert run.returncode == 2, run.stderr
    lines = [ln for ln in run.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and all(word in lines[0] for word in expected), run.stderr
    shown = _outputs(run, tmp_path / "out.jsonl")
    assert secure_redis.password not in shown and wrong not in shown


def test_the_cluster_really_wants_a_password(secure_redis: SecureRedis) -> None:
    """The tests above prove something: without credentials the nodes refuse."""
    client = redis.Redis.from_url(secure_redis.url, socket_timeout=5)
    try:
        with pytest.raises(redis.AuthenticationError):
            client.ping()
    finally:
        client.close()
