#!/usr/bin/env python3
"""Containment (issue 27): precision and recall of `contained` drops and `contains` lists.

Broder's containment of A in B, c(A, B) = |S(A) & S(B)| / |S(A)| over word 8-shingles, says
"A is roughly contained in B". This script builds a labelled crawl of its own at run time
(seeded, in memory; no corpus text is ever written), replays it through the real pipeline
and scores the decisions against exact containment.

The set (counts are arguments), from ../shared/corpora:

- base: distinct real documents with >= 300 words of visible text, served first: HTML
  pages of the WARC set as crawled (their own bytes, their own URL) and sections of the
  httpbis drafts (300-1,500 words) in a small page template of their own;
- excerpt: a contiguous 50-70 % of a base's text (a fifth of them 20-40 %, a fifth
  80-95 %) in a short page of another host with a small template (title, nav line); four
  in five add words of their own before or after it (1-30 % of the excerpt: commentary),
  which spreads their c8 in the base over 0.75-1;
- extended: a whole base's text followed by about as much other text (they CONTAIN the
  base); a quarter append a second base, and so contain two;
- quote: 2-5 separate passages (12-40 words) of a base mixed into new text (low
  containment, a few up to ~0.6);
- short: an excerpt of 12-50 words (below ~25-45 shingles: min_shingles is 25);
- boilerplate: pages of a few "sites" sharing a large template (nav, sidebar, legal
  footer: 60-85 % of the words) around a small article of their own;
- unrelated: other documents (WARC pages and drafts' sections).

Every piece of text comes from a pool whose pieces overlap nothing else chosen (a WARC
page shares <= 10 % of its shingles with the pieces chosen before it, a draft section
<= 2 %), so the only containment in the set is the one built in. After the bases (in a
seeded order) every other page comes in a shuffled order (--order-seed).

Ground truth: each served page's shingles are computed the way the engine computes them
(`Analyzer.canonical` -> canonical tokens -> `Sketcher.shingles`, word 8-shingles as 64-bit
fingerprints) into Python sets; c8(A in B) and J8 are exact over those sets.

The tables:

1. per kind and bucket of c8(page in its base) ([0, 0.5), [0.5, 0.8), [0.8, 0.9),
   [0.9, 0.95), [0.95, 1]): pages and their decisions (decision/reason counts). "Its base"
   is the base a derived page was built from; for a boilerplate page, the first page of
   its site served; for a base or an unrelated page, the earlier page it is most
   contained in.
2. `contained`: precision = share of `contained` drops whose true c8 in the page they
   name (`duplicate_of`) is >= 0.8; recall, kept-relative = share of the pages contained
   at c8 >= --bar in some earlier page the engine KEPT that were dropped `contained` (and,
   second figure, dropped at all), also per bucket of that best kept c8 and without the
   pages under min_shingles.
3. `contains`: the pairs (kept page P, earlier kept page K) with c8(K in P) >= --bar:
   recall = share of them that P's decision lists in `contains`; precision = share of
   listed entries whose true c8(K in P) is >= 0.8; per bucket of c8(K in P).
4. resemblance: the drops for any other reason (exact, canonical, near, near-verified)
   per kind, with the true J8 and c8 against the page they name. The issue requires that
   these do not move.

Fields that do not exist before issue 27 (reason `contained`, `Decision.contains`,
`Decision.containment`) are read with getattr: on older code the script runs and shows
recall 0 (the "before").

Reading recall: a page of n shingles inside one of m becomes a candidate through the four
stored keys with a chance of about 1 - (1 - n/m)**4, through the deep keys (a 1/8 sample)
with 1 - (7/8)**n: what they still miss is pages under 25 shingles (never sketched) and
versions dropped `near` (each >= 0.9 inside the other). `--set contain_sample=0`: the four
keys alone.

    PYTHONPATH=/work/main python3 -P bench/containment.py      # any checkout: before/after
    python3 bench/containment.py --bar 0.95 --seed 2
"""

from __future__ import annotations

import argparse
import html
import os
import random
import statistics
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
if os.environ.get("PYTHONPATH"):  # the checkout it names, before benchlib adds this one
    import stream_dedup

import benchlib  # noqa: E402
from benchlib import table  # noqa: E402

