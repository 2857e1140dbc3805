"""The decide step, pure: a batch of analyses + what the index answered -> verdicts.

    raw fingerprint stored ──> drop "exact"
    canonical fingerprint stored ──> drop "canonical"
    (fewer than min_shingles shingles: keep "unique", short=True; exact layers only)
    features' posting lists ─> pages sharing >= r features
        none ─> pages sharing 1..r-1 features or a band key (verify_single_feature)?
                verify them: drop "near-verified" if one passes, else keep "unique"
        some ─> sampled? verify the best (resemblance + estimated LD)
                   passes ─> drop "near" (verified)      fails ─> keep "verified-distinct"
                not sampled ─> drop "near" (unverified)

A page whose URL has a kept version (the index's answer, or a page of this batch) is a
recrawl, compared with that version first:

    same bytes, same canonical text, or near by the verification above ──> drop "unchanged"
        (`previous`: that version; no `duplicate_of`)
    otherwise a new version: the checks above, against every page but that version;
        a drop names the other URL's page (and `previous`); a keep is "changed" and
        replaces the version (Verdict.replaces) in the index
    a WARC revisit record: "unchanged" against the version of the URL it refers to; rejected
        "revisit-unknown" when there is none, "revisit-mismatch" when the capture it
        refers to is older than that version (which replaced its payload)
    a fetch older than the URL's version and not the same (by page id, when ids are
        input positions, which sort by time): drop "superseded" (it arrived late: another
        partition, an instance behind); the newer version stays

Verification: the exact Jaccard of the shingle sets (verify_exact, when both pages have
one) at verify_min_jaccard, else the sketch's estimate at the tier's bar; and Coates'
estimated LD ratio.

No I/O and no state between calls: the index was asked once for the whole batch
(`FeatureIndex.lookup`); a page kept earlier in the same batch joins an `Overlay` that
the later pages see as if it were stored, so a batch is decided exactly as the same pages
one at a time would be (tests/test_golden.py holds every batch size to that). Only kept
pages count (a dropped page is not indexed: no drift by chaining).

No answer makes it raise: a record it needs and the answer lacks (a shared index's answer
is read while other instances work) leaves that page undecided, with the handle it needs
(Verdict.missing), and the pages after it in the batch too (Verdict.deferred): the
deduplicator asks the index again, for those records, and decides them in a later round.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from time import perf_counter

from stream_dedup.config import Settings
from stream_dedup.core import ldsig
from stream_dedup.core.sketch import jaccard, resemblance
from stream_dedup.decide.containment import containment
from stream_dedup.decide.verdicts import (
    OVERLAY,
    Analysis,
    BatchDocs,
    MissingRecord,
    Overlay,
    Verdict,
    drop_verdict,
    keep_verdict,
    previous_of,
    warc_digest,
)
from stream_dedup.index.base import (
    Answer,
    StoredDoc,
    near_candidates,
    weak_candidates,
)
from stream_dedup.models import (
    CANONICAL,
    CHANGED,
    EXACT,
    NEAR,
    NEAR_VERIFIED,
    SUPERSEDED,
    TIMED_IDS,
    UNCHANGED,
    UNIQUE,
    VERIFIED_DISTINCT,
    Decision,
)

_U64_SPAN = float(1 << 64)


def decide_batch(
    analyses: Sequence[Analysis], page_ids: Sequence[int], answers: Sequence[Answer],
    settings: Settings, *, keep_ids: bool = True, url_keys: Sequence[int] | None = None,
) -> list[Verdict]:
    """Verdicts for analysed pages (no errors) in input order; `answers[i]` is the index's
    answer for `analyses[i]`, whose id is `page_ids[i]` and whose URL's key (core/urls.py)
    is `url_keys[i]` (None, or a key 0: no URL versions). `keep_ids` False: kept pages get
    no page_id in their decision (a question, not a decision)."""
    overlays: dict[str, Overlay] = {}  # a namespace's pages see only each other
    nc = settings.contain_asked  # a probe's last keys: containment's
    out: list[Verdict] = []
    last = len(analyses) - 1  # no page after it to see it (one page: `check`)
    keys = url_keys if url_keys is not None else [0] * len(analyses)
    for i, (a, pid, answer, key) in enumerate(zip(analyses, page_ids, answers, keys,
                                                  strict=True)):
        namespace = a.page.namespace or settings.namespace
        overlay = overlays.get(namespace)
        if overlay is None:
            overlay = overlays[namespace] = Overlay(namespace)
        try:
            v = _decide(a, pid, key, answer, overlay, settings, keep_ids, nc)
        except MissingRecord as missing:
            # Decided without that record, the page might be kept beside a duplicate: it
            # waits for it, and the pages after it wait too (they are decided after it).
            out.append(Verdict(None, missing=(missing.handle,)))
            out += [Verdict(None, deferred=True) for _ in analyses[i + 1 :]]
            return out
        if v.doc is not None and i < last:
            replaced = v.replaces
            if v.replaces_in_batch is not None:
                replaced = OVERLAY + overlay.batch_index.index(v.replaces_in_batch)
            overlay.add(v.doc, i, replaced)
        out.append(v)
    return out


def _version(key: int, answer: Answer, overlay: Overlay) -> int | None:
    """The handle of the kept version of the page's URL: the batch's newest, else the
    index's (unless a page of this batch replaced it)."""
    if not key:
        return None
    version = overlay.urls.get(key)
    if version is None and answer.version is not None \
            and answer.version not in overlay.retired:
        version = answer.version
    return version


