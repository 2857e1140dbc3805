"""deploy/redis-local's secure mode (REDIS_LOCAL_SECURE=1) and the pinned redis-py against it.

One cluster serves both kinds of client. Each node has a plain port (password only) and a
TLS port (TLS and password). With `tls-cluster yes`, redis-server 7.0 answers a connection
with the ports of its own kind in CLUSTER SLOTS, CLUSTER NODES and MOVED; CLUSTER SHARDS
gives both, as "port" and "tls-port". So the sync and the asyncio RedisCluster work through
either port.

What redis-py 7.0 raises when it cannot get in is the same for RedisCluster and the asyncio
RedisCluster: a RedisClusterException, "Redis Cluster cannot be connected. Please provide at
least one reachable node: <cause>", whose __cause__ is the error of the one seed node. The
cluster client does not retry there: it tries each seed node once, and the
cluster_error_retry_attempts retries apply only to commands once it is initialized. So a
failure takes one connection attempt, at most socket_connect_timeout. No message holds the
password or a URL. Those about connections name the host and port.
"""

from __future__ import annotations

import asyncio
import gc
import os
import re
import ssl
import stat
import subprocess
import time
import traceback
import uuid
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.cluster import RedisCluster
from redis.crc import key_slot
from redis.exceptions import AuthenticationError, MovedError, RedisClusterException
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from securekit_redis import SCRIPT, SecureRedis, start_secure, stop

pytestmark = pytest.mark.redis

CONNECT_TIMEOUT = 2.0
TIMEOUTS = {"socket_connect_timeout": CONNECT_TIMEOUT, "socket_timeout": CONNECT_TIMEOUT}
FAILS_WITHIN = 5.0  # seconds, every failure below
CANNOT = "Redis Cluster cannot be connected. Please provide at least one reachable node: "


# ------------------------------------------------------------------------------ ways in

def _way(s: SecureRedis, way: str) -> tuple[str, dict[str, Any], tuple[int, ...]]:
    """The seed URL, redis-py's arguments and the node ports the client must end up on."""
    if way == "plain":
        return s.url, s.auth(), s.ports
    if way == "tls":
        return s.tls_url, {**s.auth(), **s.tls()}, s.tls_ports
    if way == "tls-client-cert":
        return s.tls_url, {**s.auth(), **s.tls(client_cert=True)}, s.tls_ports
    if way == "tls-127.0.0.1":
        return s.tls_url.replace("localhost", "127.0.0.1"), {**s.auth(), **s.tls()}, s.tls_ports
    raise AssertionError(way)


WAYS = ["plain", "tls", "tls-client-cert", "tls-127.0.0.1"]


def _keys(count: int = 60) -> list[str]:
    tag = uuid.uuid4().hex[:8]
    return [f"secure:{tag}:{n}" for n in range(count)]


@pytest.mark.parametrize("way", WAYS)
def test_set_get_across_slots(secure_redis: SecureRedis, way: str) -> None:
    url, kwargs, ports = _way(secure_redis, way)
    client = RedisCluster.from_url(url, **TIMEOUTS, **kwargs)
    try:
        # The seed "localhost" is gone: redis-py turns it into 127.0.0.1 (ClusterNode), and
        # the nodes announce 127.0.0.1, so TLS checks every node's certificate for the IP.
        assert {(n.host, n.port) for n in client.get_nodes()} == {("127.0.0.1", p) for p in ports}
        keys = _keys()
        assert {client.get_node_from_key(k).port for k in keys} == set(ports)
        for k in keys:
            assert client.set(k, k, ex=60)
        assert [client.get(k) for k in keys] == [k.encode() for k in keys]
        assert client.delete(*keys) == len(keys)
    finally:
        client.close()


