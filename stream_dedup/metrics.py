"""Every Prometheus metric of stream-dedup, in one module (docs/operating.md lists them).

    pipeline.Deduplicator ──Observer──> Metrics.page()       per decided page: outcome, bytes,
                                        Metrics.batch()      stage timings; index size per batch
    runner.Runner ────────────────────> Metrics.decided()    page -> decision latency,
                                        progress, index errors
    kafka_edges (serve) ──────────────> lag, commit latency, Kafka errors, dead letters

Each `Metrics` owns a `CollectorRegistry` (with the process, GC and platform collectors), so
a process may hold several (tests do) without "Duplicated timeseries" errors, and `/metrics`
of one service shows only its own series. Updates are a few lock-protected float additions
per page (label children are looked up once and cached), next to 1-3 ms of work per page.

Labels stay bounded: decision/reason/kind come from fixed sets in the code, partitions from
the consumer's assignment; never a URL or a host. Namespaces come from the input
(--namespace-field), so only one metric has them as a label, and only the first
NAMESPACE_LABELS of them; the rest are counted together (`_other`).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Info,
    disable_created_metrics,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.gc_collector import GCCollector
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector

from stream_dedup.config import Settings
from stream_dedup.errors import IndexUnavailable
from stream_dedup.index.base import FeatureIndex
from stream_dedup.models import CANONICAL as R_CANONICAL
from stream_dedup.models import (
    CHANGED,
    CONTAINED,
    EXACT,
    NEAR,
    NEAR_VERIFIED,
    UNCHANGED,
    UNIQUE,
    VERIFIED_DISTINCT,
    Decision,
    Page,
    Rejected,
)
from stream_dedup.pipeline.observe import StageTimes, verify_outcome
from stream_dedup.version import __version__

if TYPE_CHECKING:
    from stream_dedup.pipeline.deduplicator import Deduplicator

STAGES = ("canonicalize", "sketch", "index", "verify")
OUTCOMES = ("confirmed", "overturned", "unsampled")
KAFKA_OPERATIONS = ("connect", "metadata", "fetch", "produce", "commit")
OUTPUTS = ("decision", "kept", "dead-letter")
INDEX_OPERATIONS = ("decide", "commit", "expire")
# Kinds of records skipped (not pages): WARC 1.1's record types that are never pages, a
# revisit of another profile, a non-HTML response or resource; any type a producer makes up
# is counted as "other", so the labels stay bounded
SKIPPED_KINDS = ("request", "metadata", "warcinfo", "revisit", "conversion", "continuation",
                 "non-html")
# Seconds. Stages take tens of microseconds (index) to tens of milliseconds (large pages).
STAGE_BUCKETS = (0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                 0.1, 0.25, 1.0)
# From consumption: well under a second; from the crawler's fetch: minutes to hours.
LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
                   900.0, 3600.0, 4 * 3600.0, 86400.0)
# A shared index's round trip: a pipelined batch of commands, tenths of a ms to tens of ms.
REDIS_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0)
REDIS_OPERATIONS = ("register", "join", "read", "peek", "sweep", "docs", "claim", "renew",
                    "release", "count", "stats", "ping")
COMMIT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
                  30.0)
# Index statistics can cost O(pages) (the memory index sums its documents): refresh them at
# most every MIN_S seconds and never spend more than 1/STATS_BUDGET of the time on them.
INDEX_STATS_MIN_S = 1.0
INDEX_STATS_BUDGET = 100.0
# stream_dedup_namespace_decisions_total names this many namespaces (the first decided);
# "_default" and "_other" can be no namespace's name (one starts with a letter or digit)
NAMESPACE_LABELS = 50
DEFAULT_LABEL, OTHER_LABEL = "_default", "_other"

# The `*_created` series (one more per counter child) only help systems that cannot detect
# counter resets; Prometheus can. Process-wide switch of prometheus_client.
disable_created_metrics()  # type: ignore[no-untyped-call]


class Metrics:
    """All metrics of one service or replay; also the pipeline's `Observer`."""

    def __init__(self, settings: Settings | None = None, *, process: bool = True) -> None:
        settings = settings or Settings()
        r = self.registry = CollectorRegistry()
        if process:
            ProcessCollector(registry=r)
            GCCollector(registry=r)
            PlatformCollector(registry=r)
        # --- decisions -----------------------------------------------------------------
        self.pages = Counter("stream_dedup_pages", "Pages decided, by decision and reason "
                             "(reason of a reject: its error kind)", ["decision", "reason"],
                             registry=r)
        self.bytes = Counter("stream_dedup_bytes", "Body bytes of the pages decided",
                             ["decision"], registry=r)
        self.rejects = Counter("stream_dedup_rejects", "Inputs rejected, by error kind",
                               ["kind"], registry=r)
        self.namespace_decisions = Counter(
            "stream_dedup_namespace_decisions", f"Pages decided, by namespace and decision: "
            f"the first {NAMESPACE_LABELS} namespaces decided by name, every later one as "
            f"{OTHER_LABEL}, the default namespace as {DEFAULT_LABEL}",
            ["namespace", "decision"], registry=r)
        self.skipped = Counter("stream_dedup_skipped_records", "Input records that are not "
                               "pages, skipped without a decision and committed (--input-format "
                               "warc: request, metadata, warcinfo... records; non-html "
                               "responses; revisit records of other profiles), by type",
                               ["type"], registry=r)
        self.redelivered_pages = Counter("stream_dedup_redelivered", "Pages delivered again that "
                                   "got their earlier decision back", registry=r)
        self.stage = Histogram("stream_dedup_stage_seconds", "Seconds a page spent in a stage "
                               "(only pages that ran the stage)", ["stage"],
                               buckets=STAGE_BUCKETS, registry=r)
        self.latency = Histogram("stream_dedup_decision_latency_seconds", "Seconds from the "
                                 "page's fetch (since=fetch, when it carries fetched_at) or from "
                                 "its consumption (since=consume) to its decision being "
                                 "delivered", ["since"], buckets=LATENCY_BUCKETS, registry=r)
        # --- index -----------------------------------------------------------------------
        self.index_pages = Gauge("stream_dedup_index_pages", "Pages held by the index",
                                 registry=r)
        self.index_features = Gauge("stream_dedup_index_features", "(feature, page) entries "
                                    "held by the index", registry=r)
        self.index_bytes_per_page = Gauge("stream_dedup_index_bytes_per_page", "Feature index "
                                          "bytes per page held", registry=r)
        self.index_record_file = Gauge("stream_dedup_index_record_file_bytes", "Memory index: "
                                       "bytes of its record file (what only verification "
                                       "reads, on disk; --memory-records disk)", registry=r)
        # --- verification ----------------------------------------------------------------
        self.verify = Counter("stream_dedup_verify", "Near-duplicate candidates by what "
                              "verification did: confirmed (dropped), overturned (kept as "
                              "verified-distinct), unsampled (dropped unverified)", ["outcome"],
                              registry=r)
        self.precision = Gauge("stream_dedup_near_precision_estimate", "confirmed / (confirmed "
                               "+ overturned) since start: estimated share of the filter's "
                               "near-duplicate candidates that are real (NaN before the first "
                               "verified candidate)", registry=r)
        self.precision.set_function(self._precision)
        Gauge("stream_dedup_verify_rate", "Share of candidates verified (setting)",
              registry=r).set(settings.verify_rate)
        # --- Kafka -----------------------------------------------------------------------
        self.lag = Gauge("stream_dedup_kafka_consumer_lag", "Records in the partition not yet "
                         "processed (highwater - position), per assigned partition",
                         ["topic", "partition"], registry=r)
        self.redis_seconds = Histogram("stream_dedup_redis_seconds", "Seconds a round trip to "
                                       "the shared Redis index took, by operation (a pipelined "
                                       "batch of commands)", ["operation"],
                                       buckets=REDIS_BUCKETS, registry=r)
        self.redis_errors = Counter("stream_dedup_redis_errors", "Failed round trips to the "
                                    "shared Redis index, by operation (the batch is decided "
                                    "again)", ["operation"], registry=r)
        self.redis_waits = Counter("stream_dedup_redis_waits", "Pages asked again in a later "
                                   "round because an older page they collide with was pending "
                                   "on another instance (shared index)", registry=r)
        self.redis_lost = Counter("stream_dedup_redis_lost_claims", "Claims another instance "
                                  "made first: the page was decided again (shared index)",
                                  registry=r)
        self._protocol: tuple[int, int] = (0, 0)  # the index's waits and lost claims so far
        for op in REDIS_OPERATIONS:  # zero without a Redis index: dashboards stay whole
            self.redis_seconds.labels(op)
            self.redis_errors.labels(op)
        self.batch_step = Histogram("stream_dedup_batch_step_seconds", "Seconds a batch "
                                    "spent in each step of the runner: decide (records to "
                                    "decisions), deliver (outputs sent and acknowledged; "
                                    "--exactly-once: the transaction), index-commit, "
                                    "source-commit (the input offsets)", ["step"],
                                    buckets=COMMIT_BUCKETS, registry=r)
        self.commit_seconds = Histogram("stream_dedup_kafka_commit_seconds", "Seconds to commit "
                                        "a batch's offsets (retries included)",
                                        buckets=COMMIT_BUCKETS, registry=r)
        self.kafka_errors = Counter("stream_dedup_kafka_errors", "Failed Kafka operations "
                                    "(each is retried with backoff)", ["operation"], registry=r)
        self.dead_letters = Counter("stream_dedup_kafka_dead_letters", "Records sent to the "
                                    "dead-letter topic (acknowledged)", registry=r)
        self.reduced = Counter("stream_dedup_kafka_reduced_outputs", "Outputs larger than "
                               "their topic accepts, sent reduced (a decision without the "
                               "long fields, a reference instead of the kept page, a "
                               "truncated dead letter)", ["output"], registry=r)
        self.index_errors = Counter("stream_dedup_index_errors", "Index steps that failed "
                                    "because the index could not answer (a shared index's "
                                    "node down...); each is tried again with backoff",
                                    ["operation"], registry=r)
        self.transactions = Counter("stream_dedup_kafka_transactions", "Kafka transactions "
                                    "(--exactly-once), by outcome: committed, aborted (the "
                                    "batch comes again, the index is reopened)", ["outcome"],
                                    registry=r)
        for outcome in ("committed", "aborted"):
            self.transactions.labels(outcome)
        self.restored = Counter("stream_dedup_index_restored_pages", "Kept pages replayed "
                                "from the changelog topic into the index (--exactly-once)",
                                registry=r)
        self.log_dropped = Counter("stream_dedup_log_lines_dropped", "Repeated Kafka client "
                                   "log lines dropped by the rate limit", registry=r)
        # --- HTTP API --------------------------------------------------------------------
        self.http_bad_requests = Counter("stream_dedup_http_bad_requests", "HTTP requests "
                                         "the server could not parse (a header line over 8 KB, "
                                         "a bad request line...), each logged in one line",
                                         registry=r)
        # --- progress --------------------------------------------------------------------
        self.batches = Counter("stream_dedup_batches", "Batches decided and delivered "
                               "(committed, for the Kafka service)", registry=r)
        self.last_progress = Gauge("stream_dedup_last_progress_timestamp_seconds", "Unix time "
                                   "of the last batch delivered (start time before the first)",
                                   registry=r)
        Info("stream_dedup_build", "Version and sketch parameters", registry=r).info({
            "version": __version__, "stamp": f"{settings.params.stamp:#x}",
            "shingle_words": str(settings.shingle_words), "groups": str(settings.groups),
            "group_size": str(settings.group_size), "threshold": str(settings.threshold)})

        # Label children made once: rate() works from the first scrape, updates skip lookups.
        self._stage = tuple(self.stage.labels(s) for s in STAGES)
        self._verify = {o: self.verify.labels(o) for o in OUTCOMES}
        self._since_fetch = self.latency.labels("fetch")
        self._since_consume = self.latency.labels("consume")
        for op in KAFKA_OPERATIONS:
            self.kafka_errors.labels(op)
        for output in OUTPUTS:
            self.reduced.labels(output)
        for op in INDEX_OPERATIONS:
            self.index_errors.labels(op)
        for kind in (*SKIPPED_KINDS, "other"):
            self.skipped.labels(kind)
        self._by_decision: dict[tuple[str, str], tuple[Any, Any, Any]] = {}
        for decision, reason in (("keep", UNIQUE), ("keep", VERIFIED_DISTINCT), ("drop", EXACT),
                                 ("drop", R_CANONICAL), ("drop", NEAR),
                                 ("drop", NEAR_VERIFIED), ("keep", CHANGED),
                                 ("drop", UNCHANGED), ("drop", CONTAINED)):
            self._children(decision, reason)
        self.bytes.labels("reject")
        self._namespace_labels: dict[str, str] = {"": DEFAULT_LABEL}
        self._by_namespace: dict[tuple[str, str], Any] = {}
        self._confirmed = self._overturned = 0
        self._next_index_stats = 0.0
        self._index_changed = False
        self.index_stats: dict[str, float] = {}
        self.lags: dict[tuple[str, int], int] = {}
        self.progress_at = time.monotonic()
        self.last_progress.set(time.time())

    # --- pipeline.Observer ----------------------------------------------------------------
    def page(self, decision: Decision, nbytes: int, times: StageTimes) -> None:
        pages, nbytes_counter, rejects = self._children(decision.decision, decision.reason)
        pages.inc()
        nbytes_counter.inc(nbytes)
        if rejects is not None:
            rejects.inc()
        self._namespace_child(decision.namespace, decision.decision).inc()
        for child, seconds in zip(self._stage, times, strict=True):
            if seconds > 0.0:
                child.observe(seconds)
        outcome = verify_outcome(decision)
        if outcome is not None:
            self._verify[outcome].inc()
            if outcome == "confirmed":
                self._confirmed += 1
            elif outcome == "overturned":
                self._overturned += 1

    def redelivered(self, decision: Decision) -> None:
        self.redelivered_pages.inc()

    def redis_call(self, operation: str, seconds: float, failed: bool) -> None:
        """A round trip to the Redis index (RedisIndex's `observe`)."""
        self.redis_seconds.labels(operation).observe(seconds)
        if failed:
            self.redis_errors.labels(operation).inc()

    def batch(self, index: FeatureIndex) -> None:
        try:
            self.index_pages.set(len(index))
        except IndexUnavailable:  # a shared index that cannot answer now: counted elsewhere
            pass
        now = (getattr(index, "waits", 0), getattr(index, "lost", 0))  # a shared index's
        seen = self._protocol if all(n >= o for n, o in zip(now, self._protocol, strict=True)
                                     ) else (0, 0)  # (an index reopened: counted afresh)
        self.redis_waits.inc(now[0] - seen[0])
        self.redis_lost.inc(now[1] - seen[1])
        self._protocol = now
        self._index_changed = True
        if time.monotonic() >= self._next_index_stats:
            self._index_gauges(index)

    def refresh_index(self, dedup: Deduplicator) -> None:
        """Bring the index gauges up to date if they are behind (for idle moments, when no
        batch will do it; takes the Deduplicator's lock)."""
        if self._index_changed and time.monotonic() >= self._next_index_stats:
            with dedup.lock:
                self._index_gauges(dedup.index)

    def _index_gauges(self, index: FeatureIndex) -> None:
        """Best effort: a shared index that cannot answer now leaves the gauges as they were
        (its failed round trips are counted where they happen)."""
        started = time.monotonic()
        try:
            stats = index.stats()
        except IndexUnavailable:
            self._next_index_stats = started + INDEX_STATS_MIN_S
            return
        took = time.monotonic() - started
        self._next_index_stats = started + max(INDEX_STATS_MIN_S, INDEX_STATS_BUDGET * took)
        self._index_changed = False
        self.index_stats = stats
        self.index_features.set(stats.get("feature_entries", 0))
        self.index_bytes_per_page.set(stats.get("index_bytes_per_page", 0.0))
        self.index_record_file.set(stats.get("doc_file_bytes", 0))

    # --- delivery (runner, replay) ----------------------------------------------------------
    def batch_steps(self, steps: Iterable[str], laps: list[float]) -> None:
        """A batch's steps ended at `laps` (after the first: its start)."""
        for step, start, end in zip(steps, laps[:-1], laps[1:], strict=True):
            self.batch_step.labels(step).observe(end - start)

    def decided(self, items: Iterable[Page | Rejected], received: float, done: float, *,
                since_fetch: bool = True) -> None:
        """Decisions of `items` (consumed at `received`) were delivered at `done` (Unix
        seconds). With `since_fetch`, a page carrying `fetched_at` counts from its fetch."""
        for item in items:
            fetched = _epoch(item.fetched_at) if since_fetch and isinstance(item, Page) else None
            if fetched is None:
                self._since_consume.observe(max(0.0, done - received))
            else:
                self._since_fetch.observe(max(0.0, done - fetched))

    def skipped_records(self, kind: str, n: int) -> None:
        """`n` records of a committed batch were skipped as not pages, of type `kind`."""
        self.skipped.labels(kind if kind in SKIPPED_KINDS else "other").inc(n)

    def progress(self) -> None:
        """A batch was delivered."""
        self.batches.inc()
        self.progress_at = time.monotonic()
        self.last_progress.set(time.time())

    def consumer_lag(self, topic: str, partition: int, lag: int) -> None:
        self.lags[(topic, partition)] = lag
        self.lag.labels(topic, str(partition)).set(lag)

    def forget_partitions(self, partitions: Iterable[tuple[str, int]]) -> None:
        """Partitions handed to another consumer: their lag is no longer ours to report."""
        for topic, partition in partitions:
            if self.lags.pop((topic, partition), None) is not None:
                self.lag.remove(topic, str(partition))

    def kafka_error(self, operation: str) -> None:
        self.kafka_errors.labels(operation).inc()

    def index_error(self, operation: str) -> None:
        self.index_errors.labels(operation).inc()

    # --- reading ----------------------------------------------------------------------------
    def precision_estimate(self) -> float | None:
        sampled = self._confirmed + self._overturned
        return self._confirmed / sampled if sampled else None

    def exposition(self) -> tuple[bytes, str]:
        """The /metrics body and its content type."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST

    def _precision(self) -> float:
        p = self.precision_estimate()
        return float("nan") if p is None else p

    def _namespace_child(self, namespace: str, decision: str) -> Any:
        """The counter child of a namespace's decisions: by its name for the first
        NAMESPACE_LABELS namespaces (the default one aside), the rest under _other."""
        label = self._namespace_labels.get(namespace)
        if label is None:
            label = namespace if len(self._namespace_labels) <= NAMESPACE_LABELS else OTHER_LABEL
            if label != OTHER_LABEL:
                self._namespace_labels[namespace] = label
        child = self._by_namespace.get((label, decision))
        if child is None:
            child = self._by_namespace[(label, decision)] = self.namespace_decisions.labels(
                label, decision)
        return child

    def _children(self, decision: str, reason: str) -> tuple[Any, Any, Any]:
        key = (decision, reason)
        found = self._by_decision.get(key)
        if found is None:
            found = (self.pages.labels(decision, reason), self.bytes.labels(decision),
                     self.rejects.labels(reason) if decision == "reject" else None)
            self._by_decision[key] = found
        return found


def _epoch(text: str | None) -> float | None:
    """Unix seconds of an ISO-8601 time (UTC when no zone is given); None if unparsable."""
    if not text:
        return None
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()