def _decide(a: Analysis, pid: int, key: int, answer: Answer, overlay: Overlay, s: Settings,
            keep_ids: bool, nc: int) -> Verdict:
    docs = BatchDocs(answer, overlay)
    version = _version(key, answer, overlay)
    if a.page.revisit is not None:
        return _revisit(a, version, docs, overlay)
    if version is None:
        return _decide_page(a, pid, key, answer, docs, overlay, s, keep_ids, None, nc)
    prev = docs[version]
    same = _same_version(a, version, prev, answer, docs, overlay, s)
    if same is not None:
        return same
    if keep_ids and prev.page_id > pid >= TIMED_IDS:  # a late fetch: the version is newer
        return Verdict(Decision(a.page.url, "drop", SUPERSEDED, source=a.page.source,
                                fetched_at=a.page.fetched_at, previous=previous_of(prev),
                                cluster=prev.page_id))
    v = _decide_page(a, pid, key, answer, docs, overlay, s, keep_ids, version, nc)
    if v.decision is not None and v.decision.decision == "drop":  # a copy of another URL
        v.decision = replace(v.decision, previous=previous_of(prev))
    return v


def _same_version(a: Analysis, version: int, prev: StoredDoc, answer: Answer, docs: BatchDocs,
                  overlay: Overlay, s: Settings) -> Verdict | None:
    """`unchanged` when the page is its URL's kept version again: the same bytes, the same
    canonical text, or a near-duplicate of it by the verification any near-duplicate gets;
    None: a new version (or Verdict(None): only fingerprinted, analyse it first). A stored
    version is the same bytes or text when the index found it by the page's fingerprint (a
    stored record may hold only part of its fingerprints); a page of this batch, when its
    fingerprints are the page's."""
    mine = version >= OVERLAY
    if a.raw_fp == prev.raw_fp if mine else answer.raw == version:
        return _unchanged_drop(a, version, docs, overlay, prev, EXACT)
    if a.canonical_fp is None:
        return Verdict(None)
    if a.text_length > 0 and prev.text_length > 0 and (
            a.canonical_fp == prev.canonical_fp if mine else answer.canonical == version):
        return _unchanged_drop(a, version, docs, overlay, prev, CANONICAL)
    if a.shingle_count < s.min_shingles or a.sketch is None or prev.sketch.shape[0] == 0:
        return None
    started = perf_counter()
    confirmed, _ = _verify(a, [(version, 0)], docs, overlay, s, UNCHANGED)
    if confirmed is None:
        return None
    confirmed.verify_s = perf_counter() - started
    return _unchanged(a, confirmed, prev, NEAR)


def _unchanged(a: Analysis, v: Verdict, prev: StoredDoc, match: str) -> Verdict:
    """A verified drop (`v`) as an `unchanged` one."""
    assert v.decision is not None
    v.decision = replace(v.decision, duplicate_of=None, previous=previous_of(prev, match),
                         payload_digest=_payload_digest(a))
    return v


def _unchanged_drop(a: Analysis, version: int, docs: BatchDocs, overlay: Overlay,
                    prev: StoredDoc, match: str) -> Verdict:
    """`unchanged`, made at once (not a drop, then replaced: 1 % of a recrawl's replay)."""
    return drop_verdict(a, UNCHANGED, version, docs, overlay,
                        previous=previous_of(prev, match), payload_digest=_payload_digest(a))


def _payload_digest(a: Analysis) -> str | None:
    page = a.page
    digest = page.payload_digest
    if digest is None and page.body and a.body_bytes is None:
        digest = warc_digest(page.body)
    return digest