@pytest.mark.parametrize("way", WAYS)
def test_asyncio_set_get_across_slots(secure_redis: SecureRedis, way: str) -> None:
    url, kwargs, ports = _way(secure_redis, way)

    async def use() -> tuple[set[int], list[bytes | None], list[str]]:
        # One call at a time: a burst of calls on TLS is test_asyncio_tls_connections_are_dear
        client = AsyncRedisCluster.from_url(url, **TIMEOUTS, **kwargs)
        try:
            keys = _keys()
            for k in keys:
                await client.set(k, k, ex=60)
            got = [await client.get(k) for k in keys]
            assert await client.delete(*keys) == len(keys)
            return {n.port for n in client.get_nodes()}, got, keys
        finally:
            await client.aclose()

    nodes, got, keys = asyncio.run(use())
    assert nodes == set(ports)
    assert got == [k.encode() for k in keys]


def _owner(slots: list[Any], key: str) -> int:
    """The port of KEY's master in a CLUSTER SLOTS reply."""
    slot = key_slot(key.encode())
    return next(int(r[2][1]) for r in slots if r[0] <= slot <= r[1])


def test_one_cluster_answers_each_client_with_its_own_ports(secure_redis: SecureRedis) -> None:
    """Why one cluster is enough: each kind of connection is sent its kind of ports."""
    s = secure_redis
    plain = redis.Redis(host="127.0.0.1", port=s.ports[0], **TIMEOUTS, **s.auth())
    tls = redis.Redis(host="127.0.0.1", port=s.tls_ports[0], ssl=True, **TIMEOUTS, **s.auth(),
                      **s.tls())
    try:
        for client, ports in ((plain, s.ports), (tls, s.tls_ports)):
            slots = client.execute_command("CLUSTER SLOTS")
            assert sorted(r[2][1] for r in slots) == sorted(ports)
            nodes = client.execute_command("CLUSTER NODES")
            assert sorted(int(name.rsplit(":", 1)[1]) for name in nodes) == sorted(ports)
            # CLUSTER SHARDS names both, whoever asks
            shards = client.execute_command("CLUSTER SHARDS")
            pairs = set()
            for shard in shards:
                for node in dict(zip(shard[::2], shard[1::2], strict=True))[b"nodes"]:
                    fields = dict(zip(node[::2], node[1::2], strict=True))
                    pairs.add((fields[b"port"], fields[b"tls-port"]))
            assert pairs == set(zip(s.ports, s.tls_ports, strict=True))
            # a key of another node: MOVED to that node's port of the asker's kind
            key = next(k for k in _keys(100) if _owner(slots, k) != ports[0])
            with pytest.raises(MovedError) as moved:
                client.get(key)
            assert moved.value.port == _owner(slots, key) and moved.value.port in ports
    finally:
        plain.close()
        tls.close()


def test_secure_json(secure_redis: SecureRedis) -> None:
    s = secure_redis
    path = s.dir / "secure.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert s.username == "alice" and re.fullmatch(r"[0-9a-f]{48}", s.password)
    assert s.url == f"redis://127.0.0.1:{s.ports[0]}"
    assert s.tls_url == f"rediss://localhost:{s.tls_ports[0]}"
    assert s.password not in repr(s)
    assert s.tls_auth_clients == "optional"
    assert len(s.ports) == len(s.tls_ports) == 3
    assert s.tls_ports == tuple(p + len(s.ports) for p in s.ports)
    for name in ("ca_cert", "other_ca_cert", "client_cert", "client_key"):
        assert Path(getattr(s, name)).is_file(), name
    for key in ("ca.key", "node.key", "client.key"):
        assert stat.S_IMODE((s.dir / "tls" / key).stat().st_mode) == 0o600
    assert not (s.dir / "tls" / "other-ca.key").exists()
    san = subprocess.run(["openssl", "x509", "-noout", "-ext", "subjectAltName", "-in",
                          str(s.dir / "tls" / "node.pem")], capture_output=True, text=True,
                         check=True).stdout
    assert "DNS:localhost" in san and "IP Address:127.0.0.1" in san
    # the node configs hold the password (masterauth): only their owner may read them
    for conf in s.dir.glob("node-*/redis.conf"):
        assert stat.S_IMODE(conf.stat().st_mode) == 0o600


# ------------------------------------------------------------------------ ways not in

