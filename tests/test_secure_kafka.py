"""`serve` and `replay --to-kafka` against a secured broker (deploy/kafka-local's secure
mode, securekit_kafka.py): SASL PLAIN from a client properties file, SCRAM over TLS with
--exactly-once, mutual TLS; each refusal at start one line naming what to fix, within
seconds; the password in no output of a run (log, decisions, /v1/stats, /metrics)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from opskit import free_port, get, wait_for
from securekit_kafka import SecureKafka
from test_service import decisions_of

from stream_dedup.cli.sample import build

pytestmark = pytest.mark.kafka
PAGES = 100


def _topics() -> dict[str, str]:
    tag = f"sec-{uuid.uuid4().hex[:10]}"
    return {"input": f"{tag}-pages", "decisions": f"{tag}-decisions", "kept": f"{tag}-kept",
            "dead": f"{tag}-dead", "group": f"{tag}-group"}


def _properties(path: Path, bootstrap: str, protocol: str, mechanism: str, user: str,
                password: str, cafile: str = "") -> Path:
    module = ("plain.PlainLoginModule" if mechanism == "PLAIN" else "scram.ScramLoginModule")
    lines = [f"bootstrap.servers={bootstrap}", f"security.protocol={protocol}",
             f"sasl.mechanism={mechanism}",
             f"sasl.jaas.config=org.apache.kafka.common.security.{module} required "
             f'username="{user}" password="{password}";']
    if cafile:
        lines += ["ssl.truststore.type=PEM", f"ssl.truststore.location={cafile}"]
    path.write_text("\n".join(lines) + "\n")
    return path


def _crawl(tmp_path: Path) -> Path:
    """PAGES pages as JSONL: the sample crawl's first ones."""
    path = tmp_path / "crawl.jsonl"
    path.write_text("".join(json.dumps({"url": p.url, "html": p.html}) + "\n"
                            for p in build(seed=11, articles=60)[:PAGES]))
    return path


def _cli(*args: str, env: dict[str, str] | None = None, timeout: float = 120
         ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "stream_dedup", *args], capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, **(env or {})})


def _serve(t: dict[str, str], log: Path, *flags: str, env: dict[str, str] | None = None
           ) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:  # the child has its own copy
        return subprocess.Popen(
            [sys.executable, "-m", "stream_dedup", "serve", "--input-topic", t["input"],
             "--decisions-topic", t["decisions"], "--kept-topic", t["kept"],
             "--dead-letter-topic", t["dead"], "--group-id", t["group"], *flags],
            stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})


def _decided_and_stopped(sk: SecureKafka, t: dict[str, str], proc: subprocess.Popen[bytes],
                         http_port: int, password: str) -> list[str]:
    """Wait for every page's decision (read on the plain listener), read /v1/stats and
    /metrics while it runs, stop it with SIGTERM (exit 0); what it showed."""
    wait_for("the decisions", lambda: len(decisions_of(sk.plaintext_bootstrap,
                                                       t["decisions"])) >= PAGES, 120)
    shown = [get(f"http://127.0.0.1:{http_port}/v1/stats")[1].decode(),
             get(f"http://127.0.0.1:{http_port}/metrics")[1].decode()]
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(60) == 0
    decisions = decisions_of(sk.plaintext_bootstrap, t["decisions"])
    assert len(decisions) == PAGES
    assert sum(d["decision"] == "drop" for d in decisions) > 0  # it really decided
    shown.append(json.dumps(decisions))
    assert all(password not in text for text in shown)
    return shown


def test_serve_with_a_properties_file_decides_and_never_prints_the_password(
        secure_kafka: SecureKafka, tmp_path: Path) -> None:
    """The held-out check: SASL/PLAIN from a client properties file, as Kafka's tools take
    it; `replay --to-kafka` feeds the input topic through the same file."""
    password = secure_kafka.passwords["alice"]
    props = _properties(tmp_path / "client.properties", secure_kafka.sasl_plaintext_bootstrap,
                        "SASL_PLAINTEXT", "PLAIN", "alice", password)
    t = _topics()
    fed = _cli("replay", str(_crawl(tmp_path)), "--to-kafka", t["input"],
               "--kafka-properties", str(props))
    assert fed.returncode == 0, fed.stderr
    http_port = free_port()
    log = tmp_path / "serve.log"
    proc = _serve(t, log, "--kafka-properties", str(props), "--http-port", str(http_port))
    try:
        _decided_and_stopped(secure_kafka, t, proc, http_port, password)
    finally:
        proc.kill()
    text = log.read_text() + fed.stdout + fed.stderr
    assert "SASL_PLAINTEXT, PLAIN as alice" in text  # what it connected with, at start
    assert password not in text


