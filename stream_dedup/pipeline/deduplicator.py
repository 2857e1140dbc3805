"""The only place the dedup steps are sequenced: Page -> Decision.

    Analyzer (pipeline/analysis.py; pure, may share a batch with an AnalysisPool's processes): raw
        fingerprint; canonical text and its fingerprint; shingles -> sketch -> features ->
        LD signature
    Deduplicator (ordered, owns the index): per batch, index.lookup -> decide/step.py's pure
        decide step -> index.claim; the keep/drop rules are drawn in decide/step.py

Replay and the Kafka service both go through this module (runner/loop.py).

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
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from stream_dedup.config import Settings
from stream_dedup.core.urls import UrlKeys
from stream_dedup.decide.step import decide_batch
from stream_dedup.decide.verdicts import Analysis
from stream_dedup.errors import IndexUnavailable
from stream_dedup.index import index_for
from stream_dedup.index.base import Change, FeatureIndex, Plan
from stream_dedup.index.namespaces import Forget, salt
from stream_dedup.models import Decision, Page, Rejected
from stream_dedup.pipeline.analysis import (
    AnalysisPool,
    Analyzer,
    canonical_fingerprint,
    raw_fingerprint,
)
from stream_dedup.pipeline.memo import Memo, analyse_batch
from stream_dedup.pipeline.observe import (
    NOT_RUN,
    NullObserver,
    Observer,
    StageTimes,
    verify_outcome,
)
from stream_dedup.pipeline.rounds import ask, decide_in_rounds, page_probe

log = logging.getLogger("stream_dedup")
__all__ = ["AnalysisPool", "Analyzer", "Deduplicator", "NullObserver", "Observer",
           "StageTimes", "canonical_fingerprint", "raw_fingerprint", "verify_outcome"]
# The analyses a Deduplicator remembers (a quarter of a replay process's: this one lives as
# long as the service, next to its index): ~3 KB each and their shingle sets.
MEMO_PAGES, MEMO_BYTES = 1024, 16 << 20


def _with_carried(items: Sequence[Page | Rejected], out: list[Decision | None]
                  ) -> list[Decision]:
    """The decisions, each with its item's carried fields (--carry-fields). Added here, at
    the end, so that a decision remembered for a re-delivery or answered by a shared index
    gets the fields of the record it answers now."""
    decided = [d for d in out if d is not None]
    for i, item in enumerate(items):
        if item.carried:
            decided[i] = replace(decided[i], carried=item.carried)
    return decided


@dataclass
class Counters:
    """Running totals for summaries and /v1/stats."""

    pages: int = 0
    redelivered: int = 0
    decisions: Counter[tuple[str, str]] = field(default_factory=Counter)
    verify: Counter[str] = field(default_factory=Counter)


class Deduplicator:
    """Decides keep/drop for a stream of pages, remembering the kept ones.

    A batch: rejects and re-deliveries are answered at once; every other page gets its id
    (its input position, or a local number), is analysed (exact copies of stored pages
    only fingerprinted), then the index is asked once (`lookup`), the pure decide step
    (decide/step.py) decides the batch, and the index is told the outcome (`claim`); a claim a
    concurrent instance won (shared index only) sends that page round again.

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
        self.observer: Observer = observer or NullObserver()
        self.index: FeatureIndex = index if index is not None else index_for(
            s, getattr(self.observer, "redis_call", None))
        self.counters = Counters()
        self.urls = UrlKeys(s.url_ignore_params)
        # Serializes everything that reads or changes the index, counters, _recent, _memo.
        self.lock = threading.RLock()
        # Decisions by (input position, raw fingerprint): a page delivered again (Kafka
        # re-delivers what was not committed) gets the decision it got the first time, never
        # "duplicate of itself". The fingerprint is part of the key because a position is
        # only a name: another page under the same `source` must be decided, not answered.
        self._recent: OrderedDict[tuple[str, int], Decision] = OrderedDict()
        # Ids of the pages of a batch that failed (IndexUnavailable), by object: kept alive
        # here, so an id() cannot be reused by another page meanwhile.
        self._retry_ids: dict[int, tuple[Page, int]] = {}
        # The kept pages of the batches since take_journal, for a changelog (exactly-once
        # with a local index); None: not kept.
        self.journal: list[Change] | None = None
        # Analyses of recent bodies: a copy of a page that was not stored (a near-duplicate,
        # dropped) is decided again, but not analysed again. On a WARC of 11 copies of the
        # corpus's pages, 420 of 870 analyses were such copies (0.53 s of a 4.6 s replay).
        self._memo = Memo(count=MEMO_PAGES, nbytes=MEMO_BYTES)

    # --- public API ------------------------------------------------------------------
    def check(self, page: Page) -> Decision:
        """Decide one page (and remember it if kept)."""
        return self.check_batch([page])[0]

    def would_decide(self, page: Page) -> Decision:
        """The decision `check` would give `page` now, without storing, counting or
        remembering it (a kept page gets no page_id). Safe to call from another thread."""
        a = self.analyzer.analyze(page)  # pure: outside the lock
        with self.lock:
            earlier = self._earlier(page, a.raw_fp)
            if earlier is not None:
                return earlier
            if a.error is not None:
                return Decision(page.url, "reject", a.error.kind, error=a.error.message,
                                source=page.source)
            key = self.url_key(page)
            ns = self.namespace_of(page)
            answers = ask(self, [a], [page_probe(a, 0, key, ns)], [ns], register=False)
            verdict = decide_batch([a], [0], answers, self.settings, keep_ids=False,
                                   url_keys=[key])[0]
            assert verdict.decision is not None, "a fully analysed page is always decided"
            return verdict.decision.in_namespace(self.namespace_of(page))

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
        self, items: Sequence[Page | Rejected], pool: AnalysisPool | None = None, *,
        redeliveries: bool = True, analysed: Sequence[Analysis | None] | None = None,
    ) -> list[Decision]:
        """Decisions for a batch, in order; the pure stages may run in `pool`, an
        AnalysisPool built with this Deduplicator's Settings (anything else is refused: a
        TypeError, or a ValueError for other Settings). Gives exactly the decisions `check`
        would give one by one.

        `redeliveries`: the items may be records delivered before (Kafka), so a page whose
        `source` and body were decided already gets that decision again. False for a source
        that never delivers a record twice (files): there a page seen before is a duplicate
        (or, read in a second replay, a page of the index), and nothing is remembered.

        `analysed[i]`, if given and not None: the analysis of `items[i]` (`Analyzer.analyze`
        of it, made where the page was read: a worker process), which is then not analysed
        again; the page may come without its body (`Analysis.body_bytes`)."""
        if pool is not None:
            self._check_pool(pool)
        out: list[Decision | None] = [None] * len(items)
        times: list[StageTimes] = [NOT_RUN] * len(items)
        fresh = [True] * len(items)  # False: delivered again, answered as before
        pages: list[tuple[int, Page]] = []
        fps: list[int] = []
        ready: list[Analysis | None] = []  # the given analysis of each of `pages`
        with self.lock:
            for i, item in enumerate(items):
                if isinstance(item, Rejected):
                    out[i] = Decision(item.url, "reject", item.kind, error=item.message,
                                      source=item.source)
                    continue
                given = analysed[i] if analysed is not None else None
                fp = raw_fingerprint(item.body) if given is None else given.raw_fp
                out[i] = self._seen(item, fp) if redeliveries else None
                fresh[i] = out[i] is None
                if fresh[i]:
                    pages.append((i, item))
                    fps.append(fp)
                    ready.append(given)
            ids = self._ids([p for _, p in pages])
            # An exact copy of a stored page needs no analysis: its raw fingerprint decides.
            stored = self.index.stored([fp ^ salt(self.namespace_of(p))
                                        for fp, (_, p) in zip(fps, pages, strict=True)])
        analyses = analyse_batch(self.analyzer, self._memo, self.lock,
                                 [p for _, p in pages], fps, stored, pool, ready)
        with self.lock:
            try:
                decide_in_rounds(self, pages, ids, analyses, out, times, fresh, ready)
            except IndexUnavailable:
                # The same pages will come again (the runner retries the batch): they keep
                # their ids, or a shared index would see them as other pages than the ones
                # it already holds, pending or kept.
                self._retry_ids = {id(p): (p, pid) for (_, p), pid in zip(pages, ids,
                                                                        strict=True)}
                self._release(ids)
                raise
            except BaseException:
                self._release(ids)
                raise
            self._retry_ids = {}
            remember = dict(zip((i for i, _ in pages), fps, strict=True)) if redeliveries else {}
            for i, (item, d, t, new) in enumerate(zip(items, out, times, fresh, strict=True)):
                assert d is not None
                d = out[i] = d.in_namespace(self.namespace_of(item) if isinstance(item, Page)
                                            else self.settings.namespace)
                if new:
                    given = analysed[i] if analysed is not None else None
                    nbytes = (len(item.raw or b"") if isinstance(item, Rejected)
                              else len(item.body) if given is None or given.body_bytes is None
                              else given.body_bytes)
                    self._record(d, nbytes, t, remember.get(i))
            self.observer.batch(self.index)
        return _with_carried(items, out)

    def _ids(self, pages: list[Page]) -> list[int]:
        """Each page's id: its input position, the id it had when its batch last failed,
        or a new local one."""
        again = [self._retry_ids.get(id(p), (None, None)) for p in pages]
        fresh = iter(self.index.local_ids(sum(
            p.position is None and same is not p for p, (same, _) in zip(pages, again,
                                                                        strict=True))))
        return [p.position if p.position is not None else pid if same is p else next(fresh)
                for p, (same, pid) in zip(pages, again, strict=True)]

    def _release(self, ids: list[int]) -> None:
        """The pages of a batch given up: a shared index stops holding them for this
        instance, so that no other instance waits for them meanwhile."""
        release = getattr(self.index, "release", None)
        if release is not None and ids:
            release(ids)

    def interrupt(self) -> None:
        """A stop: a batch waiting on another instance gives up (IndexUnavailable) rather
        than wait on; safe to call from any thread."""
        interrupt = getattr(self.index, "interrupt", None)
        if interrupt is not None:
            interrupt()

    def _check_pool(self, pool: object) -> None:
        if not isinstance(pool, AnalysisPool):
            raise TypeError(f"check_batch(items, pool): pool must be an AnalysisPool (or "
                            f"None), not {type(pool).__name__}; build one with "
                            f"AnalysisPool(settings, workers)")
        if pool.settings != self.settings:
            differ = sorted(f for f in self.settings.names()
                            if getattr(pool.settings, f) != getattr(self.settings, f))
            raise ValueError(f"this AnalysisPool was built with other Settings than this "
                             f"Deduplicator ({', '.join(differ) or 'params'} differ): its "
                             f"analyses would decide differently")

    def take_journal(self) -> list[Change]:
        """The kept pages since the last call (kafka/changelog.py writes them), when journaling."""
        with self.lock:
            if self.journal is None:
                return []
            taken, self.journal = self.journal, []
            return taken

    def namespace_of(self, page: Page) -> str:
        """The page's namespace: its own (--namespace-field), else the process's."""
        return page.namespace or self.settings.namespace

    def forget(self, what: Forget) -> list[int]:
        """Forget the held pages `what` selects (every backend; FeatureIndex.forget); their
        page ids. Journaling (exactly-once), each is written to the changelog with the next
        batch, so that a restored index forgets it too."""
        if what.url is not None and not what.url_key:
            what = replace(what, url_key=self.urls.key(what.url))
        with self.lock:
            gone = self.index.forget(what)
            if self.journal is not None:
                self.journal += [Change(None, page_id) for page_id in gone]
            return gone

    def url_key(self, page: Page) -> int:
        """The key of the page's URL (for a revisit record, of the URL it refers to)."""
        url = page.url
        if page.revisit is not None and page.revisit.refers_to_uri:
            url = page.revisit.refers_to_uri
        return self.urls.key(url)

    def commit(self, offsets: Mapping[str, int] | None = None) -> None:
        """Make the pages kept so far durable, atomically with the input offsets they
        cover (a no-op for the memory index beyond remembering the offsets)."""
        with self.lock:
            self.index.commit(offsets)

    def begin(self, plan: Plan) -> None:
        """Record the batch about to be decided (see FeatureIndex.begin)."""
        with self.lock:
            self.index.begin(plan)

    def expire(self, older_than: datetime) -> int:
        """Forget the pages of every namespace crawled (or kept) before `older_than`
        (retention_days); a Redis index's keys expire by themselves. The pages forgotten."""
        if getattr(self.index, "expires_itself", False):
            return 0
        return len(self.forget(Forget(None, before=older_than.timestamp())))

    def close(self) -> None:
        with self.lock:
            self.index.close()

    def reopen(self) -> None:
        """Close the index and open it again as it was last committed (a memory index:
        empty), forgetting every decision remembered since: after a transaction that was
        not committed, what was decided in it never happened."""
        with self.lock:
            self.index.close()
            self.index = index_for(self.settings, getattr(self.observer, "redis_call", None))
            self._recent.clear()
            self._retry_ids = {}
            if self.journal is not None:
                self.journal = []

    def reject(self, item: Rejected) -> Decision:
        return self._reject(item, len(item.raw or b""), NOT_RUN)

    def snapshot(self) -> dict[str, Any]:
        """The running totals, copied consistently (for /v1/stats); `index_pages` None
        while a shared index cannot answer."""
        with self.lock:
            try:
                held: int | None = len(self.index)
            except IndexUnavailable:
                held = None
            return {
                "pages": self.counters.pages,
                "redelivered": self.counters.redelivered,
                "decisions": {f"{d}/{r}": n for (d, r), n in sorted(
                    self.counters.decisions.items())},
                "verification": dict(self.counters.verify),
                "index_pages": held,
            }

    # --- helpers ----------------------------------------------------------------------
    def _reject(self, item: Rejected, nbytes: int, times: StageTimes) -> Decision:
        d = Decision(item.url, "reject", item.kind, error=item.message, source=item.source,
                     carried=item.carried, namespace=self.settings.namespace)
        with self.lock:
            return self._record(d, nbytes, times)

    def _earlier(self, page: Page, raw_fp: int) -> Decision | None:
        """The decision this very page (same source, same body) got before, if remembered."""
        return None if page.source is None else self._recent.get((page.source, raw_fp))

    def _seen(self, page: Page, raw_fp: int) -> Decision | None:
        earlier = self._earlier(page, raw_fp)
        if earlier is not None:
            self.counters.redelivered += 1
            self.observer.redelivered(earlier)
        return earlier

    def _record(self, d: Decision, nbytes: int, times: StageTimes,
                raw_fp: int | None = None) -> Decision:
        """Count a decision; with `raw_fp` (a page whose source may deliver it again), also
        remember it for its redelivery."""
        self.counters.pages += 1
        self.counters.decisions[(d.decision, d.reason)] += 1
        outcome = verify_outcome(d)
        if outcome is not None:
            self.counters.verify[outcome] += 1
        self.observer.page(d, nbytes, times)
        limit = self.settings.recent_decisions
        if d.source is not None and raw_fp is not None and limit > 0:
            self._recent[(d.source, raw_fp)] = d
            if len(self._recent) > limit:
                self._recent.popitem(last=False)
        return d
