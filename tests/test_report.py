"""`stream-dedup report`: the page, read back from a real browser (headless Chromium over
the DevTools protocol, tests/browserkit.py), and its answers to bad input.

The corpus test replays the WARC corpus and the HTTP drafts with `replay --report`, renders
the page, and checks what a person would see: the totals equal the decisions', each
decision and reason is there with its count, drops are shown side by side with both URLs
and both texts, the page's one script ran, nothing was fetched and nothing went wrong in
the console. Its screenshot is kept in tests/artifacts/ (not in git) and must be a real
picture."""

from __future__ import annotations

import base64
import gzip
import io
import json
import shutil
from collections import Counter
from pathlib import Path

import pytest
from browserkit import chromium, render
from PIL import Image
from test_corpus import CORPORA, HTTPBIS, WARCS, httpbis_in_revision_order

from stream_dedup.cli.main import main
from stream_dedup.cli.sample import write_sample

ARTIFACTS = Path(__file__).resolve().parent / "artifacts"


@pytest.fixture
def browser() -> None:
    """As the other system tools: missing, the test fails here, saying so (tests/run
    installs it)."""
    if chromium() is None:
        pytest.fail("chromium is not installed (tests/run installs it; apt-get install chromium)")

# What the page shows, read from the rendered DOM
DOM = """(() => {
  const q = (s, el) => Array.from((el || document).querySelectorAll(s));
  const count = el => Number(el.querySelector("td.count").dataset.count);
  return {
    pages: Number(document.querySelector("#totals tr.total td.count").dataset.count),
    outcomes: Object.fromEntries(q("#totals tr.outcome").map(r => [r.dataset.decision, count(r)])),
    reasons: q("#totals tr.reason").map(r => [r.dataset.decision, r.dataset.reason, count(r)]),
    pairs: q("article.pair").map(a => ({
      reason: a.dataset.reason,
      urls: q(".head .url, .other .url", a).map(u => u.textContent),
      texts: q(".sbs .words", a).map(w => w.textContent),
      marked: q(".sbs mark", a).length})),
    scripts: document.scripts.length,
    views: document.documentElement.getAttribute("data-views"),
    notes: q("#notes li").map(li => li.textContent),
    clusterLinks: q("#clusters a[href^='#pair-']").length,
    charts: q("svg.chart").length,
  };
})()"""


def _decisions(path: Path) -> list[dict]:  # type: ignore[type-arg]
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _keep_artifacts(*files: Path) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    for f in files:
        shutil.copy(f, ARTIFACTS / f.name)


def _a_real_picture(png: bytes) -> Image.Image:
    assert png.startswith(b"\x89PNG\r\n\x1a\n")
    img = Image.open(io.BytesIO(png))
    img.load()
    assert img.format == "PNG" and img.width >= 1000 and img.height >= 1500, img.size
    colours = img.convert("RGB").getcolors(maxcolors=1 << 22)
    assert colours is not None and len(colours) >= 200, len(colours or ())  # text, charts
    top = max(n for n, _ in colours)
    assert top < 0.9 * img.width * img.height  # not a blank page with a few marks
    return img


@pytest.mark.corpus
@pytest.mark.skipif(not CORPORA.is_dir(), reason="../shared/corpora is not here")
@pytest.mark.usefixtures("browser")
def test_the_report_of_a_corpus_replay_renders_in_chromium(tmp_path: Path) -> None:
    drafts = tmp_path / "httpbis.jsonl"
    with open(drafts, "w") as fh:
        for rel in httpbis_in_revision_order():
            body = (HTTPBIS / rel).read_bytes()
            fh.write(json.dumps({"url": f"https://drafts.example/{rel}",
                                 "body_b64": base64.b64encode(body).decode(),
                                 "headers": {"Content-Type": "text/html"}}) + "\n")
    warcs = sorted(str(p) for p in WARCS.rglob("*") if ".arc" in p.name or ".warc" in p.name)
    out, report = tmp_path / "decisions.jsonl", tmp_path / "report.html"
    assert main(["replay", *warcs, str(drafts), "-o", str(out), "--report", str(report),
                 "-q", "--allow-bad-inputs"]) == 0
    decisions = _decisions(out)
    assert report.stat().st_size < 3 << 20  # a sample, not a dump
    seen = render(report, DOM)
    shot = tmp_path / "report.png"
    shot.write_bytes(seen.screenshot)
    _keep_artifacts(report, shot)

    assert seen.errors == [] and seen.requests == [report.resolve().as_uri()]
    dom = seen.value
    assert dom["pages"] == len(decisions)
    assert dom["outcomes"] == dict(Counter(d["decision"] for d in decisions))
    assert Counter({(d, r): n for d, r, n in dom["reasons"]}) == \
        Counter((d["decision"], d["reason"]) for d in decisions)
    assert dom["scripts"] == 1 and dom["views"] == str(len(dom["pairs"]))  # the script ran
    drops = [p for p in dom["pairs"] if p["reason"] not in ("verified-distinct",)]
    assert len(drops) >= 10
    by_url = {d["url"]: d for d in decisions}
    for p in drops:  # both URLs, and the dropped page names the other
        assert len(p["urls"]) == 2, p
        assert p["urls"][0] in by_url
    both = [p for p in drops if len(p["texts"]) == 2 and all(p["texts"])]
    assert len(both) >= 10  # found in the crawls and shown side by side
    assert any(p["marked"] for p in both if p["reason"] in ("near", "near-verified"))
    assert {p["reason"] for p in drops} >= {"exact", "near"}
    assert dom["clusterLinks"] >= 1 and dom["charts"] >= 4
    _a_real_picture(seen.screenshot)


