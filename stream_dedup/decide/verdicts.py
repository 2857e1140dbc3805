"""What the decide step works with and makes (decide/step.py's vocabulary): a page's Analysis,
the Verdict for it, the batch's Overlay of kept pages and the records by handle it reads
(BatchDocs), and the two ways a verdict is made, keep_verdict and drop_verdict. Pure."""

from __future__ import annotations

import base64
import hashlib
from dataclasses import dataclass

import numpy as np

from stream_dedup.errors import PageError
from stream_dedup.index.base import Answer, StoredDoc
from stream_dedup.models import Decision, DuplicateOf, Page, Previous

NO_FEATURES = np.zeros(0, dtype=np.uint64)  # a short page's (read only, like every array here)
NO_SKETCH = np.zeros(0, dtype=np.uint32)
# Handles of the batch's own kept pages: above every stored handle (they are the newest).
OVERLAY = 1 << 128


@dataclass(slots=True)
class Analysis:
    """What the pure stages compute for one page (picklable: crosses process pools).
    Never changed once made; not declared frozen only because a frozen dataclass costs
    1.3 µs to build instead of 0.23, twice a page. `canonical_fp` None with no error: only
    the raw fingerprint was computed (an exact copy of a stored page needs no more)."""

    page: Page
    raw_fp: int
    canonical_fp: int | None = None
    text_length: int = 0
    shingle_count: int = 0
    sketch: np.ndarray | None = None
    features: np.ndarray | None = None  # the k features, then the band keys: index keys
    ld_signature: bytes = b""
    error: PageError | None = None
    canonical_s: float = 0.0  # seconds in decode + extract + canonicalize
    sketch_s: float = 0.0  # seconds in shingles + sketch + features + LD signature (0: not run)
    # The body's length, when the page comes without its body (read and analysed in a
    # worker process: the body need not cross back); None: len(page.body).
    body_bytes: int | None = None
    # Its shingles' top 32 bits (sketch.shingle_tops), for exact verification; b"": none
    shingles: bytes = b""


@dataclass(slots=True)
class Verdict:
    """A decision and what the index must store for it. `decision` None: the page was
    only fingerprinted and its stored copy is gone (retention): analyse it and decide again."""

    decision: Decision | None
    doc: StoredDoc | None = None  # a kept page's record
    depends_on: int | None = None  # a drop of a page kept earlier in this batch: its index
    verify_s: float = 0.0
    # A kept new version of a URL: the stored version it replaces (a handle), or the index
    # of the page of this batch that was the URL's version
    replaces: int | None = None
    replaces_in_batch: int | None = None
    # decision None, not decided this round: the records of these handles were needed and
    # not in the index's answer (ask the index for them and decide again); () with
    # `deferred`: a page after such a one in its batch (decided after it, in order).
    missing: tuple[int, ...] = ()
    deferred: bool = False


class MissingRecord(LookupError):
    """A record the decide step needs is not in the index's answer (a shared index read it
    before the page was final, or ranked candidates otherwise): caught by decide_batch,
    which asks for it (Verdict.missing) rather than decide without it."""

    def __init__(self, handle: int) -> None:
        super().__init__(handle)
        self.handle = handle


class Overlay:
    """The pages kept so far in this batch, as the index would hold them."""

    def __init__(self, namespace: str = "") -> None:
        self.namespace = namespace  # of every page it holds, and of their decisions
        self.docs: list[StoredDoc] = []
        self.batch_index: list[int] = []
        self.raw: dict[int, int] = {}
        self.canonical: dict[int, int] = {}
        self.postings: dict[int, list[int]] = {}
        self.urls: dict[int, int] = {}  # url key -> the handle of its newest version
        self.retired: set[int] = set()  # versions replaced in this batch (any handle)
        # The index's records read so far in this batch, by handle: a record is decoded at
        # each read of an arena, and a recrawl reads its version 3 times, a cluster its
        # representative once a page
        self.read: dict[int, StoredDoc] = {}

    def add(self, doc: StoredDoc, batch_index: int, replaces: int | None) -> None:
        handle = OVERLAY + len(self.docs)
        self.docs.append(doc)
        self.batch_index.append(batch_index)
        if replaces is not None:
            self.retired.add(replaces)
        if doc.url_key:
            self.urls[doc.url_key] = handle
        self.raw.setdefault(doc.raw_fp, handle)
        if doc.text_length > 0:
            self.canonical.setdefault(doc.canonical_fp, handle)
        for feature in doc.features.tolist():
            self.postings.setdefault(feature, []).append(handle)


