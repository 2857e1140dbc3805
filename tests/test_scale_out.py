"""Two `serve` processes in one consumer group on one Redis Cluster decide as one.

Pairs of near-duplicates are produced with one member on each of the input topic's two
partitions, so each instance sees one member of every pair. A real broker, a real cluster.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
from indexkit import flush_redis
from opskit import DEPLOY, free_port, get, wait_for
from racekit import duplicates, group_pages
from test_service import (  # noqa: F401 (service: a fixture)
    committed_and_end,
    create_topics,
    decisions_of,
    names,
    service,
)

from stream_dedup import Settings
from stream_dedup.models import Page
from stream_dedup.pipeline.deduplicator import Analyzer

pytestmark = pytest.mark.slow

PAIRS = 150


def produce(bootstrap: str, topic: str, partition: int, pages: list[tuple[str, bytes]]) -> None:
    lines = b"".join(url.encode() + b"\t" + json.dumps(
        {"url": url, "html": html.decode()}).encode() + b"\n" for url, html in pages)
    subprocess.run(["kcat", "-P", "-b", bootstrap, "-t", topic, "-p", str(partition), "-K",
                    "\t", "-z", "none"], input=lines, check=True, timeout=60)


@pytest.mark.parametrize("index", ["redis", "memory"])
def test_two_instances_keep_one_of_each_pair(kafka_bootstrap: str, redis_url: str, service,  # type: ignore[no-untyped-def] # noqa: F811
                                             index: str, tmp_path: Path) -> None:
    flush_redis(redis_url)
    t = names("scale")
    create_topics(kafka_bootstrap, [t["input"]], partitions=2)
    extra = ["--batch-size", "10", "--index", index]
    if index == "redis":
        extra += ["--redis-url", redis_url]
    a, b = service(t, *extra, log="a.log"), service(t, *extra, log="b.log")
    wait_for("both instances own a partition", lambda: all(
        "partitions assigned: ['" in s.text() for s in (a, b)), timeout=120)
    pairs = [group_pages(g)[0::2] for g in range(PAIRS)]  # members 0 and 2: near-duplicates
    for start in range(0, PAIRS, 25):  # both partitions fed at once, a slice at a time
        for partition in (0, 1):
            produce(kafka_bootstrap, t["input"], partition,
                    [pair[partition] for pair in pairs[start : start + 25]])
        time.sleep(0.2)
    wait_for("every page decided", lambda: len(decisions_of(kafka_bootstrap, t["decisions"]))
             >= 2 * PAIRS, timeout=180)
    by_url = {d["url"]: d for d in decisions_of(kafka_bootstrap, t["decisions"])}
    analyzer, settings = Analyzer(Settings()), Settings()
    kept_both = kept_none = 0
    for first, second in pairs:
        d1, d2 = by_url[first[0]], by_url[second[0]]
        kinds = sorted((d1["decision"], d2["decision"]))
        a1, a2 = (analyzer.analyze(Page(u, h, (("Content-Type", "text/html"),)))
                  for u, h in (first, second))
        # Two kept pages are a double keep if the filter rule makes them duplicates (two
        # members may share no feature at all: both kept, by any index).
        kept_both += kinds == ["keep", "keep"] and duplicates(a1, a2, settings)
        kept_none += kinds == ["drop", "drop"]
        if kinds == ["drop", "keep"]:
            drop, keep = (d1, d2) if d1["decision"] == "drop" else (d2, d1)
            assert drop["duplicate_of"] == {"page_id": keep["page_id"], "url": keep["url"]}
    assert a.stop() == 0 and b.stop() == 0
    assert all("stopped after" in s.text() and "records" in s.text() for s in (a, b))
    if index == "redis":
        assert (kept_both, kept_none) == (0, 0)
    else:  # the control: each instance remembers only its own partition's pages
        assert kept_both > PAIRS // 3


def test_a_primary_killed_under_two_instances_is_waited_out(
        kafka_bootstrap: str, redis_with_replicas: tuple[str, Path],
        service,  # type: ignore[no-untyped-def] # noqa: F811
        tmp_path: Path) -> None:
    """kill -9 a primary of a 3+3 cluster while two instances decide: /readyz says so while
    it lasts, every record is decided and committed afterwards, and the double keeps that
    Redis's asynchronous replication could cause are counted (docs/scale-out.md: Faults)."""
    url, directory = redis_with_replicas
    port = int(url.rsplit(":", 1)[1])
    seeds = ",".join(f"redis://127.0.0.1:{p}" for p in range(port, port + 3))
    t = names("failover")
    create_topics(kafka_bootstrap, [t["input"]], partitions=2)
    http = [free_port(), free_port()]
    a, b = (service(t, "--batch-size", "10", "--index", "redis", "--redis-url", seeds,
                    "--http-port", str(p), log=f"{i}.log") for i, p in enumerate(http))
    wait_for("both instances own a partition", lambda: all(
        "partitions assigned: ['" in s.text() for s in (a, b)), timeout=120)
    groups = 600
    pairs = [group_pages(g)[0::2] for g in range(groups)]
    not_ready: list[str] = []
    killed = []
    for start in range(0, groups, 25):
        for partition in (0, 1):
            produce(kafka_bootstrap, t["input"], partition,
                    [pair[partition] for pair in pairs[start : start + 25]])
        if start == 250:
            killed.append(subprocess.run([str(DEPLOY / "redis-local"), "kill-master",
                                          str(directory)], capture_output=True, text=True,
                                         timeout=60).stdout.strip())
        for p in http:  # what /readyz says meanwhile
            status, body = get(f"http://127.0.0.1:{p}/readyz")
            if status != 200 and b'"index"' in body:
                not_ready.append(body.decode())
        time.sleep(0.3)
    wait_for("every page decided", lambda: len(decisions_of(kafka_bootstrap, t["decisions"]))
             >= 2 * groups, timeout=240)
    assert killed and killed[0]
    assert not_ready, "/readyz never said the index was unavailable"
    assert a.stop() == 0 and b.stop() == 0
    committed, end = committed_and_end(kafka_bootstrap, t["input"], t["group"])
    assert committed == end == 2 * groups
    by_url = {d["url"]: d for d in decisions_of(kafka_bootstrap, t["decisions"])}
    analyzer, settings = Analyzer(Settings()), Settings()
    double = sum(
        by_url[x[0]]["decision"] == by_url[y[0]]["decision"] == "keep" and duplicates(
            *(analyzer.analyze(Page(u, h, (("Content-Type", "text/html"),))) for u, h in (x, y)),
            settings) for x, y in pairs)
    print(f"failover under serve: {double} double keeps of {groups} pairs; "
          f"{len(not_ready)} /readyz answers not ready")
    assert double <= 5
