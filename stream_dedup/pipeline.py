"""The only place the dedup steps are sequenced: Page -> Decision.

    raw fingerprint ──match──> drop "exact"
    canonicalize ─> canonical fingerprint ──match──> drop "canonical"
    (fewer than min_shingles shingles: keep "unique", short=True; exact layers only)
    shingles ─> sketch ─> features ─> index.candidates(>= r shared)
        none ─> keep "unique"
        some ─> sampled? verify best candidates (resemblance + estimated LD)
                   passes ─> drop "near" (verified)      fails ─> keep "verified-distinct"
                not sampled ─> drop "near" (unverified)
    kept pages are inserted into the index; dropped ones are not (no drift by chaining).

`analyze` is pure and stateless (it can run in a worker process); `Deduplicator.decide`
owns the index and must see pages in order. `check` = both, skipping the sketch when an
exact layer already matched. Replay and the Kafka service both go through this module.

Every decided page is reported once to an `Observer` (stage timings, outcome, size): the
default does nothing; `metrics.Metrics` turns it into Prometheus metrics. The public methods
are serialized by one lock, so a read-only `would_decide` (the HTTP `/v1/check`) may run in
another thread while a batch is decided.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter, OrderedDict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Executor, ProcessPoolExecutor
from dataclasses import dataclass, field, replace
from datetime import datetime
from time import perf_counter
from typing import Any, NamedTuple, Protocol

import numpy as np
import xxhash

from .config import Settings
from .core import ldsig
from .core.canonical import canonicalize, kernels
from .core.sketch import Sketcher, resemblance
from .core.tokens import Tokens
from .errors import PageError
from .index import open_index
from .index.base import CANONICAL, RAW, FeatureIndex, Plan, StoredDoc
from .models import (
    CANONICAL as R_CANONICAL,
)
from .models import (
    EXACT,
    NEAR,
    NEAR_VERIFIED,
    UNIQUE,
    VERIFIED_DISTINCT,
    Decision,
    DuplicateOf,
    Page,
    Rejected,
)
from .workers import pool as worker_pool

_U64_SPAN = float(1 << 64)
_NO_FEATURES = np.zeros(0, dtype=np.uint64)  # a short page's (read only, like every array here)
_NO_SKETCH = np.zeros(0, dtype=np.uint32)
log = logging.getLogger("stream_dedup")


@dataclass(slots=True)
class Analysis:
    """What the pure stages compute for one page (picklable: crosses process pools).
    Never changed once made; not declared frozen only because a frozen dataclass costs
    1.3 µs to build instead of 0.23, twice a page."""

    page: Page
    raw_fp: int
    canonical_fp: int | None = None
    text_length: int = 0
    shingle_count: int = 0
    sketch: np.ndarray | None = None
    features: np.ndarray | None = None
    ld_signature: bytes = b""
    error: PageError | None = None
    canonical_s: float = 0.0  # seconds in decode + extract + canonicalize
    sketch_s: float = 0.0  # seconds in shingles + sketch + features + LD signature (0: not run)


class StageTimes(NamedTuple):
    """Seconds one page spent in each stage; 0.0 means the stage did not run."""

    canonical_s: float = 0.0
    sketch_s: float = 0.0
    index_s: float = 0.0
    verify_s: float = 0.0


_NOT_RUN = StageTimes()


class Observer(Protocol):
    """Told about every decision (called in the deciding thread; keep it cheap)."""

    def page(self, decision: Decision, nbytes: int, times: StageTimes) -> None:
        """A page was decided (once per page; `nbytes` is its body size)."""

    def redelivered(self, decision: Decision) -> None:
        """A page delivered again got its earlier decision back."""

    def batch(self, index: FeatureIndex) -> None:
        """A batch is decided (a moment to look at the index)."""


class NullObserver:
    def page(self, decision: Decision, nbytes: int, times: StageTimes) -> None:
        pass

    def redelivered(self, decision: Decision) -> None:
        pass

    def batch(self, index: FeatureIndex) -> None:
        pass


def verify_outcome(d: Decision) -> str | None:
    """What verification did for this decision: confirmed, overturned, unsampled or None."""
    if d.reason == NEAR:
        return "confirmed" if d.verified else "unsampled"
    return "overturned" if d.reason == VERIFIED_DISTINCT else None


def raw_fingerprint(body: bytes) -> int:
    return xxhash.xxh3_64_intdigest(body)


def canonical_fingerprint(tokens: Tokens) -> int:
    """xxh3 of the canonical text's UTF-32 code units (read in place, not copied)."""
    return xxhash.xxh3_64_intdigest(tokens.codepoints.data)


