"""No lookup answer makes the decide step raise: a record it needs and the answer lacks
(a shared index read while other instances work; candidates ranked otherwise once the
batch's own pages are in the lists) leaves the page undecided, and the pages after it;
the deduplicator asks the index for those records and decides them as one process would.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from stream_dedup import Deduplicator, Page, Settings
from stream_dedup.decide.step import decide_batch
from stream_dedup.index.base import Answer, Probe
from stream_dedup.index.memory import MemoryIndex
from stream_dedup.pipeline.deduplicator import Analyzer

WORDS = [f"w{i}x" for i in range(5000)]


def page(url: str, words: list[str]) -> Page:
    return Page(url, f"<p>{' '.join(words)}</p>".encode(), (("Content-Type", "text/html"),))


def pages() -> list[Page]:
    """6 articles, then a near-duplicate of each, then an excerpt of each."""
    rng = random.Random(7)
    articles = [[rng.choice(WORDS) for _ in range(400)] for _ in range(6)]
    edited = [words[:200] + ["changed"] + words[201:] for words in articles]
    return ([page(f"http://a/{i}", words) for i, words in enumerate(articles)]
            + [page(f"http://b/{i}", words) for i, words in enumerate(edited)]
            + [page(f"http://c/{i}", words[100:300]) for i, words in enumerate(articles)])


class Forgetful(MemoryIndex):
    """A memory index whose answers leave out the records of the stored pages, as a
    shared index's answer may, until they are asked for (`records`)."""

    def __init__(self, stamp: int) -> None:
        super().__init__(stamp)
        self.asked: list[list[int]] = []

    def lookup(self, probes: Sequence[Probe], *, register: bool = True,
               records: Sequence[int] = ()) -> list[Answer]:
        answers = super().lookup(probes, register=register, records=records)
        self.asked.append(list(records))
        docs = {h: self.records()[h] for h in records}
        for answer in answers:
            answer.docs = docs
        return answers


def test_the_decide_step_asks_for_a_record_it_lacks_and_defers_the_pages_after() -> None:
    settings = Settings()
    analyzer = Analyzer(settings)
    every = pages()
    first, near, other = (analyzer.analyze(every[i]) for i in (0, 6, 12))
    index = MemoryIndex(settings.params.stamp)
    dd = Deduplicator(settings, index)
    kept = dd.check(first.page)
    assert kept.decision == "keep"
    answers = index.lookup([Probe(2, a.raw_fp, a.canonical_fp, a.features) for a in
                            (near, other)])
    for answer in answers:
        answer.docs = {}  # the stored page's record not read
    verdicts = decide_batch([near, other], [2, 3], answers, settings)
    assert verdicts[0].decision is None and verdicts[0].missing == (0,)
    assert verdicts[1].decision is None and verdicts[1].deferred


def test_a_deduplicator_decides_as_one_process_when_answers_lack_records() -> None:
    settings = Settings()
    expected = [d.decision + "/" + d.reason for d in
                Deduplicator(settings).check_batch(pages())]
    index = Forgetful(settings.params.stamp)
    dd = Deduplicator(settings, index)
    got = []
    for start in range(0, 18, 6):
        got += [d.decision + "/" + d.reason for d in dd.check_batch(pages()[start:start + 6])]
    assert got == expected
    assert "drop/near" in got and "drop/contained" in got
    assert any(index.asked), "no answer lacked a record: the test tests nothing"
