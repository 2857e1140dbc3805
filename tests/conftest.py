"""Shared fixtures. Broker tests talk to a real Apache Kafka broker (deploy/kafka-local).

If STREAM_DEDUP_TEST_BOOTSTRAP is set (as .ci/run does) the tests use that broker; otherwise
the first broker test starts one in a temporary directory on free ports below the ephemeral
range and stops it at the end of the session. A broker that cannot be started is an error,
not a skip.
"""

from __future__ import annotations

import os
import random
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _free_port(taken: int = 0) -> int:
    """A free port below the kernel's ephemeral range, never one it would give a client's
    outgoing connection: a broker on such a port could not restart while a client that
    reconnects to it held the port (deploy/kafka-local --help, Ports). Random (not seeded):
    test sessions running at the same time should not pick the same port."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    rng = random.SystemRandom()
    for _ in range(1000):
        port = rng.randrange(10000, low)
        if port == taken:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise RuntimeError(f"no free port on 127.0.0.1 below {low}")


@pytest.fixture(scope="session")
def kafka_bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    given = os.environ.get("STREAM_DEDUP_TEST_BOOTSTRAP")
    if given:
        yield given
        return
    directory = tmp_path_factory.mktemp("kafka")
    port = _free_port()
    env = {**os.environ, "KAFKA_LOCAL_PORT": str(port),
           "KAFKA_LOCAL_CONTROLLER_PORT": str(_free_port(taken=port))}
    script = str(REPO / "deploy" / "kafka-local")
    started = subprocess.run([script, "start", str(directory)], env=env, capture_output=True,
                             text=True, timeout=600)
    if started.returncode != 0:
        pytest.fail(f"could not start a Kafka broker:\n{started.stderr[-3000:]}")
    try:
        yield started.stdout.strip().splitlines()[-1]
    finally:
        subprocess.run([script, "stop", str(directory)], env=env, capture_output=True,
                       timeout=120)
