"""Recrawls: a URL fetched again is `unchanged` or `changed`, never a duplicate of itself,
and the index holds one version per URL, in every backend."""

from __future__ import annotations

import base64
import hashlib
import random
from dataclasses import replace
from pathlib import Path

from stream_dedup import Deduplicator, Page, Settings
from stream_dedup.models import Decision, Revisit

WORDS = [f"w{i}x" for i in range(5000)]


def _html(words: list[str]) -> bytes:
    return f"<html><body><p>{' '.join(words)}</p></body></html>".encode()


def _edit(words: list[str], n: int, rng: random.Random) -> list[str]:
    """`n` consecutive words replaced (a date line, a counter: J8 ~0.89 for 10 of 300)."""
    out = list(words)
    at = rng.randrange(len(out) - n)
    out[at : at + n] = [f"edit{rng.randrange(10**6)}" for _ in range(n)]
    return out


def _reason(d: Decision) -> tuple[str, str]:
    return d.decision, d.reason


def test_the_five_lines_of_the_issue(make_dedup) -> None:  # type: ignore[no-untyped-def]
    """One URL fetched four times (same bytes; 10 of 300 words changed; all words
    changed), then a mirror of it on another host."""
    rng = random.Random(1)
    v1 = [rng.choice(WORDS) for _ in range(300)]
    v2 = _edit(v1, 10, rng)
    v3 = [rng.choice(WORDS) for _ in range(300)]
    url = "https://docs.example/a"
    pages = [Page(url, _html(v1), fetched_at="2026-01-01T00:00:00Z"),
             Page(url, _html(v1), fetched_at="2026-02-01T00:00:00Z"),
             Page("HTTPS://Docs.Example:443/a#top", _html(v2), fetched_at="2026-03-01T00:00:00Z"),
             Page(url, _html(v3), fetched_at="2026-04-01T00:00:00Z"),
             Page("https://mirror.example/a", _html(v3))]
    for batch in (1, 5):
        dd = make_dedup()
        out = [d for i in range(0, 5, batch) for d in dd.check_batch(pages[i : i + batch])]
        assert [_reason(d) for d in out] == [
            ("keep", "unique"), ("drop", "unchanged"), ("drop", "unchanged"),
            ("keep", "changed"), ("drop", "exact")]
        first = out[0].page_id
        assert out[1].previous is not None and out[1].previous.page_id == first
        assert (out[1].previous.match, out[1].previous.fetched_at) == (
            "exact", "2026-01-01T00:00:00Z")
        assert out[1].duplicate_of is None and out[1].fetched_at == "2026-02-01T00:00:00Z"
        sha1 = base64.b32encode(hashlib.sha1(_html(v1)).digest()).decode()
        assert out[1].payload_digest == "sha1:" + sha1
        near = out[2]
        assert near.previous is not None and near.previous.match == "near"
        assert near.jaccard is not None and 0.8 <= near.jaccard < 1.0 and near.verified
        changed = out[3]
        assert changed.previous is not None and changed.previous.page_id == first
        assert changed.payload_digest is None
        mirror = out[4]
        assert mirror.duplicate_of is not None and mirror.duplicate_of.url == url
        assert mirror.duplicate_of.page_id == changed.page_id and mirror.previous is None
        assert len(dd.index) == 1  # one URL held, in its newest version


def test_one_version_per_url_and_a_replaced_version_is_gone(make_dedup) -> None:  # type: ignore[no-untyped-def]
    """Many fetches of few URLs: the index holds one page a URL; a copy of a version that
    was replaced is new content (kept), a copy of the current one is dropped."""
    rng = random.Random(2)
    dd = make_dedup(batch_size=7)
    urls = [f"https://site.example/p{i}" for i in range(12)]
    current: dict[str, list[str]] = {}
    first_versions: dict[str, bytes] = {}
    for crawl in range(6):
        batch = []
        for url in urls:
            words = current.get(url) or [rng.choice(WORDS) for _ in range(200)]
            if crawl and rng.random() < 0.5:
                words = [rng.choice(WORDS) for _ in range(200)]  # a new release of the page
            current[url] = words
            first_versions.setdefault(url, _html(words))
            batch.append(Page(url, _html(words)))
        for d in dd.check_batch(batch):
            assert d.duplicate_of is None or d.duplicate_of.url != d.url
        assert len(dd.index) == len(urls)
    replaced = [u for u in urls if _html(current[u]) != first_versions[u]]
    assert replaced, "the seed gives some URLs a new version"
    old_copy = dd.check(Page("https://copy.example/old", first_versions[replaced[0]]))
    assert _reason(old_copy) == ("keep", "unique")
    new_copy = dd.check(Page("https://copy.example/new", _html(current[replaced[0]])))
    assert _reason(new_copy) == ("drop", "exact")
    assert new_copy.duplicate_of is not None and new_copy.duplicate_of.url == replaced[0]


