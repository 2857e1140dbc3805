"""One batch's rounds with the index, for the Deduplicator (pipeline/deduplicator.py): ask the index
(lookup), decide the pages it answered (decide/step.py's pure step), tell it the outcome (claim);
again for the pages that could not be decided in that round:
- a page waiting for an older one another instance is deciding (Answer.prior WAIT): asked
  again next round, for as long as that page's lease lives (index/redis/lease.py);
- a page whose claim another instance beat (shared index): decided again, and answered by
  that instance's decision if it was a re-delivery of the same page;
- a page whose decide step lacked a record (Verdict.missing) and the pages after it
  (Verdict.deferred): asked again, with those records asked for;
- a page only fingerprinted whose stored copy is gone: analysed, then decided again.
The other pages of the batch are decided and claimed meanwhile: nothing is thrown away.
"""

from __future__ import annotations

from dataclasses import replace
from time import perf_counter
from typing import TYPE_CHECKING

from stream_dedup.decide.step import decide_batch
from stream_dedup.decide.verdicts import Analysis
from stream_dedup.errors import IndexUnavailable
from stream_dedup.index.base import WAIT, Answer, Change, Claim, FeatureIndex, Probe, merge_answers
from stream_dedup.index.namespaces import salted_doc, salted_probe
from stream_dedup.models import Decision, Page
from stream_dedup.pipeline.observe import StageTimes

if TYPE_CHECKING:
    from stream_dedup.pipeline.deduplicator import Deduplicator

# Rounds of one batch with a claim lost (or a record missing) before it is given up: a
# shared index loses a claim only to a concurrent instance, so a few such rounds are the rule.
MAX_ROUNDS = 50


def page_probe(a: Analysis, page_id: int, url_key: int, namespace: str = "") -> Probe:
    """What a page asks the index, in its namespace: exact layers only unless it has
    features."""
    canonical = a.canonical_fp if a.text_length > 0 else None
    return salted_probe(Probe(page_id, a.raw_fp, canonical, a.features, url_key), namespace)


def ask(dd: Deduplicator, analyses: list[Analysis], probes: list[Probe], spaces: list[str],
        *, register: bool = True, records: list[int] | tuple[()] = ()) -> list[Answer]:
    """The index's answers for these pages (their probes, each in its namespace `spaces[i]`),
    with what the namespaces read (--namespace-read) hold: a read-only lookup a namespace
    read (index/namespaces.py)."""
    answers = dd.index.lookup(probes, register=register, records=records)
    reads = dd.settings.read_namespaces
    if not reads:
        return answers
    others: list[list[Answer]] = [[] for _ in analyses]
    for name in reads:
        which = [k for k, ns in enumerate(spaces) if ns != name]
        if not which:
            continue
        got = dd.index.lookup([page_probe(analyses[k], probes[k].page_id, 0, name)
                               for k in which], register=False)
        for k, answer in zip(which, got, strict=True):
            others[k].append(answer)
    merged = [merge_answers(own, more, dd.settings.max_posting)
              for own, more in zip(answers, others, strict=True)]
    complete = getattr(dd.index, "complete", None)  # a shared index: records it lacks
    if complete is not None:
        complete(merged)
    return merged


def decide_in_rounds(dd: Deduplicator, pages: list[tuple[int, Page]], ids: list[int],
                     analyses: list[Analysis], out: list[Decision | None],
                     times: list[StageTimes], fresh: list[bool],
                     ready: list[Analysis | None]) -> None:
    """Ask the index, decide, claim; again for the pages whose claims were lost, that
    wait for an older page, or whose decide step lacked a record: `out`, `times` and
    `fresh` (False: answered as decided before) filled in, by batch position."""
    for (i, _), a in zip(pages, analyses, strict=True):
        if a.error is not None:
            page = a.page
            out[i] = Decision(page.url, "reject", a.error.kind, error=a.error.message,
                              source=page.source)
            times[i] = StageTimes(canonical_s=a.canonical_s)
    todo = [k for k, a in enumerate(analyses) if a.error is None]
    keys = [dd.url_key(a.page) if a.error is None else 0 for a in analyses]
    spaces = [dd.namespace_of(a.page) for a in analyses]
    contended = 0  # rounds in which a claim was lost (waiting is the index's to bound)
    # Records the decide step asked for (Verdict.missing), every one of this batch so far: a
    # page may need several, found one a round (a page reading other namespaces: records
    # its own answer did not rank)
    records: list[int] = []
    while todo:
        started = perf_counter()
        probes = {k: page_probe(analyses[k], ids[k], keys[k], spaces[k]) for k in todo}
        answers = ask(dd, [analyses[k] for k in todo], list(probes.values()),
                      [spaces[k] for k in todo], records=records)
        live = []
        later = []
        for k, answer in zip(todo, answers, strict=True):
            if answer.prior == WAIT:
                later.append(k)
            elif answer.prior is not None:  # a shared store decided it before
                page = pages[k][1]
                out[pages[k][0]] = replace(answer.prior, url=page.url, source=page.source,
                                           fetched_at=page.fetched_at,
                                           namespace=dd.namespace_of(page))
                fresh[pages[k][0]] = False
                dd.counters.redelivered += 1
                dd.observer.redelivered(answer.prior)
            else:
                live.append((k, answer))
        asked = perf_counter()
        verdicts = decide_batch([analyses[k] for k, _ in live], [ids[k] for k, _ in live],
                                [ans for _, ans in live], dd.settings,
                                url_keys=[keys[k] for k, _ in live])
        decided = perf_counter()
        claims = [Claim(probes[k], salted_doc(v.doc, spaces[k]), v.decision, v.depends_on,
                        v.replaces, v.replaces_in_batch)
                  for (k, _), v in zip(live, verdicts, strict=True)]
        won = dd.index.claim(claims)
        if dd.journal is not None:
            dd.journal += kept_changes(dd.index, claims, won)
        index_s = (asked - started + perf_counter() - decided) / max(1, len(live))
        missing = [h for v in verdicts for h in v.missing]
        records = list(dict.fromkeys([*records, *missing]))
        if missing or not all(won):
            contended += 1
            if contended > MAX_ROUNDS:
                raise IndexUnavailable(
                    f"claims of this batch were lost in {MAX_ROUNDS} rounds in a row to "
                    "other instances; the batch is decided again later")
        todo = later
        for (k, _), v, ok in zip(live, verdicts, won, strict=True):
            if v.decision is None and (v.missing or v.deferred):
                ok = False  # asked again, with the records it needs
            elif v.decision is None:  # only fingerprinted, and the stored copy is gone
                given = ready[k]
                analyses[k] = (dd.analyzer.analyze(analyses[k].page) if given is None
                               else given)
                ok = False
            if not ok:
                todo.append(k)
                continue
            a = analyses[k]
            out[pages[k][0]] = v.decision
            times[pages[k][0]] = StageTimes(a.canonical_s, a.sketch_s, index_s, v.verify_s)
        todo.sort()  # decided in input order, as one process would


def kept_changes(index: FeatureIndex, claims: list[Claim], won: list[bool]) -> list[Change]:
    """The kept pages of a claim, with the page id of the version each replaced."""
    docs = index.records()  # type: ignore[attr-defined]  # a local index: journaling
    out = []
    for c, ok in zip(claims, won, strict=True):
        if ok and c.doc is not None:
            replaced = (claims[c.replaces_claim].probe.page_id
                        if c.replaces_claim is not None
                        else None if c.replaces is None else docs[c.replaces].page_id)
            out.append(Change(c.doc, replaced))
    return out
