"""`serve --exactly-once` across rebalances and at start, against a real broker: a batch
taken before a revoke is not delivered after it; the index is restored only once the
partitions' earlier transactions are fenced (completed or aborted); a non-retriable error
stops the service (exit 1) instead of starting over forever; a changelog topic that would
lose kept pages to retention is refused (kafka/: transactions.py,
restore.py, topics.py)."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import time

import pytest
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from opskit import wait_for
from test_exactly_once import _fill, check_exactly_once, crawl, read_committed
from test_service import (
    create_topics,
    names,
    service,  # noqa: F401  (the fixture)
)

pytestmark = pytest.mark.kafka


def create_topic(bootstrap: str, topic: str, partitions: int = 1, **configs: str) -> None:
    async def go() -> None:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        try:
            await admin.create_topics([NewTopic(topic, partitions, 1, topic_configs=configs)])
        finally:
            await admin.close()
    asyncio.run(go())


def restores_within_their_ranges(text: str) -> None:
    """Each restore claimed no more pages than the changelog records it said it read (a
    fetch begun before its seek once handed it records the index held already)."""
    for first, last, claimed in re.findall(
            r"restoring the index from \S+: offsets (\d+)\.\.(\d+)\n(?:.*\n)*?.*"
            r"restored (\d+) kept pages", text):
        assert int(claimed) <= int(last) - int(first) + 1, (first, last, claimed)


def _decided(bootstrap: str, t: dict[str, str]) -> int:
    return len(read_committed(bootstrap, t["decisions"]))


def test_a_batch_taken_before_a_revoke_is_not_delivered_after_it(
        kafka_bootstrap: str, service) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    """Three partitions, a batch size above what each holds: a fetch queues a batch of
    each. The first instance stalls 7 s in its first batch (its loop blocked, within its
    session) while a second joins: the revoke waits for that batch, and the runner takes
    the next one from the queue meanwhile. That batch must be dropped (its partition is
    revoked, its records come again from the committed offset), not delivered after the
    revoke: "no producer for ..." and a start over, or with the partition back, a second
    decision of the same records."""
    pages = crawl(range(60, 62))
    t = _fill(kafka_bootstrap, pages, partitions=3)
    args = ["--exactly-once", "--batch-size", "100"]
    first = service(t, *args, "--crash-at", "before-transaction-commit:1:7", log="a.log")
    wait_for("the first instance's partitions", lambda: first.text().count("resuming at") == 3,
             60)
    time.sleep(1.0)  # its first batch stalls now
    second = service(t, *args, log="b.log")
    wait_for("the first instance's revoke", lambda: re.search(
        r"partitions revoked: \['", first.text()), 60)
    check_exactly_once(kafka_bootstrap, t, pages, partitions=3)
    assert first.stop() == 0 and second.stop() == 0
    for svc in (first, second):
        text = svc.text()
        assert "no producer for" not in text and "starting over" not in text, text[-3000:]
        restores_within_their_ranges(text)


def test_the_index_is_restored_after_the_earlier_owner_is_fenced(
        kafka_bootstrap: str, service) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    """An instance joins while the owner of the only partition stalls inside a transaction
    (8 s, within its session). The owner then commits that transaction (and maybe another)
    and goes (SIGTERM). The newcomer's index must hold what those transactions kept: it is
    restored once it owns the partition and has fenced the owner's transactional id, not
    at start, before them (its decisions would then differ from an uninterrupted run's)."""
    pages = crawl(range(60, 63))
    t = _fill(kafka_bootstrap, pages)
    args = ["--exactly-once", "--batch-size", "20"]
    first = service(t, *args, "--crash-at", "before-transaction-commit:3:8", log="a.log")
    wait_for("two batches", lambda: _decided(kafka_bootstrap, t) >= 40, 60)
    second = service(t, *args, log="b.log")
    wait_for("the newcomer in the group", lambda: "connected; consuming" in second.text(), 60)
    wait_for("the stalled transaction committed", lambda: _decided(kafka_bootstrap, t) >= 60,
             60)
    assert first.stop() == 0
    got = check_exactly_once(kafka_bootstrap, t, pages)
    assert second.stop() == 0
    restored = [int(n) for n in re.findall(r"restored (\d+) kept pages", second.text())]
    kept_by_first = sum(1 for d in got[:60] if d["decision"] == "keep")
    assert sum(restored) >= kept_by_first, second.text()[-3000:]
    restores_within_their_ranges(first.text())
    restores_within_their_ranges(second.text())


def test_a_non_retriable_error_exits_1(kafka_bootstrap: str, service) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    """A compacted kept topic refuses the kept copy of a record without a key (the copy
    keeps the input's key): not retriable. The service exits 1 and says why, as without
    --exactly-once, instead of starting over again and again."""
    t = names("eo-fatal")
    create_topics(kafka_bootstrap, [t["input"]], partitions=1)
    create_topic(kafka_bootstrap, t["kept"], **{"cleanup.policy": "compact"})
    value = json.dumps({"url": "https://keyless.example/", "html": "<p>no key here</p>"})
    subprocess.run(["kcat", "-P", "-b", kafka_bootstrap, "-t", t["input"]],
                   input=value.encode() + b"\n", check=True, timeout=60)
    text = _exits_1(service(t, "--exactly-once"))
    assert "starting over" not in text
    # aiokafka 0.14 does not know InvalidRecord (87): UnknownError, and the log says so
    assert re.search(r"ERROR .*stopping: .*UnknownError.*InvalidRecord.*refused for good",
                     text), text[-3000:]


def test_a_changelog_topic_that_deletes_is_refused(
        kafka_bootstrap: str, service) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    """A changelog topic made beforehand with cleanup.policy=delete would lose the index's
    kept pages to retention: refused at start, exit 1, the log says what to do."""
    t = _fill(kafka_bootstrap, crawl(range(60, 61))[:10])
    create_topic(kafka_bootstrap, f"{t['group']}-index-changelog",
                 **{"cleanup.policy": "delete"})
    text = _exits_1(service(t, "--exactly-once"))
    assert "cleanup.policy" in text and "compact" in text
    assert _decided(kafka_bootstrap, t) == 0


def test_instances_sharing_a_changelog_learn_each_others_pages(
        kafka_bootstrap: str, service, tmp_path) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    """Two instances with LSM indexes of their own share a group, so a changelog; each
    decides one of two partitions, both writing the changelog at once (their batches'
    records interleave). Restarted alone, the first must hold every page kept by either:
    its stored changelog position never skips what the other wrote before its own last
    batch."""
    from test_service import kcat_produce

    from stream_dedup import Deduplicator, Settings

    t = names("eo-shared")
    create_topics(kafka_bootstrap, [t["input"]], partitions=2)
    a_args = ["--exactly-once", "--batch-size", "5", "--index", "lsm", "--index-path",
              str(tmp_path / "a-index")]
    b_args = ["--exactly-once", "--batch-size", "5", "--index", "lsm", "--index-path",
              str(tmp_path / "b-index")]
    first = service(t, *a_args, log="a.log")
    wait_for("the first's partitions", lambda: "partitions assigned: ['" in first.text(), 60)
    second = service(t, *b_args, log="b.log")
    wait_for("a partition each", lambda: "partitions assigned: ['" in second.text() and
             re.search(r"partitions assigned: \['[^,\]]*'\]", first.text()) is not None, 60)
    pages = crawl(range(60, 64))
    kcat_produce(kafka_bootstrap, t["input"], [(u, json.dumps({"url": u, "html": h}).encode())
                                               for u, h in pages])
    got = check_exactly_once(kafka_bootstrap, t, pages, partitions=2)
    assert first.stop() == 0 and second.stop() == 0
    again = service(t, *a_args, log="a2.log")
    wait_for("the restart's restore", lambda: "resuming at" in again.text(), 60)
    time.sleep(2.0)
    assert again.stop() == 0
    dd = Deduplicator(Settings(index="lsm", index_path=str(tmp_path / "a-index")))
    try:
        held = len(dd.index)
    finally:
        dd.close()
    kept_urls = {d["url"] for d in got if d["decision"] == "keep"}
    assert held == len(kept_urls), (held, len(kept_urls))


def _exits_1(svc) -> str:  # type: ignore[no-untyped-def]
    """The service's log, once it has exited 1 (within 60 s: else the test fails)."""
    try:
        rc = svc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail(f"still running after 60 s:\n{svc.text()[-3000:]}")
    text = svc.text()
    assert rc == 1, text[-3000:]
    return str(text)
