"""Shared fixtures. Broker tests talk to a real Apache Kafka broker (deploy/kafka-local).

If STREAM_DEDUP_TEST_BOOTSTRAP is set (as .ci/run does) the tests use that broker; otherwise
the first broker test starts one in a temporary directory on free ports and stops it at the
end of the session. A broker that cannot be started is an error, not a skip.
"""

from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# tests/sanitize.sh runs the kernel tests a second time with the portable block path forced
# (the only one on CPUs without AVX-512 and on arm64).
FORCED_BLOCK_PATH = os.environ.get("STREAM_DEDUP_TEST_BLOCK_PATH") or None
if FORCED_BLOCK_PATH is not None:
    from stream_dedup.core import _native

    _native.block_path(FORCED_BLOCK_PATH)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="session")
def kafka_bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    given = os.environ.get("STREAM_DEDUP_TEST_BOOTSTRAP")
    if given:
        yield given
        return
    directory = tmp_path_factory.mktemp("kafka")
    env = {**os.environ, "KAFKA_LOCAL_PORT": str(_free_port()),
           "KAFKA_LOCAL_CONTROLLER_PORT": str(_free_port())}
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
