"""A Redis Cluster in deploy/redis-local's secure mode (REDIS_LOCAL_SECURE=1), for tests of
clients that authenticate and speak TLS: the session fixture `secure_redis`.

The cluster has 3 masters. Each node listens on a plain port (password only) and a TLS port
(TLS and password). The ACL user is `alice`, with a random password, and the `default` user
is off. DIR/secure.json says how to connect; `SecureRedis` is that file, read.

If $STREAM_DEDUP_TEST_SECURE_REDIS is set, it names the DIR of a running secure cluster
(`REDIS_LOCAL_SECURE=1 deploy/redis-local start DIR`). Otherwise the first test that asks
starts one in a temporary directory on free ports and stops it at the end of the session.

A test module gets the fixture by importing it:
`from securekit_redis import secure_redis_fixture  # noqa: F401`.

The password is never to be printed: `SecureRedis` leaves it out of its repr, and its URLs
hold none. Pass it to redis-py as `**s.auth()`, not inside a URL.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from opskit import DEPLOY, free_redis_ports

ENV = "STREAM_DEDUP_TEST_SECURE_REDIS"
SCRIPT = str(DEPLOY / "redis-local")
MASTERS = 3


@dataclass(frozen=True)
class SecureRedis:
    """DIR/secure.json of a secure deploy/redis-local cluster."""

    dir: Path
    url: str  # redis://127.0.0.1:PORT, the plain port of one node (password only)
    tls_url: str  # rediss://localhost:TLS_PORT, the same node's TLS port
    username: str
    password: str = field(repr=False)
    ca_cert: str  # the CA of the nodes' certificate (ssl_ca_certs)
    other_ca_cert: str  # an unrelated CA: a client that trusts only it must fail
    client_cert: str  # a client certificate and its key from the CA (tls-auth-clients)
    client_key: str
    tls_auth_clients: str  # optional, yes or no
    ports: tuple[int, ...]  # every node's plain port
    tls_ports: tuple[int, ...]  # every node's TLS port, in the same order

    @classmethod
    def read(cls, directory: Path | str) -> SecureRedis:
        raw: dict[str, Any] = json.loads((Path(directory) / "secure.json").read_text())
        return cls(dir=Path(raw["dir"]), url=raw["url"], tls_url=raw["tls_url"],
                   username=raw["username"], password=raw["password"], ca_cert=raw["ca_cert"],
                   other_ca_cert=raw["other_ca_cert"], client_cert=raw["client_cert"],
                   client_key=raw["client_key"], tls_auth_clients=raw["tls_auth_clients"],
                   ports=tuple(raw["ports"]), tls_ports=tuple(raw["tls_ports"]))

    def auth(self) -> dict[str, str]:
        """redis-py's keyword arguments to log in as the ACL user."""
        return {"username": self.username, "password": self.password}

    def tls(self, client_cert: bool = False) -> dict[str, str]:
        """redis-py's keyword arguments to trust the CA (and present the client cert)."""
        kwargs = {"ssl_ca_certs": self.ca_cert}
        if client_cert:
            kwargs |= {"ssl_certfile": self.client_cert, "ssl_keyfile": self.client_key}
        return kwargs


def start_secure(directory: Path, env: dict[str, str] | None = None) -> SecureRedis:
    """`REDIS_LOCAL_SECURE=1 deploy/redis-local start DIR` (3 masters, free ports), read."""
    env = {**os.environ, "REDIS_LOCAL_SECURE": "1", "REDIS_LOCAL_MODE": "cluster",
           "REDIS_LOCAL_REPLICAS": "0", **(env or {})}
    env.setdefault("REDIS_LOCAL_PORT", str(free_redis_ports(2 * MASTERS)))
    started = subprocess.run([SCRIPT, "start", str(directory)], env=env, capture_output=True,
                             text=True, timeout=180)
    if started.returncode != 0:
        pytest.fail(f"could not start a secure Redis Cluster:\n{started.stderr[-3000:]}")
    return SecureRedis.read(directory)


def stop(directory: Path) -> None:
    subprocess.run([SCRIPT, "stop", str(directory)], capture_output=True, timeout=120)


@pytest.fixture(scope="session", name="secure_redis")
def secure_redis_fixture(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureRedis]:
    """The secure cluster of $STREAM_DEDUP_TEST_SECURE_REDIS, else one of the session's."""
    given = os.environ.get(ENV)
    if given:
        if not (Path(given) / "secure.json").is_file():
            pytest.fail(f"{ENV}={given} holds no secure.json (REDIS_LOCAL_SECURE=1 "
                        f"deploy/redis-local start {given})")
        yield SecureRedis.read(given)
        return
    directory = tmp_path_factory.mktemp("redis-secure")
    try:
        yield start_secure(directory)
    finally:
        stop(directory)
