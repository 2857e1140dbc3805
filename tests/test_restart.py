"""Persistent index through the CLI: restarts are invisible, bad directories are refused."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from stream_dedup.cli import main
from stream_dedup.sample import build, write_jsonl


def _replay(out: Path, *args: str) -> list[dict]:  # type: ignore[type-arg]
    assert main(["replay", *args, "-o", str(out), "-q"]) == 0
    return [json.loads(line) for line in out.read_text().splitlines()]


@pytest.fixture(scope="module")
def halves(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("crawl")
    pages = [p for seed in range(40, 44) for p in build(seed=seed)]
    first, second = d / "first.jsonl", d / "second.jsonl"
    write_jsonl(pages[: len(pages) // 2], first)
    write_jsonl(pages[len(pages) // 2 :], second)
    return first, second


def _comparable(decisions: list[dict]) -> list[tuple]:  # type: ignore[type-arg]
    return [(d["url"], d["decision"], d["reason"], d["page_id"],
             d["duplicate_of"] and d["duplicate_of"]["url"], d["resemblance"])
            for d in decisions]


def test_two_halves_with_a_restart_equal_one_go(halves: tuple[Path, Path], tmp_path: Path) -> None:
    first, second = halves
    index = tmp_path / "index"
    a = _replay(tmp_path / "a.jsonl", str(first), "--index", "lsm", "--index-path", str(index))
    b = _replay(tmp_path / "b.jsonl", str(second), "--index", "lsm", "--index-path", str(index))
    whole = _replay(tmp_path / "w.jsonl", str(first), str(second), "--index", "lsm",
                    "--index-path", str(tmp_path / "fresh"))
    memory = _replay(tmp_path / "m.jsonl", str(first), str(second))
    assert _comparable(a + b) == _comparable(whole) == _comparable(memory)
    assert any(d["reason"] == "near" for d in b) and any(d["reason"] == "exact" for d in b)


def test_other_parameters_are_refused_and_nothing_is_overwritten(
        halves: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    first, _ = halves
    index = tmp_path / "index"
    _replay(tmp_path / "a.jsonl", str(first), "--index", "lsm", "--index-path", str(index))
    before = sorted((f.name, f.stat().st_size) for f in index.iterdir() if f.suffix == ".sst")
    code = main(["replay", str(first), "-o", str(tmp_path / "x"), "--index", "lsm",
                 "--index-path", str(index), "--shingle-words", "5"])
    assert code == 2
    assert "other sketch parameters" in capsys.readouterr().err
    after = sorted((f.name, f.stat().st_size) for f in index.iterdir() if f.suffix == ".sst")
    assert after == before


def test_a_directory_that_is_not_an_index_is_refused(
        halves: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    first, _ = halves
    (tmp_path / "photos").mkdir()
    (tmp_path / "photos" / "cat.jpg").write_bytes(b"\xff\xd8")
    code = main(["replay", str(first), "-o", str(tmp_path / "x"), "--index", "lsm",
                 "--index-path", str(tmp_path / "photos")])
    assert code == 2
    assert "holds no index" in capsys.readouterr().err
    assert [f.name for f in (tmp_path / "photos").iterdir()] == ["cat.jpg"]
    assert main(["replay", str(first), "-o", str(tmp_path / "x"), "--index", "lsm"]) == 2
    assert "--index-path" in capsys.readouterr().err


def test_full_disk_is_a_clear_error(halves: tuple[Path, Path], tmp_path: Path) -> None:
    mount = tmp_path / "small"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mount)],
                      capture_output=True).returncode != 0:
        pytest.skip("cannot mount a small tmpfs here (needs root)")
    try:
        first, second = halves
        out = subprocess.run(
            ["stream-dedup", "replay", str(first), str(second), "-o", str(tmp_path / "x"),
             "--index", "lsm", "--index-path", str(mount / "index")],
            capture_output=True, text=True, timeout=120)
        assert out.returncode == 2, out.stderr[-2000:]
        assert "No space left" in out.stderr or "no space" in out.stderr.lower()
    finally:
        subprocess.run(["umount", str(mount)], check=False)


def test_index_commands(halves: tuple[Path, Path], tmp_path: Path,
                        capsys: pytest.CaptureFixture[str]) -> None:
    first, _ = halves
    index = tmp_path / "index"
    decisions = _replay(tmp_path / "a.jsonl", str(first), "--index", "lsm",
                        "--index-path", str(index))
    kept = sum(d["decision"] == "keep" for d in decisions)
    capsys.readouterr()
    assert main(["index", "stats", "--index-path", str(index)]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["pages"] == kept
    assert main(["index", "compact", "--index-path", str(index)]) == 0
    assert main(["index", "export", str(tmp_path / "copy"), "--index-path", str(index)]) == 0
    capsys.readouterr()
    assert main(["index", "stats", "--index-path", str(tmp_path / "copy")]) == 0
    assert json.loads(capsys.readouterr().out)["pages"] == kept
    assert main(["index", "stats", "--index-path", str(tmp_path / "nothing")]) == 2
    assert "no index at" in capsys.readouterr().err
