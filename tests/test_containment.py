"""Containment (Broder 1997: c(A, B) = |S(A) ∩ S(B)| / |S(A)|) and clusters, in every
backend: a page inside an earlier kept one is dropped `contained`; a kept page lists the
earlier kept pages inside it; every decision names its cluster's kept page."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from stream_dedup import Deduplicator, Page, Settings
from stream_dedup.models import Decision

WORDS = [f"w{i}x" for i in range(20000)]


def _html(words: list[str], title: str = "t") -> bytes:
    return (f"<html><head><title>{title}</title></head><body><nav>home news</nav>"
            f"<p>{' '.join(words)}</p></body></html>").encode()


def _article(rng: random.Random, n: int = 600) -> list[str]:
    return [rng.choice(WORDS) for _ in range(n)]


def _reason(d: Decision) -> tuple[str, str]:
    return d.decision, d.reason


def test_an_excerpt_is_contained_and_an_extended_copy_contains(make_dedup) -> None:  # type: ignore[no-untyped-def]
    rng = random.Random(1)
    found = contains = 0
    for trial in range(12):  # candidates are found with chance: count, then bound
        dd = make_dedup()
        article = _article(rng)
        kept = dd.check(Page(f"https://news.example/{trial}", _html(article)))
        at = rng.randrange(0, 200)
        excerpt = dd.check(Page(f"https://digest.example/{trial}",
                                _html(article[at : at + 360], "digest")))
        assert excerpt.decision in ("keep", "drop")
        if excerpt.reason == "contained":
            found += 1
            assert excerpt.duplicate_of is not None
            assert excerpt.duplicate_of.page_id == kept.page_id == excerpt.cluster
            assert excerpt.containment is not None and excerpt.containment >= 0.9
            assert excerpt.jaccard is not None and excerpt.jaccard < 0.8
        else:
            assert _reason(excerpt) == ("keep", "unique") and not excerpt.contains
        longer = dd.check(Page(f"https://archive.example/{trial}",
                               _html(article + _article(rng, 500), "archive")))
        assert _reason(longer) == ("keep", "unique") and longer.cluster == longer.page_id
        if longer.contains:
            contains += 1
            assert longer.contains[0].page_id == kept.page_id
            assert longer.contains[0].containment >= 0.9
    # four stored containment keys find a page inside one 5/3 its size with chance ~0.97
    # (more with the band keys), and 8 asked keys the article inside the longer page with
    # ~0.998; 12 trials each
    assert found >= 6 and contains >= 5, (found, contains)


def test_what_is_not_contained_enough_is_kept() -> None:
    rng = random.Random(2)
    dd = Deduplicator()
    article = _article(rng)
    dd.check(Page("https://a.example/1", _html(article)))
    # a partial quote: a third of the page from the article, the rest new
    quote = article[:120] + _article(rng, 240)
    assert _reason(dd.check(Page("https://b.example/1", _html(quote)))) == ("keep", "unique")
    # too short to be contained anywhere (fewer than contain_min_shingles shingles: 29 words
    # and the title's and nav's 3 give 24)
    short = dd.check(Page("https://c.example/1", _html(article[300:329])))
    assert _reason(short) == ("keep", "unique")


def test_a_site_template_does_not_make_pages_contained() -> None:
    """Pages of one site share a template bigger than their text: the template's shingles
    are common, and no page is inside another."""
    rng = random.Random(3)
    template = _article(rng, 300)
    dd = Deduplicator()
    out = [dd.check(Page(f"https://site.example/{i}", _html(template + _article(rng, 60))))
           for i in range(30)]
    assert {d.reason for d in out} <= {"unique", "near-verified", "near"}
    assert not any(d.contains for d in out)


def test_containment_off_and_batches_decide_as_one_by_one() -> None:
    rng = random.Random(4)
    pages = []
    for i in range(8):
        article = _article(rng)
        pages += [Page(f"https://n.example/{i}", _html(article)),
                  Page(f"https://d.example/{i}", _html(article[100:460], "d")),
                  Page(f"https://x.example/{i}", _html(article + _article(rng, 400), "x"))]
    one = Deduplicator()
    singles = [one.check(p) for p in pages]
    together = Deduplicator().check_batch(pages)
    assert [(d.reason, d.contains, d.cluster) for d in singles] == [
        (d.reason, d.contains, d.cluster) for d in together]
    assert any(d.reason == "contained" for d in singles)
    off = Deduplicator(Settings(contain_min=0)).check_batch(pages)
    assert not any(d.reason == "contained" or d.contains for d in off)


def test_clusters() -> None:
    rng = random.Random(5)
    article = _article(rng)
    dd = Deduplicator(Settings(max_page_bytes=64_000))
    first = dd.check(Page("https://k.example/a", _html(article)))
    copy = dd.check(Page("https://m.example/a", _html(article)))
    again = dd.check(Page("https://k.example/a", _html(article)))
    bad = dd.check(Page("https://k.example/b", _html(article) * 20))  # past max_page_bytes
    assert first.cluster == first.page_id is not None
    assert copy.cluster == first.page_id and again.cluster == first.page_id
    assert _reason(bad) == ("reject", "too-large") and bad.cluster is None


def test_the_clusters_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import csv
    import json

    from stream_dedup.cli.main import main
    from stream_dedup.cli.sample import write_sample

    warc, jsonl, _ = write_sample(tmp_path / "crawl")
    out = tmp_path / "d.jsonl"
    assert main(["replay", str(warc), str(jsonl), "-o", str(out), "-q"]) == 0
    decisions = [json.loads(line) for line in out.read_text().splitlines()]
    (out.parent / "bad.jsonl").write_bytes(b'{"decision": "keep"\n[1]\n{"url": "\xff"}\n')
    capsys.readouterr()
    assert main(["clusters", str(out), "--top", "3", "--csv", str(tmp_path / "p.csv")]) == 0
    text = capsys.readouterr().out
    clusters = {d["cluster"] for d in decisions if d["decision"] != "reject"}
    assert text.startswith(f"pages {len(decisions)}: {len(clusters)} clusters")
    with open(tmp_path / "p.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == len(decisions)
    kept = {d["page_id"]: d["url"] for d in decisions if d["decision"] == "keep"}
    for row, d in zip(rows, decisions, strict=True):
        if d["decision"] != "reject":
            assert row["cluster_url"] == kept[d["cluster"]]
    # a file written before ids were strings (ints): the same clusters, the same report
    old = out.parent / "old.jsonl"
    old.write_text("".join(json.dumps(_with_int_ids(d)) + "\n" for d in decisions))
    assert main(["clusters", str(old), "--top", "3"]) == 0
    assert capsys.readouterr().out == text
    assert main(["clusters", str(out.parent / "bad.jsonl")]) == 1
    assert "UNREADABLE LINES (3)" in capsys.readouterr().out  # bad UTF-8: one line, no crash
    assert main(["clusters", str(tmp_path / "missing.jsonl")]) == 2


def _with_int_ids(d: dict[str, Any]) -> dict[str, Any]:
    """A decision as written before ids became strings."""
    def num(x: Any) -> Any:
        return None if x is None else int(x)
    out = {**d, "page_id": num(d["page_id"]), "cluster": num(d["cluster"])}
    for name in ("duplicate_of", "previous"):
        if d[name] is not None:
            out[name] = {**d[name], "page_id": int(d[name]["page_id"])}
    out["contains"] = [{**c, "page_id": int(c["page_id"])} for c in d["contains"]]
    return out
