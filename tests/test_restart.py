"""Persistent index through the CLI: restarts are invisible, bad directories are refused."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from test_service import service  # noqa: F401  (the fixture)

from stream_dedup.cli.main import main
from stream_dedup.cli.sample import build, write_jsonl


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


# --- the Kafka service: a crash with a batch in flight over several partitions -------------
def _near_pairs(n: int, seed: int = 11) -> list[tuple[str, str]]:
    """n articles and a copy of each with two words changed (near-duplicates)."""
    import random

    from opskit import _WORDS, html

    rng = random.Random(seed)
    pairs = []
    for _ in range(n):
        words = [rng.choice(_WORDS) for _ in range(400)]
        edited = list(words)
        for i in rng.sample(range(len(words)), 2):
            edited[i] = "zq" + edited[i]
        pairs.append((html([" ".join(words)]), html([" ".join(edited)])))
    return pairs


@pytest.mark.slow
@pytest.mark.kafka
def test_lsm_restart_decides_the_batch_in_flight_as_before(
        kafka_bootstrap: str, service, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    """Pairs of near-duplicates spread over two partitions. The service dies after sending a
    batch's decisions and before committing it, and restarts with another batch size: a
    redelivered batch cut differently would decide some pairs the other way round (keep <->
    drop, and a page dropped on the decisions topic but present on the kept topic)."""
    from test_service import create_topics, decisions_of, kcat_consume, names

    b, t = kafka_bootstrap, names("inflight")
    create_topics(b, [t["input"]], partitions=3)
    for i, (one, other) in enumerate(_near_pairs(40)):
        first, second = (0, 1) if i % 2 else (1, 0)
        for part, page in ((first, one), (second, other)):
            line = json.dumps({"url": f"https://p.example/{i}/{part}", "html": page})
            subprocess.run(["kcat", "-P", "-b", b, "-t", t["input"], "-p", str(part)],
                           input=line.encode(), check=True, timeout=60)
    lsm = ("--index", "lsm", "--index-path", str(tmp_path / "index"))
    crashed = service(t, *lsm, "--batch-size", "50", "--crash-at", "before-index-commit:1",
                      log="crash.log")
    assert crashed.wait(timeout=120) == 70
    first_time = {d["source"]: d for d in decisions_of(b, t["decisions"])}
    again = service(t, *lsm, "--batch-size", "7", log="again.log")

    def all_decided() -> bool:
        return len({d["source"] for d in decisions_of(b, t["decisions"])}) >= 80
    from opskit import wait_for
    wait_for("every page decided", all_decided, timeout=120)
    assert again.stop() == 0
    assert "as it was" in again.text()
    decisions: dict[str, set[tuple[str, str]]] = {}
    for d in decisions_of(b, t["decisions"]):
        decisions.setdefault(d["source"], set()).add((d["decision"], d["reason"]))
    assert len(first_time) == 50
    changed = [s for s, ds in decisions.items() if len(ds) > 1]
    assert changed == [], changed
    keeps = {d["url"] for d in decisions_of(b, t["decisions"]) if d["decision"] == "keep"}
    kept_urls = {json.loads(m["payload"])["url"] for m in kcat_consume(b, t["kept"])}
    assert kept_urls <= keeps and len(keeps) >= 40