def _revisit(a: Analysis, version: int | None, docs: BatchDocs, overlay: Overlay) -> Verdict:
    """A WARC revisit record says "the payload of the capture of WARC-Refers-To-Target-URI
    at WARC-Refers-To-Date". `unchanged` against that URL's version held, unless the capture
    it refers to is older than that version (by more than a second: a WARC-Date may have
    whole seconds): the version held replaced that capture's payload, so the record is not
    that version again, and, without a body, cannot be analysed as a new one -> reject
    `revisit-mismatch`, naming both captures (a record that arrives late, or a URL back to
    an earlier payload). No date on either side to compare: `unchanged`. The payload
    digests are not compared: the index does not hold its versions' digests."""
    page = a.page
    assert page.revisit is not None
    what = f"a revisit record ({page.revisit.profile.rsplit('/', 1)[-1]})"
    uri = page.revisit.refers_to_uri or page.url
    if version is None:
        return Verdict(Decision(
            page.url, "reject", "revisit-unknown", source=page.source,
            fetched_at=page.fetched_at,
            error=f"{what} refers to {uri}, of which the index holds no version"))
    prev = docs[version]
    refers, held = _capture_time(page.revisit.refers_to_date), _capture_time(prev.fetched_at)
    if refers is not None and held is not None and refers < held - 1.0:
        return Verdict(Decision(
            page.url, "reject", "revisit-mismatch", source=page.source,
            fetched_at=page.fetched_at, previous=previous_of(prev),
            error=f"{what} of {page.url} (payload {page.payload_digest or 'without a digest'}) "
                  f"refers to the capture of {uri} at {page.revisit.refers_to_date}, older "
                  f"than the version the index holds (page {prev.page_id}, fetched "
                  f"{prev.fetched_at}), which replaced it: not that version's payload"))
    return _unchanged_drop(a, version, docs, overlay, prev, "revisit")


def _capture_time(value: str | None) -> float | None:
    """A capture's time (a WARC-Date, a page's fetched_at) in POSIX seconds, UTC when it
    names no zone; None when absent or not ISO 8601 (then nothing is compared)."""
    from datetime import UTC, datetime

    try:
        when = datetime.fromisoformat(value.strip()) if value else None
    except ValueError:
        return None
    if when is None:
        return None
    return (when if when.tzinfo is not None else when.replace(tzinfo=UTC)).timestamp()


def _decide_page(a: Analysis, pid: int, key: int, answer: Answer, docs: BatchDocs,
                 overlay: Overlay, s: Settings, keep_ids: bool, version: int | None, nc: int
                 ) -> Verdict:
    """The checks against other pages (`version`, the URL's kept version, is not one); the
    last `nc` keys are containment's."""
    kept = UNIQUE if version is None else CHANGED
    first = answer.raw
    if first is None or first in overlay.retired:
        first = overlay.raw.get(a.raw_fp)
    if first is not None and first not in overlay.retired:
        return drop_verdict(a, EXACT, first, docs, overlay)
    if a.canonical_fp is None:
        return Verdict(None)  # fingerprinted only, and its stored copy is gone
    if a.text_length > 0:  # pages without visible text are not "the same text"
        first = answer.canonical
        if first is None or first in overlay.retired:
            first = overlay.canonical.get(a.canonical_fp)
        if first is not None and first not in overlay.retired:
            return drop_verdict(a, CANONICAL, first, docs, overlay)
    if a.shingle_count < s.min_shingles:
        return keep_verdict(a, pid, key, kept, keep_ids, docs, version, short=True)
    if a.sketch is None or a.features is None:
        raise ValueError("decide_batch needs a sketched Analysis for a long page")
    keys, postings = a.features.tolist(), answer.postings
    if len(keys) != len(postings):
        raise ValueError(f"{len(postings)} posting lists for {len(keys)} keys")
    if overlay.postings.keys() & keys:
        # The batch's own pages are the newest: they push the oldest out.
        postings = [stored if (mine := overlay.postings.get(key)) is None
                    else (stored + mine)[-s.max_posting:]
                    for key, stored in zip(keys, postings, strict=True)]
    found = near_candidates(postings, s.groups, s.threshold)
    gone = overlay.retired | {version} if version is not None else overlay.retired
    if gone:  # neither the URL's version nor one replaced in this batch is a candidate
        found = [c for c in found if c[0] not in gone]
    resembling = postings[: len(postings) - nc]
    weak = (weak_candidates(resembling, s.groups) if not found and s.verify_single_feature
            else [])
    if gone and weak:
        weak = [c for c in weak if c[0] not in gone]
    v = _resemble(a, pid, key, kept, keep_ids, docs, overlay, s, version, found, weak)
    if nc:  # a keep: is it inside a kept page, or one inside it? a near drop: inside it?
        v = containment(a, v, postings, nc, docs, overlay, s, gone, weak or found)
    return v


