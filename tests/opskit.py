"""Helpers of the operations tests (metrics, HTTP API, Prometheus, deploy files)."""

from __future__ import annotations

import json
import random
import re
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
DEPLOY = REPO / "deploy"
_WORDS = [f"w{i}x" for i in range(5000)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def html(paragraphs: list[str]) -> str:
    return "<html><body>" + "".join(f"<p>{p}</p>" for p in paragraphs) + "</body></html>"


def reordered_pair(seed: int = 42) -> tuple[str, str]:
    """An article and the same paragraphs in another order, with one new: the filter calls
    them near-duplicates (J8 ~0.89), verification overturns it (large edit distance), and
    the second is not inside the first (c8 ~0.89, under the 0.9 of `contained`; the first
    is inside the second, which lists it in `contains`)."""
    rng = random.Random(seed)
    paras = [" ".join(rng.choice(_WORDS) for _ in range(300)) for _ in range(9)]
    first = html(paras[:8])
    reordered = paras[:8]
    rng.shuffle(reordered)
    return first, html([*reordered, paras[8]])


def get(url: str, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    req = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def get_json(url: str) -> Any:
    status, body = get(url)
    assert status == 200, (url, status, body[:500])
    return json.loads(body)


def wait_for(what: str, check: Callable[[], bool], timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}")


def sample_names(exposition: str) -> set[str]:
    """Names of the samples of a Prometheus text exposition (`x_total`, `x_bucket`...)."""
    return {line.split("{", 1)[0].split(" ", 1)[0]
            for line in exposition.splitlines() if line and not line.startswith("#")}


def samples(exposition: str, name: str) -> dict[str, float]:
    """`{labels}` -> value of every sample called `name`."""
    out = {}
    for line in exposition.splitlines():
        m = re.fullmatch(re.escape(name) + r"(\{.*\})? (\S+)", line)
        if m:
            out[m.group(1) or ""] = float(m.group(2))
    return out


def queried_metrics(expr: str) -> set[str]:
    """Metric names a PromQL expression selects (ours and the process collector's)."""
    return set(re.findall(r"\b((?:stream_dedup|process|python)_[a-z0-9_]+)\b", expr))


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_broker_port(taken: int = 0) -> int:
    """A free port below the kernel's ephemeral range, never one it would give a client's
    outgoing connection: a broker on such a port could not restart while a client that
    reconnects to it held the port (deploy/kafka-local --help, Ports). Random (not seeded):
    test sessions running at the same time should not pick the same port."""
    low = _ephemeral_low()
    rng = random.SystemRandom()
    for _ in range(1000):
        port = rng.randrange(10000, low)
        if port != taken and _port_free(port):
            return port
    raise RuntimeError(f"no free port on 127.0.0.1 below {low}")


def free_broker_ports(count: int) -> list[int]:
    """COUNT distinct free ports, each as free_broker_port picks it."""
    ports: list[int] = []
    while len(ports) < count:
        port = free_broker_port()
        if port not in ports:
            ports.append(port)
    return ports


def free_redis_ports(count: int) -> int:
    """The first of COUNT consecutive free ports for deploy/redis-local: each, and its cluster
    bus port (+10000), free and below the ephemeral range (see free_broker_port)."""
    low = _ephemeral_low()
    rng = random.SystemRandom()
    for _ in range(1000):
        first = rng.randrange(10000, low - 10000 - count)
        ports = [*range(first, first + count), *range(first + 10000, first + 10000 + count)]
        if all(_port_free(p) for p in ports):
            return first
    raise RuntimeError(f"no {count} free ports (and bus ports) on 127.0.0.1 below {low}")


# --- processes (/proc) ---------------------------------------------------------------
def proc_stat(pid: int) -> list[str] | None:
    """Fields of /proc/<pid>/stat after the command name (state first), None if no such pid."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            found += [int(c) for c in (task / "children").read_text().split()]
        except OSError:  # the thread or the process ended meanwhile
            pass
    return found


def tree(pid: int) -> list[int]:
    """`pid` and all its descendants."""
    found, todo = [], [pid]
    while todo:
        found.append(todo.pop())
        todo += children(found[-1])
    return found


def identity(pid: int) -> tuple[int, str] | None:
    """pid and start time: a pid the kernel gives to another process later is not this one."""
    fields = proc_stat(pid)
    return None if fields is None else (pid, fields[19])


def alive(identity: tuple[int, str]) -> bool:
    fields = proc_stat(identity[0])
    return fields is not None and fields[19] == identity[1] and fields[0] not in "ZX"