import stream_dedup  # noqa: E402, F811
from stream_dedup import Settings  # noqa: E402
from stream_dedup.core.decode import decode_html  # noqa: E402
from stream_dedup.core.extract import visible_text  # noqa: E402
from stream_dedup.core.tokens import tokenize  # noqa: E402
from stream_dedup.models import Decision, Page  # noqa: E402
from stream_dedup.pipeline.analysis import Analyzer  # noqa: E402
from stream_dedup.pipeline.deduplicator import Deduplicator  # noqa: E402

CONTAINED = "contained"
BUCKETS = ((0.0, 0.5), (0.5, 0.8), (0.8, 0.9), (0.9, 0.95), (0.95, 1.0))
HIGH_BUCKETS = BUCKETS[2:]
KINDS = ("base", "excerpt", "extended", "quote", "short", "boilerplate", "unrelated")
PRECISE = 0.8  # the precision bar: a `contained` drop must be >= 0.8 contained
UTF8 = (("Content-Type", "text/html; charset=utf-8"),)


# --- text pools ---------------------------------------------------------------------------------


@dataclass
class Doc:
    """A base or unrelated document: served as `page`; `words` is the text derived pages
    copy from (the article without its template), `all_words` its whole visible text."""

    page: Page
    words: list[str]
    all_words: list[str]


class Pool:
    """Real text nobody else uses: consecutive words of accepted draft sections."""

    def __init__(self, segments: list[list[str]]) -> None:
        self.segments = segments
        self.at = 0  # segment
        self.pos = 0  # word in it

    def take(self, n: int) -> list[str]:
        """n contiguous words of one section (sections chained when one is not enough)."""
        out: list[str] = []
        while len(out) < n:
            if self.at >= len(self.segments):
                raise SystemExit("the drafts ran out of distinct text: ask for fewer pages")
            seg = self.segments[self.at]
            left = len(seg) - self.pos
            want = n - len(out)
            if not out and left < min(want, 200) and left < want:  # too little: next one
                self.at, self.pos = self.at + 1, 0
                continue
            piece = seg[self.pos : self.pos + want]
            out += piece
            self.pos += len(piece)
            if self.pos >= len(seg):
                self.at, self.pos = self.at + 1, 0
        return out

    def words_left(self) -> int:
        rest = self.segments[self.at :]
        return sum(len(s) for s in rest) - (self.pos if rest else 0)


def shingle_set(analyzer: Analyzer, text: str) -> set[int]:
    return set(analyzer.sketcher.shingles(tokenize(text).hashes).tolist())


def page_words(page: Page) -> list[str]:
    """The page's visible text, split on white space (cuts there are token boundaries)."""
    return visible_text(decode_html(page.body, page.header("content-type")), collapse=False
                        ).split()


def _novel(s: set[int], seen: set[int], bar: float) -> bool:
    return bool(s) and len(s & seen) <= bar * len(s)


def warc_docs(analyzer: Analyzer, rng: random.Random) -> list[tuple[Doc, set[int]]]:
    """WARC HTML pages with 300-20,000 words of mostly space-separated text, each sharing
    <= 10 % of its shingles with those before it, one per URL, in a seeded order."""
    pages, _ = benchlib.load_warc_pages()
    rng.shuffle(pages)
    out: list[tuple[Doc, set[int]]] = []
    urls: set[str] = set()
    seen: set[int] = set()
    for page in pages:
        key = page.url.lower().split("://", 1)[-1].rstrip("/")
        if key in urls or page.revisit is not None:
            continue
        a, tokens = analyzer.canonical(page)
        if tokens is None or not 300 <= len(tokens) <= 20_000:
            continue
        words = page_words(page)
        if not 0.7 <= len(tokens) / max(1, len(words)) <= 1.6:  # CJK runs, symbol soup
            continue
        s = set(analyzer.sketcher.shingles(tokens.hashes).tolist())
        if not _novel(s, seen, 0.10):
            continue
        seen |= s
        urls.add(key)
        out.append((Doc(page, words, words), s))
    return out


def segments(analyzer: Analyzer, rng: random.Random, seen: set[int], words: list[str],
             out: list[list[str]]) -> None:
    """Cut `words` into sections of 200-900 words; keep (in `out`) those sharing <= 2 % of
    their shingles with `seen` (which grows with them)."""
    i = 0
    while i < len(words):
        n = rng.randint(200, 900)
        seg = words[i : i + n]
        i += n
        if len(seg) < 150:
            continue
        s = shingle_set(analyzer, " ".join(seg))
        if _novel(s, seen, 0.02):
            seen |= s
            out.append(seg)


