"""The FeatureIndex seam: what the decide step needs from any index backend, per batch.

A backend stores, for every kept page, its index keys (k features then its band keys: key ->
pages; the index does not tell them apart), its raw and canonical fingerprints (fingerprint
-> first page) and the document record verification reads (url, full sketch, LD signature,
canonical length, shingles). It is asked two questions a batch:

    lookup(probes)  what is stored that each page of the batch may collide with: the first
                    page with its raw / canonical fingerprint, each feature's posting list,
                    and the records verification may read (and, for a shared store, the
                    decision a page delivered again already has);
    claim(claims)   store the batch's outcome (the kept pages, in order; a shared store
                    also records the drops); a claim a concurrent instance beat is lost and
                    that page is decided again.

A memory or LSM index answers from this process and never loses a claim; the Redis index
answers from a shared store in a few pipelined round trips and may (see redis/backend.py). Pages
are named by *handles*, ints chosen by the backend that sort oldest first (a row number, or
the page id itself); a page's public id is `StoredDoc.page_id`, given before deciding:
its input position, or a number the deduplicator takes from `local_ids`.

Every index is stamped with the sketch Params it was built under; opening it with other
Params raises IndexMismatchError, because features of different Params mean nothing to
each other.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np

if TYPE_CHECKING:
    from stream_dedup.index.namespaces import Forget

RAW, CANONICAL = 0, 1


@dataclass(slots=True)  # never changed once made (frozen would cost 1 µs more to build)
class StoredDoc:
    url: str
    features: np.ndarray  # uint64[k]
    sketch: np.ndarray  # uint32[k*s]
    ld_signature: bytes
    text_length: int
    # A stored page's fingerprints may hold their top 32 bits only (the memory index keeps
    # no more): compare a page with a stored one through the index's answer (raw, canonical)
    raw_fp: int
    canonical_fp: int
    fetched_at: str | None = None
    page_id: int = 0  # public: the input position, or a local number (see local_ids)
    shingles: bytes = b""  # its shingles' top 32 bits (exact verification); b"": none
    url_key: int = 0  # its URL's key (core/urls.py): a URL has one version held
    # Its namespace (index/namespaces.py): its keys above are salted with it; "" the default
    namespace: str = ""


@dataclass(slots=True)
class Probe:
    """What one page of a batch asks the index."""

    page_id: int
    raw_fp: int
    canonical_fp: int | None  # None: no visible text (no canonical layer)
    features: np.ndarray | None  # None: a short page, or one not analysed (exact layers only)
    url_key: int = 0  # the key of its URL (of the URL a revisit record refers to)


class Docs(Protocol):
    def __getitem__(self, handle: int) -> StoredDoc: ...


@dataclass(slots=True)
class Answer:
    """What the index holds that one probe may collide with (kept pages only)."""

    raw: int | None  # handle of the first page with this raw fingerprint
    canonical: int | None  # ... with this canonical fingerprint
    postings: list[list[int]]  # per feature: handles of its most recent `cap` pages
    docs: Docs  # records by handle: at least the exact hits and the best candidates
    version: int | None = None  # handle of the kept version of the probe's URL (in docs)
    # A shared store's Decision (url and source None) for a page it has already decided,
    # or WAIT: an older page it collides with is being decided elsewhere; ask again.
    prior: Any = None


WAIT = "wait"


@dataclass(slots=True)
class Claim:
    """One decided page of a batch, handed back to the index in input order."""

    probe: Probe
    doc: StoredDoc | None  # a kept page's record; None for a drop
    decision: Any = None  # the Decision (a shared store records it, for re-deliveries)
    depends_on: int | None = None  # a drop of a page kept earlier in this batch: its index
    # A kept new version of a URL: the version it replaces, a stored handle...
    replaces: int | None = None
    # ... or the index of a claim of this batch (the URL's version kept earlier in it)
    replaces_claim: int | None = None


@dataclass(slots=True, frozen=True)
class Change:
    """A kept page as an index's changelog carries it (kafka/changelog.py): its record, and the
    page id of the version of its URL it replaced; or (doc None) a page forgotten, by id."""

    doc: StoredDoc | None
    replaced: int | None = None


# A batch's composition: ("topic/partition", first offset, end offset) in decide order.
Plan = list[tuple[str, int, int]]


@runtime_checkable
class FeatureIndex(Protocol):
    stamp: int
    cap: int  # posting lists hold a feature's `cap` most recent pages

    def __len__(self) -> int:
        """Pages held."""
        ...

    def lookup(self, probes: Sequence[Probe], *, register: bool = True,
               records: Sequence[int] = ()) -> list[Answer]:
        """One Answer per probe, from the stored pages only; `version`: the kept page with
        the probe's url_key, whose record is in `docs` (a batch's own pages are the
        decide step's overlay). `register=False`: a read-only question (/v1/check).
        `records`: handles whose records the decide step asked for and did not find in the
        last answer (Verdict.missing): in `docs` this time, unless gone."""
        ...

    def claim(self, claims: Sequence[Claim]) -> list[bool]:
        """Store the kept pages (in order) and, for a shared store, every decision; per
        claim, False if it was lost to a concurrent instance (decide that page again). A
        kept page with `replaces` (or `replaces_claim`) removes that version of its URL:
        its keys, fingerprints and record; a URL holds one version."""
        ...

    def stored(self, raw_fps: Sequence[int]) -> list[bool]:
        """Whether a page with each raw fingerprint may be held: a hint that spares an
        exact copy its analysis (a wrong hint costs one analysis later, never a decision)."""
        ...

    def local_ids(self, n: int) -> range:
        """Page ids for n pages without an input position (replay, the library)."""
        ...

    def stats(self) -> dict[str, float]:
        """Pages, entries and bytes held (for operators and benchmarks)."""
        ...

    def forget(self, what: Forget) -> list[int]:
        """Forget the held pages `what` selects (namespaces.Forget), from every structure:
        keys, fingerprints, URL map, records; a later fetch of one is decided as if never
        seen. The page ids forgotten. Safe between batches (the Deduplicator's lock)."""
        ...

    def namespaces(self) -> dict[str, dict[str, Any]]:
        """Per namespace held ("" the default): {"pages": n, "oldest": ISO time of its
        oldest page's crawl (or store), or None}."""
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
    """(handle, shared features) for pages sharing >= min_shared features, most shared
    first, then oldest first: how often each handle occurs among the posting lists of a
    page's features.
    (A Counter: the lists hold a few ids, at most k * max_posting, where numpy's unique and
    lexsort cost ~13 µs a page in fixed overhead.)"""
    if not page_ids:  # most pages: nothing shared
        return []
    hits = [(i, n) for i, n in Counter(page_ids).items() if n >= min_shared]
    hits.sort(key=_most_shared_first)
    return hits


def _most_shared_first(hit: tuple[int, int]) -> tuple[int, int]:
    return -hit[1], hit[0]


# The two rankings the decide step verifies, from a page's posting lists (its `groups`
# features' first, then its band keys'), as (handle, features shared): one definition for
# decide/step.py and for a shared index choosing which records to fetch (RedisIndex._wanted).

def near_candidates(postings: Sequence[Sequence[int]], groups: int, threshold: int
                    ) -> list[tuple[int, int]]:
    """Pages sharing >= threshold features (`near`)."""
    return rank_candidates([h for ids in postings[:groups] for h in ids], threshold)


def contain_candidates(postings: Sequence[Sequence[int]], keys: int, common: int,
                       gone: Set[int] = frozenset()) -> list[int]:
    """Candidates for containment: the pages sharing a key (the last `keys` are the
    containment keys; features and band keys find the larger overlaps) that fewer than
    `common` pages share (a site's template shingle is shared by many), but those `gone`:
    most keys shared first, then oldest."""
    if not keys:
        return []
    candidates = {h for ids in postings if len(ids) < common for h in ids if h not in gone}
    if not candidates:
        return []
    shared = Counter(h for ids in postings for h in ids if h in candidates)
    return sorted(candidates, key=lambda h: (-shared[h], h))


def weak_candidates(postings: Sequence[Sequence[int]], groups: int) -> list[tuple[int, int]]:
    """Every page sharing a feature or a band key, most keys shared first
    (`near-verified`)."""
    features = [h for ids in postings[:groups] for h in ids]
    every = features + [h for ids in postings[groups:] for h in ids]
    if not every:
        return []
    shared = Counter(features)
    return [(h, shared[h]) for h, _ in rank_candidates(every, 1)]


class LocalIndex:
    """What the in-process backends (memory, LSM) share: one process asks, so no claim is
    ever lost; handles are rows, in order of keeping."""

    _next_local: int

    def first_with(self, layer: int, fingerprint: int) -> int | None:
        """The first row with this RAW or CANONICAL fingerprint."""
        raise NotImplementedError

    def postings(self, features: np.ndarray) -> list[list[int]]:
        """Each feature's `cap` most recent rows."""
        raise NotImplementedError

    def insert(self, doc: StoredDoc) -> int:
        """Store a kept page; its row."""
        raise NotImplementedError

    def records(self) -> Docs:
        """Records by row."""
        raise NotImplementedError

    def version_of(self, url_key: int) -> int | None:
        """The row of the kept version of the URL with this key."""
        raise NotImplementedError

    def retire(self, row: int) -> None:
        """Remove a version a newer one of its URL replaced (keys, fingerprints, record)."""
        raise NotImplementedError

    def lookup(self, probes: Sequence[Probe], *, register: bool = True,
               records: Sequence[int] = ()) -> list[Answer]:
        out = []  # (`records`: every record is in `docs` here)
        for p in probes:
            raw = self.first_with(RAW, p.raw_fp)
            canonical = None
            if raw is None and p.canonical_fp is not None:
                canonical = self.first_with(CANONICAL, p.canonical_fp)
            postings = [] if p.features is None else self.postings(p.features)
            version = self.version_of(p.url_key) if p.url_key else None
            out.append(Answer(raw, canonical, postings, self.records(), version))
        return out

    def claim(self, claims: Sequence[Claim]) -> list[bool]:
        rows: dict[int, int] = {}
        for i, c in enumerate(claims):
            if c.doc is not None:
                rows[i] = self.insert(c.doc)
                replaced = rows[c.replaces_claim] if c.replaces_claim is not None \
                    else c.replaces
                if replaced is not None:
                    self.retire(replaced)
        return [True] * len(claims)

    def stored(self, raw_fps: Sequence[int]) -> list[bool]:
        return [self.first_with(RAW, fp) is not None for fp in raw_fps]

    def local_ids(self, n: int) -> range:
        start = self._next_local
        self._next_local += n
        return range(start, start + n)


class ChainDocs:
    """Records by handle: the page's own answer's, then each read namespace's."""

    __slots__ = ("parts",)

    def __init__(self, parts: list[Docs]) -> None:
        self.parts = parts

    def __getitem__(self, handle: int) -> StoredDoc:
        for docs in self.parts:
            try:
                return docs[handle]
            except (KeyError, IndexError):
                continue
        raise KeyError(handle)


def merge_answers(own: Answer, others: list[Answer], cap: int) -> Answer:
    """The page's own answer with what read namespaces hold: the oldest exact match of
    either, each key's most recent `cap` pages of both; URL version and prior its own."""
    if not others:
        return own
    raws = [h for h in [own.raw, *(o.raw for o in others)] if h is not None]
    canonicals = [h for h in [own.canonical, *(o.canonical for o in others)] if h is not None]
    postings = []
    for i, mine in enumerate(own.postings):
        union = set(mine)
        for o in others:
            union.update(o.postings[i])
        postings.append(sorted(union)[-cap:] if len(union) > len(mine) else mine)
    return Answer(min(raws) if raws else None, min(canonicals) if canonicals else None,
                  postings, ChainDocs([own.docs, *(o.docs for o in others)]), own.version,
                  own.prior)
