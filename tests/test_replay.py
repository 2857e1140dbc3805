"""Replay over a crawl the tests generate themselves, through the CLI."""

from __future__ import annotations

import base64
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from opskit import alive, children, identity, proc_stat, wait_for
from schemakit import decisions_in
from test_units import _ready_pool
from warcgen import split_cases

from stream_dedup import Deduplicator, Settings
from stream_dedup.cli.main import main
from stream_dedup.cli.sample import build, write_sample
from stream_dedup.cli.settings import SECRETS
from stream_dedup.metrics import Metrics
from stream_dedup.replay.run import EARLY_START_BYTES, replay
from stream_dedup.sinks.files import MemorySink


@pytest.fixture(scope="module")
def sample(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, list]:  # type: ignore[type-arg]
    return write_sample(tmp_path_factory.mktemp("crawl"))


def _run(tmp_path: Path, *args: str) -> list[dict]:  # type: ignore[type-arg]
    out = tmp_path / "decisions.jsonl"
    assert main(["replay", *args, "-o", str(out), "-q"]) == 0
    return decisions_in(out.read_text().splitlines())  # each checked against the schema


def test_golden_decisions_in_input_order(sample, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    warc, jsonl, pages = sample
    summary_path = tmp_path / "summary.json"
    got = _run(tmp_path, str(warc), str(jsonl), "--summary-json", str(summary_path),
               "--dead-letter", str(tmp_path / "dead.jsonl"))
    expected = [(p.url, *p.expected) for p in pages] + [(None, "reject", "bad-json")]
    # the WARC's revisit record (after its responses) of the first page, which was kept
    revisit = (pages[0].url, "drop", "unchanged")
    last_response = max(i for i, d in enumerate(got) if warc.name in (d["source"] or "#"))
    expected.insert(last_response, revisit)
    assert [(d["url"], d["decision"], d["reason"]) for d in got] == expected
    assert got[expected.index(revisit)]["previous"]["match"] == "revisit"
    # every drop names the page it duplicates: the article it was derived from
    for d in got:
        if d["decision"] == "drop" and d["reason"] != "unchanged":
            assert d["url"].startswith(d["duplicate_of"]["url"])
        if d["reason"] == "near":
            assert d["verified"] and d["resemblance"] >= 0.8
    summary = json.loads(summary_path.read_text())
    assert summary["pages"] == len(expected)
    assert summary["rejected"] == 1
    assert summary["skipped_records"] == {"non-html": 1}
    assert summary["verification"]["confirmed"] == sum(p.expected[1] == "near" for p in pages)
    # what a machine is sized by: this process's resident set with the index held, and its
    # peak (never below it)
    memory = summary["memory"]
    assert 10 * 2**20 < memory["rss"] <= memory["peak_rss"]
    dead = [json.loads(x) for x in (tmp_path / "dead.jsonl").read_text().splitlines()]
    lines = len(jsonl.read_text().splitlines())
    assert [(d["error"], d["source"]) for d in dead] == [("bad-json", f"{jsonl}#{lines}")]


def test_workers_give_the_same_decisions(sample, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    warc, jsonl, _ = sample
    one = _run(tmp_path, str(warc), str(jsonl))
    two = _run(tmp_path, str(warc), str(jsonl), "--workers", "2")
    assert one == two


CORPUS = Path(__file__).parents[2] / "shared" / "corpora" / "warc"
# Real files beside the generated ones when the corpus is here: WARC with revisits and
# pages without a payload digest, record-gzipped ARC, plain ARC v1 without separators.
CORPUS_FILES = ("aut/example.warc.gz", "aut/example.arc.gz",
                "copycat/wayback-snapshot-wayback-topic-02.warc.gz",
                "copycat/commoncrawl-small-sample-1262850551027_8.arc")


@pytest.fixture(scope="module")
def split_archives(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return split_cases(tmp_path_factory.mktemp("split"), [p.html.encode() for p in build(11)])


@pytest.mark.parametrize("workers", ["2", "3"])
def test_archives_read_in_parts_give_byte_identical_outputs(
        split_archives: dict[str, Path], sample, tmp_path: Path,  # type: ignore[no-untyped-def]
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        workers: str) -> None:
    """`replay --workers N` with the workers reading archives cut into parts (the traps
    of warcgen.split_cases, the sample, corpus files): the decisions and the dead letters,
    byte for byte, of --workers 1; the summary names the file that is one gzip stream
    once, with the fix."""
    from stream_dedup.replay import run as replay_module
    from stream_dedup.replay import units

    monkeypatch.setattr(replay_module, "EARLY_START_BYTES", 0)  # the workers read the input
    monkeypatch.setattr(units, "UNIT_BYTES", 8000)  # in parts, these files being small
    files = [*map(str, split_archives.values()), str(sample[0])]
    files += [str(CORPUS / f) for f in CORPUS_FILES if (CORPUS / f).is_file()]
    got = {}
    for w in ("1", workers):
        out, dead, summary = (tmp_path / f"{name}{w}" for name in ("out", "dead", "summary"))
        assert main(["replay", *files, "--workers", w, "-o", str(out), "--dead-letter",
                     str(dead), "--summary-json", str(summary)]) == 0
        got[w] = out.read_bytes(), dead.read_bytes(), json.loads(summary.read_text())
    assert got[workers][:2] == got["1"][:2] and got["1"][0].count(b"\n") > 100
    decisions_in(got["1"][0].splitlines())  # valid decisions (the workers': the same)
    assert got[workers][2]["unsplit_inputs"] == [str(split_archives["stream.warc.gz"])]
    assert got["1"][2]["unsplit_inputs"] == []  # one process reads everything anyway
    err = capsys.readouterr().err
    assert err.count("one gzip stream") == 1 and "warcio recompress" in err


def test_a_small_replay_starts_no_worker_process(sample, tmp_path: Path, monkeypatch,
                                                 caplog) -> None:  # type: ignore[no-untyped-def]
    from stream_dedup.pipeline import analysis

    started: list[int] = []
    monkeypatch.setattr(analysis, "worker_pool", lambda *a: started.append(1))
    warc, jsonl, _ = sample
    with caplog.at_level("INFO", logger="stream_dedup"):
        replay([warc, jsonl], MemorySink(), Settings(), workers=2)
    assert started == []
    assert "analysed in this process" in caplog.text


def test_worker_processes_and_read_ahead_give_the_same_decisions(
        sample, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The pool started before the first batch and used for every one (batches of 7, the
    next read while one is decided): the decisions of one process, in the same order."""
    from stream_dedup.pipeline import analysis
    from stream_dedup.replay import run as replay_module

    warc, jsonl, _ = sample
    settings = Settings(batch_size=7)
    one = MemorySink()
    replay([warc, jsonl], one, settings)
    pools: list[analysis.AnalysisPool] = []
    monkeypatch.setattr(replay_module, "AnalysisPool", _ready_pool(pools))
    monkeypatch.setattr(replay_module, "EARLY_START_BYTES", 0)
    two = MemorySink()
    replay([warc, jsonl], two, settings, workers=2)
    assert pools and pools[0].starts == 1
    assert two.decisions == one.decisions and len(one.decisions) > 20


def test_missing_input_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay", str(tmp_path / "nope.warc.gz"), "-o", str(tmp_path / "o")]) == 2
    assert "no such input file" in capsys.readouterr().err
    got = _run(tmp_path, str(tmp_path / "nope.warc.gz"), "--allow-bad-inputs")
    assert [(d["decision"], d["reason"]) for d in got] == [("reject", "unreadable-file")]


def test_replay_decides_in_batches_of_the_batch_size(sample) -> None:  # type: ignore[no-untyped-def]
    warc, jsonl, pages = sample
    metrics = Metrics(Settings(), process=False)
    summary = replay([warc, jsonl], MemorySink(), Settings(batch_size=7), metrics=metrics)
    batches = metrics.registry.get_sample_value("stream_dedup_batches_total")
    # the pages, the revisit record, the line that is not JSON
    assert summary.pages == len(pages) + 2 and batches == -(-summary.pages // 7)


def test_replay_applies_the_retention_window(tmp_path: Path) -> None:
    """Pages crawled in 2020, replayed into an index; replayed again with a retention of a
    day, they are forgotten before the first batch, so they are kept again."""
    crawl = tmp_path / "old.jsonl"
    crawl.write_text("".join(json.dumps({
        "url": f"https://old.example/{i}", "fetched_at": "2020-01-01T00:00:00Z",
        "html": f"<p>page {i} of an old crawl, long forgotten</p>"}) + "\n" for i in range(3)))
    index = ("--index", "lsm", "--index-path", str(tmp_path / "index"))
    assert {d["decision"] for d in _run(tmp_path, str(crawl), *index)} == {"keep"}
    assert {d["decision"] for d in _run(tmp_path, str(crawl), *index)} == {"drop"}
    again = _run(tmp_path, str(crawl), *index, "--retention-days", "1")
    assert {d["decision"] for d in again} == {"keep"}


def test_bad_settings_are_explained(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay", "x", "-o", "y", "--threshold", "9"]) == 2
    assert "threshold must be in 1..groups" in capsys.readouterr().err
    cfg = tmp_path / "c.toml"
    cfg.write_text("[stream_dedup]\nverify_rat = 0.5\n")
    assert main(["replay", "x", "-o", "y", "--config", str(cfg)]) == 2
    assert "unknown setting(s)" in capsys.readouterr().err


def test_env_settings_apply(sample, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    warc, jsonl, _ = sample
    monkeypatch.setenv("STREAM_DEDUP_VERIFY_RATE", "0")
    got = _run(tmp_path, str(warc))
    near = [d for d in got if d["reason"] == "near"]
    assert near and not any(d["verified"] for d in near)


def test_curve_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    png = tmp_path / "curve.png"
    assert main(["curve", "--points", "6", "--png", str(png)]) == 0
    out = capsys.readouterr().out
    assert "50% point rho = 0.909" in out
    assert out.count("\n") >= 9
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_file_given_twice_is_read_once(sample, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The same file twice (a repeated path, overlapping globs, a symlink) is read once and
    the summary says so; a copy under another name is new input: all duplicates. Either
    way what the summary calls kept is what the index holds, and no page id is reused."""
    warc, _, _ = sample
    link, copy = tmp_path / "link.warc.gz", tmp_path / "copy.warc.gz"
    link.symlink_to(warc)
    copy.write_bytes(warc.read_bytes())
    once = replay([warc], MemorySink(), Settings(batch_size=4))
    for paths, repeated in (([warc, warc, link], 2), ([warc, copy], 0)):
        sink = MemorySink()
        summary = replay(paths, sink, Settings(batch_size=4))
        kept = [d.page_id for d in sink.decisions if d.decision == "keep"]
        assert summary.count("keep") == once.count("keep") == summary.index["pages"]
        assert len(set(kept)) == len(kept) == summary.count("keep")
        assert len(summary.repeated) == repeated
        assert "read once" in summary.render() if repeated else "read once" not in summary.render()
    assert summary.pages == 2 * once.pages  # the copy: every page decided, none kept


def test_a_second_replay_on_the_same_deduplicator_remembers_the_first(sample) -> None:  # type: ignore[no-untyped-def]
    """A file source never claims re-deliveries: replayed again into the same index, a
    file's pages are duplicates of what the index holds, not the first run's decisions."""
    warc, _, _ = sample
    dd = Deduplicator()
    first = replay([warc], MemorySink(), dedup=dd)
    sink = MemorySink()
    replay([warc], sink, dedup=dd)
    assert first.count("keep") == len(dd.index) > 0
    assert not [d for d in sink.decisions if d.decision == "keep"]


@pytest.mark.parametrize("make", ["directory", "empty", "text", "empty-jsonl"])
def test_an_unreadable_input_is_named_and_fails_the_run(
    sample, tmp_path: Path, capsys: pytest.CaptureFixture[str], make: str,  # type: ignore[no-untyped-def]
) -> None:
    warc, _, _ = sample
    bad = tmp_path / {"directory": "d", "empty": "e.warc.gz", "text": "notes.txt",
                      "empty-jsonl": "e.jsonl"}[make]
    if make == "directory":
        bad.mkdir()
    else:
        bad.write_text("just some notes\n" if make == "text" else "")
    out, summary = tmp_path / "o.jsonl", tmp_path / "s.json"
    assert main(["replay", str(warc), str(bad), "-o", str(out),
                 "--summary-json", str(summary)]) == 1
    err = capsys.readouterr().err
    assert "UNREADABLE INPUTS (1)" in err and f"\n  {bad}" in err and "--allow-bad-inputs" in err
    assert json.loads(summary.read_text())["unreadable_inputs"][0].startswith(str(bad))
    assert main(["replay", str(warc), str(bad), "-o", str(out), "--allow-bad-inputs",
                 "-q"]) == 0
    assert "unreadable input: " + str(bad) in capsys.readouterr().err


@pytest.mark.parametrize(("args", "message"), [
    (["--index-path", "idx"], "--index-path is where an LSM index lives"),
    (["--to-kafka", "pages"], "-o/--output and --to-kafka exclude each other"),
    (["-o", "no/such/dir/out.jsonl"], "the directory no/such/dir does not exist"),
    (["--dead-letter", "no/such/dir/dead.jsonl"], "--dead-letter no/such/dir/dead.jsonl:"),
])
def test_options_that_cannot_work_are_one_line_errors(
    sample, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,  # type: ignore[no-untyped-def]
    args: list[str], message: str,
) -> None:
    monkeypatch.chdir(tmp_path)
    warc, _, _ = sample
    output = [] if "-o" in args else ["-o", "out.jsonl"]
    assert main(["replay", str(warc), *output, *args]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err
    assert not (tmp_path / "idx").exists()


def test_curve_plot_is_titled_in_words_labelled_and_ranged(tmp_path: Path) -> None:
    from stream_dedup.cli.curve import curve_figure

    ax = curve_figure(6, 14, 2, 0.7, 0.95).axes[0]
    assert ax.get_title() == "P(candidate) for 6 features of 14 min-hashes, r = 2"
    assert ax.get_xlim() == (0.7, 0.95)
    xs = ax.get_lines()[0].get_xdata()
    assert (min(xs), max(xs)) == (0.7, 0.95)
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "50 % at rho = 0.909" in legend
    assert main(["curve", "--low", "0.9", "--high", "0.8"]) == 2


def test_serve_help_shows_every_setting_with_its_env_variable_and_default(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """One table builds the flags: a setting added to Settings without a flag fails here."""
    from dataclasses import fields

    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines anywhere
    text = text.replace("- ", "-")  # ... even inside a default (pages-dead- letter)
    for f in fields(Settings):
        if not f.init:
            continue
        env = f"STREAM_DEDUP_{f.name.upper()}"
        assert env in text, f.name
        if f.name in SECRETS:  # environment, config file or a file, never a flag
            assert "--" + f.name.replace("_", "-") + " " not in text, f.name
            continue
        flag = "--" + f.name.replace("_", "-")
        assert f"{flag} " in text, f.name
        shown = ("on" if f.default else "off") if isinstance(f.default, bool) else (
            repr(f.default) if f.default == "" else str(f.default))
        assert f"[env {env}, default {shown}]" in text, f.name
    assert "(default info)" in text  # --log-level


# --- `--workers` on a large input: the workers are forked from replay ---------------------
GONE_WITHIN_S = 30.0


@pytest.fixture(scope="module")
def slow_crawl(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A JSONL crawl past replay's EARLY_START_BYTES (its workers read it) whose pages take
    ~0.07 s each to analyse (deep nesting, each other bytes): replay runs for seconds, the
    workers busy. The size is a field no reader looks at, on the last line."""
    lines = [json.dumps({"url": f"https://slow.example/{i}", "body_b64": base64.b64encode(
        b"<div>" * 7956 + f"page {i}".encode()).decode()}) for i in range(200)]
    lines.append(json.dumps({"url": "https://slow.example/pad", "body_b64": "",
                             "pad": "x" * EARLY_START_BYTES}))
    path = tmp_path_factory.mktemp("slow") / "slow.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _replay_with_forked_worker(crawl: Path, tmp_path: Path):  # type: ignore[no-untyped-def]
    """`replay --workers 2` in a session of its own, once its worker runs: the process and
    its worker, forked from it (the same command line: no forkserver between them)."""
    # SIGINT as a terminal gives it, whatever this suite inherited: a shell ignores it in
    # a command it starts in the background ("cmd &" without job control), and an
    # ignored signal stays ignored through exec.
    proc = subprocess.Popen([sys.executable, "-m", "stream_dedup", "replay", str(crawl),
                             "--workers", "2", "-o", str(tmp_path / "out.jsonl")],
                            stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=_default_sigint)

    def worker() -> int | None:
        for pid in children(proc.pid):
            try:
                # (the parent's command line read now: just after Popen it may still be
                # this process's, not yet replaced by the exec)
                own = Path(f"/proc/{proc.pid}/cmdline").read_bytes()
                if Path(f"/proc/{pid}/cmdline").read_bytes() == own and \
                        (proc_stat(pid) or ["S"])[0] == "R":
                    return pid
            except OSError:
                pass
        return None

    seen: list[int] = []

    def found() -> bool:
        seen.extend(pid for pid in [worker()] if pid is not None)
        return bool(seen) or proc.poll() is not None

    wait_for("a forked worker running", found, timeout=60)
    assert seen, proc.communicate()[1][-3000:]
    pid = seen[0]
    time.sleep(0.3)
    return proc, identity(pid)


def _gone(ident: tuple[int, str]) -> bool:
    deadline = time.monotonic() + GONE_WITHIN_S
    while alive(ident) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not alive(ident)


@pytest.mark.slow
@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_a_stop_signal_to_the_group_ends_replay_and_its_forked_workers(
        slow_crawl: Path, tmp_path: Path, sig: str) -> None:
    """Ctrl-C (SIGINT to the process group): replay says it was interrupted (130), with no
    traceback, and no worker outlives it; a SIGTERM, which replay does not catch, ends it
    and its workers as well."""
    proc, worker = _replay_with_forked_worker(slow_crawl, tmp_path)
    os.killpg(proc.pid, getattr(signal, sig))
    _, err = proc.communicate(timeout=60)
    if sig == "SIGINT":
        assert proc.returncode == 130 and "interrupted" in err, err[-3000:]
        for sign in ("Traceback", "BrokenProcessPool"):
            assert sign not in err, err[-3000:]
    else:
        assert proc.returncode == -signal.SIGTERM, err[-3000:]
    assert _gone(worker), f"a worker still runs {GONE_WITHIN_S} s after replay ended"


def test_the_forked_workers_of_a_killed_replay_exit(slow_crawl: Path, tmp_path: Path) -> None:
    proc, worker = _replay_with_forked_worker(slow_crawl, tmp_path)
    proc.kill()
    proc.communicate(timeout=60)
    assert _gone(worker), f"a worker still runs {GONE_WITHIN_S} s after SIGKILL of replay"


@pytest.mark.parametrize("workers", [1, 2])
def test_a_reader_that_stops_reading_ends_replay_quietly(
        slow_crawl: Path, workers: int) -> None:
    """`replay ... -o - | head -1`: once the reader is gone, replay stops with SIGPIPE's
    status, no traceback, and leaves no worker behind."""
    with subprocess.Popen([sys.executable, "-m", "stream_dedup", "replay", str(slow_crawl),
                           "--workers", str(workers), "--batch-size", "10", "-o", "-", "-q"],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          start_new_session=True) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        first = proc.stdout.readline()  # the first batch's: 190 pages are still to come
        assert json.loads(first)["url"] == "https://slow.example/0"
        proc.stdout.close()
        err = proc.stderr.read().decode()
        assert proc.wait(timeout=60) == 128 + signal.SIGPIPE, err
    assert "Traceback" not in err and "Error" not in err, err
    wait_for("no process of the replay's group left", lambda: not _group(proc.pid), timeout=10)


def _group(pgid: int) -> list[int]:
    """The processes still in a process group."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            found.append(int(stat.parent.name))
    return found


def test_a_replay_without_a_metrics_reader_keeps_no_metrics(sample, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Without --http-port nobody reads a replay's metrics: prometheus_client (and tqdm,
    under -q) is not even imported; with the port, prometheus_client is."""
    warc, _, _ = sample
    code = ("import sys; from stream_dedup.cli.main import main; "
            f"main(['replay', {str(warc)!r}, '-q', '-o', {os.devnull!r}] + sys.argv[1:]); "
            "print(sorted(m for m in ('prometheus_client', 'tqdm') if m in sys.modules))")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    quiet = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           env=env, timeout=120, check=True)
    assert quiet.stdout.strip().splitlines()[-1] == "[]"
    with socket.socket() as free:  # a port of its own (0 is "no HTTP server")
        free.bind(("127.0.0.1", 0))
        port = str(free.getsockname()[1])
    served = subprocess.run([sys.executable, "-c", code, "--http-port", port],
                            capture_output=True, text=True, env=env, timeout=120, check=True)
    assert served.stdout.strip().splitlines()[-1] == "['prometheus_client']"
