"""Replay over a crawl the tests generate themselves, through the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stream_dedup import Settings
from stream_dedup.cli import main
from stream_dedup.metrics import Metrics
from stream_dedup.replay import replay
from stream_dedup.sample import write_sample
from stream_dedup.sinks import MemorySink


@pytest.fixture(scope="module")
def sample(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, list]:  # type: ignore[type-arg]
    return write_sample(tmp_path_factory.mktemp("crawl"))


def _run(tmp_path: Path, *args: str) -> list[dict]:  # type: ignore[type-arg]
    out = tmp_path / "decisions.jsonl"
    assert main(["replay", *args, "-o", str(out), "-q"]) == 0
    return [json.loads(line) for line in out.read_text().splitlines()]


def test_golden_decisions_in_input_order(sample, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    warc, jsonl, pages = sample
    summary_path = tmp_path / "summary.json"
    got = _run(tmp_path, str(warc), str(jsonl), "--summary-json", str(summary_path),
               "--dead-letter", str(tmp_path / "dead.jsonl"))
    expected = [(p.url, *p.expected) for p in pages] + [(None, "reject", "bad-json")]
    assert [(d["url"], d["decision"], d["reason"]) for d in got] == expected
    # every drop names the page it duplicates: the article it was derived from
    for d in got:
        if d["decision"] == "drop":
            assert d["url"].startswith(d["duplicate_of"]["url"])
        if d["reason"] == "near":
            assert d["verified"] and d["resemblance"] >= 0.8
    summary = json.loads(summary_path.read_text())
    assert summary["pages"] == len(expected)
    assert summary["rejected"] == 1
    assert summary["skipped_records"] == {"non-html": 1, "revisit": 1}
    assert summary["verification"]["confirmed"] == sum(p.expected[1] == "near" for p in pages)
    dead = [json.loads(x) for x in (tmp_path / "dead.jsonl").read_text().splitlines()]
    lines = len(jsonl.read_text().splitlines())
    assert [(d["error"], d["source"]) for d in dead] == [("bad-json", f"{jsonl}#{lines}")]


def test_workers_give_the_same_decisions(sample, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    warc, jsonl, _ = sample
    one = _run(tmp_path, str(warc), str(jsonl))
    two = _run(tmp_path, str(warc), str(jsonl), "--workers", "2")
    assert one == two


def test_a_small_replay_starts_no_worker_process(sample, tmp_path: Path, monkeypatch,
                                                 caplog) -> None:  # type: ignore[no-untyped-def]
    from stream_dedup import analysis

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
    from stream_dedup import analysis
    from stream_dedup import replay as replay_module

    warc, jsonl, _ = sample
    settings = Settings(batch_size=7)
    one = MemorySink()
    replay([warc, jsonl], one, settings)
    pools: list[analysis.AnalysisPool] = []

    class Ready(analysis.AnalysisPool):
        def start(self) -> None:
            super().start()
            if self not in pools:
                pools.append(self)
                assert self.wait_ready(60)

    monkeypatch.setattr(replay_module, "AnalysisPool", Ready)
    monkeypatch.setattr(replay_module, "EARLY_START_BYTES", 0)
    two = MemorySink()
    replay([warc, jsonl], two, settings, workers=2)
    assert pools and pools[0].starts == 1
    assert two.decisions == one.decisions and len(one.decisions) > 20


def test_missing_input_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay", str(tmp_path / "nope.warc.gz"), "-o", str(tmp_path / "o")]) == 2
    assert "no such input file" in capsys.readouterr().err
    got = _run(tmp_path, str(tmp_path / "nope.warc.gz"), "--keep-going")
    assert [(d["decision"], d["reason"]) for d in got] == [("reject", "unreadable-file")]


def test_replay_decides_in_batches_of_the_batch_size(sample) -> None:  # type: ignore[no-untyped-def]
    warc, jsonl, pages = sample
    metrics = Metrics(Settings(), process=False)
    summary = replay([warc, jsonl], MemorySink(), Settings(batch_size=7), metrics=metrics)
    batches = metrics.registry.get_sample_value("stream_dedup_batches_total")
    assert summary.pages == len(pages) + 1 and batches == -(-summary.pages // 7)


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
