"""A Kafka broker in deploy/kafka-local's secure mode (KAFKA_LOCAL_SECURE=1), for tests of
clients that authenticate and speak TLS: the session fixture `secure_kafka`.

Besides its PLAINTEXT listener (unauthenticated, as without the secure mode) the broker has
a SASL_PLAINTEXT and a SASL_SSL listener (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512) and an SSL
listener that requires a client certificate, advertised as localhost:PORT. Users: admin and
alice (super users) and bob (no ACL: refused on every topic), with random passwords. The
broker's certificate names DNS:localhost only. DIR/secure.json says how to connect;
`SecureKafka` is that file, read, and `SecureKafka.client()` makes aiokafka's arguments.

If $STREAM_DEDUP_TEST_SECURE_KAFKA is set, it names the DIR of a running secure broker
(`KAFKA_LOCAL_SECURE=1 deploy/kafka-local start DIR`). Otherwise the first test that asks
starts one in a temporary directory on free ports and stops it at the end of the session.
Tests that use it are marked `kafka`.

A test module gets the fixture by importing it:
`from securekit_kafka import secure_kafka_fixture  # noqa: F401`.

The passwords are never to be printed: `SecureKafka` leaves them out of its repr.
"""

from __future__ import annotations

import json
import os
import ssl
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from opskit import DEPLOY, free_broker_ports

ENV = "STREAM_DEDUP_TEST_SECURE_KAFKA"
SCRIPT = str(DEPLOY / "kafka-local")
HEAP = "-Xms128m -Xmx512m"


@dataclass(frozen=True)
class SecureKafka:
    """DIR/secure.json of a secure deploy/kafka-local broker."""

    dir: Path
    plaintext_bootstrap: str  # 127.0.0.1:PORT, no authentication (User:ANONYMOUS, super user)
    sasl_plaintext_bootstrap: str  # localhost:PORT
    sasl_ssl_bootstrap: str  # localhost:PORT
    ssl_bootstrap: str  # localhost:PORT, client certificate required
    plaintext_port: int
    sasl_plaintext_port: int
    sasl_ssl_port: int
    ssl_port: int
    sasl_mechanisms: tuple[str, ...]  # PLAIN, SCRAM-SHA-256, SCRAM-SHA-512
    ca_file: str  # the CA of the broker's (and the client's) certificate
    other_ca_file: str  # an unrelated CA: a client that trusts only it must fail
    client_cert_file: str  # a client certificate and its key from the CA
    client_key_file: str
    client_principal: str  # what the client certificate authenticates as: User:client
    super_users: tuple[str, ...]
    passwords: dict[str, str] = field(repr=False)  # admin, alice, bob

    @classmethod
    def read(cls, directory: Path | str) -> SecureKafka:
        raw: dict[str, Any] = json.loads((Path(directory) / "secure.json").read_text())
        return cls(dir=Path(raw["dir"]), plaintext_bootstrap=raw["plaintext_bootstrap"],
                   sasl_plaintext_bootstrap=raw["sasl_plaintext_bootstrap"],
                   sasl_ssl_bootstrap=raw["sasl_ssl_bootstrap"],
                   ssl_bootstrap=raw["ssl_bootstrap"], plaintext_port=raw["plaintext_port"],
                   sasl_plaintext_port=raw["sasl_plaintext_port"],
                   sasl_ssl_port=raw["sasl_ssl_port"], ssl_port=raw["ssl_port"],
                   sasl_mechanisms=tuple(raw["sasl_mechanisms"]), ca_file=raw["ca_file"],
                   other_ca_file=raw["other_ca_file"],
                   client_cert_file=raw["client_cert_file"],
                   client_key_file=raw["client_key_file"],
                   client_principal=raw["client_principal"],
                   super_users=tuple(raw["super_users"]), passwords=dict(raw["users"]))

    def ssl_context(self, cafile: str | None = None, client_cert: bool = False,
                    check_hostname: bool = True) -> ssl.SSLContext:
        """A client context trusting CAFILE (default: the broker's CA), optionally with the
        client certificate."""
        ctx = ssl.create_default_context(cafile=cafile or self.ca_file)
        ctx.check_hostname = check_hostname
        if client_cert:
            ctx.load_cert_chain(self.client_cert_file, self.client_key_file)
        return ctx

    def client(self, protocol: str, mechanism: str | None = None, user: str = "alice",
               password: str | None = None, ssl_context: ssl.SSLContext | None = None
               ) -> dict[str, Any]:
        """aiokafka's keyword arguments (bootstrap_servers included) for the listener of
        PROTOCOL (PLAINTEXT, SASL_PLAINTEXT, SASL_SSL, SSL), as USER with MECHANISM (SASL),
        with the CA's context (SSL: and the client certificate) unless SSL_CONTEXT is given."""
        bootstrap = {"PLAINTEXT": self.plaintext_bootstrap,
                     "SASL_PLAINTEXT": self.sasl_plaintext_bootstrap,
                     "SASL_SSL": self.sasl_ssl_bootstrap, "SSL": self.ssl_bootstrap}[protocol]
        kwargs: dict[str, Any] = {"bootstrap_servers": bootstrap, "security_protocol": protocol}
        if protocol.startswith("SASL_"):
            kwargs |= {"sasl_mechanism": mechanism or "PLAIN", "sasl_plain_username": user,
                       "sasl_plain_password": self.passwords[user] if password is None
                       else password}
        if protocol.endswith("SSL"):
            kwargs["ssl_context"] = ssl_context or self.ssl_context(
                client_cert=protocol == "SSL")
        return kwargs