def draft_segments(analyzer: Analyzer, rng: random.Random, seen: set[int]) -> list[list[str]]:
    """Sections (200-900 words) of the httpbis drafts, newest revision first, then the
    oldest, then the rest; each shares <= 2 % of its shingles with everything before it
    (so revisions of one draft contribute only the text that changed)."""
    order = benchlib.httpbis_in_revision_order()
    published = [p for p in order if p.startswith("published/")]
    revs = sorted({p.split("/")[1] for p in published}, key=int)
    rank = {r: i for i, r in enumerate([revs[-1], revs[0], *reversed(revs[1:-1])])}
    published.sort(key=lambda p: (rank[p.split("/")[1]], p))
    out: list[list[str]] = []
    for rel in published:
        page = Page(url=rel, body=(benchlib.HTTPBIS / rel).read_bytes(), headers=benchlib.HTML)
        segments(analyzer, rng, seen, page_words(page), out)
    return out


# --- pages ----------------------------------------------------------------------------------------


def paragraphs(words: Sequence[str], rng: random.Random) -> list[str]:
    out, i = [], 0
    while i < len(words):
        n = rng.randint(30, 90)
        out.append(" ".join(words[i : i + n]))
        i += n
    return out


def render(title: str, nav: Sequence[str], parts: Sequence[str], footer: str = "") -> bytes:
    esc = html.escape
    body = [f"<header><h1>{esc(title)}</h1>"]
    if nav:
        body.append("<nav>" + " | ".join(f'<a href="/{i}">{esc(w)}</a>'
                                        for i, w in enumerate(nav)) + "</nav>")
    body.append("</header><main>")
    body += [f"<p>{esc(p)}</p>" for p in parts]
    body.append("</main>")
    if footer:
        body.append(f"<footer><p>{esc(footer)}</p></footer>")
    return ("<!doctype html><html><head><meta charset=\"utf-8\"><title>"
            f"{esc(title)}</title></head><body>" + "".join(body) + "</body></html>").encode()


@dataclass
class Item:
    kind: str
    page: Page
    base: int | None = None  # index (into the served order) of the page it was built from
    also: list[int] = field(default_factory=list)  # further bases an extended copy contains
    site: int | None = None
    note: str = ""


class Builder:
    def __init__(self, rng: random.Random, vocab: benchlib.Vocabulary) -> None:
        self.rng = rng
        self.vocab = vocab
        self.hosts = [f"{''.join(vocab.sample(rng, 2))}.example" for _ in range(24)]
        self.navs = [vocab.sample(rng, rng.randint(3, 6)) for _ in self.hosts]
        self.n = 0

    def page(self, kind: str, body: bytes, host: str | None = None) -> Page:
        self.n += 1
        host = host or self.rng.choice(self.hosts)
        url = f"https://{host}/{kind}/{self.n}-{self.vocab.sample(self.rng, 1)[0]}"
        return Page(url=url, body=body, headers=UTF8, source=f"containment#{self.n}")

    def templated(self, kind: str, words: Sequence[str], short: bool = False) -> Page:
        """A page of another host: a title of its own, the host's nav line (fewer than 8
        words, so two pages of a host share no template shingle), then the text."""
        k = self.rng.randrange(len(self.hosts))
        title = " ".join(self.vocab.sample(self.rng, 2 if short else self.rng.randint(3, 7)))
        nav = [] if short else self.navs[k]
        return self.page(kind, render(title, nav, paragraphs(words, self.rng)), self.hosts[k])