def test_a_url_fetched_twice_in_one_batch_decides_as_one_by_one(make_dedup) -> None:  # type: ignore[no-untyped-def]
    rng = random.Random(3)
    a, b, c = ([rng.choice(WORDS) for _ in range(250)] for _ in range(3))
    pages = [Page("http://x/1", _html(a)), Page("http://x/1", _html(b)),
             Page("http://y/1", _html(a)), Page("http://x/1", _html(c)),
             Page("http://x/1", _html(c)), Page("http://z/1", _html(b))]
    one = make_dedup()
    singles = [one.check(p) for p in pages]
    together = make_dedup().check_batch(pages)
    assert [_reason(d) for d in singles] == [_reason(d) for d in together] == [
        ("keep", "unique"), ("keep", "changed"), ("keep", "unique"), ("keep", "changed"),
        ("drop", "unchanged"), ("keep", "unique")]
    assert len(one.index) == 3


def test_new_content_that_copies_another_url_is_dropped_against_it(make_dedup) -> None:  # type: ignore[no-untyped-def]
    """The URL's own version stays (a drop stores nothing); the decision names both."""
    rng = random.Random(4)
    a, b = ([rng.choice(WORDS) for _ in range(250)] for _ in range(2))
    dd = make_dedup()
    dd.check(Page("http://x/1", _html(a)))
    dd.check(Page("http://y/1", _html(b)))
    d = dd.check(Page("http://x/1", _html(b)))
    assert _reason(d) == ("drop", "exact")
    assert d.duplicate_of is not None and d.duplicate_of.url == "http://y/1"
    assert d.previous is not None and d.previous.url == "http://x/1"
    assert _reason(dd.check(Page("http://x/1", _html(a)))) == ("drop", "unchanged")


def test_short_pages_compare_exactly(make_dedup) -> None:  # type: ignore[no-untyped-def]
    dd = make_dedup()
    assert _reason(dd.check(Page("http://s/", b"<p>Hello there</p>"))) == ("keep", "unique")
    assert _reason(dd.check(Page("http://s/", b"<b>HELLO, there!</b>"))) == ("drop", "unchanged")
    assert _reason(dd.check(Page("http://s/", b"<p>Goodbye</p>"))) == ("keep", "changed")


def test_revisit_records(make_dedup) -> None:  # type: ignore[no-untyped-def]
    rng = random.Random(5)
    body = _html([rng.choice(WORDS) for _ in range(250)])
    dd = make_dedup()
    kept = dd.check(Page("http://r/1", body, fetched_at="2026-01-01T00:00:00Z"))
    profile = "http://netpreserve.org/warc/1.1/revisit/identical-payload-digest"
    same = dd.check(Page("http://r/1", b"", fetched_at="2026-02-01T00:00:00Z",
                         payload_digest="sha1:ABC", revisit=Revisit(profile, "http://r/1")))
    assert _reason(same) == ("drop", "unchanged")
    assert same.previous is not None and same.previous.page_id == kept.page_id
    assert (same.previous.match, same.payload_digest) == ("revisit", "sha1:ABC")
    other = dd.check(Page("http://r/2", b"", revisit=Revisit(profile, "http://r/1")))
    assert _reason(other) == ("drop", "unchanged")  # refers to r/1's version
    unknown = dd.check(Page("http://r/3", b"", revisit=Revisit(profile, None)))
    assert (unknown.decision, unknown.reason) == ("reject", "revisit-unknown")
    assert unknown.error is not None and "http://r/3" in unknown.error
    assert len(dd.index) == 1