def start_secure(directory: Path, env: dict[str, str] | None = None) -> SecureKafka:
    """`KAFKA_LOCAL_SECURE=1 deploy/kafka-local start DIR` on free ports, read."""
    plain, controller, sasl, sasl_ssl, tls = free_broker_ports(5)
    env = {**os.environ, "KAFKA_LOCAL_SECURE": "1", "KAFKA_LOCAL_HEAP_OPTS": HEAP,
           "KAFKA_LOCAL_PORT": str(plain), "KAFKA_LOCAL_CONTROLLER_PORT": str(controller),
           "KAFKA_LOCAL_SASL_PORT": str(sasl), "KAFKA_LOCAL_SASL_SSL_PORT": str(sasl_ssl),
           "KAFKA_LOCAL_SSL_PORT": str(tls), **(env or {})}
    started = subprocess.run([SCRIPT, "start", str(directory)], env=env, capture_output=True,
                             text=True, timeout=600)
    if started.returncode != 0:
        pytest.fail(f"could not start a secure Kafka broker:\n{started.stderr[-3000:]}")
    return SecureKafka.read(directory)


def stop(directory: Path) -> None:
    subprocess.run([SCRIPT, "stop", str(directory)], capture_output=True, timeout=120)


@pytest.fixture(scope="session", name="secure_kafka")
def secure_kafka_fixture(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureKafka]:
    """The secure broker of $STREAM_DEDUP_TEST_SECURE_KAFKA, else one of the session's."""
    given = os.environ.get(ENV)
    if given:
        if not (Path(given) / "secure.json").is_file():
            pytest.fail(f"{ENV}={given} holds no secure.json (KAFKA_LOCAL_SECURE=1 "
                        f"deploy/kafka-local start {given})")
        status = subprocess.run([SCRIPT, "status", given], capture_output=True, text=True,
                                timeout=60)
        if status.returncode != 0:
            pytest.fail(f"{ENV}={given}: its broker does not answer:\n{status.stderr[-2000:]}")
        yield SecureKafka.read(given)
        return
    directory = tmp_path_factory.mktemp("kafka-secure")
    try:
        yield start_secure(directory)
    finally:
        stop(directory)