class BatchDocs:
    """Records by handle: the overlay's, else the index's answer (each read once a batch)."""

    __slots__ = ("answer", "overlay")

    def __init__(self, answer: Answer, overlay: Overlay) -> None:
        self.answer, self.overlay = answer, overlay

    def __getitem__(self, handle: int) -> StoredDoc:
        if handle >= OVERLAY:
            return self.overlay.docs[handle - OVERLAY]
        doc = self.overlay.read.get(handle)
        if doc is None:
            try:
                doc = self.overlay.read[handle] = self.answer.docs[handle]
            except KeyError:
                raise MissingRecord(handle) from None
        return doc


def previous_of(prev: StoredDoc, match: str | None = None) -> Previous:
    return Previous(prev.page_id, prev.url, prev.fetched_at, match)


def warc_digest(payload: bytes) -> str:
    """A payload's digest as WARC writes it (WARC-Payload-Digest): sha1, base32."""
    return "sha1:" + base64.b32encode(hashlib.sha1(payload).digest()).decode("ascii")


def keep_verdict(
    a: Analysis, pid: int, key: int, reason: str, keep_ids: bool, docs: BatchDocs,
    version: int | None, *, short: bool = False, shared: int = 0,
    resemblance: float | None = None, ld: float | None = None, jaccard: float | None = None,
) -> Verdict:
    assert a.canonical_fp is not None
    page_id = pid if keep_ids else None
    page = a.page
    doc = StoredDoc(
        page.url,
        a.features if a.features is not None else NO_FEATURES,
        a.sketch if a.sketch is not None else NO_SKETCH,
        a.ld_signature, a.text_length, a.raw_fp, a.canonical_fp, page.fetched_at,
        pid, a.shingles, key,
    )
    previous = None if version is None else previous_of(docs[version])
    v = Verdict(Decision(
        page.url, "keep", reason, page_id=page_id, shared_features=shared,
        resemblance=resemblance, ld_estimate=ld, jaccard=jaccard, short=short,
        source=page.source, fetched_at=page.fetched_at, previous=previous, cluster=page_id,
        namespace=docs.overlay.namespace,
    ), doc)
    if version is not None and version >= OVERLAY:
        v.replaces_in_batch = docs.overlay.batch_index[version - OVERLAY]
    else:
        v.replaces = version
    return v


def drop_verdict(
    a: Analysis, reason: str, handle: int, docs: BatchDocs, overlay: Overlay, *, shared: int = 0,
    resemblance: float | None = None, ld: float | None = None, jaccard: float | None = None,
    verified: bool = False, containment: float | None = None, previous: Previous | None = None,
    payload_digest: str | None = None,
) -> Verdict:
    """A drop against the page at `handle`; with `previous` (an `unchanged` page: its
    URL's version) it names no other page."""
    first = docs[handle]
    depends_on = overlay.batch_index[handle - OVERLAY] if handle >= OVERLAY else None
    return Verdict(Decision(
        a.page.url, "drop", reason,
        duplicate_of=None if previous else DuplicateOf(first.page_id, first.url),
        shared_features=shared, resemblance=resemblance, ld_estimate=ld, jaccard=jaccard,
        verified=verified, source=a.page.source, fetched_at=a.page.fetched_at,
        previous=previous, payload_digest=payload_digest, containment=containment,
        cluster=first.page_id, namespace=overlay.namespace,
    ), depends_on=depends_on)
