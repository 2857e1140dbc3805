"""deploy/redis-local and the pinned redis-py against it (issue 14: the shared index's Redis).

The session's cluster (the `redis_url` fixture) must be healthy, spread keys over its three
masters and let many asyncio clients start at once; single mode and stop/kill-master/
restart-node are checked on Redis started here, in temporary directories.
"""

from __future__ import annotations

import asyncio
import gc
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio
from opskit import DEPLOY, REPO, _ephemeral_low, free_redis_ports
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.cluster import RedisCluster

pytestmark = pytest.mark.redis

SCRIPT = str(DEPLOY / "redis-local")


def _run(*args: str, env: dict[str, str] | None = None,
         check: bool = True) -> subprocess.CompletedProcess[str]:
    out = subprocess.run([SCRIPT, *args], env={**os.environ, **(env or {})},
                         capture_output=True, text=True, timeout=120)
    if check:
        assert out.returncode == 0, out.stderr[-3000:]
    return out


def _pids(directory: Path) -> dict[int, int]:
    return {int(f.parent.name.removeprefix("node-")): int(f.read_text())
            for f in directory.glob("node-*/redis.pid")}


def _alive(pid: int) -> bool:
    """Running, not a zombie waiting for whoever adopted it to reap it."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


@pytest.fixture
def cluster(redis_url: str) -> Iterator[RedisCluster]:
    client = RedisCluster.from_url(redis_url)
    try:
        yield client
    finally:
        client.close()


def test_cluster_is_ok_with_three_masters_covering_every_slot(cluster: RedisCluster) -> None:
    for node in cluster.get_nodes():
        info = cluster.cluster_info(target_nodes=node)
        assert info["cluster_state"] == "ok", (node.name, info)
        assert int(info["cluster_slots_ok"]) == 16384
    ranges = sorted((int(r[0]), int(r[1])) for r in cluster.execute_command(
        "CLUSTER SLOTS", target_nodes=cluster.get_random_node()))
    assert len(cluster.get_primaries()) == len(ranges) == 3
    assert ranges[0][0] == 0 and ranges[-1][1] == 16383
    assert all(a[1] + 1 == b[0] for a, b in zip(ranges, ranges[1:], strict=False))
    low = _ephemeral_low()  # ports and cluster bus ports stay below it (--help, Ports)
    assert all(n.port + 10000 < low for n in cluster.get_nodes())


def test_keys_land_on_all_three_masters(cluster: RedisCluster) -> None:
    tag = uuid.uuid4().hex[:8]
    keys = [f"{tag}:{n}" for n in range(300)]
    for key in keys:
        cluster.set(key, b"1", ex=60)
    per_master = [len(cluster.execute_command("KEYS", f"{tag}:*", target_nodes=node))
                  for node in cluster.get_primaries()]
    assert sum(per_master) == len(keys) and min(per_master) > 50, per_master


async def _start_up(url: str, clients: int, calls: int) -> tuple[list[Any], list[str]]:
    """CLIENTS async cluster clients initialized at once, CLIENTS more whose first calls are 5
    commands at once, and one fresh client given CALLS first commands at once. Returns every
    outcome and what asyncio's exception handler was told (a client dropped with open
    connections)."""
    told: list[str] = []
    asyncio.get_running_loop().set_exception_handler(
        lambda _loop, context: told.append(str(context.get("message"))))
    tag = uuid.uuid4().hex[:8]

    async def set_get(client: AsyncRedisCluster, key: str) -> bytes | None:
        await client.set(key, key, ex=60)
        value: bytes | None = await client.get(key)
        return value

    async def initialized(client: AsyncRedisCluster, key: str) -> bytes | None:
        await client.initialize()
        return await set_get(client, key)

    first = [AsyncRedisCluster.from_url(url) for _ in range(clients)]
    lazy = [AsyncRedisCluster.from_url(url) for _ in range(clients)]
    shared = AsyncRedisCluster.from_url(url)
    calls_made = [
        *(initialized(c, f"{tag}:i:{n}") for n, c in enumerate(first)),
        *(set_get(c, f"{tag}:l:{n}:{m}") for n, c in enumerate(lazy) for m in range(5)),
        *(set_get(shared, f"{tag}:s:{n}") for n in range(calls)),
    ]
    outcomes = await asyncio.wait_for(asyncio.gather(*calls_made, return_exceptions=True), 20)
    await asyncio.gather(*(c.aclose() for c in [*first, *lazy, shared]))
    del first, lazy, shared
    gc.collect()
    await asyncio.sleep(0)
    return outcomes, told


def test_many_cluster_clients_start_at_once(redis_url: str) -> None:
    outcomes, told = asyncio.run(_start_up(redis_url, clients=20, calls=100))
    errors = [repr(o) for o in outcomes if isinstance(o, BaseException)]
    assert errors == [] and told == []
    assert all(isinstance(o, bytes) for o in outcomes) and len(outcomes) == 20 + 100 + 100


def test_several_processes_start_at_once(redis_url: str) -> None:
    out = subprocess.run([sys.executable, str(REPO / "bench" / "redis_startup.py"), redis_url,
                          "--processes", "3", "--clients", "10", "--commands", "100"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "0 of 1 rounds" in out.stdout, out.stdout + out.stderr


def test_single_mode_serves_plain_clients(tmp_path: Path) -> None:
    env = {"REDIS_LOCAL_PORT": str(free_redis_ports(1))}
    url = _run("start", "--single", str(tmp_path), env=env).stdout.splitlines()[-1]
    (pid,) = _pids(tmp_path).values()
    try:
        async def use() -> list[Any]:
            clients = [redis.asyncio.Redis.from_url(url) for _ in range(20)]
            try:
                info = await clients[0].info("cluster")
                config = await clients[0].config_get("*")
                sets = await asyncio.gather(*(c.set(f"k{n}", n) for n, c in enumerate(clients)))
                return [info["cluster_enabled"], config["appendonly"], config["save"],
                        config["maxmemory-policy"], config["bind"], all(sets)]
            finally:
                await asyncio.gather(*(c.aclose() for c in clients))

        assert asyncio.run(use()) == [0, "no", "", "noeviction", "127.0.0.1", True]
    finally:
        _run("stop", str(tmp_path))
    assert not _alive(pid)


def test_stop_kill_master_and_restart_node(tmp_path: Path) -> None:
    env = {"REDIS_LOCAL_PORT": str(free_redis_ports(3)), "REDIS_LOCAL_NODE_TIMEOUT": "1000"}
    url = _run("start", str(tmp_path), env=env).stdout.splitlines()[-1]
    try:
        started = _pids(tmp_path)
        assert len(started) == 3 and all(map(_alive, started.values()))
        assert _run("start", str(tmp_path)).stdout.splitlines()[-1] == url  # already running
        killed = int(_run("kill-master", str(tmp_path)).stdout.splitlines()[-1])
        assert not _alive(started[killed])
        _run("restart-node", str(killed), str(tmp_path))
        status = _run("status", str(tmp_path))
        assert status.stderr.count(" ok, master, slots ") == 3, status.stderr
        pids = _pids(tmp_path)
        assert pids[killed] != started[killed]
    finally:
        _run("stop", str(tmp_path))
    assert not any(map(_alive, [*started.values(), *pids.values()]))
    assert _run("status", str(tmp_path), check=False).returncode == 3
    assert _pids(tmp_path) == {}