class Analyzer:
    """The pure part: bytes to fingerprints, sketch and features. No index, no I/O."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.sketcher = Sketcher(settings.params)
        if kernels() != "compiled":
            log.warning("pure stages run on %s code (the C extension stream_dedup.core._native "
                        "was not built or not bound): same decisions, several times slower; "
                        "reinstall with a C compiler present", kernels())

    def analyze(self, page: Page) -> Analysis:
        """All pure stages for one page (what a worker process runs)."""
        a, tokens = self.canonical(page)
        return a if tokens is None else self.finish(a, tokens)

    def canonical(self, page: Page, raw_fp: int | None = None) -> tuple[Analysis, Tokens | None]:
        """Fingerprints and canonical tokens; tokens is None when the page is rejected.
        `raw_fp`: the body's raw fingerprint, if the caller has it already."""
        started = perf_counter()
        if raw_fp is None:
            raw_fp = raw_fingerprint(page.body)
        limit = self.settings.max_page_bytes
        if len(page.body) > limit:
            err = PageError("too-large", f"{len(page.body)} bytes > max_page_bytes={limit}")
            return Analysis(page, raw_fp, error=err, canonical_s=perf_counter() - started), None
        try:
            tokens = canonicalize(
                page.body, page.header("content-type"), boilerplate=self.settings.boilerplate
            )
        except PageError as err:
            return Analysis(page, raw_fp, error=err, canonical_s=perf_counter() - started), None
        except Exception as exc:  # a parser bug must reject one page, not stop the stream
            bug = PageError("parse-error", repr(exc))
            return Analysis(page, raw_fp, error=bug, canonical_s=perf_counter() - started), None
        a = Analysis(
            page,
            raw_fp,
            canonical_fingerprint(tokens),
            text_length=int(tokens.codepoints.shape[0]),
            shingle_count=max(0, len(tokens) - self.settings.shingle_words + 1),
            canonical_s=perf_counter() - started,
        )
        return a, tokens

    def finish(self, a: Analysis, tokens: Tokens) -> Analysis:
        """Sketch, features and LD signature (skipped for short pages)."""
        if a.shingle_count < self.settings.min_shingles:
            return a
        started = perf_counter()
        sk, features, sig = self.sketcher.page(tokens.hashes, tokens.codepoints)
        # Built directly: dataclasses.replace costs several µs a page.
        return Analysis(a.page, a.raw_fp, a.canonical_fp, a.text_length, a.shingle_count, sk,
                        features, sig, None, a.canonical_s, perf_counter() - started)


_WORKER: Analyzer | None = None


def _worker_init(settings: Settings) -> None:
    global _WORKER
    _WORKER = Analyzer(settings)


_NO_PAGE = Page(url="", body=b"")


def _worker_analyze(page: Page) -> Analysis:
    """The analysis without its page: the caller still has it, and the body (tens of KB)
    need not be pickled back across the process boundary."""
    assert _WORKER is not None, "analysis_pool() initializes every worker"
    return replace(_WORKER.analyze(page), page=_NO_PAGE)


def analysis_pool(settings: Settings, workers: int) -> ProcessPoolExecutor:
    """Worker processes for the pure stages (parse, shingle, sketch): both cores busy
    while the ordered, stateful decide step stays in the caller. They ignore SIGINT and
    SIGTERM (the caller decides when to stop) and exit when the caller dies (workers.py)."""
    return worker_pool(workers, _worker_init, (settings,))


@dataclass
class Counters:
    """Running totals for summaries and /v1/stats."""

    pages: int = 0
    redelivered: int = 0
    decisions: Counter[tuple[str, str]] = field(default_factory=Counter)
    verify: Counter[str] = field(default_factory=Counter)


