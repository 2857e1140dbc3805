"""The FeatureIndex seam: what the pipeline needs from any index backend.

A backend stores, for every kept page, its k features (feature -> page ids), its raw and
canonical fingerprints (fingerprint -> first page id) and the document record that
verification reads (url, full sketch, LD signature, canonical length). Page ids are dense
and increase with insertion order, so "earlier page" means "smaller id".

Every index is stamped with the sketch Params it was built under; opening it with other
Params raises IndexMismatchError, because features of different Params mean nothing to
each other.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

RAW, CANONICAL = 0, 1


@dataclass(slots=True)  # never changed once made (frozen would cost 1 µs more to build)
class StoredDoc:
    url: str
    features: np.ndarray  # uint64[k]
    sketch: np.ndarray  # uint32[k*s]
    ld_signature: bytes
    text_length: int
    raw_fp: int
    canonical_fp: int
    fetched_at: str | None = None


# A batch's composition: ("topic/partition", first offset, end offset) in decide order.
Plan = list[tuple[str, int, int]]


@runtime_checkable
class FeatureIndex(Protocol):
    stamp: int

    def __len__(self) -> int:
        """Pages held."""
        ...

    def first_with(self, layer: int, fingerprint: int) -> int | None:
        """Earliest page id with this RAW or CANONICAL fingerprint, or None."""
        ...

    def candidates(self, features: np.ndarray, min_shared: int) -> list[tuple[int, int]]:
        """(page id, shared features) for pages sharing >= min_shared features,
        most shared first, then earliest first."""
        ...

    def insert(self, doc: StoredDoc) -> int:
        """Store a kept page; returns its page id."""
        ...

    def doc(self, page_id: int) -> StoredDoc:
        """The document record of a stored page."""
        ...

    def stats(self) -> dict[str, float]:
        """Pages, entries and bytes held (for operators and benchmarks)."""
        ...

    def commit(self, offsets: Mapping[str, int] | None = None) -> None:
        """Make every insert so far durable together with the input offsets they cover."""
        ...

    def offsets(self) -> dict[str, int]:
        """The input offsets stored by the last commit ("topic/partition" -> next offset)."""
        ...

    def begin(self, plan: Plan) -> None:
        """Remember the batch about to be decided (its partitions' offset ranges, in the
        order they are decided) until the next commit, so that after a crash the same batch
        can be decided again in the same order."""
        ...

    def inflight(self) -> Plan | None:
        """The plan of a batch begun and never committed (a crash), if the index keeps it."""
        ...

    def close(self) -> None: ...


def rank_candidates(page_ids: list[int], min_shared: int) -> list[tuple[int, int]]:
    """Count how often each page id occurs among the posting lists of a page's features.
    (A Counter: the lists hold a few ids, at most k * max_posting, where numpy's unique and
    lexsort cost ~13 µs a page in fixed overhead.)"""
    if not page_ids:  # most pages: nothing shared
        return []
    hits = [(i, n) for i, n in Counter(page_ids).items() if n >= min_shared]
    hits.sort(key=_most_shared_first)
    return hits


def _most_shared_first(hit: tuple[int, int]) -> tuple[int, int]:
    return -hit[1], hit[0]
