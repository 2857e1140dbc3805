"""Shared fixtures. Broker tests talk to a real Apache Kafka broker (deploy/kafka-local),
Redis tests to a real Redis Cluster of 3 masters (deploy/redis-local).

Every decision made in this process is checked against docs/decision.schema.json when it
is made (schemakit.py); a test during which a bad one was made fails.

If STREAM_DEDUP_TEST_BOOTSTRAP / STREAM_DEDUP_TEST_REDIS are set (as tests/run does) the tests
use that broker / cluster (and STREAM_DEDUP_TEST_SECURE_KAFKA / STREAM_DEDUP_TEST_SECURE_REDIS:
the directory of a secure one, securekit_*.py); otherwise the first test that needs one
starts it in a temporary directory on free ports below the ephemeral range and stops it at
the end of the session.
A broker or cluster that cannot be started is an error, not a skip.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opskit import free_broker_port, free_redis_ports
from schemakit import WATCH
from securekit_kafka import secure_kafka_fixture  # noqa: F401 (the fixture secure_kafka)
from securekit_redis import secure_redis_fixture  # noqa: F401 (the fixture secure_redis)

REPO = Path(__file__).resolve().parents[1]

# tests/sanitize.sh runs the kernel tests a second time with the portable block path forced
# (the only one on CPUs without AVX-512 and on arm64).
FORCED_BLOCK_PATH = os.environ.get("STREAM_DEDUP_TEST_BLOCK_PATH") or None
if FORCED_BLOCK_PATH is not None:
    from stream_dedup.core import _native

    _native.block_path(FORCED_BLOCK_PATH)


def _deploy_local(name: str, what: str, directory: Path, env: dict[str, str],
                  timeout: float) -> Iterator[str]:
    """`deploy/<name> start DIR` (an error if it fails), its address, then `stop DIR`."""
    script = str(REPO / "deploy" / name)
    env = {**os.environ, **env}
    started = subprocess.run([script, "start", str(directory)], env=env, capture_output=True,
                             text=True, timeout=timeout)
    if started.returncode != 0:
        pytest.fail(f"could not start {what}:\n{started.stderr[-3000:]}")
    try:
        yield started.stdout.strip().splitlines()[-1]
    finally:
        subprocess.run([script, "stop", str(directory)], env=env, capture_output=True,
                       timeout=120)


@pytest.fixture(scope="session")
def kafka_bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    given = os.environ.get("STREAM_DEDUP_TEST_BOOTSTRAP")
    if given:
        yield given
        return
    port = free_broker_port()
    yield from _deploy_local("kafka-local", "a Kafka broker", tmp_path_factory.mktemp("kafka"),
                             {"KAFKA_LOCAL_PORT": str(port), "KAFKA_LOCAL_CONTROLLER_PORT":
                              str(free_broker_port(taken=port))}, timeout=600)


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """redis://127.0.0.1:PORT, a seed node of a 3-master Redis Cluster."""
    given = os.environ.get("STREAM_DEDUP_TEST_REDIS")
    if given:
        yield given
        return
    yield from _deploy_local("redis-local", "a Redis Cluster", tmp_path_factory.mktemp("redis"),
                             {"REDIS_LOCAL_PORT": str(free_redis_ports(3)),
                              "REDIS_LOCAL_MODE": "cluster", "REDIS_LOCAL_REPLICAS": "0"},
                             timeout=120)


@pytest.fixture(scope="session")
def redis_single_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """redis://127.0.0.1:PORT, one Redis that is not a cluster (the index must work on it
    too: its scripts then run on the one node)."""
    yield from _deploy_local("redis-local", "a single Redis", tmp_path_factory.mktemp("redis1"),
                             {"REDIS_LOCAL_PORT": str(free_redis_ports(1)),
                              "REDIS_LOCAL_MODE": "single", "REDIS_LOCAL_REPLICAS": "0"},
                             timeout=120)


@pytest.fixture
def redis_with_replicas(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A Redis Cluster of 3 masters and 3 replicas of the test's own (it kills a master):
    its address and its deploy/redis-local directory."""
    directory = tmp_path / "redis-replicas"
    started = _deploy_local("redis-local", "a Redis Cluster with replicas", directory,
                            {"REDIS_LOCAL_PORT": str(free_redis_ports(6)),
                             "REDIS_LOCAL_MODE": "cluster", "REDIS_LOCAL_REPLICAS": "1"},
                            timeout=180)
    yield next(started), directory
    next(started, None)  # stop it


@pytest.fixture(params=["memory", "lsm", "redis"])
def make_dedup(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    """A factory of Deduplicators on each backend in turn (each call: a fresh index;
    `make(**settings)`), for decision tests every backend must pass."""
    from stream_dedup import Deduplicator, Settings

    made: list[Deduplicator] = []

    def make(**settings: object) -> Deduplicator:
        extra: dict[str, object] = {"index": request.param}
        if request.param == "lsm":
            extra["index_path"] = str(tmp_path / f"idx{len(made)}")
        if request.param == "redis":
            from indexkit import flush_redis

            url = request.getfixturevalue("redis_url")
            flush_redis(url)
            extra["redis_url"] = url
        dd = Deduplicator(Settings(**{**extra, **settings}))  # type: ignore[arg-type]
        made.append(dd)
        return dd

    if request.param == "redis":
        request.applymarker(pytest.mark.redis)
    yield make
    for dd in made:
        dd.close()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]
                              ) -> Iterator[pytest.TestReport]:
    """A failing test that started services (`item.services`, filled by the `service`
    fixture) shows each one's log tail, after SIGUSR1 has made a running one write its
    threads' stacks there: CI keeps nothing else of a failed run."""
    report = yield
    services = getattr(item, "services", []) if report.failed else []
    running = [svc for svc in services if svc.proc.poll() is None]
    for svc in running:
        os.kill(svc.proc.pid, signal.SIGUSR1)
    if running:
        time.sleep(1.0)
    for svc in services:
        if svc.log.exists():
            tail = svc.log.read_text(errors="replace").splitlines()[-150:]
            report.sections.append((f"last lines of {svc.log.name}", "\n".join(tail)))
    return report


def pytest_configure(config: pytest.Config) -> None:
    WATCH.install()


def pytest_unconfigure(config: pytest.Config) -> None:
    WATCH.uninstall()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    """The test fails if a decision made since the last test's call (its own fixtures'
    included) does not match the published schema."""
    try:
        result = yield
    finally:
        bad = WATCH.bad[:]
        WATCH.bad.clear()
    if bad:
        shown = "\n".join(f"  {d!r}\n    {'; '.join(wrong)}" for d, wrong in bad[:5])
        raise AssertionError(f"{len(bad)} decision(s) made during the test do not match "
                             f"docs/decision.schema.json:\n{shown}")
    return result


def pytest_terminal_summary(terminalreporter: Any) -> None:
    w = WATCH
    if w.seen:
        terminalreporter.write_line(
            f"decision schema: {w.seen:,} decisions made or serialized here, {w.checked:,} "
            f"checked against docs/decision.schema.json (the rest equal to one) in "
            f"{w.seconds:.1f} s ({w.cpu_seconds:.1f} s CPU)")
