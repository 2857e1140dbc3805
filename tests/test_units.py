"""`replay --workers N` with the worker processes reading the input (replay/units.py,
replay/parts.py): the same items, analyses and decisions, in the same order, as one
process reading it; big archives cut into parts, including archives built to trip the cuts."""

from __future__ import annotations

import asyncio
import base64
import fcntl
import itertools
import json
import multiprocessing
import os
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from pathlib import Path

import pytest
from warcgen import Resp, metadata, request, split_cases, warcinfo, write_warc

from stream_dedup import Settings
from stream_dedup.cli.sample import build, write_sample
from stream_dedup.models import Page, Rejected
from stream_dedup.pipeline import memo as memo_module
from stream_dedup.pipeline.analysis import AnalysisPool, Analyzer, raw_fingerprint
from stream_dedup.replay import parts, unit_feed, unit_read, units
from stream_dedup.replay import run as replay_module
from stream_dedup.replay.run import replay
from stream_dedup.sinks.files import MemorySink
from stream_dedup.sources.files import iter_inputs
from stream_dedup.sources.stats import SourceStats
from stream_dedup.workers import pool as workers

BAD_LINES = (5, 12, 13)  # 1-based lines of crawl.jsonl that are not a page
CORPUS = Path(__file__).parents[2] / "shared" / "corpora" / "warc"


