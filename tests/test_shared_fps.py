"""The bodies the processes of a replay share (workers/shared_fps.py): a copy of a body is
analysed in one process, whichever read it first, and the decisions do not change."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_units import _counting, _same_analyses, big_warc  # noqa: F401  (a fixture)

from stream_dedup import Settings
from stream_dedup.models import Page
from stream_dedup.pipeline import analysis, memo
from stream_dedup.pipeline.analysis import Analyzer
from stream_dedup.replay import unit_plan, unit_read, units
from stream_dedup.sources.stats import SourceStats
from stream_dedup.workers.shared_fps import SharedFingerprints


def test_the_tables_are_shared_across_fork_one_writer_each() -> None:
    """A forked worker sees what the parent remembers and the parent what the worker reads;
    what the parent forgets is gone for the worker; 0 and 1 (the empty and gone marks) are
    never shared."""
    seen = SharedFingerprints(2, slots=64)
    seen.remember(7 << 40, [])
    seen.remember(1, [])
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the worker
        os.close(r)
        seen.claim()
        answers = [seen.in_parent(7 << 40), seen.in_parent(8), seen.in_parent(1)]
        seen.reading(9 << 40)
        seen.reading(0)
        os.write(w, bytes(answers))
        os._exit(0)
    os.close(w)
    assert os.waitpid(pid, 0)[1] == 0
    assert list(os.read(r, 3)) == [1, 0, 0]
    os.close(r)
    assert seen.in_worker(9 << 40) and not seen.in_worker(7 << 40) and not seen.in_worker(0)
    seen.forget(7 << 40)
    assert not seen.in_parent(7 << 40)


def test_full_tables_are_cleared_or_rebuilt_and_keep_what_is_remembered() -> None:
    seen = SharedFingerprints(1, slots=16)
    seen.claim()  # (this process plays the worker too)
    for fp in range(2, 30):
        seen.reading(fp)
        assert seen.in_worker(fp)  # the newest always there
    assert not seen.in_worker(2)  # cleared on the way
    held = list(range(100, 106))
    for fp in held:
        seen.remember(fp, held)
    for fp in range(106, 140):  # forgotten as soon as remembered: gone marks pile up
        seen.remember(fp, held)
        seen.forget(fp)
    assert all(seen.in_parent(fp) for fp in held)  # through rebuilds
    assert not any(seen.in_parent(fp) for fp in range(106, 140))


@pytest.fixture
def worker(monkeypatch: pytest.MonkeyPatch) -> SharedFingerprints:
    """This process as the parent and, through `worker_read`, as its one worker (the same
    code a forked worker runs; the first test shows the tables shared across fork)."""
    seen = SharedFingerprints(1)
    seen.claim()
    monkeypatch.setattr(analysis, "_WORKER", Analyzer(Settings()))
    monkeypatch.setattr(analysis, "_SEEN", seen)
    monkeypatch.setattr(unit_read, "_MEMO", unit_read.Memo())
    return seen


class _Pool:
    """A pool's tables, and no processes: every unit the source reads is read here."""

    def __init__(self, seen: SharedFingerprints) -> None:
        self.seen = seen

    def executor(self) -> None:
        return None


def _first_unit(path: Path) -> unit_plan.Unit:
    first = next(u for u in unit_plan.plan_units([path], SourceStats(), unit_bytes=1 << 20)
                 if isinstance(u, unit_plan.Unit))
    assert first.kind == "archive-part"
    return first


def test_a_worker_sends_fingerprints_for_bodies_this_process_remembers(
        big_warc: Path, worker: SharedFingerprints) -> None:  # noqa: F811
    """A unit read here first: the worker reading it again analyses none of its bodies and
    sends their fingerprints; filled in here, they are the analyses a fresh read gives."""
    first = _first_unit(big_warc)
    source = units.UnitSource([big_warc], Analyzer(Settings()), _Pool(worker))  # type: ignore[arg-type]
    here = source._here(units.Slot(first))
    assert len(source._shared.memo.rows) > 10
    packed = unit_read.worker_read(first)
    pages = [r for r in packed.rows if r is not None]
    assert pages and all(isinstance(r, int) for r in pages)  # no analysis came back
    _same_analyses(unit_read.unpack(packed, None, source._shared.recall), here)


def test_a_worker_sends_fingerprints_even_for_bodies_it_analysed_itself(
        big_warc: Path, worker: SharedFingerprints) -> None:  # noqa: F811
    """The worker's own memo has the analyses too, but this process remembering them is
    asked first: their rows (~3.7 KB each) are not sent again."""
    first = _first_unit(big_warc)
    source = units.UnitSource([big_warc], Analyzer(Settings()), _Pool(worker))  # type: ignore[arg-type]
    packed = unit_read.worker_read(first)
    assert any(not isinstance(r, int) for r in packed.rows if r is not None)
    source._shared.remembered(unit_read.unpack(packed, None, source._shared.recall))
    again = unit_read.worker_read(first)
    pages = [r for r in again.rows if r is not None]
    assert pages and all(isinstance(r, int) for r in pages)
    _same_analyses(unit_read.unpack(again, None, source._shared.recall),
                   unit_read.unpack(packed, None, source._shared.recall))