def test_the_memory_index_lets_go_of_replaced_versions() -> None:
    """A URL's replaced versions leave the memory index's maps at the next flush or merge:
    what is held grows with URLs, not with fetches."""
    rng = random.Random(6)
    dd = Deduplicator(Settings(bands=5))
    urls = [f"https://v.example/{i}" for i in range(40)]
    for _ in range(50):  # 2,000 kept versions of 40 URLs
        dd.check_batch([Page(u, _html([rng.choice(WORDS) for _ in range(120)])) for u in urls])
    stats = dd.index.stats()
    assert stats["pages"] == len(dd.index) == 40
    assert stats["feature_entries"] < 0.3 * 2000 * 11  # 6 features, 5 band keys a page
    small = (*dd.index._exact, dd.index._urls)  # 2,000 entries each, in their memtables
    for entries in small:
        entries.flush()
    assert [len(m) for m in small] == [40, 40, 40]


def test_a_late_fetch_does_not_replace_a_newer_version(make_dedup) -> None:  # type: ignore[no-untyped-def]
    """Ids that are input positions sort by time: a fetch older than the URL's version
    (another partition behind) is unchanged if it is the same, else superseded; the newer
    version stays."""
    from stream_dedup.models import position_id

    rng = random.Random(8)
    old, new = ([rng.choice(WORDS) for _ in range(250)] for _ in range(2))
    at = 1_780_000_000_000
    dd = make_dedup()
    kept = dd.check(Page("http://l/1", _html(new), position=position_id(at + 60_000, 1, 9)))
    late = dd.check(Page("http://l/1", _html(old), position=position_id(at, 0, 4)))
    assert _reason(late) == ("drop", "superseded")
    assert late.previous is not None and late.previous.page_id == kept.page_id
    same = dd.check(Page("http://l/1", _html(new), position=position_id(at + 1, 0, 5)))
    assert _reason(same) == ("drop", "unchanged")
    newer = dd.check(Page("http://l/1", _html(old), position=position_id(at + 120_000, 0, 6)))
    assert _reason(newer) == ("keep", "changed") and len(dd.index) == 1


def test_the_url_map_survives_a_restart(tmp_path: Path) -> None:
    """LSM: the URL's version, and a replacement, are committed with the pages."""
    rng = random.Random(9)
    a, b = ([rng.choice(WORDS) for _ in range(250)] for _ in range(2))
    settings = Settings(index="lsm", index_path=str(tmp_path / "idx"))
    first = Deduplicator(settings)
    first.check(Page("http://p/1", _html(a)))
    first.commit()
    first.close()
    second = Deduplicator(settings)
    assert _reason(second.check(Page("http://p/1", _html(a)))) == ("drop", "unchanged")
    assert _reason(second.check(Page("http://p/1", _html(b)))) == ("keep", "changed")
    second.commit()
    second.close()
    third = Deduplicator(settings)
    assert len(third.index) == 1
    assert _reason(third.check(Page("http://q/1", _html(a)))) == ("keep", "unique")
    assert _reason(third.check(Page("http://p/1", _html(b)))) == ("drop", "unchanged")
    third.close()


REVISIT = "http://netpreserve.org/warc/1.1/revisit/identical-payload-digest"


