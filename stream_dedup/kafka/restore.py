"""Restoring a memory or LSM index from its changelog (`serve --exactly-once`,
kafka/transactions.py; the records' format: kafka/changelog.py).

The index stores the changelog position it has read up to. `restore_index` reads the
changelog from there up to its last stable offset (read_committed: only committed
transactions, and nothing past one still open), claims the kept pages it reads
(changelog.claim_again: a page the index holds already, or a later version of its URL, is
left out), forgets the pages forgotten since (their tombstones), and commits the index with
the position reached, one fetch at a time. Only this moves the position: a batch this
instance commits does not (other instances sharing the changelog may have written before
its records). It runs before the group is joined, once
the assigned partitions' producers are started (TransactionalSource: their InitProducerId
completed or aborted whatever transaction an earlier owner had open, so a commit still
completing is read, not missed), and every CATCH_UP_S. Every wait on the broker ends
within STOP_GRACE_S of a stop.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition

from stream_dedup.config import Settings
from stream_dedup.index.base import LocalIndex
from stream_dedup.kafka import changelog
from stream_dedup.kafka.client import consumer_kwargs, retry, stop_within
from stream_dedup.metrics import Metrics
from stream_dedup.pipeline.deduplicator import Deduplicator
from stream_dedup.runner.edges import STOP_GRACE_S, Abandoned, within_grace

log = logging.getLogger("stream_dedup.kafka")

RESTORE_FETCH = 2000  # changelog records a fetch while restoring
RESTORE_LOG_EVERY_S = 10.0


async def restore_index(settings: Settings, dedup: Deduplicator, metrics: Metrics,
                        stop: asyncio.Event,
                        keep_alive: Callable[[], Awaitable[None]] | None = None) -> int:
    """Claim into a memory or LSM index what the changelog holds past the position the
    index stored; the kept pages claimed. Reads up to the changelog's last stable offset:
    called once the partitions' earlier owners are fenced (TransactionalSource), their
    transactions are all there. `keep_alive` is awaited between reads. Every wait on the
    broker ends within STOP_GRACE_S of a stop (Abandoned)."""
    index = dedup.index
    if not isinstance(index, LocalIndex):
        return 0
    tp = TopicPartition(settings.changelog(), 0)
    stream = f"{tp.topic}/0"
    start = dedup.index.offsets().get(stream, 0)
    consumer = AIOKafkaConsumer(**{**consumer_kwargs(settings), "group_id": None})
    restored = 0
    try:
        await retry(f"connecting to {settings.bootstrap_servers} (restoring the index)",
                    lambda: within_grace(consumer.start(), stop), stop)
        consumer.assign([tp])
        end = (await within_grace(consumer.end_offsets([tp]), stop))[tp]
        if start > end:
            log.warning("the index reflects %s up to offset %d, but the topic ends at %d: "
                        "was it deleted and made again? The index is used as it is; give a "
                        "new changelog topic a new index", stream, start, end)
        if start >= end:
            return 0
        consumer.seek(tp, start)
        log.info("restoring the index from %s: offsets %d..%d", stream, start, end - 1)
        next_log = time.monotonic() + RESTORE_LOG_EVERY_S
        while not stop.is_set():
            got = await within_grace(consumer.getmany(
                tp, timeout_ms=1000, max_records=RESTORE_FETCH), stop)
            # A fetch begun at the assignment (from the topic's start) can answer after
            # the seek: what it read before `start` is in the index already. Records past
            # `end` (committed since) are left to the next restore.
            chunk = [r for r in got.get(tp, []) if start <= r.offset < end]
            position = await within_grace(consumer.position(tp), stop)
            done = position >= end
            if chunk or done:
                restored += await asyncio.to_thread(_claim, dedup, chunk, stream,
                                                    end if done else position)
            if done:
                break
            if keep_alive is not None:
                await keep_alive()
            if time.monotonic() >= next_log:
                next_log = time.monotonic() + RESTORE_LOG_EVERY_S
                log.info("restoring the index: %d pages so far (offset %d of %d)", restored,
                         position, end)
        if stop.is_set():
            raise Abandoned("stopped while restoring the index")
    finally:
        await stop_within(consumer, STOP_GRACE_S)
    metrics.restored.inc(restored)
    log.info("restored %d kept pages from %s", restored, stream)
    return restored


def _claim(dedup: Deduplicator, records: list[Any], stream: str, reached: int) -> int:
    """Claim the kept pages of changelog records (changelog.claim_again: those the index
    holds already, or holds a later version of, are left out) and forget the pages their
    forget tombstones name (changelog.restore_batch), then commit the index with
    the position reached: everything before it is in the index. The pages claimed."""
    claimed = 0
    with dedup.lock:
        index = dedup.index
        assert isinstance(index, LocalIndex)
        for docs, forgotten, _ in changelog.changes(records):
            claimed += changelog.restore_batch(index, docs, forgotten)
        dedup.index.commit({stream: reached})
    return claimed
