"""`serve --input-format warc` on a real broker: the records of real WARC files, one a
message (sent by `replay --to-kafka-format warc`), give the decisions `replay` gives the same
files; records that are not pages get none and are committed. (Bad WARC messages:
test_poison.py.) Reads ../shared/corpora/warc in place."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from opskit import wait_for
from test_service import (
    committed_and_end,
    create_topics,
    decisions_of,
    names,
    service,  # noqa: F401  (the fixture)
)

from stream_dedup.sources.fastwarc_reader import record_bytes

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

CORPUS = Path(__file__).parents[2] / "shared" / "corpora" / "warc"
# revisit records (dupes, example-revisit, BL-...), request / metadata / warcinfo records
# (all), HTML resource records and a Webrecorder snapshot (example-resource), non-HTML
# responses, a chunked body, and exact and near duplicates across files
FILES = ["pywb/dupes.warc.gz", "pywb/iana.warc.gz", "warc2zim/example-revisit.warc.gz",
         "dolma/sample-0000.warc.gz", "ukwa/BL-20140325122341434-00000-32090~opera~8443.warc.gz",
         "warcio-edgecases/example-resource.warc.gz", "warcio-edgecases/example.warc.gz",
         "warcio-edgecases/example-iana.org-chunked.warc"]


def replay_decisions(paths: list[Path], out: Path) -> list[dict[str, Any]]:
    run = subprocess.run([sys.executable, "-m", "stream_dedup", "replay", *map(str, paths),
                          "-o", str(out)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    return [json.loads(line) for line in out.read_text().splitlines()]


def push_records(bootstrap: str, topic: str, paths: list[Path]) -> None:
    run = subprocess.run([sys.executable, "-m", "stream_dedup", "replay", *map(str, paths),
                          "--to-kafka", topic, "--to-kafka-format", "warc",
                          "--bootstrap-servers", bootstrap],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr


def comparable(d: dict[str, Any]) -> tuple[Any, ...]:
    """What must agree (page ids differ by construction: positions vs a counter)."""
    dup = d["duplicate_of"]
    prev = d["previous"]
    return (d["decision"], d["reason"], d["url"], dup and dup["url"], prev and prev["url"],
            d["fetched_at"])


def raw_messages(bootstrap: str, topic: str) -> list[tuple[bytes, dict[str, bytes]]]:
    """A topic's values as bytes, with their headers (kcat's JSON output cannot carry
    binary payloads)."""
    async def go() -> list[tuple[bytes, dict[str, bytes]]]:
        consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap,
                                    auto_offset_reset="earliest", enable_auto_commit=False)
        await consumer.start()
        try:
            got: list[tuple[bytes, dict[str, bytes]]] = []
            while batch := await consumer.getmany(timeout_ms=3000):
                got += [(r.value, dict(r.headers)) for records in batch.values()
                        for r in records]
            return got
        finally:
            await consumer.stop()
    return asyncio.run(go())


def produce(bootstrap: str, topic: str, values: list[bytes]) -> None:
    async def go() -> None:
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
        await producer.start()
        try:
            for value in values:
                await producer.send_and_wait(topic, value)
        finally:
            await producer.stop()
    asyncio.run(go())


@pytest.mark.corpus
@pytest.mark.skipif(not CORPUS.is_dir(), reason="../shared/corpora/warc is absent")
@pytest.mark.parametrize("mode", ["at-least-once", "exactly-once"])
def test_warc_records_through_serve_get_replays_decisions(
        kafka_bootstrap: str, service, tmp_path: Path, mode: str) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    """exactly-once, batches of one record: most batches hold a skipped record only, and
    each still commits its transaction with its offset."""
    b, t = kafka_bootstrap, names("warcin")
    paths = [CORPUS / f for f in FILES]
    if mode == "exactly-once":
        paths = paths[:3]
    create_topics(b, [t["input"]], partitions=1)
    push_records(b, t["input"], paths)
    records = [value for p in paths for _, value in record_bytes(p)]
    expected = replay_decisions(paths, tmp_path / "replay.jsonl")
    extra = ("--exactly-once", "--batch-size", "1") if mode == "exactly-once" else (
        "--batch-size", "64")
    svc = service(t, "--input-format", "warc", *extra)
    wait_for("every page decided", lambda: committed_and_end(b, t["input"], t["group"])
             == (len(records), len(records)), timeout=240)
    assert svc.stop() == 0
    got = decisions_of(b, t["decisions"])
    assert [comparable(d) for d in got] == [comparable(d) for d in expected]
    reasons = {d["reason"] for d in got}
    assert "unchanged" in reasons and {"unique", "exact"} <= reasons  # revisits, copies
    # one decision a page; every other record skipped, by type, in the summary line
    summary = [line for line in svc.text().splitlines() if "stopped after" in line][-1]
    assert f"stopped after {len(records)} records" in summary
    assert "'request':" in summary and "'warcinfo':" in summary
    offsets = [int(d["source"].rsplit("/", 1)[1]) for d in got]
    assert offsets == sorted(offsets) and len(got) < len(records)