class Deduplicator:
    """Decides keep/drop for a stream of pages, remembering the kept ones.

    >>> dd = Deduplicator()
    >>> dd.check_html("http://a/", "<p>hello</p>").decision
    'keep'
    """

    def __init__(
        self, settings: Settings | None = None, index: FeatureIndex | None = None,
        observer: Observer | None = None,
    ) -> None:
        self.settings = settings or Settings()
        self.analyzer = Analyzer(self.settings)
        s = self.settings
        self.index: FeatureIndex = index if index is not None else open_index(
            s.index, s.params.stamp, s.max_posting, s.index_path, s.warm_from)
        self.counters = Counters()
        self.observer: Observer = observer or NullObserver()
        # Serializes everything that reads or changes the index, counters and _recent.
        self.lock = threading.RLock()
        # Decisions by input position: a page delivered again (Kafka re-delivers what was
        # not committed) gets the decision it got the first time, never "duplicate of itself".
        self._recent: OrderedDict[str, Decision] = OrderedDict()

    # --- public API ------------------------------------------------------------------
    def check(self, page: Page) -> Decision:
        """Decide one page (and remember it if kept). Sketches only when it must."""
        with self.lock:
            again = self._seen(page)
            if again is not None:
                return again
            started = perf_counter()
            raw_fp = raw_fingerprint(page.body)
            first = self.index.first_with(RAW, raw_fp)
            if first is not None:
                times = StageTimes(index_s=perf_counter() - started)
                return self._record(self._dup(page, EXACT, first), len(page.body), times)
            a, tokens = self.analyzer.canonical(page, raw_fp)
            if tokens is None:
                return self.decide(a)
            first = self._canonical_match(a)
            if first is not None:
                times = StageTimes(a.canonical_s, index_s=perf_counter() - started - a.canonical_s)
                return self._record(self._dup(page, R_CANONICAL, first), len(page.body), times)
            # Neither exact layer matched (and the lock kept the index as it was).
            return self._decide_and_record(self.analyzer.finish(a, tokens), exact_checked=True)

    def would_decide(self, page: Page) -> Decision:
        """The decision `check` would give `page` now, without inserting, counting or
        remembering it (a kept page gets no page_id). Safe to call from another thread."""
        a = self.analyzer.analyze(page)  # pure: outside the lock
        with self.lock:
            earlier = self._recent.get(page.source) if page.source is not None else None
            if earlier is not None:
                return earlier
            if a.error is not None:
                return Decision(page.url, "reject", a.error.kind, error=a.error.message,
                                source=page.source)
            return self._decide(a, insert=False)[0]

    def check_html(self, url: str, html: str | bytes, content_type: str | None = None) -> Decision:
        body = html.encode("utf-8") if isinstance(html, str) else html
        if content_type is None and isinstance(html, str):
            content_type = "text/html; charset=utf-8"
        headers = (("Content-Type", content_type),) if content_type else ()
        return self.check(Page(url=url, body=body, headers=headers))

    def check_many(self, items: Iterable[Page | Rejected]) -> Iterator[Decision]:
        """Decisions for a stream of pages (and records already rejected by a reader)."""
        for item in items:
            yield self.reject(item) if isinstance(item, Rejected) else self.check(item)

    def check_batch(
        self, items: Sequence[Page | Rejected], pool: Executor | None = None
    ) -> list[Decision]:
        """Decisions for a batch, in order; the pure stages may run in `pool` (see
        `analysis_pool`). Gives exactly the decisions `check` would give one by one."""
        # Analyse each distinct body once: a later byte-identical copy in the same batch
        # goes through check(), which finds the first copy in the index (or, if that was
        # dropped, analyses it then), exactly as one-by-one checking would.
        todo: list[Page] = []
        seen: set[int] = set()
        with self.lock:
            for item in items:
                if not isinstance(item, Page):
                    continue
                raw_fp = raw_fingerprint(item.body)
                if raw_fp in seen or (item.source is not None and item.source in self._recent):
                    continue
                seen.add(raw_fp)
                if not self._stored(raw_fp):
                    todo.append(item)
        if pool is None or len(todo) < 2:
            analyses = [self.analyzer.analyze(p) for p in todo]
        else:
            stripped = pool.map(_worker_analyze, todo, chunksize=max(1, len(todo) // 16))
            analyses = [replace(a, page=p) for p, a in zip(todo, stripped, strict=True)]
        by_identity = {id(p): a for p, a in zip(todo, analyses, strict=True)}
        out = []
        for item in items:
            if isinstance(item, Rejected):
                out.append(self.reject(item))
            elif id(item) in by_identity:
                out.append(self.decide(by_identity[id(item)]))
            else:
                out.append(self.check(item))  # an exact copy of a page already stored
        with self.lock:
            self.observer.batch(self.index)
        return out

    def commit(self, offsets: Mapping[str, int] | None = None) -> None:
        """Make the pages kept so far durable, atomically with the input offsets they
        cover (a no-op for the memory index beyond remembering the offsets)."""
        with self.lock:
            self.index.commit(offsets)

    def begin(self, plan: Plan) -> None:
        """Record the batch about to be decided (see FeatureIndex.begin)."""
        with self.lock:
            self.index.begin(plan)

    def expire(self, older_than: datetime, limit: int = 10_000) -> int:
        """Forget pages crawled before `older_than` (persistent index only; 0 otherwise)."""
        expire = getattr(self.index, "expire", None)
        if expire is None:
            return 0
        with self.lock:
            return int(expire(older_than, limit))

    def close(self) -> None:
        with self.lock:
            self.index.close()

    def reject(self, item: Rejected) -> Decision:
        return self._reject(item, len(item.raw or b""), _NOT_RUN)

    def snapshot(self) -> dict[str, Any]:
        """The running totals, copied consistently (for /v1/stats)."""
        with self.lock:
            return {
                "pages": self.counters.pages,
                "redelivered": self.counters.redelivered,
                "decisions": {f"{d}/{r}": n for (d, r), n in sorted(
                    self.counters.decisions.items())},
                "verification": dict(self.counters.verify),
                "index_pages": len(self.index),
            }

    # --- the ordered, stateful part ---------------------------------------------------
    def decide(self, a: Analysis) -> Decision:
        page = a.page
        if a.error is not None:
            rejected = Rejected(page.url, a.error.kind, a.error.message, page.source)
            return self._reject(rejected, len(page.body), StageTimes(canonical_s=a.canonical_s))
        return self._decide_and_record(a)

    def _decide_and_record(self, a: Analysis, *, exact_checked: bool = False) -> Decision:
        with self.lock:
            started = perf_counter()
            d, verify_s = self._decide(a, insert=True, exact_checked=exact_checked)
            index_s = perf_counter() - started - verify_s
            times = StageTimes(a.canonical_s, a.sketch_s, index_s, verify_s)
            return self._record(d, len(a.page.body), times)

    def _decide(
        self, a: Analysis, *, insert: bool, exact_checked: bool = False
    ) -> tuple[Decision, float]:
        """The decision for an analysed page, and the seconds verification took. Changes
        nothing but the index (a kept page is inserted when `insert`). `exact_checked`:
        the caller, holding the lock, has just found neither exact layer to match."""
        page, s = a.page, self.settings
        if not exact_checked:
            first = self.index.first_with(RAW, a.raw_fp)
            if first is not None:
                return self._dup(page, EXACT, first), 0.0
            first = self._canonical_match(a)
            if first is not None:
                return self._dup(page, R_CANONICAL, first), 0.0
        if a.shingle_count < s.min_shingles:
            return self._keep(a, UNIQUE, insert, short=True), 0.0
        if a.sketch is None:  # analysis stopped early (e.g. check() after a cheap pass)
            raise ValueError("decide() needs a sketched Analysis for a long page")
        assert a.features is not None
        found = self.index.candidates(a.features, 1 if s.verify_single_feature else s.threshold)
        weak = [c for c in found if c[1] < s.threshold]
        found = [c for c in found if c[1] >= s.threshold]
        if not found and weak:
            started = perf_counter()
            confirmed, _ = self._verify(a, weak, NEAR_VERIFIED, s.near_verified_min_resemblance)
            if confirmed is not None:
                return confirmed, perf_counter() - started
            return self._keep(a, UNIQUE, insert), perf_counter() - started
        if not found:
            return self._keep(a, UNIQUE, insert), 0.0
        if not self._sampled(a.canonical_fp):
            best, shared = found[0]
            return self._dup(page, NEAR, best, shared=shared), 0.0
        started = perf_counter()
        confirmed, (res, ld) = self._verify(a, found)
        verify_s = perf_counter() - started
        if confirmed is not None:
            return confirmed, verify_s
        kept = self._keep(a, VERIFIED_DISTINCT, insert, shared=found[0][1], resemblance=res, ld=ld)
        return kept, verify_s

    # --- helpers ----------------------------------------------------------------------
    def _reject(self, item: Rejected, nbytes: int, times: StageTimes) -> Decision:
        d = Decision(item.url, "reject", item.kind, error=item.message, source=item.source)
        with self.lock:
            return self._record(d, nbytes, times)

    def _seen(self, page: Page) -> Decision | None:
        if page.source is None:
            return None
        earlier = self._recent.get(page.source)
        if earlier is not None:
            self.counters.redelivered += 1
            self.observer.redelivered(earlier)
        return earlier

    def _stored(self, raw_fp: int) -> bool:
        return self.index.first_with(RAW, raw_fp) is not None

    def _canonical_match(self, a: Analysis) -> int | None:
        # Pages without visible text are not "the same text" as each other.
        if a.text_length == 0 or a.canonical_fp is None:
            return None
        return self.index.first_with(CANONICAL, a.canonical_fp)

    def _sampled(self, canonical_fp: int | None) -> bool:
        # Deterministic per page: the same page is sampled in every replay and after a
        # re-delivery, so decisions are reproducible.
        rate = self.settings.verify_rate
        if canonical_fp is None or rate >= 1.0:
            return rate > 0.0
        return rate > 0.0 and (canonical_fp ^ 0xA5A5) / _U64_SPAN < rate

    def _verify(
        self, a: Analysis, found: list[tuple[int, int]], reason: str = NEAR,
        min_resemblance: float | None = None,
    ) -> tuple[Decision | None, tuple[float, float]]:
        """The confirmed near-duplicate decision (or None), and the first candidate's
        (resemblance, estimated LD) for a NEAR verification (what `verified-distinct`
        reports). A candidate below the resemblance bar fails whatever its distance, so its
        LD estimate (the costly part on long pages) is skipped unless it is reported."""
        s = self.settings
        assert a.sketch is not None
        bar = s.verify_min_resemblance if min_resemblance is None else min_resemblance
        first_seen: tuple[float, float] | None = None
        for page_id, shared in found[: s.verify_max_candidates]:
            doc = self.index.doc(page_id)
            res = resemblance(a.sketch, doc.sketch)
            if res < bar and (first_seen is not None or reason != NEAR):
                continue
            limit = s.verify_max_ld_ratio * max(a.text_length, doc.text_length)
            ld = ldsig.estimate(a.ld_signature, doc.ld_signature, s.ld_c, limit)
            ratio = ldsig.ratio(ld, a.text_length, doc.text_length)
            if first_seen is None:
                if ld > limit and reason == NEAR:  # fails; its exact estimate is reported
                    ld = ldsig.estimate(a.ld_signature, doc.ld_signature, s.ld_c)
                first_seen = (res, float(ld))
            if res >= bar and ratio <= s.verify_max_ld_ratio:
                return Decision(
                    a.page.url, "drop", reason, duplicate_of=DuplicateOf(page_id, doc.url),
                    shared_features=shared, resemblance=res, ld_estimate=float(ld),
                    verified=True, source=a.page.source,
                ), (res, float(ld))
        return None, first_seen or (0.0, 0.0)  # (0, 0) only for NEAR_VERIFIED: not reported

    def _keep(
        self, a: Analysis, reason: str, insert: bool, *, short: bool = False, shared: int = 0,
        resemblance: float | None = None, ld: float | None = None,
    ) -> Decision:
        assert a.canonical_fp is not None
        if not insert:
            return Decision(
                a.page.url, "keep", reason, shared_features=shared, resemblance=resemblance,
                ld_estimate=ld, short=short, source=a.page.source,
            )
        page_id = self.index.insert(StoredDoc(
            a.page.url,
            a.features if a.features is not None else _NO_FEATURES,
            a.sketch if a.sketch is not None else _NO_SKETCH,
            a.ld_signature, a.text_length, a.raw_fp, a.canonical_fp, a.page.fetched_at,
        ))
        return Decision(
            a.page.url, "keep", reason, page_id=page_id, shared_features=shared,
            resemblance=resemblance, ld_estimate=ld, short=short, source=a.page.source,
        )

    def _dup(self, page: Page, reason: str, first: int, shared: int = 0) -> Decision:
        return Decision(
            page.url, "drop", reason, duplicate_of=DuplicateOf(first, self.index.doc(first).url),
            shared_features=shared, source=page.source,
        )

    def _record(self, d: Decision, nbytes: int, times: StageTimes) -> Decision:
        self.counters.pages += 1
        self.counters.decisions[(d.decision, d.reason)] += 1
        outcome = verify_outcome(d)
        if outcome is not None:
            self.counters.verify[outcome] += 1
        self.observer.page(d, nbytes, times)
        limit = self.settings.recent_decisions
        if d.source is not None and limit > 0:
            self._recent[d.source] = d
            if len(self._recent) > limit:
                self._recent.popitem(last=False)
        return d
