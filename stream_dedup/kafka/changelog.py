"""The index's changelog (pure: bytes in, bytes out): what `serve --exactly-once` writes of
each batch's kept pages, inside the batch's transaction, and how they are claimed again
into a memory or LSM index when it starts.

A record a kept page, on partition 0 of the changelog topic (the index is one, whatever the
input partitions):
    key      the page id, 16 bytes big-endian
    value    its URL key (8 bytes, little-endian), then its document record (doc_codec)
    header   `stream-dedup-batch`: the batch it was kept in (its input partition and first
             offset)
and, for a kept page that replaced its URL's version, a tombstone (that version's page id,
no value), so that compaction (the topic is compacted) forgets the version a URL no longer
holds. The compacted log therefore holds what the index holds: one version a URL. A page
forgotten (Deduplicator.forget: `index forget`, /v1/forget, retention) is a tombstone too,
with the header `stream-dedup-forget`: compaction drops its record, and a restore that
reads the tombstone forgets the page if it holds it (`restore_batch`), so that a restored
index holds no page forgotten, whether its record was compacted away yet or not.

Several producers write the topic at once (one a partition of the input, on one or several
instances), so a batch's records need not be consecutive: `changes` groups the records it
is given by their batch header, not by adjacency, and a batch may come in two reads (its
records on both sides of another transaction still open). Nothing depends on a batch being
whole: `claim_again` claims each kept page as its URL's version unless the index holds that
page already, or a later version of its URL (page ids of Kafka records sort by time:
models.position_id). So claiming the changelog again from any position, over pages this
index kept itself or claimed before, changes nothing of them, and adds the others.

Replaying: the index reaches the state it had after the last committed transaction: the same
pages (one instance: the same rows in the same order). After compaction removed replaced
versions, a posting list longer than `max_posting` may hold one older page more than it
did; with several instances deciding one URL on two input partitions at once, the later
page id wins on a restore where the later decision won live.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any, cast

from stream_dedup.index.base import Change, Claim, FeatureIndex, LocalIndex, Probe, StoredDoc
from stream_dedup.index.doc_codec import decode_doc, encode_doc
from stream_dedup.index.namespaces import Forget

BATCH_HEADER = "stream-dedup-batch"
FORGET_HEADER = "stream-dedup-forget"
_ID_BYTES = 16

Record = tuple[bytes, bytes | None, tuple[tuple[str, bytes], ...]]  # key, value, headers


def records(changes: Sequence[Change], batch: str) -> list[Record]:
    """The changelog records of one batch's kept pages, in the order they were kept, and of
    the pages forgotten since the last batch (a tombstone each)."""
    headers = ((BATCH_HEADER, batch.encode()),)
    forgets = (*headers, (FORGET_HEADER, b"1"))
    out: list[Record] = []
    for change in changes:
        doc = change.doc
        if doc is None:
            if change.replaced is not None:
                out.append((change.replaced.to_bytes(_ID_BYTES, "big"), None, forgets))
            continue
        value = doc.url_key.to_bytes(8, "little") + encode_doc(doc, 0.0)
        out.append((doc.page_id.to_bytes(_ID_BYTES, "big"), value, headers))
        if change.replaced is not None:
            out.append((change.replaced.to_bytes(_ID_BYTES, "big"), None, headers))
    return out


def doc_of(value: bytes) -> StoredDoc:
    doc, _ = decode_doc(value[8:], 0)
    doc.url_key = int.from_bytes(value[:8], "little")
    return doc


def changes(consumed: Iterable[Any]) -> Iterator[tuple[list[StoredDoc], list[int], int]]:
    """Consumed changelog records (anything with .offset, .value, .headers) -> each batch's
    kept pages, grouped by the batch header in the order the batches first appear, the page
    ids its forget tombstones name (a replaced version's tombstone is none of them:
    claiming its replacement retires it), and the offset after the batch's last record
    among them."""
    groups: dict[bytes, tuple[list[StoredDoc], list[int], list[int]]] = {}
    for record in consumed:
        headers = dict(record.headers or ())
        batch = headers.get(BATCH_HEADER, b"")
        docs, forgotten, end = groups.setdefault(batch, ([], [], [-1]))
        end[0] = record.offset + 1
        if record.value is not None:
            docs.append(doc_of(record.value))
        elif FORGET_HEADER in headers:
            forgotten.append(int.from_bytes(record.key, "big"))
    for docs, forgotten, end in groups.values():
        yield docs, forgotten, end[0]


def restore_batch(index: LocalIndex, docs: Sequence[StoredDoc], forgotten: Sequence[int]
                  ) -> int:
    """One batch restored: its kept pages claimed again (claim_again), then the pages it
    forgot forgotten, if held. The pages claimed."""
    claimed = claim_again(index, docs)
    if forgotten:
        cast(FeatureIndex, index).forget(Forget(page_ids=frozenset(forgotten)))
    return claimed


def claim_again(index: LocalIndex, docs: Sequence[StoredDoc]) -> int:
    """Claim one batch's kept pages into `index` as they were first claimed: a page whose URL
    has a version (held, or kept earlier in the batch) replaces it. A page the index holds
    already, or whose URL it holds in a later version, is left out (see above); a page
    without a URL key is claimed as it comes. The pages claimed."""
    claims: list[Claim] = []
    kept_at: dict[int, int] = {}  # url key -> the claim of this batch that kept it
    for doc in docs:
        earlier = kept_at.get(doc.url_key) if doc.url_key else None
        held = index.version_of(doc.url_key) if doc.url_key and earlier is None else None
        if held is not None and index.records()[held].page_id >= doc.page_id:
            continue  # this page, or a later version of its URL
        probe = Probe(doc.page_id, doc.raw_fp, doc.canonical_fp, doc.features, doc.url_key)
        claims.append(Claim(probe, doc, replaces=held, replaces_claim=earlier))
        if doc.url_key:
            kept_at[doc.url_key] = len(claims) - 1
    if claims:
        index.claim(claims)
    return len(claims)
