"""Real pages from ../shared/corpora (third-party; read in place, never copied here).

Skipped when the folder is absent; CI has it.
"""

from __future__ import annotations

import base64
import csv
import json
from pathlib import Path

import numpy as np
import pytest

from stream_dedup import Settings
from stream_dedup.core import theory
from stream_dedup.replay.run import replay
from stream_dedup.sinks.files import MemorySink

CORPORA = Path(__file__).resolve().parents[2] / "shared" / "corpora"
HTTPBIS = CORPORA / "httpbis-drafts"
WARCS = CORPORA / "warc"

pytestmark = [
    pytest.mark.corpus,
    pytest.mark.skipif(not CORPORA.is_dir(), reason="../shared/corpora is not here"),
]


def httpbis_in_revision_order() -> list[str]:
    with open(HTTPBIS / "manifest.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    published = sorted((r for r in rows if r["set"] == "published"),
                       key=lambda r: (int(r["revision"]), r["doc"]))
    editors = sorted((r for r in rows if r["set"] != "published"), key=lambda r: r["path"])
    return [r["path"] for r in published + editors]


@pytest.fixture(scope="module")
def httpbis_jsonl(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("httpbis") / "httpbis.jsonl"
    with open(out, "w") as fh:
        for rel in httpbis_in_revision_order():
            body = (HTTPBIS / rel).read_bytes()
            fh.write(json.dumps({"url": rel, "body_b64": base64.b64encode(body).decode(),
                                 "headers": {"Content-Type": "text/html"}}) + "\n")
    return out


def test_httpbis_revisions_with_j8_at_least_095_are_dropped(httpbis_jsonl: Path) -> None:
    sink = MemorySink()
    summary = replay([httpbis_jsonl], sink, Settings())
    decision = {d.url: d for d in sink.decisions}
    assert summary.count("reject") == 0
    with open(HTTPBIS / "pairs_groundtruth.csv", newline="") as fh:
        pairs = [r for r in csv.DictReader(fh) if float(r["jaccard_w8"]) >= 0.95]
    order = {rel: i for i, rel in enumerate(httpbis_in_revision_order())}
    # Only kept pages are indexed (a dropped page is already represented downstream), so
    # the test covers pairs whose earlier revision was kept.
    pairs = [r for r in pairs if decision[min((r["a"], r["b"]), key=order.__getitem__)].decision
             == "keep"]
    assert len(pairs) >= 20
    later = [max((r["a"], r["b"]), key=order.__getitem__) for r in pairs]
    dropped = sum(decision[u].decision == "drop" for u in later)
    # Each later revision is dropped at least as often as the filter accepts its pair
    # (it may also match other earlier revisions). Allow 3 standard deviations.
    probs = np.array([theory.acceptance(float(r["jaccard_w8"])) for r in pairs])
    floor = probs.sum() - 3 * np.sqrt((probs * (1 - probs)).sum())
    assert dropped >= floor, (dropped, len(later), probs.sum())
    # and the far-apart pairs stay apart: cross-document negatives are never near-dups
    with open(HTTPBIS / "pairs_groundtruth.csv", newline="") as fh:
        negatives = [r for r in csv.DictReader(fh) if r["relation"] == "cross-document-negative"]
    for r in negatives:
        d = decision[max((r["a"], r["b"]), key=order.__getitem__)]
        other = min((r["a"], r["b"]), key=order.__getitem__)
        assert d.duplicate_of is None or d.duplicate_of.url != other


def test_every_warc_file_is_read_or_cleanly_rejected() -> None:
    files = sorted(p for p in WARCS.rglob("*") if ".arc" in p.name or ".warc" in p.name)
    assert len(files) >= 50
    sink = MemorySink()
    summary = replay(files, sink, Settings())
    assert summary.pages == len(sink.decisions) > 800
    short = [d for d in sink.decisions if d.short]
    assert len(short) >= 20  # real stubs, frames and error pages: the rule below is exercised
    for d in sink.decisions:
        assert d.decision in ("keep", "drop", "reject")
        if d.decision == "reject":
            assert d.error, d
        if d.short:  # short pages are only ever dropped by the exact layers
            assert d.reason in ("unique", "exact", "canonical", "changed", "unchanged")
            assert d.previous is None or d.previous.match in (None, "exact", "canonical")
    # the two aut files are the same 2008 crawl (ARC and WARC): the second copy is all dups
    aut_warc = [d for d in sink.decisions if "aut/example.warc.gz#" in (d.source or "")]
    if aut_warc:
        kept = [d for d in aut_warc if d.decision == "keep"]
        assert len(kept) <= 0.1 * len(aut_warc), [d.url for d in kept][:5]


def test_estimated_levenshtein_tracks_the_true_distance() -> None:
    """Coates' estimate (c=32, n=4) against the exact distances of pairs_groundtruth.csv."""
    from stream_dedup.core import ldsig
    from stream_dedup.core.canonical import canonicalize

    with open(HTTPBIS / "pairs_groundtruth.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))[::6]
    cache: dict[str, np.ndarray] = {}

    def codepoints(rel: str) -> np.ndarray:
        if rel not in cache:
            body = (HTTPBIS / rel).read_bytes()
            cache[rel] = canonicalize(body, "text/html", boilerplate=False).codepoints
        return cache[rel]

    errors = []
    for r in rows:
        a, b = codepoints(r["a"]), codepoints(r["b"])
        est = ldsig.estimate(ldsig.signature(a, 32, 4), ldsig.signature(b, 32, 4), 32)
        errors.append(abs(est - int(r["lev_distance"])) / max(a.shape[0], b.shape[0]))
    assert len(errors) >= 50
    assert np.median(errors) < 0.02 and np.percentile(errors, 90) < 0.1, (
        np.median(errors), np.percentile(errors, 90))