def test_a_copy_a_worker_reads_is_analysed_there_not_here(
        big_warc: Path, worker: SharedFingerprints,  # noqa: F811
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The worker reads a unit first: the same unit read here leaves every page for later,
    and once the worker's analyses are back none is analysed here."""
    first = _first_unit(big_warc)
    packed = unit_read.worker_read(first)
    source = units.UnitSource([big_warc], Analyzer(Settings()), _Pool(worker))  # type: ignore[arg-type]
    analysed = _counting(monkeypatch)
    here = source._here(units.Slot(first))
    assert here.deferred and all(here.analyses[i] is None for i in here.deferred)
    assert analysed == []
    source._shared.remembered(unit_read.unpack(packed, None, source._shared.recall))
    assert unit_read.finish_deferred(here, source.analyzer, source._shared.memo) == 0
    assert analysed == [] and not here.deferred
    _same_analyses(here, unit_read.read_unit(first, source.analyzer, unit_read.Memo()))


def test_an_analysis_forgotten_here_is_kept_until_the_units_sent_before_are_back(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Past REMEMBERED, this process forgets the oldest analysis, and the workers are told:
    one may have been told before, so it is kept while any unit sent by then is out."""
    monkeypatch.setattr(memo, "REMEMBERED", 2)

    seen = SharedFingerprints(1, slots=16)
    source = units.UnitSource([], Analyzer(Settings()), _Pool(seen))  # type: ignore[arg-type]
    out = units.Slot(None, task=(None, None))  # type: ignore[arg-type]
    source._shared.sent = out.sent = 1
    source._slots.append(out)
    for fp in (10, 11, 12):
        source._shared.memo.put(fp, (fp, b""))
    assert list(source._shared.memo.rows) == [11, 12] and not seen.in_parent(10)
    source._bury()
    assert source._shared.recall(10) == (10, b"")  # the unit sent before may ask for it
    source._slots.clear()
    source._bury()
    with pytest.raises(RuntimeError, match="does not have its analysis"):
        source._shared.recall(10)


@pytest.mark.parametrize("remembered", [3, 4096])
def test_copies_in_both_processes_give_the_same_decisions(
        big_warc: Path, tmp_path: Path, remembered: int) -> None:  # noqa: F811
    """`replay --workers 2` (a process of its own: its worker is forked, and shares the
    tables) of the sample's articles and their copies, in parts, decides as one process
    does, also with a memo of 3 (forgetting while units are out)."""
    run = ("import sys; from stream_dedup.pipeline import memo; from stream_dedup.replay "
           "import run as replay, units; memo.REMEMBERED = int(sys.argv[1]); "
           "replay.EARLY_START_BYTES = 0; units.UNIT_BYTES = 256 << 10; "
           "from stream_dedup.cli.main import main; sys.exit(main(sys.argv[2:]))")
    out = {}
    for w in (1, 2):
        out[w] = tmp_path / f"w{w}.jsonl"
        subprocess.run([sys.executable, "-c", run, str(remembered), "replay", "-q",
                        "--workers", str(w), "-o", str(out[w]), str(big_warc)], check=True)
    decisions = out[1].read_text().splitlines()
    assert len(decisions) > 100 and out[2].read_text().splitlines() == decisions


def test_a_body_analysed_here_is_told_to_the_workers_before_its_analysis_is_done(
        big_warc: Path, worker: SharedFingerprints,  # noqa: F811
        monkeypatch: pytest.MonkeyPatch) -> None:
    """While this process analyses a body, a worker reading a copy finds it in this
    process's table (and sends its fingerprint, not a second analysis of it)."""
    first = _first_unit(big_warc)
    source = units.UnitSource([big_warc], Analyzer(Settings()), _Pool(worker))  # type: ignore[arg-type]
    told: list[bool] = []
    analyze = Analyzer.analyze

    def analysing(self: Analyzer, page: Page) -> object:
        told.append(worker.in_parent(analysis.raw_fingerprint(page.body)))
        return analyze(self, page)

    monkeypatch.setattr(Analyzer, "analyze", analysing)
    here = source._here(units.Slot(first))
    assert len(told) > 10 and all(told)
    monkeypatch.setattr(Analyzer, "analyze", analyze)
    packed = unit_read.worker_read(first)
    assert all(isinstance(r, int) for r in packed.rows if r is not None)
    _same_analyses(unit_read.unpack(packed, None, source._shared.recall), here)
