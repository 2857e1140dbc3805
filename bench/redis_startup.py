#!/usr/bin/env python3
"""Does redis-py's asyncio client survive a concurrent start-up? (issue 14: how the pin was chosen)

Against a Redis from deploy/redis-local (cluster or single, told apart with INFO cluster),
each process runs three start-ups, all in one event loop, and counts the calls that fail:

initialize  CLIENTS clients created at once, each `await initialize()` (cluster) or PING
            (single), then SET and GET of its own key;
lazy        CLIENTS fresh clients whose first call is a command (no initialize), each firing
            10 SET+GET pairs at once;
shared      one fresh client, COMMANDS SET+GET pairs fired at once as its first calls.

`--processes N` starts N such processes together (each a fresh interpreter) and adds their
counts, and the client objects asyncio reports as dropped with open connections
("Unclosed ClusterNode object": a leak, not a failed call). A start-up that does not finish
within 20 s counts as one failure ("hang").
Prints one line per run (`--rounds`): the version, failures per start-up, and the distinct
errors. Run it with the redis-py under test first on sys.path:

    PYTHONPATH=/tmp/redispy-8.1.0 python3 bench/redis_startup.py redis://127.0.0.1:7000 --rounds 20
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

import redis
import redis.asyncio
from redis.asyncio.cluster import RedisCluster

SCENARIOS = ("initialize", "lazy", "shared")
LIMIT_S = 20.0


def _error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc)[:120]}"


async def _close(client: Any) -> None:
    close = getattr(client, "aclose", None) or client.close  # aclose arrived in 5.0.1
    try:
        await close()
    except Exception:  # noqa: BLE001 - closing a broken client is not what is measured
        pass


async def _set_get(client: Any, key: str) -> None:
    await client.set(key, key)
    value = await client.get(key)
    if value != key.encode():
        raise AssertionError(f"GET {key} returned {value!r}")


async def _count(calls: list[Awaitable[None]], errors: Counter[str]) -> int:
    try:
        results = await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), LIMIT_S)
    except TimeoutError:
        errors["hang"] += 1
        return 1
    failed = [r for r in results if isinstance(r, BaseException)]
    errors.update(_error(r) for r in failed)
    return len(failed)


async def run_once(url: str, clients: int, commands: int) -> dict[str, Any]:
    probe = redis.asyncio.Redis.from_url(url)
    cluster = (await probe.info("cluster")).get("cluster_enabled") == 1
    await _close(probe)
    make: Callable[[], Any] = (lambda: RedisCluster.from_url(url)) if cluster else (
        lambda: redis.asyncio.Redis.from_url(url))
    tag = uuid.uuid4().hex[:8]
    errors: Counter[str] = Counter()
    failures = {}

    async def initialize(client: Any, key: str) -> None:
        if cluster:
            await client.initialize()
        else:
            await client.ping()
        await _set_get(client, key)

    many = [make() for _ in range(clients)]
    failures["initialize"] = await _count(
        [initialize(c, f"{tag}:i:{n}") for n, c in enumerate(many)], errors)
    await asyncio.gather(*(_close(c) for c in many))

    async def lazy(client: Any, n: int) -> None:
        await asyncio.gather(*(_set_get(client, f"{tag}:l:{n}:{m}") for m in range(10)))

    many = [make() for _ in range(clients)]
    failures["lazy"] = await _count([lazy(c, n) for n, c in enumerate(many)], errors)
    await asyncio.gather(*(_close(c) for c in many))

    one = make()
    failures["shared"] = await _count(
        [_set_get(one, f"{tag}:s:{m}") for m in range(commands)], errors)
    await _close(one)
    return {"cluster": cluster, "failures": failures, "errors": dict(errors)}


def run_processes(args: argparse.Namespace) -> dict[str, Any]:
    cmd = [sys.executable, __file__, args.url, "--clients", str(args.clients),
           "--commands", str(args.commands), "--worker"]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(args.processes)]
    total: dict[str, Any] = {"failures": Counter(), "errors": Counter(), "crashed": 0,
                             "unclosed": 0}
    for proc in procs:
        out, err = proc.communicate(timeout=4 * LIMIT_S + 30)
        # asyncio's exception handler reports a client object dropped with its connections
        # open ("Unclosed ClusterNode object"): a leak, though every call succeeded.
        total["unclosed"] += sum(line.startswith("Unclosed ") for line in err.splitlines())
        if proc.returncode != 0:
            sys.stderr.write(err[-2000:])
        if proc.returncode != 0 or not out.strip():
            total["crashed"] += 1
            continue
        one = json.loads(out.strip().splitlines()[-1])
        total["cluster"] = one["cluster"]
        total["failures"].update(one["failures"])
        total["errors"].update(one["errors"])
    return total


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("url", help="redis://HOST:PORT of deploy/redis-local (cluster or single)")
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--commands", type=int, default=200)
    parser.add_argument("--processes", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(asyncio.run(run_once(args.url, args.clients, args.commands))))
        return 0
    bad_rounds = 0
    for n in range(1, args.rounds + 1):
        result = run_processes(args)
        failed = sum(result["failures"].values()) + result["crashed"]
        bad_rounds += failed > 0 or result["unclosed"] > 0
        counts = " ".join(f"{s}={result['failures'][s]}" for s in SCENARIOS)
        mode = "cluster" if result.get("cluster") else "single"
        print(f"redis-py {redis.__version__} {mode} round {n}: {counts} "
              f"crashed={result['crashed']} unclosed={result['unclosed']} "
              f"errors={dict(result['errors'])}", flush=True)
    print(f"redis-py {redis.__version__}: {bad_rounds} of {args.rounds} rounds had failures "
          f"or leaks ({args.processes} processes x {args.clients} clients, "
          f"{args.commands} shared calls)")
    return 1 if bad_rounds else 0


if __name__ == "__main__":
    sys.exit(main())