@dataclass
class Failure:
    error: RedisClusterException
    seconds: float
    text: str  # the whole traceback, causes included: what a log would show

    @property
    def cause(self) -> BaseException:
        assert self.error.__cause__ is not None
        return self.error.__cause__


def _fails(flavour: str, url: str, **kwargs: Any) -> Failure:
    """What the sync or the asyncio RedisCluster raises on its first use, and how soon."""
    start = time.monotonic()
    if flavour == "sync":
        with pytest.raises(RedisClusterException) as info:
            RedisCluster.from_url(url, **TIMEOUTS, **kwargs).close()  # __init__ connects
    else:
        async def first_use() -> None:
            client = AsyncRedisCluster.from_url(url, **TIMEOUTS, **kwargs)
            try:
                await client.set("secure:never", 1)
            finally:
                await client.aclose()

        with pytest.raises(RedisClusterException) as info:
            asyncio.run(first_use())
    seconds = time.monotonic() - start
    text = "".join(traceback.format_exception(info.value))
    if flavour != "sync":
        _collect_refused(info.value)
    return Failure(info.value, seconds, text)


def _collect_refused(error: BaseException) -> None:
    """redis-py's asyncio client leaves the transport of a refused connection open, held by
    the frames of the error's traceback: collected here (its ResourceWarning is redis-py's,
    not ours), not by the garbage collector in some later test's setup."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [error]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        traceback.clear_frames(e.__traceback__)
        todo += [e.__cause__, e.__context__]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        gc.collect()


def _wrong_password(s: SecureRedis) -> tuple[str, dict[str, Any]]:
    return s.url, {"username": s.username, "password": "not-the-password"}


def _wrong_password_tls(s: SecureRedis) -> tuple[str, dict[str, Any]]:
    return s.tls_url, {"username": s.username, "password": "not-the-password", **s.tls()}


def _no_password(s: SecureRedis) -> tuple[str, dict[str, Any]]:
    return s.url, {}


def _password_without_user(s: SecureRedis) -> tuple[str, dict[str, Any]]:
    return s.url, {"password": s.password}  # AUTH <password>: the `default` user, which is off


def _unknown_ca(s: SecureRedis) -> tuple[str, dict[str, Any]]:
    return s.tls_url, {**s.auth(), "ssl_ca_certs": s.other_ca_cert}


def _plain_client_on_tls_port(s: SecureRedis) -> tuple[str, dict[str, Any]]:
    return f"redis://127.0.0.1:{s.tls_ports[0]}", s.auth()


def _tls_client_on_plain_port(s: SecureRedis) -> tuple[str, dict[str, Any]]:
    return f"rediss://localhost:{s.ports[0]}", {**s.auth(), **s.tls()}


def _name_not_in_certificate(s: SecureRedis) -> tuple[str, dict[str, Any]]:
    # "127.1" reaches 127.0.0.1 (inet_aton), but it is neither DNS:localhost nor IP:127.0.0.1
    return f"rediss://127.1:{s.tls_ports[0]}", {**s.auth(), **s.tls()}


# case -> (seed and arguments, the cause's class, the cause's message (regex))
FAILURES: dict[str, tuple[Callable[[SecureRedis], tuple[str, dict[str, Any]]],
                          type[BaseException], str]] = {
    "wrong password": (_wrong_password, AuthenticationError,
                       r"invalid username-password pair or user is disabled\."),
    "wrong password, TLS": (_wrong_password_tls, AuthenticationError,
                            r"invalid username-password pair or user is disabled\."),
    "no password": (_no_password, AuthenticationError, r"Authentication required\."),
    "password without user": (_password_without_user, AuthenticationError,
                              r"invalid username-password pair or user is disabled\."),
    "unknown CA": (_unknown_ca, RedisConnectionError,
                   r"Error 1 connecting to 127\.0\.0\.1:\d+\. \[SSL: CERTIFICATE_VERIFY_FAILED\] "
                   r"certificate verify failed: .*"),
    "plain client on the TLS port": (_plain_client_on_tls_port, RedisConnectionError,
                                     r"Error while reading from 127\.0\.0\.1:\d+ : \(104, "
                                     r"'Connection reset by peer'\)|Connection closed by server\."),
    "TLS client on the plain port": (_tls_client_on_plain_port, RedisTimeoutError,
                                     r"Timeout connecting to server"),
    "host name not in the certificate": (
        _name_not_in_certificate, RedisConnectionError,
        r"Error 1 connecting to 127\.1:\d+\. \[SSL: CERTIFICATE_VERIFY_FAILED\] certificate "
        r"verify failed: Hostname mismatch, certificate is not valid for '127\.1'\..*"),
}


@pytest.mark.parametrize("flavour", ["sync", "asyncio"])
@pytest.mark.parametrize("case", list(FAILURES))
def test_what_redis_py_raises(secure_redis: SecureRedis, case: str, flavour: str) -> None:
    make, cause_type, message = FAILURES[case]
    url, kwargs = make(secure_redis)
    failed = _fails(flavour, url, **kwargs)
    assert type(failed.cause) is cause_type, failed.text
    assert re.fullmatch(message, str(failed.cause)), str(failed.cause)
    assert str(failed.error) == CANNOT + str(failed.cause)
    assert secure_redis.password not in failed.text
    assert "://" not in str(failed.error)  # no URL, so no URL with a password either
    assert failed.seconds < FAILS_WITHIN, failed.seconds
    if case == "TLS client on the plain port":
        # the node reads the ClientHello as the start of a command and waits for its end;
        # the client gives up at socket_connect_timeout, once (no retry)
        assert CONNECT_TIMEOUT * 0.9 < failed.seconds < CONNECT_TIMEOUT * 1.9, failed.seconds
    else:
        assert failed.seconds < CONNECT_TIMEOUT, failed.seconds
    if "CA" in case or "certificate" in case:  # redis-py raises it in an except block
        assert isinstance(failed.cause.__context__, ssl.SSLCertVerificationError)


def test_asyncio_tls_connections_are_dear(secure_redis: SecureRedis) -> None:
    """redis-py 7.0's asyncio SSLConnection makes an SSLContext of its own for each connection
    (ssl.create_default_context(), which reads the system's CA bundle, then the CA file), on
    the event loop: about 50 to 140 ms of CPU each on a 2-core machine. A burst of first calls
    opens a connection each, so 60 at once can hold the loop past socket_connect_timeout. The
    client then drops the seed from its startup nodes and closes, and its later calls fail
    with "Redis Cluster cannot be connected. Please provide at least one reachable node:
    None". This test checks the cause, not the timing: no two connections share a context."""
    s = secure_redis

    async def contexts() -> list[ssl.SSLContext]:
        client = AsyncRedisCluster.from_url(s.tls_url, **TIMEOUTS, **s.auth(), **s.tls())
        try:
            await client.ping()
            keys = [k for k in _keys(40) if _owner_of(client, k) == s.tls_ports[0]][:4]
            await asyncio.gather(*(client.get(k) for k in keys))  # 4 connections to node 0
            node = client.get_node(port=s.tls_ports[0], host="127.0.0.1")
            assert node is not None
            return [c.ssl_context.get() for c in node._connections]
        finally:
            await client.aclose()

    made = asyncio.run(contexts())
    assert len(made) >= 2
    assert len({id(c) for c in made}) == len(made)


def _owner_of(client: AsyncRedisCluster, key: str) -> int:
    return client.get_node_from_key(key).port


def test_the_host_name_check_is_what_refuses_127_1(secure_redis: SecureRedis) -> None:
    url, kwargs = _name_not_in_certificate(secure_redis)
    client = RedisCluster.from_url(url, ssl_check_hostname=False, **TIMEOUTS, **kwargs)
    try:
        assert client.ping()
    finally:
        client.close()


@pytest.fixture
def client_certs_required(secure_redis: SecureRedis) -> Iterator[None]:
    """tls-auth-clients yes on every node for the test (CONFIG SET), then back as it was."""
    s = secure_redis
    admin = RedisCluster.from_url(s.url, **TIMEOUTS, **s.auth())
    try:
        admin.config_set("tls-auth-clients", "yes", target_nodes=RedisCluster.ALL_NODES)
        yield
    finally:
        admin.config_set("tls-auth-clients", s.tls_auth_clients,
                         target_nodes=RedisCluster.ALL_NODES)
        admin.close()


@pytest.mark.usefixtures("client_certs_required")
@pytest.mark.parametrize("flavour", ["sync", "asyncio"])
def test_without_a_client_certificate_when_one_is_required(secure_redis: SecureRedis,
                                                           flavour: str) -> None:
    s = secure_redis
    failed = _fails(flavour, s.tls_url, **s.auth(), **s.tls())
    assert type(failed.cause) is RedisConnectionError, failed.text
    # TLS 1.3: the client's handshake ends before the node has checked; the node's alert, or
    # its closing the connection, comes at the client's first read or write, whichever wins
    assert re.fullmatch(r"Error while reading from 127\.0\.0\.1:\d+ : \(1, '\[SSL: "
                        r"TLSV13_ALERT_CERTIFICATE_REQUIRED\] tlsv13 alert certificate "
                        r"required \(_ssl\.c:\d+\)'\)"
                        r"|Error while reading from 127\.0\.0\.1:\d+ : \(104, 'Connection reset "
                        r"by peer'\)"
                        r"|Error 8 while writing to socket\. EOF occurred in violation of "
                        r"protocol \(_ssl\.c:\d+\)\.", str(failed.cause)), str(failed.cause)
    assert s.password not in failed.text
    assert failed.seconds < CONNECT_TIMEOUT
    client = RedisCluster.from_url(s.tls_url, **TIMEOUTS, **s.auth(), **s.tls(client_cert=True))
    try:
        assert client.ping()
    finally:
        client.close()


# ------------------------------------------------------------------------------ the script

def test_restart_keeps_password_and_certificates(tmp_path: Path) -> None:
    directory = tmp_path / "secure"
    refused = subprocess.run([SCRIPT, "start", "--single", str(directory)], capture_output=True,
                             text=True, env={**os.environ, "REDIS_LOCAL_SECURE": "1"}, timeout=60)
    assert refused.returncode == 1 and "needs cluster mode" in refused.stderr
    first = start_secure(directory)
    try:
        tls = directory / "tls"
        certs = {p.name: p.read_bytes() for p in tls.iterdir()}
        assert sorted(certs) == ["ca.key", "ca.pem", "client.key", "client.pem", "node.key",
                                 "node.pem", "other-ca.pem"]
        stop(directory)
        bare = {k: v for k, v in os.environ.items() if not k.startswith("REDIS_LOCAL_")}
        again = subprocess.run([SCRIPT, "start", str(directory)], capture_output=True, text=True,
                               env=bare, timeout=120)  # no REDIS_LOCAL_*: what DIR holds
        assert again.returncode == 0, again.stderr[-3000:]
        assert again.stdout == first.url + "\n"
        assert first.password not in again.stdout + again.stderr
        second = SecureRedis.read(directory)
        assert second == first and second.password == first.password
        assert {p.name: p.read_bytes() for p in tls.iterdir()} == certs
        client = RedisCluster.from_url(second.tls_url, **TIMEOUTS, **second.auth(),
                                       **second.tls())
        try:
            assert client.set("secure:again", 1) and client.get("secure:again") == b"1"
        finally:
            client.close()
        status = subprocess.run([SCRIPT, "status", str(directory)], capture_output=True,
                                text=True, timeout=60)
        assert status.returncode == 0, status.stderr
        assert status.stdout == first.url + "\n"
        plain = subprocess.run([SCRIPT, "start", str(directory)], capture_output=True, text=True,
                               env={**os.environ, "REDIS_LOCAL_SECURE": "0"}, timeout=60)
        assert plain.returncode == 1 and "in secure mode" in plain.stderr
    finally:
        stop(directory)