def build(args: argparse.Namespace, analyzer: Analyzer) -> tuple[list[Item], dict[str, Any]]:
    rng = random.Random(args.seed)
    vocab = benchlib.Vocabulary(random.Random(args.seed + 1))
    # WARC pages of 300-3,000 words serve as bases and unrelated pages; draft sections, then
    # the other WARC pages' text, are the pool every other text comes from
    warc = warc_docs(analyzer, rng)
    fit = [(d, s) for d, s in warc if len(d.words) <= 3000]
    n_warc = min(len(fit), args.bases // 2)
    n_unrel = min(len(fit) - n_warc, (args.unrelated + 1) // 2)
    used = fit[: n_warc + n_unrel]
    seen: set[int] = set().union(*(s for _, s in used))
    segs = draft_segments(analyzer, rng, seen)
    drafts = len(segs)
    for d, _ in warc:
        if all(d is not u for u, _ in used):
            segments(analyzer, rng, seen, d.words, segs)
    pool = Pool(segs)
    b = Builder(rng, vocab)

    def draft_doc(kind: str) -> Doc:
        words = pool.take(rng.randint(300, 1500))
        title = " ".join(vocab.sample(rng, rng.randint(3, 6)))
        nav = vocab.sample(rng, rng.randint(3, 6))
        page = b.page(kind, render(title, nav, paragraphs(words, rng)))
        return Doc(page, words, page_words(page))

    bases = [d for d, _ in used[:n_warc]] + [draft_doc("base") for _ in range(args.bases - n_warc)]
    rest_warc = [d for d, _ in used[n_warc:]]
    rng.shuffle(bases)
    items = [Item("base", d.page) for d in bases]
    derived: list[Item] = []

    def pick() -> int:
        return rng.randrange(len(bases))

    # excerpts: a fifth 20-40 %, a fifth 80-95 %, the rest 50-70 % of the base's text
    for i in range(args.excerpts):
        lo, hi = (0.2, 0.4) if i % 5 == 0 else (0.8, 0.95) if i % 5 == 1 else (0.5, 0.7)
        k = pick()
        w = bases[k].words
        n = max(8, round(len(w) * rng.uniform(lo, hi)))
        start = rng.randint(0, len(w) - n)
        words = w[start : start + n]
        if i % 5 != 2:  # most with words of their own (commentary): c8 in the base ~0.75-1
            own = pool.take(max(8, round(n * rng.choice((0.01, 0.05, 0.1, 0.2, 0.3)))))
            cut = rng.choice((0, len(own) // 2, len(own)))
            words = own[:cut] + words + own[cut:]
        derived.append(Item("excerpt", b.templated("excerpt", words), k,
                            note=f"{lo:.0%}-{hi:.0%}"))
    # extended copies: a whole base (with its template half the time) + as much again
    for i in range(args.extended):
        k = pick()
        d = bases[k]
        head = d.all_words if d.words is d.all_words or rng.random() < 0.5 else d.words
        also: list[int] = []
        if i % 4 == 3:
            k2 = rng.choice([j for j in range(len(bases)) if j != k])
            tail, also = list(bases[k2].words), [k2]
        else:
            tail = pool.take(max(100, round(len(head) * rng.uniform(0.7, 1.3))))
        derived.append(Item("extended", b.templated("extended", head + tail), k, also))
    # partial quotes: passages of a base mixed into new text
    for _ in range(args.quotes):
        k = pick()
        w = bases[k].words
        quotes = []
        for _ in range(rng.randint(2, 5)):
            n = rng.randint(12, 40)
            s = rng.randint(0, max(0, len(w) - n))
            quotes.append(w[s : s + n])
        own = pool.take(round(sum(map(len, quotes)) * rng.uniform(0.3, 5.0)))
        paras = paragraphs(own, rng)
        for q in quotes:
            paras.insert(rng.randint(0, len(paras)), " ".join(q))
        derived.append(Item("quote", b.templated("quote", " ".join(paras).split()), k))
    # short pages: 12-50 words of a base, a two-word title, no nav
    for _ in range(args.short):
        k = pick()
        w = bases[k].words
        n = rng.randint(12, 50)
        s = rng.randint(0, len(w) - n)
        derived.append(Item("short", b.templated("short", w[s : s + n], short=True), k))
    # boilerplate-heavy sites: one large template, small articles (60-85 % template)
    for site in range(args.sites):
        host = f"{''.join(vocab.sample(rng, 2))}-portal.example"
        nav = pool.take(rng.randint(25, 45))
        side = pool.take(rng.randint(60, 120))
        legal = pool.take(rng.randint(200, 320))
        t_words = len(nav) + len(side) + len(legal)
        for _ in range(args.site_pages):
            share = rng.uniform(0.6, 0.85)
            article = pool.take(max(25, round(t_words * (1 - share) / share)))
            parts = [" ".join(nav), *paragraphs(article, rng), " ".join(side)]
            title = " ".join(vocab.sample(rng, rng.randint(3, 6)))
            body = render(title, [], parts, footer=" ".join(legal))
            derived.append(Item("boilerplate", b.page("boilerplate", body, host), site=site))
    # unrelated: the remaining WARC pages, then draft sections
    for i in range(args.unrelated):
        doc = rest_warc[i // 2] if i % 2 == 0 and i // 2 < len(rest_warc) else \
            draft_doc("unrelated")
        derived.append(Item("unrelated", doc.page))

    random.Random(args.order_seed).shuffle(derived)
    items += derived
    info = {"WARC bases": n_warc, "WARC unrelated": n_unrel,
            "text pool": f"{drafts} draft + {len(segs) - drafts} WARC sections, "
                         f"{pool.words_left():,} words unused"}
    return items, info


# --- ground truth ---------------------------------------------------------------------------------


@dataclass
class Truth:
    sets: list[set[int]]
    inter: list[dict[int, int]]  # inter[i][j] = |S_i & S_j| for j < i (nonzero only)

    def c8(self, a: int, b: int) -> float:
        """Containment of page a in page b (0 for a page without shingles)."""
        n = len(self.sets[a])
        if not n or a == b:
            return float(a == b and n > 0)
        common = self.inter[a].get(b, 0) if b < a else self.inter[b].get(a, 0)
        return common / n

    def j8(self, a: int, b: int) -> float:
        na, nb = len(self.sets[a]), len(self.sets[b])
        common = self.inter[max(a, b)].get(min(a, b), 0)
        return common / (na + nb - common) if na + nb else float("nan")


def ground_truth(items: Sequence[Item], analyzer: Analyzer) -> Truth:
    sets: list[set[int]] = []
    for it in items:
        _, tokens = analyzer.canonical(it.page)
        sets.append(set() if tokens is None else
                    set(analyzer.sketcher.shingles(tokens.hashes).tolist()))
    postings: dict[int, list[int]] = defaultdict(list)
    inter: list[dict[int, int]] = []
    for i, s in enumerate(sets):
        counts: Counter[int] = Counter()
        for x in s:
            p = postings[x]
            counts.update(p)
            p.append(i)
        inter.append(dict(counts))
    return Truth(sets, inter)


def refs(items: Sequence[Item], truth: Truth) -> list[int | None]:
    """Each page's reference: its base (derived kinds), its site's first page
    (boilerplate), else the earlier page it is most contained in."""
    first_of_site: dict[int, int] = {}
    out: list[int | None] = []
    for i, it in enumerate(items):
        if it.base is not None:
            out.append(it.base)
            continue
        if it.site is not None and it.site in first_of_site:
            out.append(first_of_site[it.site])
            continue
        if it.site is not None:
            first_of_site[it.site] = i
        best = max(range(i), key=lambda j: truth.c8(i, j), default=None)
        out.append(best)
    return out


# --- decisions ------------------------------------------------------------------------------------


def label(d: Decision) -> str:
    return f"{d.decision} {d.reason}"


def _get(entry: Any, name: str) -> Any:
    return entry.get(name) if isinstance(entry, dict) else getattr(entry, name, None)


def contains_of(d: Decision) -> list[tuple[int | None, float | None]]:
    """(page_id, containment) of each entry of d.contains (none before issue 27)."""
    return [(_get(e, "page_id"), _get(e, "containment"))
            for e in (getattr(d, "contains", None) or ())]


def bucket_of(c: float, buckets: Sequence[tuple[float, float]] = BUCKETS) -> int | None:
    for i, (lo, hi) in enumerate(buckets):
        if lo <= c < hi or (hi == 1.0 and c == 1.0):
            return i
    return None


def blabel(b: tuple[float, float]) -> str:
    return f"[{b[0]:.2f}, {b[1]:.2f}" + ("]" if b[1] == 1.0 else ")")


def pct(k: int, n: int) -> str:
    return f"{k}/{n} = {100 * k / n:.0f} %" if n else "–"


def set_table(items: Sequence[Item], truth: Truth, ref: Sequence[int | None]) -> str:
    rows = []
    for kind in KINDS:
        idx = [i for i, it in enumerate(items) if it.kind == kind]
        if not idx:
            continue
        words = [len(truth.sets[i]) for i in idx]
        c8s = [truth.c8(i, r) for i in idx if (r := ref[i]) is not None]
        j8s = [truth.j8(i, r) for i in idx if (r := ref[i]) is not None]
        cin = [truth.c8(r, i) for i in idx if (r := ref[i]) is not None]
        rows.append([kind, len(idx), min(words), round(statistics.median(words)), max(words),
                     _span(c8s), _span(cin), _span(j8s)])
    return table(["kind", "pages", "shingles min", "median", "max", "c8(page in ref)",
                  "c8(ref in page)", "J8(page, ref)"], rows)


def _span(v: Sequence[float]) -> str:
    return f"{min(v):.2f}-{max(v):.2f}" if v else "–"


def decision_table(items: Sequence[Item], truth: Truth, ref: Sequence[int | None],
                   decisions: Sequence[Decision]) -> str:
    labels = sorted({label(d) for d in decisions}, key=lambda s: (not s.startswith("keep"), s))
    rows = []
    for kind in KINDS:
        for bi, b in enumerate(BUCKETS):
            idx = [i for i, it in enumerate(items) if it.kind == kind and (r := ref[i]) is not None
                   and bucket_of(truth.c8(i, r)) == bi]
            if not idx:
                continue
            counts = Counter(label(decisions[i]) for i in idx)
            listing = sum(1 for i in idx if contains_of(decisions[i]))
            rows.append([kind, blabel(b), len(idx), *[counts.get(x, 0) or "" for x in labels],
                         listing or ""])
        first = [i for i, it in enumerate(items) if it.kind == kind and ref[i] is None]
        if first:
            counts = Counter(label(decisions[i]) for i in first)
            rows.append([kind, "(first page)", len(first),
                         *[counts.get(x, 0) or "" for x in labels], ""])
    return table(["kind", "c8(page in ref)", "pages", *labels, "lists contains"], rows)


def kept_relative_best(truth: Truth, decisions: Sequence[Decision]
                       ) -> tuple[list[float], list[int | None], list[int]]:
    """Per page: the best c8 in an earlier KEPT page (and that page); kept indices."""
    kept: list[int] = []
    best: list[float] = []
    arg: list[int | None] = []
    for i, d in enumerate(decisions):
        top, where = 0.0, None
        n = len(truth.sets[i])
        if n:
            for j, common in truth.inter[i].items():
                if decisions[j].decision == "keep" and common / n > top:
                    top, where = common / n, j
        best.append(top)
        arg.append(where)
        if d.decision == "keep":
            kept.append(i)
    return best, arg, kept


def contained_tables(items: Sequence[Item], truth: Truth, decisions: Sequence[Decision],
                     bar: float, min_shingles: int) -> str:
    where = {d.page_id: i for i, d in enumerate(decisions) if d.page_id is not None}
    best, _, _ = kept_relative_best(truth, decisions)
    out = []
    # precision
    drops = [i for i, d in enumerate(decisions) if d.decision == "drop" and d.reason == CONTAINED]
    rows, errs = [], []
    ok = 0
    for i in drops:
        d = decisions[i]
        j = where.get(d.duplicate_of.page_id) if d.duplicate_of is not None else None
        c = truth.c8(i, j) if j is not None else float("nan")
        ok += c >= PRECISE
        claimed = getattr(d, "containment", None)
        if claimed is not None and c == c:
            errs.append(abs(claimed - c))
    by_kind = Counter(items[i].kind for i in drops)
    rows.append(["`contained` drops", len(drops), pct(ok, len(drops)),
                 ", ".join(f"{k} {n}" for k, n in by_kind.most_common()) or "–",
                 f"{statistics.mean(errs):.3f} / {max(errs):.3f}" if errs else "–"])
    out.append(table(["", "n", f"precision (true c8 >= {PRECISE})", "kinds",
                      "containment figure error mean / max"], rows, right=False))
    # recall, kept-relative
    rows = []
    sizes = [len(s) for s in truth.sets]
    for name, keep in (("all pages", lambda i: True),
                       (f">= {min_shingles} shingles", lambda i: sizes[i] >= min_shingles)):
        idx = [i for i in range(len(items)) if best[i] >= bar and keep(i)]
        rows.append([f"c8 >= {bar} in an earlier kept page, {name}", len(idx),
                     pct(sum(_contained(decisions[i]) for i in idx), len(idx)),
                     pct(sum(decisions[i].decision == "drop" for i in idx), len(idx))])
    for b in HIGH_BUCKETS:
        idx = [i for i in range(len(items)) if bucket_of(best[i], HIGH_BUCKETS) is not None
               and b[0] <= best[i] and (best[i] < b[1] or b[1] == 1.0)]
        kinds = Counter(items[i].kind for i in idx)
        rows.append([f"best kept c8 in {blabel(b)}: " + ", ".join(
            f"{k} {n}" for k, n in kinds.most_common()), len(idx),
            pct(sum(_contained(decisions[i]) for i in idx), len(idx)),
            pct(sum(decisions[i].decision == "drop" for i in idx), len(idx))])
    out.append(table(["pages", "n", "recall: dropped `contained`", "dropped at all"], rows,
                     right=False))
    return "\n\n".join(out)


def _contained(d: Decision) -> bool:
    return d.decision == "drop" and d.reason == CONTAINED


def contains_tables(items: Sequence[Item], truth: Truth, decisions: Sequence[Decision],
                    bar: float) -> str:
    where = {d.page_id: i for i, d in enumerate(decisions) if d.page_id is not None}
    kept = [i for i, d in enumerate(decisions) if d.decision == "keep"]
    pairs: list[tuple[int, int, float]] = []  # (P, K, c8(K in P))
    for p in kept:
        for k in kept:
            if k >= p:
                break
            c = truth.c8(k, p)
            if c >= min(bar, BUCKETS[2][0]):
                pairs.append((p, k, c))
    listed = {p: {pid for pid, _ in contains_of(decisions[p])} for p in kept}
    rows = []
    for b in HIGH_BUCKETS:
        sel = [(p, k) for p, k, c in pairs if b[0] <= c and (c < b[1] or b[1] == 1.0)]
        kinds = Counter(items[p].kind for p, _ in sel)
        hit = sum(decisions[k].page_id in listed[p] for p, k in sel)
        rows.append([f"c8(K in P) in {blabel(b)}", ", ".join(f"{k} {n}" for k, n in
                                                              kinds.most_common()) or "–",
                     len(sel), pct(hit, len(sel))])
    sel = [(p, k) for p, k, c in pairs if c >= bar]
    hit = sum(decisions[k].page_id in listed[p] for p, k in sel)
    rows.append([f"c8(K in P) >= {bar} (recall)", "", len(sel), pct(hit, len(sel))])
    pages = {p for p, _ in sel}
    full = sum(all(decisions[k].page_id in listed[p] for q, k in sel if q == p) for p in pages)
    rows.append(["kept pages P containing one at >= bar: all listed", "", len(pages),
                 pct(full, len(pages))])
    out = [table(["pairs (kept P, earlier kept K)", "P's kinds", "n", "listed in P's contains"],
                 rows, right=False)]
    entries = [(p, pid, claimed) for p in kept for pid, claimed in contains_of(decisions[p])]
    good, errs = 0, []
    for p, pid, claimed in entries:
        k = where.get(pid)
        c = truth.c8(k, p) if k is not None else float("nan")
        good += c >= PRECISE
        if claimed is not None and c == c:
            errs.append(abs(claimed - c))
    out.append(table(["`contains` entries", "n", f"precision (true c8(K in P) >= {PRECISE})",
                      "containment figure error mean / max"],
                     [["all", len(entries), pct(good, len(entries)),
                       f"{statistics.mean(errs):.3f} / {max(errs):.3f}" if errs else "–"]],
                     right=False))
    return "\n\n".join(out)


def resemblance_table(items: Sequence[Item], truth: Truth, decisions: Sequence[Decision]) -> str:
    where = {d.page_id: i for i, d in enumerate(decisions) if d.page_id is not None}
    groups: dict[tuple[str, str], list[tuple[float, float]]] = defaultdict(list)
    for i, d in enumerate(decisions):
        if d.decision != "drop" or d.reason == CONTAINED or d.duplicate_of is None:
            continue
        j = where.get(d.duplicate_of.page_id)
        if j is None:
            continue
        groups[(items[i].kind, d.reason)].append((truth.j8(i, j), truth.c8(i, j)))
    rows = []
    for (kind, reason), v in sorted(groups.items()):
        j8 = [x for x, _ in v]
        rows.append([kind, reason, len(v), min(j8), statistics.median(j8), max(j8),
                     sum(x < 0.8 for x in j8) or "", min(c for _, c in v)])
    if not rows:
        return "(no drops other than `contained`)"
    return table(["kind", "reason", "drops", "J8 min", "median", "max", "J8 < 0.8",
                  "c8 min"], rows)


# --- main -----------------------------------------------------------------------------------------


def replay(items: Sequence[Item], settings: Settings, batch: int) -> list[Decision]:
    dd = Deduplicator(settings)
    pages = [it.page for it in items]
    out: list[Decision] = []
    for s in range(0, len(pages), batch):
        out += dd.check_batch(pages[s : s + batch])
    return out


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0] + "\n\n" + "\n\n".join(__doc__.split("\n\n")[1:-1]),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Before/after: run the same command against each checkout, e.g.\n"
               "  cd /work/wt27 && PYTHONPATH=/path/to/old/checkout python3 -P "
               "bench/containment.py > before.md\n"
               "  cd /work/wt27 && PYTHONPATH=/work/wt27 python3 -P "
               "bench/containment.py > after.md\n"
               "(-P: the PYTHONPATH checkout, not an installed copy, is imported; the header "
               "prints which stream_dedup was used). Same --seed/--order-seed: the same set.",
    )
    ap.add_argument("--seed", type=int, default=27, help="builds the set (default 27)")
    ap.add_argument("--order-seed", type=int, default=1,
                    help="shuffles the derived pages (default 1)")
    ap.add_argument("--bar", type=float, default=0.9,
                    help="containment a page must have in an earlier kept page to count in "
                         "recall (default 0.9)")
    ap.add_argument("--bases", type=int, default=60, help="half WARC pages, half drafts")
    ap.add_argument("--excerpts", type=int, default=100)
    ap.add_argument("--extended", type=int, default=30)
    ap.add_argument("--quotes", type=int, default=30)
    ap.add_argument("--short", type=int, default=20)
    ap.add_argument("--sites", type=int, default=3, help="boilerplate-heavy sites")
    ap.add_argument("--site-pages", type=int, default=8)
    ap.add_argument("--unrelated", type=int, default=30)
    ap.add_argument("--batch", type=int, default=500, help="pages per check_batch call")
    ap.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                    help="a setting of the engine (Settings' names), e.g. --set "
                    "contain_min_shingles=25; repeatable")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.perf_counter()
    settings = Settings.load(env={}, overrides=dict(kv.split("=", 1) for kv in args.set))
    analyzer = Analyzer(settings)
    print(benchlib.header("# Containment: `contained` drops and `contains` lists (issue 27)"))
    print(f"stream_dedup from {Path(stream_dedup.__file__).resolve().parent}; "
          f"bar {args.bar}; seed {args.seed}, order seed {args.order_seed}\n")
    items, info = build(args, analyzer)
    built = time.perf_counter()
    truth = ground_truth(items, analyzer)
    ref = refs(items, truth)
    truthed = time.perf_counter()
    decisions = replay(items, settings, args.batch)
    replayed = time.perf_counter()
    step: Callable[[str], None] = print
    step(f"## The set: {len(items)} pages (bases first, then the rest shuffled); "
         + ", ".join(f"{k}: {v}" for k, v in info.items()) + "\n")
    step("ref = the page's base (derived kinds), its site's first page (boilerplate), else "
         "the earlier page it is most contained in. Shingles = distinct word 8-shingles.\n")
    step(set_table(items, truth, ref) + "\n")
    step("## Decisions per kind and bucket of c8(page in ref)\n")
    step(decision_table(items, truth, ref, decisions) + "\n")
    step(f"## `contained` (precision against the page named; recall kept-relative, bar "
         f"{args.bar})\n")
    step(contained_tables(items, truth, decisions, args.bar, settings.min_shingles) + "\n")
    step("## `contains` (kept page P lists the earlier kept pages K it contains)\n")
    step(contains_tables(items, truth, decisions, args.bar) + "\n")
    step("## Resemblance drops (exact, canonical, near, near-verified): J8 and c8 against "
         "the page named\n")
    step(resemblance_table(items, truth, decisions) + "\n")
    step(f"Time: build {built - started:.1f} s, ground truth {truthed - built:.1f} s, "
         f"replay {replayed - truthed:.1f} s ({len(items) / (replayed - truthed):.0f} pages/s), "
         f"total {time.perf_counter() - started:.1f} s.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