@pytest.fixture(scope="module")
def crawl(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """The sample crawl (WARC + JSONL), then a JSONL of 40 lines cut into many units: its
    pages, blank lines (one of white space), bad records, a line of `\\r` inside a body."""
    root = tmp_path_factory.mktemp("units")
    warc, jsonl, pages = write_sample(root)
    lines = []
    for i in range(40):
        p = pages[i % len(pages)]
        body = p.html.encode() + (f"<p>copy {i // len(pages)}</p>".encode() if i % 3 else b"")
        lines.append(json.dumps({"url": f"{p.url}?n={i}",
                                 "body_b64": base64.b64encode(body).decode(),
                                 "headers": [["Content-Type", "text/html"]]}))
    for n in BAD_LINES:
        lines[n - 1] = '{"url": "https://bad.example/' + str(n) + '", "body_b64": "!!"'
    lines[20] = ""  # blank: skipped, but it counts as a line
    lines[30] = " \t\x0b\r"  # white space alone: the same
    lines[21] = lines[21][:-1] + ', "x": "a\\rb"}'
    more = root / "crawl.jsonl"
    more.write_text("\n".join(lines) + "\n")
    return [warc, jsonl, more]


def _ready_pool(pools: list[AnalysisPool]) -> type[AnalysisPool]:
    class Ready(AnalysisPool):
        def start(self, *, fork: bool = False) -> None:
            super().start(fork=fork)
            if self not in pools:
                pools.append(self)
                assert self.wait_ready(60)

    return Ready


def _replay_with_units(files: list[Path], monkeypatch: pytest.MonkeyPatch, settings: Settings,
                       source_class: type[units.UnitSource] = units.UnitSource,
                       dead_letter: object = None, *, workers: int = 2, unit_bytes: int = 3000,
                       ) -> tuple[MemorySink, units.UnitSource]:
    sources: list[units.UnitSource] = []

    class Recorded(source_class):  # type: ignore[valid-type,misc]
        def __init__(self, *args: object, **kwargs: object) -> None:
            super().__init__(*args, unit_bytes=unit_bytes, **kwargs)  # type: ignore[arg-type]
            sources.append(self)

    monkeypatch.setattr(replay_module, "AnalysisPool", _ready_pool([]))
    monkeypatch.setattr(replay_module, "EARLY_START_BYTES", 0)
    monkeypatch.setattr(replay_module, "UnitSource", Recorded)
    sink = MemorySink()
    replay(files, sink, settings, workers=workers, dead_letter=dead_letter)  # type: ignore[arg-type]
    assert len(sources) == 1
    return sink, sources[0]


def _read_in_order(files: list[Path], unit_bytes: int) -> tuple[list[Page | Rejected],
                                                                 units.UnitSource]:
    """Every unit read in this process, settled in order as a replay takes them."""
    source = units.UnitSource(files, Analyzer(Settings()), None, unit_bytes=unit_bytes)
    items, _ = source._take(1 << 30, asyncio.Event())
    return items, source


def test_units_give_the_items_of_one_reader_in_order(crawl: list[Path]) -> None:
    """The plan cut at line ends, each range with its first line's number, and the WARC
    in parts: the units read in a row give exactly the items of the plain reader
    (sources, rejects, raw bytes)."""
    stats = SourceStats()
    planned = list(units.plan_units(crawl, stats, unit_bytes=3000))
    ranges = [u for u in planned if isinstance(u, units.Unit) and u.kind == "jsonl-range"]
    assert len(ranges) > 10  # the 40-line file is cut into many units
    assert sum(isinstance(u, units.Unit) and u.kind == "archive-part" for u in planned) > 10
    got, _ = _read_in_order(crawl, 3000)
    assert got == list(iter_inputs(crawl))


@pytest.fixture(scope="module")
def archives(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """warcgen.split_cases over the sample's articles (near and exact copies among them)."""
    bodies = [p.html.encode() for p in build(11)]
    return split_cases(tmp_path_factory.mktemp("parts"), bodies)


@pytest.fixture
def settled(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[Path, parts.Settled]]]:
    """Every part settled, with its file."""
    seen: list[tuple[Path, parts.Settled]] = []
    settle = parts.Chain.settle

    def spy(self: parts.Chain, cut: parts.Cut, end: parts.PartEnd, rest: bool = False
            ) -> parts.Settled:
        got = settle(self, cut, end, rest)
        seen.append((self.path, got))
        return got

    monkeypatch.setattr(parts.Chain, "settle", spy)
    yield seen


@pytest.mark.parametrize("unit_bytes", [1, 3000])
def test_archive_parts_give_the_items_of_one_reader(
        archives: dict[str, Path], settled: list[tuple[Path, parts.Settled]],
        unit_bytes: int) -> None:
    """Each archive cut into parts (at every record with unit_bytes 1), read and settled
    in order: exactly the items of the whole file's reader, and each trap took the path
    meant for it."""
    files = list(archives.values())
    got, source = _read_in_order(files, unit_bytes)
    assert got == list(iter_inputs(files))
    by_file: dict[str, Counter[str]] = {}
    for path, s in settled:
        kind = ("again" if s.again is not None else "rest" if s.rest is not None
                else "dropped" if s.base is None else "ok")
        by_file.setdefault(path.name, Counter())[kind] += 1
    # a cut inside the crawled .warc.gz / on a header line inside a body: its part is
    # dropped, and read again from the real next record if that is before its end
    for name in ("nested.warc.gz", "nested.warc"):
        assert by_file[name]["again"] + by_file[name]["dropped"] >= 1, name
    assert by_file["damaged.warc.gz"]["rest"] == 1  # FastWARC stopped at the damage
    assert by_file["junk.arc.gz"]["rest"] == 1  # the lenient reader met the junk
    for name in ("truncated.warc.gz", "pages.arc.gz", "pages.arc"):
        assert by_file[name]["ok"] > 5 and set(by_file[name]) == {"ok"}, name
    assert "stream.warc.gz" not in by_file  # one gzip stream: read whole
    assert source.stats.unsplit == [str(archives["stream.warc.gz"])]


def _decided_by_parts(files: list[Path], monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                      workers: int, unit_bytes: int) -> units.UnitSource:
    """--workers 1 against `workers` processes reading the files in parts of
    `unit_bytes`: the same decisions in the same order, the same dead letters."""
    settings = Settings(batch_size=50)
    one = MemorySink()
    with open(tmp_path / "dead1.jsonl", "w") as dead1:
        replay(files, one, settings, dead_letter=dead1)
    with open(tmp_path / "dead2.jsonl", "w") as dead2:
        two, source = _replay_with_units(files, monkeypatch, settings, dead_letter=dead2,
                                         workers=workers, unit_bytes=unit_bytes)
    assert source.units_there > 0, "the worker processes read none of the input"
    assert two.decisions == one.decisions
    assert (tmp_path / "dead2.jsonl").read_text() == (tmp_path / "dead1.jsonl").read_text()
    assert Counter(d.decision for d in one.decisions)["drop"] > 10  # decisions worth comparing
    return source


@pytest.mark.parametrize("workers", [2, 3])
def test_archives_read_in_parts_by_workers_give_the_same_decisions(
        archives: dict[str, Path], crawl: list[Path], monkeypatch: pytest.MonkeyPatch,
        tmp_path: Path, workers: int) -> None:
    source = _decided_by_parts([*archives.values(), *crawl], monkeypatch, tmp_path, workers,
                               unit_bytes=8000)
    assert source.stats.unsplit == [str(archives["stream.warc.gz"])]


@pytest.fixture(scope="module")
def big_warc(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """~6 MB, one member per record: the sample's articles and their copies from eight
    seeds, each response after a request and followed by a metadata record."""
    records: list[bytes | Resp] = [warcinfo()]
    for seed in range(8):
        for i, page in enumerate(build(seed)):
            url = f"http://big{seed}.example/{i}"
            records += [request(url), Resp(url, page.html.encode()), metadata(url)]
    return write_warc(tmp_path_factory.mktemp("big") / "big.warc.gz", records)


@pytest.mark.parametrize("workers", [2, 3])
def test_a_big_warc_in_parts_gives_the_same_decisions(
        big_warc: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
        workers: int) -> None:
    source = _decided_by_parts([big_warc], monkeypatch, tmp_path, workers,
                               unit_bytes=256 << 10)
    assert source.units_here + source.units_there > 10


def test_the_last_parts_of_a_file_shrink_so_the_processes_end_together(
        big_warc: Path) -> None:
    """Parts of about `unit` bytes, then smaller over the file's last 8 units, never under
    an eighth of one (but the last); together they tile the file."""
    unit = 256 << 10
    _, cuts = parts.plan_parts(big_warc, unit, [])
    sizes = [c.end - c.start for c in cuts]
    assert sum(sizes) == big_warc.stat().st_size and len(sizes) > 20
    tail = parts.TAPER * unit
    early = [n for n, ends in zip(sizes, itertools.accumulate(sizes), strict=True)
             if big_warc.stat().st_size - ends >= tail]
    assert min(early) >= unit and max(sizes[-6:]) < unit // 2
    assert min(sizes[:-1]) >= unit // parts.TAPER


def test_a_unit_s_pages_are_read_ahead_in_bounded_chunks() -> None:
    """Pages come out in order, read READ_AHEAD_PAGES at a time (or fewer once their bodies
    reach READ_AHEAD_BYTES): a chunk is read before the first of it is analysed."""
    pulled: list[int] = []

    def items(bodies: list[int]) -> Iterator[Page | Rejected]:
        for n, size in enumerate(bodies):
            pulled.append(n)
            yield Page(f"http://e.example/{n}", b"x" * size) if size else \
                Rejected(None, "bad-json", "not JSON")

    many = [10] * (unit_read.READ_AHEAD_PAGES * 2 + 5) + [0]
    got = unit_read._read_ahead(items(many))
    first = next(got)
    assert isinstance(first, Page) and first.url.endswith("/0")
    assert len(pulled) == unit_read.READ_AHEAD_PAGES
    rest = [first, *got]
    assert [i.url if isinstance(i, Page) else i.kind for i in rest] == \
        [f"http://e.example/{n}" for n in range(len(many) - 1)] + ["bad-json"]
    pulled.clear()
    big = unit_read.READ_AHEAD_BYTES // 3 + 1
    next(unit_read._read_ahead(items([big] * 10)))
    assert len(pulled) == 3


@pytest.mark.corpus
@pytest.mark.skipif(not CORPUS.is_dir(), reason="../shared/corpora/warc is absent")
@pytest.mark.parametrize("workers", [2, 3])
def test_real_archives_in_parts_give_the_same_decisions(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, workers: int) -> None:
    """Every WARC and ARC file of the corpus (revisits, truncated files, a one-member
    file, ARC v1 without separators...) in parts of 64 KB."""
    files = sorted(p for p in CORPUS.rglob("*") if ".arc" in p.name or ".warc" in p.name)
    source = _decided_by_parts(files, monkeypatch, tmp_path, workers, unit_bytes=64 << 10)
    assert source.units_here + source.units_there > 200


def test_workers_reading_the_input_give_the_same_decisions_in_order(
        crawl: list[Path], monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    settings = Settings(batch_size=7)
    one = MemorySink()
    with open(tmp_path / "dead1.jsonl", "w") as dead1:
        replay(crawl, one, settings, dead_letter=dead1)
    with open(tmp_path / "dead2.jsonl", "w") as dead2:
        two, source = _replay_with_units(crawl, monkeypatch, settings, dead_letter=dead2)
    assert source.units_there > 0, "the worker processes read none of the input"
    assert two.decisions == one.decisions
    assert [d.source for d in two.decisions] == [d.source for d in one.decisions]
    # the bad records of the worker-read file are rejects, with their bytes dead-lettered
    bad = [d for d in two.decisions if d.decision == "reject" and "crawl.jsonl" in d.source]
    assert [d.source.rsplit("#", 1)[1] for d in bad] == [str(n) for n in BAD_LINES]
    assert (tmp_path / "dead2.jsonl").read_text() == (tmp_path / "dead1.jsonl").read_text()


def test_a_worker_reads_a_bad_record_as_a_reject(crawl: list[Path]) -> None:
    """The unit holding the bad lines, read in a worker process: rejects with their raw
    bytes and sources come back, and pages without their bodies but with their analyses."""
    unit, page_unit = (next(u for u in units.plan_units([crawl[2]], SourceStats(), unit_bytes=1)
                            if isinstance(u, units.Unit) and u.first_line == line)
                       for line in (BAD_LINES[0], 1))
    with AnalysisPool(Settings(), 2) as pool:
        assert pool.wait_ready(60)
        executor = pool.executor()
        assert executor is not None
        got, sent = (units.unpack(executor.result(executor.submit(units.worker_read, u)))
                     for u in (unit, page_unit))
    here = units.read_unit(unit, Analyzer(Settings()), memo_module.Memo())
    assert len(got.items) == 1 and isinstance(got.items[0], Rejected)
    assert got.items[0] == here.items[0] and got.items[0].raw
    assert got.stats.rejected == here.stats.rejected == {"bad-json": 1}
    local = units.read_unit(page_unit, Analyzer(Settings()), memo_module.Memo())
    (page,), (a,) = sent.items, sent.analyses
    (full,), (b,) = local.items, local.analyses
    assert isinstance(page, Page) and isinstance(full, Page) and a is not None and b is not None
    assert page.body == b"" and a.body_bytes == len(full.body) and page.source == full.source
    assert (a.raw_fp, a.canonical_fp, a.text_length, a.shingle_count, a.ld_signature) == (
        b.raw_fp, b.canonical_fp, b.text_length, b.shingle_count, b.ld_signature)
    assert a.sketch is not None and b.sketch is not None and (a.sketch == b.sketch).all()
    assert a.features is not None and b.features is not None
    assert (a.features == b.features).all() and a.sketch.dtype == b.sketch.dtype


class KillsAWorker(units.UnitSource):
    """Kills the worker processes (SIGKILL) once, right after the first units went to them:
    they die while reading or analysing them."""

    killed = 0

    def _feed(self) -> None:
        super()._feed()
        if KillsAWorker.killed or self.pool is None:
            return
        executor = self.pool.executor()
        if executor is not None and any(s.task is not None for s in self._slots):
            for pid in list(executor._processes):  # type: ignore[attr-defined]
                os.kill(pid, signal.SIGKILL)
            KillsAWorker.killed += 1


def test_a_worker_killed_mid_file_loses_no_page_and_changes_no_decision(
        crawl: list[Path], monkeypatch: pytest.MonkeyPatch) -> None:
    settings = Settings(batch_size=7)
    one = MemorySink()
    replay(crawl, one, settings)
    KillsAWorker.killed = 0
    two, source = _replay_with_units(crawl, monkeypatch, settings, KillsAWorker)
    assert KillsAWorker.killed == 1 and source.restarts == 1
    assert two.decisions == one.decisions


def test_a_stop_leaves_the_unit_being_read_at_once(crawl: list[Path]) -> None:
    """Ctrl-C during a replay: a unit read in this process (a whole archive that cannot be
    cut, possibly minutes of work) is left after the page being read, not finished first."""
    # units of 1 MiB: the 0.3 MB WARC is too small to cut, and is the first unit
    source = units.UnitSource(crawl, Analyzer(Settings()), None, unit_bytes=1 << 20)
    stop = asyncio.Event()
    pages = 0
    tick = source._tick

    def counting() -> None:  # after the 3rd page, the replay is told to stop
        nonlocal pages
        pages += 1
        if pages == 3:
            stop.set()
        tick()

    source._tick = counting  # type: ignore[method-assign]
    items, analyses = source._take(10_000, stop)
    assert (items, analyses, pages) == ([], [], 3)  # the first unit (the WARC) left at once
    assert source._slots[0].free  # nothing of it taken: read again if asked again


def test_units_queued_to_the_workers_are_bounded_by_their_bytes(
        crawl: list[Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """An archive that cannot be cut is one unit however large: past
    QUEUED_BYTES_PER_PROCESS of input in the workers' hands (sent, not back), no more units
    go to them. (What is back waits here, bounded by the units planned ahead.)"""
    most = 0

    class Counting(units.UnitSource):
        def _feed(self) -> None:
            nonlocal most
            super()._feed()
            most = max(most, sum(1 for s in self._slots if s.task is not None
                                 and s.result is None and not s.task[1].done()))

    settings = Settings(batch_size=7)
    one = MemorySink()
    replay(crawl, one, settings)
    monkeypatch.setattr(unit_feed, "QUEUED_BYTES_PER_PROCESS", 1)
    two, source = _replay_with_units(crawl, monkeypatch, settings, Counting)
    assert source.units_there > 0 and most == 1
    assert two.decisions == one.decisions


class _Executor:
    """A worker pool as UnitSource uses it, without processes: each unit sent is recorded
    with its future, which the test completes (`first(unit)` answers the first at once)."""

    def __init__(self, first: Callable[[units.Unit], object] | None = None) -> None:
        self.sent: list[Future[object]] = []
        self.first = first

    def submit(self, fn: object, unit: units.Unit) -> Future[object]:
        f: Future[object] = Future()
        if not self.sent and self.first is not None:
            f.set_result(self.first(unit))
        self.sent.append(f)
        return f

    def result(self, f: Future[object], stopped: object) -> object:
        return f.result(timeout=10)


def _fake_pool_source(crawl: list[Path], executor: _Executor, unit_bytes: int, *,
                      analyzer: Analyzer | None = None, planned: bool = False
                      ) -> units.UnitSource:
    """A UnitSource whose one worker is `executor`; with `planned`, all of the input planned
    (few enough units that it is all its last ones, under ENDING_BYTES)."""

    class Pool:
        processes = 1
        seen = None

        def executor(self) -> _Executor:
            return executor

    source = units.UnitSource(crawl, analyzer or Analyzer(Settings()),
                              Pool(), unit_bytes=unit_bytes)  # type: ignore[arg-type]
    for _ in range(units.AHEAD_UNITS if planned else 0):
        source._plan_ahead()
    return source


def test_units_back_but_not_collected_do_not_hold_the_workers_back(
        crawl: list[Path]) -> None:
    """A unit a worker has finished waits for this process to collect it, which may be
    reading a unit itself meanwhile: it no longer counts among the QUEUED_PER_PROCESS the
    workers hold, so they get the next units instead of waiting idle."""
    executor = _Executor()
    source = _fake_pool_source(crawl, executor, 3000)
    source._plan_ahead()
    source._feed()
    first = len(executor.sent)
    assert first == unit_feed.QUEUED_PER_PROCESS
    source._feed()
    assert len(executor.sent) == first  # all still in the worker's hands
    for f in executor.sent:  # each back, none collected
        f.set_result(None)
    source._plan_ahead()
    source._feed()
    assert len(executor.sent) == 2 * first


def test_a_unit_back_while_this_process_reads_gets_the_worker_fed_at_the_next_page(
        crawl: list[Path]) -> None:
    """While this process reads a unit itself, a unit coming back gets the worker the next
    one at the next page read (not once the unit read here is done); while none comes
    back, a page read does not feed (nothing to feed)."""
    executor = _Executor()
    source = _fake_pool_source(crawl, executor, 3000)
    source._plan_ahead()
    source._feed()
    held = len(executor.sent)
    feeds = 0
    feed = source._feed

    def counting() -> None:
        nonlocal feeds
        feeds += 1
        feed()

    source._feed = counting  # type: ignore[method-assign]
    source._tick()
    assert feeds == 0 and len(executor.sent) == held
    executor.sent[0].set_result(None)  # back, not collected
    source._tick()
    assert feeds == 1 and len(executor.sent) == held + 1
    source._tick()
    assert feeds == 1


def test_a_batch_near_the_end_goes_out_rather_than_wait_for_more_reading(
        crawl: list[Path]) -> None:
    """Over the input's last units (ENDING_BYTES), a batch begun is handed out for deciding
    when the next unit is a worker's and not back, instead of this process reading another
    unit first: deciding keeps up, and little is left to decide after the last unit."""
    analyzer = Analyzer(Settings())
    # the first unit comes back at once, the others never
    executor = _Executor(lambda unit: unit_read.read_unit(unit, analyzer, memo_module.Memo()))
    source = _fake_pool_source(crawl, executor, 20_000, analyzer=analyzer, planned=True)
    assert source._ending() and len(source._slots) > unit_feed.QUEUED_PER_PROCESS + 1
    items, _ = source._take(1 << 30, asyncio.Event())
    assert items and source.units_here == 0 and source.units_there == 1
    assert any(s.free for s in source._slots)  # not read here: the batch went out instead


def test_between_fetches_at_the_end_the_workers_are_fed_as_they_finish(
        crawl: list[Path]) -> None:
    """Over the last units, while a batch is decided no fetch runs, and the workers would
    wait once the few small units they hold are done: the fetching thread gives them the
    next unit as each comes back, until the next fetch wakes it."""
    executor = _Executor()
    sent = executor.sent
    source = _fake_pool_source(crawl, executor, 20_000, planned=True)
    source._feed()
    assert source._ending() and len(sent) == unit_feed.QUEUED_PER_PROCESS
    wake: Future[None] = Future()
    feeding = threading.Thread(target=source._feeding, args=(wake,))
    feeding.start()
    for k in range(2):  # a unit back: the next goes out
        sent[k].set_result(None)
        deadline = time.monotonic() + 10
        while len(sent) < unit_feed.QUEUED_PER_PROCESS + k + 1 and time.monotonic() < deadline:
            time.sleep(0.001)
        assert len(sent) == unit_feed.QUEUED_PER_PROCESS + k + 1
    wake.set_result(None)
    feeding.join(10)
    assert not feeding.is_alive()


def test_the_workers_are_let_go_once_the_last_unit_is_back(
        big_warc: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Once every unit is planned and none is left for them, the workers are told to exit
    (AnalysisPool.finish) while this process still decides the last batches; the replay's
    shutdown then waits for them, and no process outlives it."""
    finished: list[int] = []  # decisions delivered when finish() was called
    sink = MemorySink()

    class Finishing(AnalysisPool):
        def finish(self) -> None:
            finished.append(len(sink.decisions))
            super().finish()
            assert self.executor() is None

    class Small(units.UnitSource):
        def __init__(self, *args: object, **kwargs: object) -> None:
            super().__init__(*args, **kwargs, unit_bytes=256 << 10)  # type: ignore[arg-type]

    monkeypatch.setattr(replay_module, "AnalysisPool", Finishing)
    monkeypatch.setattr(replay_module, "EARLY_START_BYTES", 0)
    monkeypatch.setattr(replay_module, "UnitSource", Small)
    summary = replay([big_warc], sink, Settings(batch_size=20), workers=2)
    assert len(finished) == 1 and 0 < finished[0] < len(sink.decisions) == summary.pages
    assert not multiprocessing.active_children()


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no sched_setaffinity")
@pytest.mark.parametrize("pin", [True, False])
def test_processes_filling_the_cpus_run_on_one_each_and_no_longer_than_the_replay(
        big_warc: Path, monkeypatch: pytest.MonkeyPatch, pin: bool) -> None:
    """With as many processes as CPUs this process may use, this process's threads run on
    the first, the worker on the second (workers/cpus.py); --no-pin leaves them to the kernel; the
    caller's thread has its CPUs back afterwards."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("one CPU")
    two = set(cpus[:2])
    seen: dict[str, list[set[int]]] = {}

    class Watching(AnalysisPool):
        def finish(self) -> None:  # in the fetching thread, which this process started
            seen["here"] = [os.sched_getaffinity(0)]
            seen["workers"] = [os.sched_getaffinity(p.pid)
                               for p in multiprocessing.active_children()]
            super().finish()

    monkeypatch.setattr(replay_module, "AnalysisPool", Watching)
    monkeypatch.setattr(replay_module, "EARLY_START_BYTES", 0)
    deadline = time.monotonic() + 10  # forked (workers.can_fork): no thread of a test before
    while not workers.can_fork() and time.monotonic() < deadline:
        time.sleep(0.01)
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, two)
    try:
        replay([big_warc], MemorySink(), Settings(batch_size=50), workers=2, pin=pin)
        after = os.sched_getaffinity(0)
    finally:
        os.sched_setaffinity(0, before)
    first, second = sorted(two)
    assert seen == ({"here": [{first}], "workers": [{second}]} if pin else
                    {"here": [two], "workers": [two]})
    assert after == two


def test_units_planned_ahead_are_bounded_by_their_bytes(
        crawl: list[Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """Their results wait here until decided: units are planned ahead until AHEAD_BYTES of
    input (at least one unit), and the decisions stay the same."""
    most = 0

    class Counting(units.UnitSource):
        def _plan_ahead(self) -> None:
            nonlocal most
            super()._plan_ahead()
            most = max(most, len(self._slots))

    settings = Settings(batch_size=7)
    one = MemorySink()
    replay(crawl, one, settings)
    monkeypatch.setattr(units, "AHEAD_BYTES", 1)
    two, source = _replay_with_units(crawl, monkeypatch, settings, Counting)
    assert most == 1 and source.units_there + source.units_here > 3
    assert two.decisions == one.decisions


def _resident_kb(path: Path) -> int:
    """This process's resident KB of its maps of `path` (/proc/self/smaps)."""
    total, in_map = 0, False
    with open("/proc/self/smaps") as fh:
        for line in fh:
            head = line.split()
            if head and "-" in head[0] and len(head) >= 5:  # a map's first line
                in_map = line.rstrip().endswith(str(path))
            elif in_map and head[:1] == ["Rss:"]:
                total += int(head[1])
    return total


@pytest.mark.skipif(not Path("/proc/self/smaps").exists(), reason="Linux only")
def test_planning_a_jsonl_crawl_does_not_keep_it_resident(tmp_path: Path) -> None:
    """The ranges of a plain JSONL file are found in a map of it; what has been planned
    leaves the map, so the planner's resident set does not grow with the file (it grew by
    the whole 270 MB of the synthetic crawl before, with --workers 2)."""
    crawl = tmp_path / "crawl.jsonl"
    line = json.dumps({"url": "https://a.example/", "html": "<p>" + "w " * 2000 + "</p>"})
    crawl.write_text((line + "\n") * 2000)  # 8 MB
    most = 0
    for unit in units.plan_units([crawl], SourceStats(), unit_bytes=256 << 10):
        assert isinstance(unit, units.Unit) and unit.kind == "jsonl-range"
        most = max(most, _resident_kb(crawl))
    assert most <= 2048  # of the 8,192 KB a map that keeps what it read holds at the end


def test_a_body_a_worker_analysed_is_not_analysed_again_here(
        big_warc: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The analyses of a worker's unit are remembered in this process: a later unit read
    here analyses only the bodies nobody analysed before (the same analyses as its own)."""
    first = next(u for u in units.plan_units([big_warc], SourceStats(), unit_bytes=1 << 20)
                 if isinstance(u, units.Unit))
    assert first.kind == "archive-part"
    with AnalysisPool(Settings(), 2) as pool:
        assert pool.wait_ready(60)
        executor = pool.executor()
        assert executor is not None
        packed = executor.result(executor.submit(units.worker_read, first))
    source = units.UnitSource([big_warc], Analyzer(Settings()), None)
    got = source._shared.remembered(units.unpack(packed))
    assert got.items and len(source._shared.memo.rows) > 10
    analysed = _counting(monkeypatch)
    again = units.read_unit(first, source.analyzer, source._shared.memo)  # the worker's unit, here
    assert analysed == [] and len(again.items) == len(got.items)
    fresh = units.read_unit(first, source.analyzer, memo_module.Memo())
    assert analysed  # (the spy sees analyses)
    _same_analyses(again, fresh)


def _counting(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    analysed: list[int] = []
    analyze = Analyzer.analyze

    def counting(self: Analyzer, page: Page) -> object:
        analysed.append(raw_fingerprint(page.body))
        return analyze(self, page)

    monkeypatch.setattr(Analyzer, "analyze", counting)
    return analysed


def _same_analyses(got: unit_read.UnitResult, fresh: unit_read.UnitResult) -> None:
    assert len(got.analyses) == len(fresh.analyses)
    for a, b in zip(got.analyses, fresh.analyses, strict=True):
        assert (a is None) == (b is None)
        if a is not None and b is not None:
            assert (a.raw_fp, a.canonical_fp, a.ld_signature, a.shingles, a.text_length) == (
                b.raw_fp, b.canonical_fp, b.ld_signature, b.shingles, b.text_length)
            assert a.sketch is None or (a.sketch == b.sketch).all()


@pytest.mark.skipif(not hasattr(fcntl, "F_GETPIPE_SZ"), reason="pipe sizes are Linux's")
def test_a_worker_sends_a_unit_s_result_without_waiting_for_the_reader() -> None:
    """The result pipe holds a unit's result (~0.5 MB; 64 KiB by default), so a worker does
    not wait for this process's result thread to take its turn of the GIL."""
    cap = int(Path("/proc/sys/fs/pipe-max-size").read_text())
    if cap < workers.RESULT_PIPE_BYTES and os.geteuid() != 0:
        pytest.skip(f"pipes are capped at {cap} bytes here")
    with AnalysisPool(Settings(), 2) as pool:
        assert pool.wait_ready(60)
        executor = pool.executor()
        assert executor is not None
        reader = executor._result_queue._reader  # type: ignore[attr-defined]
        assert fcntl.fcntl(reader.fileno(), fcntl.F_GETPIPE_SZ) >= workers.RESULT_PIPE_BYTES


def test_the_memo_of_analyses_is_bounded_by_count_and_by_bytes(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker remembers analyses of bodies it read, with their shingle sets (up to 256 KB
    each): the oldest go first past REMEMBERED entries or REMEMBERED_BYTES of sets."""
    monkeypatch.setattr(memo_module, "REMEMBERED", 3)
    monkeypatch.setattr(memo_module, "REMEMBERED_BYTES", 100)
    memo = memo_module.Memo()
    for fp in range(4):
        memo.put(fp, (fp, b"x" * 10))
    assert list(memo.rows) == [1, 2, 3] and memo.bytes == 30  # by count
    assert memo.get(1) == (1, b"x" * 10) and list(memo.rows) == [2, 3, 1]  # used: the newest
    memo.put(9, (9, b"y" * 85))
    assert list(memo.rows) == [1, 9] and memo.bytes == 95  # by bytes