@pytest.mark.parametrize("how", ["scram-tls-exactly-once", "mutual-tls"])
def test_serve_over_tls(secure_kafka: SecureKafka, tmp_path: Path, how: str) -> None:
    """SCRAM-SHA-512 over SASL_SSL with the password from a file (as a Kubernetes Secret
    mounts it) and --exactly-once; and a client certificate alone."""
    t = _topics()
    fed = _cli("replay", str(_crawl(tmp_path)), "--to-kafka", t["input"],
               "--bootstrap-servers", secure_kafka.plaintext_bootstrap)
    assert fed.returncode == 0, fed.stderr
    password = secure_kafka.passwords["alice"]
    secret = tmp_path / "password"
    secret.write_text(password + "\n")
    if how == "mutual-tls":
        env = {"STREAM_DEDUP_KAFKA_SECURITY_PROTOCOL": "SSL",
               "STREAM_DEDUP_KAFKA_SSL_CERTFILE": secure_kafka.client_cert_file,
               "STREAM_DEDUP_KAFKA_SSL_KEYFILE": secure_kafka.client_key_file}
        flags: tuple[str, ...] = ("--bootstrap-servers", secure_kafka.ssl_bootstrap)
    else:
        env = {"STREAM_DEDUP_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
               "STREAM_DEDUP_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
               "STREAM_DEDUP_KAFKA_SASL_USERNAME": "alice",
               "STREAM_DEDUP_KAFKA_SASL_PASSWORD_FILE": str(secret)}
        flags = ("--bootstrap-servers", secure_kafka.sasl_ssl_bootstrap, "--exactly-once")
    env["STREAM_DEDUP_KAFKA_SSL_CAFILE"] = secure_kafka.ca_file
    http_port = free_port()
    log = tmp_path / "serve.log"
    proc = _serve(t, log, *flags, "--http-port", str(http_port), env=env)
    try:
        _decided_and_stopped(secure_kafka, t, proc, http_port, password)
    finally:
        proc.kill()
    assert password not in log.read_text()


def _refusals(sk: SecureKafka, tmp_path: Path) -> dict[str, tuple[list[str], dict[str, str]]]:
    """Each refusal: the flags and environment of a start that meets it."""
    alice = sk.passwords["alice"]
    ca = {"STREAM_DEDUP_KAFKA_SSL_CAFILE": sk.ca_file}
    scram = {"STREAM_DEDUP_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
             "STREAM_DEDUP_KAFKA_SASL_MECHANISM": "SCRAM-SHA-256",
             "STREAM_DEDUP_KAFKA_SASL_USERNAME": "alice", "STREAM_DEDUP_KAFKA_SASL_PASSWORD": alice}
    wrong = _properties(tmp_path / "wrong.properties", sk.sasl_plaintext_bootstrap,
                        "SASL_PLAINTEXT", "PLAIN", "alice", alice + "-not")
    return {
        "wrong password": (["--kafka-properties", str(wrong)], {}),
        "unknown CA": (["--bootstrap-servers", sk.sasl_ssl_bootstrap],
                       {**scram, "STREAM_DEDUP_KAFKA_SSL_CAFILE": sk.other_ca_file}),
        "host name mismatch": (["--bootstrap-servers", f"127.0.0.1:{sk.sasl_ssl_port}"],
                               {**scram, **ca}),
        "plain text on a TLS port": (["--bootstrap-servers", sk.sasl_ssl_bootstrap],
                                     {**scram, "STREAM_DEDUP_KAFKA_SECURITY_PROTOCOL":
                                      "SASL_PLAINTEXT"}),
    }


EXPECTED = {"wrong password": ("authentication failed", "kafka_sasl_username"),
            "unknown CA": ("not signed by", "kafka_ssl_cafile"),
            "host name mismatch": ("names another host", "bootstrap_servers"),
            "plain text on a TLS port": ("closed every connection", "kafka_security_protocol")}


@pytest.mark.parametrize("case", list(EXPECTED))
def test_a_refusal_at_start_is_one_line_and_an_exit(secure_kafka: SecureKafka, tmp_path: Path,
                                                     case: str) -> None:
    flags, env = _refusals(secure_kafka, tmp_path)[case]
    t = _topics()
    started = time.monotonic()
    proc = _serve(t, tmp_path / "serve.log", *flags, "--http-port", "0", env=env)
    try:
        code = proc.wait(30)
    finally:
        proc.kill()
    took = time.monotonic() - started
    text = (tmp_path / "serve.log").read_text()
    problem, setting = EXPECTED[case]
    assert code == 1 and took < 30, text
    line = next((ln for ln in text.splitlines() if problem in ln), "")
    assert setting in line, text
    assert all(p not in text for p in secure_kafka.passwords.values())
    # replay --to-kafka meets the same refusal the same way
    fed = _cli("replay", str(_crawl(tmp_path)), "--to-kafka", t["input"], *flags, env=env,
               timeout=60)
    assert fed.returncode == 2 and problem in fed.stderr, fed.stderr
    assert all(p not in fed.stdout + fed.stderr for p in secure_kafka.passwords.values())


def test_a_user_without_acls_is_told_which_topic_and_operation(
        secure_kafka: SecureKafka, tmp_path: Path) -> None:
    bob = _properties(tmp_path / "bob.properties", secure_kafka.sasl_plaintext_bootstrap,
                      "SASL_PLAINTEXT", "PLAIN", "bob", secure_kafka.passwords["bob"])
    t = _topics()
    proc = _serve(t, tmp_path / "serve.log", "--kafka-properties", str(bob), "--http-port", "0")
    try:
        code = proc.wait(60)
    finally:
        proc.kill()
    text = (tmp_path / "serve.log").read_text()
    assert code == 1, text
    # each topic it may not create, by name and operation; then what stopped it
    assert f"topic {t['input']} does not exist, and this user may not create it" in text, text
    assert "stopping: Kafka refused bob IdempotentWrite on the cluster" in text, text
    assert secure_kafka.passwords["bob"] not in text
