"""Driving a FeatureIndex through its protocol (lookup, claim), as the deduplicator does."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from stream_dedup.index import CANONICAL, RAW, FeatureIndex, StoredDoc
from stream_dedup.index.base import Answer, Claim, Probe, rank_candidates
from stream_dedup.models import Decision


def probe_of(doc: StoredDoc) -> Probe:
    return Probe(doc.page_id, doc.raw_fp, doc.canonical_fp if doc.text_length else None,
                 doc.features if doc.features.shape[0] else None)


def keep(index: FeatureIndex, doc: StoredDoc, page_id: int) -> None:
    """Store `doc` as page `page_id`, kept: the lookup a deduplicator makes, then its claim."""
    doc = replace(doc, page_id=page_id)
    probe = probe_of(doc)
    index.lookup([probe])
    decision = Decision(doc.url, "keep", "unique", page_id=page_id)
    assert index.claim([Claim(probe, doc, decision)]) == [True]


def candidates(index: FeatureIndex, features: list[int] | np.ndarray,
               min_shared: int) -> list[tuple[int, int]]:
    """(page id, shared features) of stored pages sharing >= min_shared, best first."""
    q = np.asarray(features, dtype=np.uint64)
    answer = index.lookup([Probe(-1, 0, None, q)], register=False)[0]
    ranked = rank_candidates([h for posting in answer.postings for h in posting], min_shared)
    return [(_page_id(answer, h), n) for h, n in ranked]


def _page_id(answer: Answer, handle: int) -> int:
    """A handle's page id: from its record, or (a shared index answers with the records of
    the best candidates only) the handle itself, which is the page id there."""
    try:
        return answer.docs[handle].page_id
    except KeyError:
        return handle


def first_with(index: FeatureIndex, layer: int, fingerprint: int) -> int | None:
    """The page id of the first stored page with this RAW or CANONICAL fingerprint."""
    probe = (Probe(-1, fingerprint, None, None) if layer == RAW
             else Probe(-1, 0x5EED, fingerprint, None))
    answer = index.lookup([probe], register=False)[0]
    handle = answer.raw if layer == RAW else answer.canonical
    return None if handle is None else answer.docs[handle].page_id


__all__ = ["CANONICAL", "RAW", "candidates", "first_with", "keep", "probe_of"]


def flush_redis(url: str) -> None:
    """Empty every primary of the Redis at `url` (a test's own clean store): FLUSHALL, all
    of it, not only a test's keys (the index's key names have no prefix), which is why the
    README asks for a Redis of the tests' own."""
    from redis.cluster import RedisCluster

    from stream_dedup.index.redis.client import connect

    client = connect(url)
    if isinstance(client, RedisCluster):
        client.flushall(target_nodes=RedisCluster.PRIMARIES)
    else:
        client.flushall()
    client.close()
