"""deploy/kafka-local's secure mode (KAFKA_LOCAL_SECURE=1) and aiokafka against it.

Alice (a super user) creates a topic, produces to it and reads it back on every way in:
SASL_PLAINTEXT and SASL_SSL with each of PLAIN, SCRAM-SHA-256 and SCRAM-SHA-512, SSL with
the client certificate, and the unauthenticated PLAINTEXT listener the other tests use.

What aiokafka 0.14 raises when it cannot get in: a wrong password (PLAIN or SCRAM), a CA it
does not trust, a certificate that does not name the host it dialled, a PLAINTEXT client on
a TLS listener, and a TLS client without a certificate where one is required, all end the
same way: `start()` raises KafkaConnectionError("Unable to bootstrap from [(host, port,
family)]"), without a __cause__, after one attempt per bootstrap address (no retry, so in well
under a second). The reason is only in what the `aiokafka` logger logs at ERROR just before:
'Unable connect to "host:port": <the error>'. A user who gets in but has no ACL (bob) fails
later, on the topic: send() raises TopicAuthorizationFailedError naming it. The tests below
assert exactly that, and print each observation (`pytest -s` shows them).
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import socket
import ssl
import stat
import subprocess
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaConnectionError, KafkaError, TopicAuthorizationFailedError
from securekit_kafka import SecureKafka

pytestmark = pytest.mark.kafka

# Short timeouts: every failure below must come fast, and does.
TIMEOUTS = {"request_timeout_ms": 5000, "retry_backoff_ms": 100}
FAILS_WITHIN = 5.0  # seconds, every failure below
SASL_FAILED = re.escape("[Error 58] SaslAuthenticationFailed: ")
# Python's ssl errors end in its source line, OpenSSL 1.1 says "self signed"
SSL_LINE = r" \(_ssl\.c:\d+\)"
VERIFY_FAILED = re.escape("[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: ")


def _topic() -> str:
    return f"secure-{uuid.uuid4().hex[:10]}"


async def _create_topic(kwargs: dict[str, Any], topic: str) -> None:
    admin = AIOKafkaAdminClient(**kwargs, **TIMEOUTS)
    await admin.start()
    try:
        response = await admin.create_topics([NewTopic(topic, 1, 1)])
    finally:
        await admin.close()
    assert [(t[0], t[1]) for t in response.topic_errors] == [(topic, 0)], response


async def _produce(kwargs: dict[str, Any], topic: str, value: bytes = b"v",
                   started: list[bool] | None = None) -> None:
    producer = AIOKafkaProducer(**kwargs, **TIMEOUTS)
    try:
        await producer.start()
        if started is not None:
            started.append(True)
        await producer.send_and_wait(topic, value)
    finally:
        await producer.stop()


async def _consume_one(kwargs: dict[str, Any], topic: str) -> bytes:
    consumer = AIOKafkaConsumer(topic, auto_offset_reset="earliest", **kwargs, **TIMEOUTS)
    await consumer.start()
    try:
        message = await asyncio.wait_for(consumer.getone(), 30)
    finally:
        await consumer.stop()
    assert message.value is not None
    return message.value


def _round_trip(kwargs: dict[str, Any]) -> None:
    """Create a topic, produce a message to it, read it back: all with KWARGS."""
    topic = _topic()
    value = uuid.uuid4().bytes

    async def run() -> bytes:
        await _create_topic(kwargs, topic)
        await _produce(kwargs, topic, value)
        return await _consume_one(kwargs, topic)

    assert asyncio.run(run()) == value


# ------------------------------------------------------------------------- the broker

def test_secure_json(secure_kafka: SecureKafka) -> None:
    s = secure_kafka
    path = s.dir / "secure.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    raw = json.loads(path.read_text())
    assert set(raw) == {
        "dir", "plaintext_port", "plaintext_bootstrap", "sasl_plaintext_port",
        "sasl_plaintext_bootstrap", "sasl_ssl_port", "sasl_ssl_bootstrap", "ssl_port",
        "ssl_bootstrap", "sasl_mechanisms", "ca_file", "other_ca_file", "client_cert_file",
        "client_key_file", "client_principal", "super_users", "users"}
    assert s.plaintext_bootstrap == f"127.0.0.1:{s.plaintext_port}"
    assert s.sasl_plaintext_bootstrap == f"localhost:{s.sasl_plaintext_port}"
    assert s.sasl_ssl_bootstrap == f"localhost:{s.sasl_ssl_port}"
    assert s.ssl_bootstrap == f"localhost:{s.ssl_port}"
    assert len({s.plaintext_port, s.sasl_plaintext_port, s.sasl_ssl_port, s.ssl_port}) == 4
    assert s.sasl_mechanisms == ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
    for name in ("ca_file", "other_ca_file", "client_cert_file", "client_key_file"):
        assert Path(getattr(s, name)).is_file(), name
    assert stat.S_IMODE(Path(s.client_key_file).stat().st_mode) == 0o600
    assert sorted(s.passwords) == ["admin", "alice", "bob"]
    assert len(set(s.passwords.values())) == 3
    assert all(re.fullmatch(r"[A-Za-z0-9_-]{24}", p) for p in s.passwords.values())
    assert "passwords" not in repr(s) and s.passwords["alice"] not in repr(s)
    assert s.client_principal == "User:client"
    assert set(s.super_users) == {"User:ANONYMOUS", "User:admin", "User:alice", "User:client"}
    # `start` on a running broker prints the plain bootstrap, as without the secure mode
    again = subprocess.run([str(Path(__file__).parents[1] / "deploy" / "kafka-local"), "start",
                            str(s.dir)], capture_output=True, text=True, timeout=60)
    assert again.returncode == 0 and again.stdout == f"{s.plaintext_bootstrap}\n", again


def test_broker_certificate_names_localhost_only(secure_kafka: SecureKafka) -> None:
    ctx = secure_kafka.ssl_context(client_cert=True)
    with (socket.create_connection(("localhost", secure_kafka.ssl_port), timeout=5) as raw,
          ctx.wrap_socket(raw, server_hostname="localhost") as tls):
        cert = tls.getpeercert()
    assert cert["subjectAltName"] == (("DNS", "localhost"),)
    issuer = dict(x[0] for x in cert["issuer"])
    assert issuer["commonName"] == "kafka-local test CA"


# --------------------------------------------------------------------------- ways in

WAYS = [
    ("SASL_PLAINTEXT", "PLAIN"),
    ("SASL_PLAINTEXT", "SCRAM-SHA-256"),
    ("SASL_PLAINTEXT", "SCRAM-SHA-512"),
    ("SASL_SSL", "PLAIN"),
    ("SASL_SSL", "SCRAM-SHA-256"),
    ("SASL_SSL", "SCRAM-SHA-512"),
    ("SSL", None),  # the client certificate: User:client, a super user
    ("PLAINTEXT", None),  # User:ANONYMOUS, a super user: the other tests' listener
]


@pytest.mark.parametrize(("protocol", "mechanism"), WAYS,
                         ids=[f"{p}-{m}" if m else p for p, m in WAYS])
def test_alice_round_trip(secure_kafka: SecureKafka, protocol: str,
                          mechanism: str | None) -> None:
    _round_trip(secure_kafka.client(protocol, mechanism, user="alice"))


def test_admin_round_trip(secure_kafka: SecureKafka) -> None:
    _round_trip(secure_kafka.client("SASL_SSL", "SCRAM-SHA-256", user="admin"))


def test_tls_via_ip_without_hostname_check(secure_kafka: SecureKafka) -> None:
    """The control of the hostname-mismatch case: with the check off, 127.0.0.1 works (the
    broker then sends the client to localhost:PORT, as advertised)."""
    s = secure_kafka
    _round_trip({**s.client("SSL", ssl_context=s.ssl_context(client_cert=True,
                                                              check_hostname=False)),
                 "bootstrap_servers": f"127.0.0.1:{s.ssl_port}"})


# ---------------------------------------------------------------------- ways refused

@dataclass
class Refusal:
    error: BaseException
    logged: list[str]  # what the aiokafka loggers logged at ERROR meanwhile
    seconds: float


def _refused(caplog: pytest.LogCaptureFixture, case: str,
             attempt: Callable[[], Awaitable[None]]) -> Refusal:
    caplog.clear()
    with caplog.at_level(logging.ERROR, logger="aiokafka"):
        began = time.monotonic()
        with pytest.raises(KafkaError) as info:
            asyncio.run(attempt())
        seconds = time.monotonic() - began
    logged = [r.getMessage() for r in caplog.records
              if r.name.startswith("aiokafka") and r.levelno >= logging.ERROR]
    err = info.value
    print(f"\n{case}: {type(err).__name__}: {err} | logged: {logged} | {seconds:.2f} s")
    assert seconds < FAILS_WITHIN, (case, seconds)
    return Refusal(err, logged, seconds)


def _assert_no_bootstrap(refusal: Refusal, host: str, port: int, reason: str,
                         secrets: tuple[str, ...] = ()) -> None:
    """KafkaConnectionError "Unable to bootstrap", no cause; the reason (matching the regex
    REASON) only in the one line logged."""
    err = refusal.error
    assert type(err) is KafkaConnectionError
    assert re.fullmatch(rf"KafkaConnectionError: Unable to bootstrap from "
                        rf"\[\('{re.escape(host)}', {port}, <AddressFamily\.AF_\w+: \d+>\)\]",
                        str(err)), str(err)
    assert err.__cause__ is None and err.__context__ is None
    assert len(refusal.logged) == 1, refusal.logged
    assert re.fullmatch(re.escape(f'Unable connect to "{host}:{port}": ') + reason,
                        refusal.logged[0]), refusal.logged
    for secret in secrets:
        assert secret not in str(err) and secret not in "".join(refusal.logged)


SCRAM_FAILED = ("Authentication failed during authentication due to invalid credentials with "
                "SASL mechanism ")


@pytest.mark.parametrize(("protocol", "mechanism", "reason"), [
    ("SASL_PLAINTEXT", "PLAIN", "Authentication failed: Invalid username or password"),
    ("SASL_PLAINTEXT", "SCRAM-SHA-256", SCRAM_FAILED + "SCRAM-SHA-256"),
    ("SASL_SSL", "SCRAM-SHA-512", SCRAM_FAILED + "SCRAM-SHA-512"),
], ids=["SASL_PLAINTEXT-PLAIN", "SASL_PLAINTEXT-SCRAM-SHA-256", "SASL_SSL-SCRAM-SHA-512"])
def test_wrong_password(secure_kafka: SecureKafka, caplog: pytest.LogCaptureFixture,
                        protocol: str, mechanism: str, reason: str) -> None:
    s = secure_kafka
    wrong = "not-" + s.passwords["alice"]
    kwargs = s.client(protocol, mechanism, user="alice", password=wrong)
    refusal = _refused(caplog, f"wrong password, {protocol} {mechanism}",
                       lambda: _produce(kwargs, _topic()))
    port = s.sasl_plaintext_port if protocol == "SASL_PLAINTEXT" else s.sasl_ssl_port
    _assert_no_bootstrap(refusal, "localhost", port, SASL_FAILED + re.escape(reason),
                         secrets=(wrong, s.passwords["alice"]))


def test_unknown_ca(secure_kafka: SecureKafka, caplog: pytest.LogCaptureFixture) -> None:
    s = secure_kafka
    ctx = s.ssl_context(cafile=s.other_ca_file, client_cert=True)
    refusal = _refused(caplog, "unknown CA, SSL",
                       lambda: _produce(s.client("SSL", ssl_context=ctx), _topic()))
    # (the broker sends its CA with its certificate: "self-signed ... in certificate chain")
    _assert_no_bootstrap(refusal, "localhost", s.ssl_port, VERIFY_FAILED
                         + "self[- ]signed certificate in certificate chain" + SSL_LINE)


@pytest.mark.parametrize("protocol", ["SSL", "SASL_SSL"])
def test_hostname_mismatch(secure_kafka: SecureKafka, caplog: pytest.LogCaptureFixture,
                           protocol: str) -> None:
    s = secure_kafka
    port = s.ssl_port if protocol == "SSL" else s.sasl_ssl_port
    kwargs = {**s.client(protocol, "SCRAM-SHA-512"), "bootstrap_servers": f"127.0.0.1:{port}"}
    assert kwargs["ssl_context"].check_hostname
    refusal = _refused(caplog, f"127.0.0.1 with hostname check, {protocol}",
                       lambda: _produce(kwargs, _topic()))
    _assert_no_bootstrap(refusal, "127.0.0.1", port, VERIFY_FAILED + re.escape(
        "IP address mismatch, certificate is not valid for '127.0.0.1'.") + SSL_LINE)


@pytest.mark.parametrize("protocol", ["SSL", "SASL_SSL"])
def test_plaintext_client_on_tls_listener(secure_kafka: SecureKafka,
                                          caplog: pytest.LogCaptureFixture,
                                          protocol: str) -> None:
    s = secure_kafka
    port = s.ssl_port if protocol == "SSL" else s.sasl_ssl_port
    kwargs = {"bootstrap_servers": f"localhost:{port}"}  # security_protocol PLAINTEXT
    refusal = _refused(caplog, f"PLAINTEXT client on the {protocol} listener",
                       lambda: _produce(kwargs, _topic()))
    _assert_no_bootstrap(refusal, "localhost", port,
                         re.escape(f"KafkaConnectionError: Connection at localhost:{port} closed"))


def test_tls_without_client_certificate(secure_kafka: SecureKafka,
                                        caplog: pytest.LogCaptureFixture) -> None:
    s = secure_kafka
    kwargs = s.client("SSL", ssl_context=s.ssl_context(client_cert=False))
    refusal = _refused(caplog, "SSL without a client certificate",
                       lambda: _produce(kwargs, _topic()))
    _assert_no_bootstrap(refusal, "localhost", s.ssl_port, re.escape(
        f"KafkaConnectionError: Connection at localhost:{s.ssl_port} closed"))


@pytest.mark.parametrize(("protocol", "mechanism"), [("SASL_PLAINTEXT", "PLAIN"),
                                                     ("SASL_SSL", "SCRAM-SHA-256")])
def test_bob_is_not_authorized(secure_kafka: SecureKafka, caplog: pytest.LogCaptureFixture,
                               protocol: str, mechanism: str) -> None:
    """Bob gets in (start() works) but may not write: the topic exists (alice made it)."""
    s = secure_kafka
    topic = _topic()
    asyncio.run(_create_topic(s.client("SASL_PLAINTEXT", "PLAIN", user="alice"), topic))
    started: list[bool] = []
    kwargs = s.client(protocol, mechanism, user="bob")
    refusal = _refused(caplog, f"bob produces, {protocol} {mechanism}",
                       lambda: _produce(kwargs, topic, started=started))
    assert started == [True]
    err = refusal.error
    assert type(err) is TopicAuthorizationFailedError
    assert str(err) == f"[Error 29] TopicAuthorizationFailedError: {topic}"
    assert refusal.logged == [f"Topic {topic} is not authorized for this client"]


def test_client_certificate_cn_is_the_principal(secure_kafka: SecureKafka, tmp_path: Path,
                                                caplog: pytest.LogCaptureFixture) -> None:
    """A certificate from the same CA with another CN gets in but is not a super user: the
    principal is the CN (ssl.principal.mapping.rules), not just "has a certificate"."""
    s = secure_kafka
    ca = Path(s.ca_file)
    key, csr, cert = tmp_path / "m.key", tmp_path / "m.csr", tmp_path / "m.pem"
    for args in (["req", "-new", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", csr,
                  "-subj", "/O=stream-dedup kafka-local/CN=mallory"],
                 ["x509", "-req", "-in", csr, "-CA", ca, "-CAkey", ca.with_name("ca.key"),
                  "-set_serial", "7", "-days", "1", "-out", cert]):
        subprocess.run(["openssl", *map(str, args)], check=True, capture_output=True)
    ctx = s.ssl_context()
    ctx.load_cert_chain(cert, key)
    topic = _topic()
    started: list[bool] = []
    refusal = _refused(caplog, "client certificate CN=mallory",
                       lambda: _produce(s.client("SSL", ssl_context=ctx), topic,
                                        started=started))
    assert started == [True]
    assert type(refusal.error) is TopicAuthorizationFailedError
    assert str(refusal.error) == f"[Error 29] TopicAuthorizationFailedError: {topic}"


def test_ssl_context_defaults(secure_kafka: SecureKafka) -> None:
    ctx = secure_kafka.ssl_context()
    assert ctx.check_hostname and ctx.verify_mode == ssl.CERT_REQUIRED