def _jsonl(path: Path, pages: list[tuple[str, str]]) -> Path:
    with open(path, "w") as fh:
        for url, html in pages:
            fh.write(json.dumps({"url": url, "html": html}) + "\n")
    return path


def _words(n: int, seed: int = 0) -> str:
    return " ".join(f"w{(i * 7919 + seed) % 100_003}" for i in range(n))


@pytest.mark.usefixtures("browser")
def test_hostile_text_and_urls_render_as_text(tmp_path: Path) -> None:
    hostile = "&lt;script&gt;document.title='pwned'&lt;/script&gt;"
    base = _words(400)
    crawl = _jsonl(tmp_path / "hostile.jsonl", [
        ("https://a.example/x?q=\"'><script>document.title='pwned'</script>",
         f"<p>{hostile} {base}</p>"),
        ("https://a.example/y\"onmouseover=\"alert(1)", f"<p>{hostile} {base} extra words</p>"),
        ("javascript:alert(3)//", f"<p>{hostile} {base}</p>"),
    ])
    out, report = tmp_path / "d.jsonl", tmp_path / "r.html"
    assert main(["replay", str(crawl), "-o", str(out), "-q", "--report", str(report)]) == 0
    html = report.read_text()
    assert "<script>document" not in html and "&lt;script&gt;document" in html
    assert 'href="javascript:' not in html
    seen = render(report, DOM + ".pairs.map(p => p.texts.join('|') + p.urls.join('|'))"
                  " + '#' + document.title + '#' + document.scripts.length")
    shown, title, scripts = seen.value.rsplit("#", 2)
    assert title == "stream-dedup report" and scripts == "1" and seen.errors == []
    assert "<script>document.title='pwned'</script>" in shown  # as text, on the page
    assert "y\"onmouseover=\"alert(1)" in shown


def test_bad_input_is_said_in_the_page(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                       ) -> None:
    warc, jsonl, _ = write_sample(tmp_path / "crawl")
    out = tmp_path / "d.jsonl"
    assert main(["replay", str(warc), "-o", str(out), "-q"]) == 0
    report = tmp_path / "r.html"
    # a crawl given as the decisions: not a decisions file, still a page; exit 1
    assert main(["report", str(warc), "-o", str(report)]) == 1
    assert "holds no decisions" in report.read_text()
    # some lines broken: counted and named, the rest shown
    lines = out.read_text().splitlines()
    broken = tmp_path / "broken.jsonl"
    broken.write_bytes(("\n".join(lines[:3]) + "\n{not json\n[1]\n\xff\n").encode("latin-1")
                       + "\n".join(lines[3:]).encode() + b"\n")
    assert main(["report", str(broken), str(warc), "-o", str(report)]) == 1
    page = report.read_text()
    assert "3 line(s) of the decisions were not decisions" in page and "line 4: not JSON" in page
    assert f'data-count="{len(lines)}"' in page
    # a crawl that does not hold the pages named: said, and the views are still there
    capsys.readouterr()
    assert main(["report", str(out), str(jsonl), "-o", str(report)]) == 0
    assert "no crawl file given matches" in capsys.readouterr().err
    assert "no crawl file given matches" in report.read_text()
    assert 'class="pair' in report.read_text()
    # decisions only: no texts, and says how to get them
    assert main(["report", str(out), "-o", str(report)]) == 0
    assert 'class="sbs"' not in report.read_text()
    assert "Give the crawl files" in report.read_text()
    # usage errors: exit 2, nothing written
    assert main(["replay", str(warc), "-o", "-", "-q", "--report", str(tmp_path / "x.html")]) == 2
    assert main(["report", str(tmp_path / "missing.jsonl"), "-o", str(tmp_path / "x.html")]) == 2
    assert main(["report", str(out), "-o", str(tmp_path / "no" / "x.html")]) == 2
    assert not (tmp_path / "x.html").exists()


def test_a_long_page_is_cut_and_the_view_says_so(tmp_path: Path) -> None:
    text = _words(5000)
    crawl = _jsonl(tmp_path / "long.jsonl", [("https://b.example/1", f"<p>{text}</p>"),
                                             ("https://b.example/2", f"<p>{text} more</p>")])
    gz = tmp_path / "long.jsonl.gz"
    gz.write_bytes(gzip.compress(crawl.read_bytes()))
    out, report = tmp_path / "d.jsonl", tmp_path / "r.html"
    assert main(["replay", str(gz), "-o", str(out), "-q", "--report", str(report)]) == 0
    assert [d["reason"] for d in _decisions(out)] == ["unique", "near"]
    page = report.read_text()
    assert "cut at 1,500 of 5,000 words" in page and "words the same" in page


def test_decisions_with_fields_of_any_type_are_reported_not_raised(tmp_path: Path) -> None:
    """A decisions file is input from anyone: each field of a real decision replaced by a
    value of every other JSON type still gives a page (the line counted or shown)."""
    warc, _, _ = write_sample(tmp_path / "crawl")
    out = tmp_path / "d.jsonl"
    assert main(["replay", str(warc), "-o", str(out), "-q"]) == 0
    real = [d for d in _decisions(out) if d["decision"] == "drop"][0]
    odd = [None, True, -1, 1e308, "x#y", "", [], ["a"], {}, {"page_id": [], "url": 5}]
    mangled = [{**real, name: value} for name in real for value in odd]
    bad = tmp_path / "mangled.jsonl"
    bad.write_text("\n".join(json.dumps(d) for d in mangled) + "\n")
    report = tmp_path / "r.html"
    assert main(["report", str(bad), str(warc), "-o", str(report)]) in (0, 1)
    page = report.read_text()
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