def _resemble(a: Analysis, pid: int, key: int, kept: str, keep_ids: bool, docs: BatchDocs,
              overlay: Overlay, s: Settings, version: int | None,
              found: list[tuple[int, int]], weak: list[tuple[int, int]]) -> Verdict:
    """The resemblance tiers: near (>= r features), near-verified (weak candidates)."""
    if weak:  # a drop reports the features shared
        started = perf_counter()
        confirmed, _ = _verify(a, weak, docs, overlay, s, NEAR_VERIFIED,
                               s.near_verified_min_resemblance)
        if confirmed is not None:
            confirmed.verify_s = perf_counter() - started
            return confirmed
        v = keep_verdict(a, pid, key, kept, keep_ids, docs, version)
        v.verify_s = perf_counter() - started
        return v
    if not found:
        return keep_verdict(a, pid, key, kept, keep_ids, docs, version)
    if not sampled(a.canonical_fp, s.verify_rate):
        best, shared = found[0]
        return drop_verdict(a, NEAR, best, docs, overlay, shared=shared)
    started = perf_counter()
    confirmed, (res, ld, j) = _verify(a, found, docs, overlay, s)
    if confirmed is None:
        confirmed = keep_verdict(a, pid, key, VERIFIED_DISTINCT if version is None else CHANGED,
                          keep_ids, docs, version, shared=found[0][1], resemblance=res, ld=ld,
                          jaccard=j)
    confirmed.verify_s = perf_counter() - started
    return confirmed


def sampled(canonical_fp: int | None, rate: float) -> bool:
    """Deterministic per page: the same page is sampled in every replay and after a
    re-delivery, so decisions are reproducible."""
    if canonical_fp is None or rate >= 1.0:
        return rate > 0.0
    return rate > 0.0 and (canonical_fp ^ 0xA5A5) / _U64_SPAN < rate


def _verify(
    a: Analysis, found: list[tuple[int, int]], docs: BatchDocs, overlay: Overlay, s: Settings,
    reason: str = NEAR, min_resemblance: float | None = None,
) -> tuple[Verdict | None, tuple[float, float, float | None]]:
    """The confirmed near-duplicate verdict (or None), and the first candidate's
    (resemblance, estimated LD, exact Jaccard or None) for a NEAR verification (what
    `verified-distinct` reports). Close enough: the exact Jaccard of the shingle sets at
    verify_min_jaccard when both pages have one (verify_exact) and it tells, else the
    sketch's estimate at the tier's bar. A candidate not close enough fails whatever its
    distance, so its LD estimate (the costly part on long pages) is skipped unless it is
    reported."""
    assert a.sketch is not None
    bar = s.verify_min_resemblance if min_resemblance is None else min_resemblance
    first_seen: tuple[float, float, float | None] | None = None
    for handle, shared in found[: s.verify_max_candidates]:
        doc = docs[handle]
        res = resemblance(a.sketch, doc.sketch)
        j = None
        if a.shingles and doc.shingles and s.verify_exact:
            j = jaccard(a.shingles, doc.shingles)
        close = res >= bar if j is None else j >= s.verify_min_jaccard
        if not close and (first_seen is not None or reason != NEAR):
            continue
        limit = s.verify_max_ld_ratio * max(a.text_length, doc.text_length)
        ld = ldsig.estimate(a.ld_signature, doc.ld_signature, s.ld_c, limit)
        ratio = ldsig.ratio(ld, a.text_length, doc.text_length)
        if first_seen is None:
            if ld > limit and reason == NEAR:  # fails; its exact estimate is reported
                ld = ldsig.estimate(a.ld_signature, doc.ld_signature, s.ld_c)
            first_seen = (res, float(ld), j)
        if close and ratio <= s.verify_max_ld_ratio:
            return drop_verdict(a, reason, handle, docs, overlay, shared=shared, resemblance=res,
                         ld=float(ld), jaccard=j, verified=True), (res, float(ld), j)
    return None, first_seen or (0.0, 0.0, None)  # (0, 0) only for NEAR_VERIFIED: not reported