def test_a_revisit_of_a_capture_older_than_the_version_held(make_dedup) -> None:  # type: ignore[no-untyped-def]
    """A revisit says "the payload of the capture at WARC-Refers-To-Date": when the version
    held is a newer capture (it replaced that one), the revisit is not that version again:
    rejected `revisit-mismatch`, naming both captures. The capture held, or a later one (an
    `unchanged` fetch, not held), or no date to compare: `unchanged`, as before."""
    rng = random.Random(10)
    v1, v2 = (_html([rng.choice(WORDS) for _ in range(250)]) for _ in range(2))
    url = "http://r/1"

    def revisit(refers_date: str | None, at: str = "2026-05-01T00:00:00Z") -> Page:
        return Page(url, b"", fetched_at=at, payload_digest="sha1:OLDPAYLOAD",
                    revisit=Revisit(REVISIT, url, refers_date))

    pages = [Page(url, v1, fetched_at="2026-01-01T00:00:00Z"),
             Page(url, v2, fetched_at="2026-03-01T00:00:00Z"),
             revisit("2026-01-01T00:00:00Z"),  # v1's capture, replaced by v2's
             revisit("2026-02-28T23:59:58Z"),  # before v2's too
             revisit("2026-03-01T00:00:00Z"),  # v2's capture
             revisit("2026-03-01T00:00:00.400Z"),  # the same, at another precision
             revisit("2026-03-01T00:00:00+00:00"),
             revisit("2026-04-01T00:00:00Z"),  # a later capture: v2 unchanged
             revisit(None),  # no date to compare: as before
             revisit("2026-01-01T00:00:00Z", at="2026-02-01T00:00:00Z")]  # late, and old
    for batch in (1, len(pages)):
        dd = make_dedup()
        out = [d for i in range(0, len(pages), batch) for d in dd.check_batch(pages[i : i + batch])]
        assert [_reason(d) for d in out] == [
            ("keep", "unique"), ("keep", "changed"),
            ("reject", "revisit-mismatch"), ("reject", "revisit-mismatch"),
            ("drop", "unchanged"), ("drop", "unchanged"), ("drop", "unchanged"),
            ("drop", "unchanged"), ("drop", "unchanged"), ("reject", "revisit-mismatch")]
        held = out[1]
        for d in out[2:]:
            assert d.previous is not None and d.previous.page_id == held.page_id
            assert d.previous.fetched_at == "2026-03-01T00:00:00Z"
        mismatch = out[2]
        assert mismatch.cluster is None and mismatch.payload_digest is None
        assert mismatch.error is not None
        for said in ("2026-01-01T00:00:00Z", "2026-03-01T00:00:00Z", "sha1:OLDPAYLOAD", url):
            assert said in mismatch.error, mismatch.error
        assert out[4].previous is not None and out[4].previous.match == "revisit"
        assert len(dd.index) == 1


def test_real_revisit_records(make_dedup) -> None:  # type: ignore[no-untyped-def]
    """The corpus's revisit records whose URL has an HTML capture in the same file refer to
    that capture (its WARC-Date, its payload digest): `unchanged`. The same records, once a
    newer capture of the URL is held: `revisit-mismatch`."""
    import pytest

    from stream_dedup.sources.files import iter_inputs

    corpus = Path(__file__).parents[2] / "shared" / "corpora" / "warc"
    files = [corpus / f for f in ("warcio-edgecases/example.warc.gz",
                                  "warc2zim/example-revisit.warc.gz", "pywb/dupes.warc.gz")]
    if not all(f.is_file() for f in files):
        pytest.skip(f"no corpus at {corpus}")
    checked = 0
    for path in files:
        pages = [p for p in iter_inputs([str(path)]) if isinstance(p, Page)]
        dd = make_dedup()
        held: dict[str, Decision] = {}
        revisits = []
        for page in pages:
            d = dd.check(page)
            if page.revisit is None:
                if d.decision == "keep":
                    held[page.url] = d
                continue
            refers = page.revisit.refers_to_uri or page.url
            if refers not in held:
                assert _reason(d) == ("reject", "revisit-unknown")  # its capture is no HTML
                continue
            assert _reason(d) == ("drop", "unchanged"), (path.name, d)
            assert d.previous is not None and d.previous.match == "revisit"
            assert d.previous.fetched_at == page.revisit.refers_to_date
            assert d.payload_digest == page.payload_digest
            revisits.append(page)
        assert revisits, path
        # a newer capture of each URL, with other content, replaces the version held; the
        # same records again (not from the same input position: a re-delivery is answered
        # with its first decision)
        for i, page in enumerate(revisits):
            assert page.revisit is not None and page.revisit.refers_to_date is not None
            newer = dd.check(Page(page.revisit.refers_to_uri or page.url,
                                  b"<p>" + f"another release {i} ".encode() * 40,
                                  fetched_at="2030-01-01T00:00:00Z"))
            assert _reason(newer) == ("keep", "changed"), newer
            again = dd.check(replace(page, source=None, position=None))
            assert _reason(again) == ("reject", "revisit-mismatch"), (path.name, again)
            assert again.error is not None and page.revisit.refers_to_date in again.error
            assert again.previous is not None and again.previous.page_id == newer.page_id
            checked += 1
    assert checked >= 3
