"""The report as one HTML file (pure): a `Tally` and the pages' texts in, a string out.

Self-contained: its style, its one small script and its charts (SVG) are inline, and its
Content-Security-Policy allows nothing else (no network, no other script: the script is
named by its hash), so it opens from disk, offline, and a crawled page's text, which is
escaped like every other value, could not run or load anything even if it were not.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Mapping, Sequence
from html import escape
from typing import Any

from stream_dedup.report import charts
from stream_dedup.report.model import DROP_REASONS, KEEP_REASONS, Pair, Tally
from stream_dedup.report.style import CSS, SCRIPT
from stream_dedup.report.texts import PageText, side_by_side

_SCORES = ("jaccard", "resemblance", "containment", "ld_estimate", "shared_features",
           "verified", "short", "match")


def _e(value: object) -> str:
    return escape("" if value is None else str(value), quote=True)


def _link(url: str | None) -> str:
    """A URL as text, and a link only where it is http(s): a javascript: URL stays text."""
    if not url:
        return '<span class="none">(none)</span>'
    if url.lower().startswith(("http://", "https://")):
        return f'<a class="url" href="{_e(url)}" rel="noreferrer">{_e(url)}</a>'
    return f'<span class="url">{_e(url)}</span>'


def _share(n: int, of: int) -> str:
    return f"{n / of:.1%}" if of else "–"


def render(tally: Tally, texts: Mapping[str, PageText | None], *, title: str,
           inputs: Sequence[str], notes: Sequence[str], run: Mapping[str, Any],
           made_at: str, crawls_given: bool) -> str:
    """The whole page. `texts`: a page's text by its source (None: not found in the
    crawls); `notes`: what could not be shown, and why; `run`: parameters and figures the
    run reported."""
    script_hash = base64.b64encode(hashlib.sha256(SCRIPT.encode()).digest()).decode()
    csp = (f"default-src 'none'; style-src 'unsafe-inline'; script-src 'sha256-{script_hash}'; "
           "img-src data:; base-uri 'none'; form-action 'none'")
    pairs = tally.pairs()
    anchors = {p.position: p.anchor for ps in pairs.values() for p in ps}
    parts = [
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        f'<meta http-equiv="Content-Security-Policy" content="{csp}">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{_e(title)}</title><style>{CSS}</style></head><body>",
        f"<header><h1>{_e(title)}</h1><p class=\"sub\">{_e(made_at)} · decisions: "
        f"{', '.join(_e(i) for i in inputs) or '(none)'}</p>",
        _nav(pairs), "</header><main>",
        _notes(notes, tally),
        _totals(tally),
        _run(run),
        _charts(tally),
        _pairs(pairs, texts, crawls_given),
        _clusters(tally, anchors),
        "</main>", f"<script>{SCRIPT}</script></body></html>",
    ]
    return "\n".join(p for p in parts if p)


def _nav(pairs: Mapping[str, list[Pair]]) -> str:
    links = ['<a href="#totals">totals</a>', '<a href="#charts">charts</a>',
             '<a href="#pairs">why, side by side</a>', '<a href="#clusters">clusters</a>']
    links += [f'<a class="minor" href="#reason-{_e(r)}">{_e(r)}</a>' for r in pairs]
    return '<nav>' + " ".join(links) + "</nav>"


def _notes(notes: Sequence[str], tally: Tally) -> str:
    items = list(notes)
    if tally.bad_lines:
        items.append(f"{tally.bad_lines:,} line(s) of the decisions were not decisions and are "
                     "left out of every figure below; the first: "
                     + "; ".join(tally.bad_examples[:5]))
    if not items:
        return ""
    lis = "".join(f"<li>{_e(n)}</li>" for n in items)
    return f'<section id="notes" class="notes"><h2>Read this first</h2><ul>{lis}</ul></section>'


def _totals(t: Tally) -> str:
    rows = [f'<tr class="total"><th>pages</th><td></td><td class="count" data-count="{t.pages}">'
            f"{t.pages:,}</td><td>100%</td></tr>"]
    for decision, reasons in (("keep", KEEP_REASONS), ("drop", DROP_REASONS), ("reject", ())):
        n = t.outcomes.get(decision, 0)
        rows.append(f'<tr class="outcome {decision}" data-decision="{decision}"><th>'
                    f'{decision}</th><td></td><td class="count" data-count="{n}">{n:,}</td>'
                    f"<td>{_share(n, t.pages)}</td></tr>")
        seen = [r for (d, r) in t.reasons if d == decision]
        order = [r for r in reasons if r in seen] + sorted(r for r in seen if r not in reasons)
        for r in order:
            m = t.reasons[(decision, r)]
            rows.append(f'<tr class="reason" data-decision="{decision}" data-reason="{_e(r)}">'
                        f'<td></td><td>{_e(r)}</td><td class="count" data-count="{m}">{m:,}</td>'
                        f"<td>{_share(m, t.pages)}</td></tr>")
    extra = (f"<p>{t.short:,} page(s) were short (exact layers only); {t.verified:,} "
             "decision(s) say <code>verified</code> (a candidate confirmed by verification); "
             f"{len(t.clusters):,} clusters, "
             f"{sum(1 for c in t.clusters.values() if c.size > 1):,} with more than one page.</p>")
    return ('<section id="totals"><h2>Totals</h2><table class="totals"><thead><tr>'
            "<th>decision</th><th>reason / kind</th><th>pages</th><th>share</th></tr></thead>"
            f"<tbody>{''.join(rows)}</tbody></table>{extra}</section>")


def _run(run: Mapping[str, Any]) -> str:
    if not run:
        return ('<section id="run"><h2>The run</h2><p class="none">The decisions do not say '
                "the parameters of the run (give <code>--summary-json</code> of the replay, "
                "or use <code>replay --report</code>).</p></section>")
    rows = "".join(f"<div><b>{_e(k)}</b> {_e(_value(v))}</div>" for k, v in run.items())
    return f'<section id="run"><h2>The run</h2><div class="kv">{rows}</div></section>'


def _value(v: object) -> str:
    if isinstance(v, dict):
        return ", ".join(f"{k} {_value(x)}" for k, x in v.items()) or "–"
    if isinstance(v, list):
        return "; ".join(map(str, v)) or "–"
    return f"{v:,}" if isinstance(v, int) and not isinstance(v, bool) else str(v)


def _charts(t: Tally) -> str:
    out = ['<section id="charts"><h2>Charts</h2><div class="grid">']
    along = t.along()
    if along:
        n = len(t.codes)
        labels = [f"decisions {b * n // len(along) + 1:,}–{(b + 1) * n // len(along):,}"
                  for b in range(len(along))]
        labels[0], labels[-1] = "start of the input", f"end ({n:,})"
        out.append(_figure("Where the duplicates are: outcomes along the input",
                           charts.columns(along, ["kept", "dropped", "rejected"],
                                          [charts.KEEP, charts.DROP, charts.REJECT], labels,
                                          "outcome shares along the input", shares=True)))
    for name, low in (("jaccard", 0.5), ("resemblance", 0.5), ("containment", 0.5)):
        drops = t.scores.get(f"{name} drop", [])
        distinct = t.scores.get(f"{name} verified-distinct", [])
        if not drops and not distinct:
            continue
        low = min(low, *(drops or [1.0]), *(distinct or [1.0]))
        low = int(low * 10) / 10
        series = [("dropped", drops, charts.DROP), ("kept verified-distinct", distinct,
                                                    charts.KEEP)]
        marker = t.bar if name == "jaccard" else 0.9 if name == "containment" else None
        out.append(_figure(f"{name.capitalize()} of the drops ({len(drops):,}) and of the "
                           f"verified-distinct keeps ({len(distinct):,})",
                           charts.histogram(series, f"{name} histogram", low=low,
                                            marker=marker)))
    sizes = t.cluster_sizes()
    if sizes:
        buckets = [(1, 1), (2, 2), (3, 5), (6, 10), (11, 100), (101, 10**12)]
        stacks = [[float(sum(n for s, n in sizes.items() if lo <= s <= hi))] for lo, hi in
                  buckets]
        names = ["1", "2", "3–5", "6–10", "11–100", "101+"]
        out.append(_figure("Cluster sizes (clusters of each size)",
                           charts.columns(stacks, ["clusters"], [charts.KEEP], names,
                                          "cluster sizes")))
    hosts = t.top_hosts()
    if hosts:
        items = [(h, [c["keep"], c["drop"]]) for h, c in hosts]
        out.append(_figure(f"Kept and dropped pages of the top {len(hosts)} hosts",
                           charts.rows(items, ["kept", "dropped"], [charts.KEEP, charts.DROP],
                                       "per-host kept and dropped")))
    recrawled = t.top_recrawled()
    if recrawled:
        items = [(h, [c["changed"], c["unchanged"], c["other"]]) for h, c in recrawled]
        out.append(_figure("Recrawls: how often a host's pages had changed",
                           charts.rows(items, ["changed", "unchanged", "copy of another URL"],
                                       [charts.KEEP, charts.DROP, charts.OTHER],
                                       "recrawl change rate per host", shares=True)))
    out.append("</div></section>")
    return "".join(out)


def _figure(caption: str, svg: str) -> str:
    return f"<figure>{svg}<figcaption>{_e(caption)}</figcaption></figure>"


def _pairs(pairs: Mapping[str, list[Pair]], texts: Mapping[str, PageText | None],
           crawls_given: bool) -> str:
    head = ('<section id="pairs"><h2>Why, side by side</h2><p>A sample of each reason, the '
            "borderline first (closest to the bar it was judged by). ")
    head += ("Texts are the visible words the filter compared; words only on one side are "
             "marked.</p>" if crawls_given else "Give the crawl files after the decisions "
             "to see the two pages' texts.</p>")
    if not pairs:
        return head + '<p class="none">No drop and no verified-distinct keep.</p></section>'
    out = [head]
    for reason, ps in pairs.items():
        out.append(f'<h3 id="reason-{_e(reason)}">{_e(reason)} <small>({len(ps)} shown)'
                   "</small></h3>")
        out += [_pair(p, texts, crawls_given) for p in ps]
    out.append("</section>")
    return "".join(out)


def _pair(p: Pair, texts: Mapping[str, PageText | None], crawls_given: bool) -> str:
    scores = " ".join(f'<span class="score"><b>{_e(k)}</b> {_e(_round(p.scores[k]))}</span>'
                      for k in _SCORES if k in p.scores)
    names = "previous version" if p.reason in ("unchanged", "superseded") else "duplicate of"
    other = ('<p class="none">A verified-distinct keep: the decision does not name the page '
             "it was compared with.</p>" if p.other_url is None and p.other_id is None
             else f'<div class="other">{names}: {_link(p.other_url)} <small>page '
             f"{_e(p.other_id)} · {_e(p.other_source)}</small></div>")
    html = [f'<article class="pair {_e(p.decision)}" id="{_e(p.anchor)}" '
            f'data-reason="{_e(p.reason)}"><div class="head"><span class="tag">{_e(p.label())}'
            f'</span> #{p.position + 1:,} {_link(p.url)} <small>{_e(p.source)}</small></div>',
            other, f'<div class="scores">{scores}</div>']
    if crawls_given:
        html.append(_texts(p, texts))
    html.append("</article>")
    return "".join(html)


def _round(v: object) -> object:
    if isinstance(v, float):
        return f"{v:,.0f}" if v >= 10 else f"{v:.4f}"
    return v


def _texts(p: Pair, texts: Mapping[str, PageText | None]) -> str:
    mine = texts.get(p.source or "")
    theirs = texts.get(p.other_source or "") if p.other_source else None
    if mine is None and theirs is None:
        return '<p class="none">Neither page was found in the crawl files given.</p>'
    a, b = (mine.words if mine else []), (theirs.words if theirs else [])
    left, right, share = side_by_side(a, b) if mine and theirs else (
        [("same", a)], [("same", b)], 0.0)
    cols = []
    sides = [("this page", mine, left), ("the page it names", theirs, right)]
    if p.other_url is None and p.other_id is None:  # a verified-distinct keep: one page
        sides = sides[:1]
    for name, page, runs in sides:
        if page is None:
            why = ("not in the crawl files given" if name == "this page" or p.other_source
                   else "its source is not in these decisions (kept before them?)")
            cols.append(f'<div class="col"><h4>{name}</h4><p class="none">{why}</p></div>')
            continue
        note = f'<p class="cut">{_e(page.note)}</p>' if page.note else ""
        cols.append(f'<div class="col"><h4>{name} <small>{page.total:,} words</small></h4>'
                    f'{note}<p class="words">{_runs(runs)}</p></div>')
    common = (f'<p class="common">{share:.1%} of the words shown are common to both.</p>'
              if mine and theirs else "")
    one = " one" if len(sides) == 1 else ""
    return f'{common}<div class="sbs{one}">{"".join(cols)}</div>'


def _runs(runs: list[tuple[str, list[str]]]) -> str:
    out = []
    for kind, words in runs:
        if kind == "fold":
            out.append(f'<span class="fold">… {int(words[0]):,} words the same …</span>')
        elif kind == "diff":
            out.append(f"<mark>{_e(' '.join(words))}</mark>")
        else:
            out.append(_e(" ".join(words)))
    return " ".join(out) or '<span class="none">(no visible text)</span>'


def _clusters(t: Tally, anchors: Mapping[int, str]) -> str:
    largest = t.largest_clusters()
    out = ['<section id="clusters"><h2>The largest clusters</h2>']
    if not largest:
        out.append('<p class="none">No cluster has more than one page.</p></section>')
        return "".join(out)
    out.append("<p>A kept page and every page the stream found like it. A member with a "
               "side-by-side view links to it.</p>")
    for c in largest:
        lis = []
        for position, reason, url in c.members:
            where = anchors.get(position)
            tag = (f'<a href="#{_e(where)}">{_e(reason)}</a>' if where else _e(reason))
            lis.append(f"<li><span class=\"tag\">{tag}</span> #{position + 1:,} {_link(url)}</li>")
        more = c.size - len(c.members)
        tail = f"<li class=\"none\">… and {more:,} more</li>" if more > 0 else ""
        out.append(f'<details class="cluster"><summary><b>{c.size:,}</b> pages · cluster '
                   f"{_e(c.page_id)} · {_link(c.url)}</summary><ol>{''.join(lis)}{tail}</ol>"
                   "</details>")
    out.append("</section>")
    return "".join(out)
