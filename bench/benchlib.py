"""Shared helpers of bench/speed.py and bench/accuracy.py: corpora, a synthetic crawl, tables.

Third-party corpora are read in place from <repo>/../shared/corpora (never copied here).
"""

from __future__ import annotations

import csv
import datetime as dt
import os
import platform
import random
import shlex
import sys
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CORPORA = REPO.parent / "shared" / "corpora"
HTTPBIS = CORPORA / "httpbis-drafts"
WARCS = CORPORA / "warc"

sys.path.insert(0, str(REPO))  # run from a checkout even when the package is not installed

from stream_dedup.models import Page  # noqa: E402
from stream_dedup.sources.files import iter_inputs  # noqa: E402

HTML = (("Content-Type", "text/html"),)


# --- real corpora -----------------------------------------------------------------------------


def warc_files() -> list[Path]:
    """Every archive of the WARC set, in the order tests/test_corpus.py replays them."""
    return sorted(p for p in WARCS.rglob("*") if ".arc" in p.name or ".warc" in p.name)


def load_warc_pages() -> tuple[list[Page], int]:
    """All pages (HTML responses) of the WARC set in replay order, and the rejected count."""
    pages: list[Page] = []
    rejected = 0
    for item in iter_inputs(warc_files()):
        if isinstance(item, Page):
            pages.append(item)
        else:
            rejected += 1
    return pages, rejected


def warc_relative(source: str) -> tuple[str, int]:
    """`/abs/.../warc/aut/x.warc.gz#12` -> ("./aut/x.warc.gz", 12), html_index.tsv's spelling."""
    path, _, ordinal = source.rpartition("#")
    return "./" + Path(path).relative_to(WARCS).as_posix(), int(ordinal)


def httpbis_in_revision_order() -> list[str]:
    """The same order as tests/test_corpus.py: published by (revision, doc), then editors."""
    with open(HTTPBIS / "manifest.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    published = sorted(
        (r for r in rows if r["set"] == "published"), key=lambda r: (int(r["revision"]), r["doc"])
    )
    editors = sorted((r for r in rows if r["set"] != "published"), key=lambda r: r["path"])
    return [r["path"] for r in published + editors]


def load_httpbis_pages() -> list[Page]:
    """Published and editor's-draft HTML of httpbis-drafts, in revision order (url = path)."""
    return [
        Page(url=rel, body=(HTTPBIS / rel).read_bytes(), headers=HTML, source=rel)
        for rel in httpbis_in_revision_order()
    ]


# --- a synthetic crawl ------------------------------------------------------------------------

_SYLLABLES = (
    "ka lo mi re su ta ne po vi da ze ru fo gi ha ly me no pa qu si to wu xe yo an el in "
    "or us ba ce di fu go hi ju ko la mu ni ob pe ri sa te ul ve wa"
).split()


class Vocabulary:
    """Generated words with Zipf-like frequencies (like real text: few common, many rare)."""

    def __init__(self, rng: random.Random, size: int = 20_000) -> None:
        seen: set[str] = set()
        words: list[str] = []
        while len(words) < size:
            w = "".join(rng.choices(_SYLLABLES, k=rng.randint(1, 4)))
            if w not in seen:
                seen.add(w)
                words.append(w)
        self.words = words
        weights = [1.0 / (rank + 1) ** 1.05 for rank in range(size)]
        total = 0.0
        self._cum: list[float] = []
        for w8 in weights:
            total += w8
            self._cum.append(total)

    def sample(self, rng: random.Random, k: int) -> list[str]:
        return rng.choices(self.words, cum_weights=self._cum, k=k)


@dataclass(frozen=True)
class Site:
    name: str
    head: str  # <head> with inline style and script (parsed, never visible)
    header: str  # banner and navigation
    footer: str  # sidebar of links, legal text, footer links


def _sentence(vocab: Vocabulary, rng: random.Random, lo: int = 6, hi: int = 22) -> str:
    words = vocab.sample(rng, rng.randint(lo, hi))
    return " ".join(words).capitalize() + "."


def make_site(vocab: Vocabulary, rng: random.Random, index: int, minimal: bool = False) -> Site:
    name = f"site{index}.example"
    if minimal:
        return Site(name, f"<head><meta charset='utf-8'><title>{name}</title></head>",
                    f"<header><h1>{name}</h1></header>", "<footer>(c) example</footer>")
    css = "".join(
        f".c{i}{{margin:{i % 7}px;padding:{i % 5}px;color:#{rng.randrange(16**6):06x}}}"
        for i in range(40)
    )
    js = ";".join(f"var v{i}=document.getElementById('x{i}')" for i in range(40))
    head = (
        f"<head><meta charset='utf-8'><title>{name}</title><style>{css}</style>"
        f"<script>{js}</script></head>"
    )
    nav = "".join(
        f'<li class="c{i % 40}"><a href="/{"-".join(vocab.sample(rng, 2))}">'
        f"{' '.join(vocab.sample(rng, rng.randint(1, 3))).title()}</a></li>"
        for i in range(30)
    )
    header = (
        f'<header><div class="banner"><h1><a href="/">{name}</a></h1>'
        f"<p>{_sentence(vocab, rng, 8, 14)}</p></div><nav><ul>{nav}</ul></nav>"
        '<form action="/search"><input name="q"><button>Search</button></form></header>'
    )
    related = "".join(
        f'<li><a href="/r/{i}">{_sentence(vocab, rng, 3, 7)}</a></li>' for i in range(20)
    )
    legal = " ".join(_sentence(vocab, rng) for _ in range(10))
    links = " | ".join(
        f'<a href="/f/{i}">{" ".join(vocab.sample(rng, 2))}</a>' for i in range(20)
    )
    footer = (
        f'<aside><h3>Related</h3><ul>{related}</ul></aside>'
        f"<footer><p>{legal}</p><p>{links}</p><p>(c) {name}</p></footer>"
    )
    return Site(name, head, header, footer)


def _paragraph(vocab: Vocabulary, rng: random.Random) -> str:
    parts = []
    for _ in range(rng.randint(3, 7)):
        s = _sentence(vocab, rng)
        roll = rng.random()
        if roll < 0.15:
            w = s.split(" ", 1)
            s = f'<a href="/w/{rng.randrange(10**6)}">{w[0]}</a> {w[1] if len(w) > 1 else ""}'
        elif roll < 0.25:
            s = f"<b>{s}</b>"
        elif roll < 0.3:
            s = f"<em>{s}</em>"
        parts.append(s)
    return "<p>" + " ".join(parts) + "</p>"


def article_paragraphs(
    vocab: Vocabulary, rng: random.Random, budget: int
) -> list[str]:
    """Paragraphs of generated text adding up to about `budget` bytes of HTML."""
    out: list[str] = []
    size = 0
    while size < budget:
        p = _paragraph(vocab, rng)
        out.append(p)
        size += len(p)
    return out


def render(site: Site, title: str, date: str, paragraphs: Sequence[str]) -> str:
    return (
        f"<!DOCTYPE html><html>{site.head}<body>{site.header}<main><article>"
        f"<h2>{title}</h2><p class='date'>Published {date}</p>{''.join(paragraphs)}"
        f"</article></main>{site.footer}</body></html>"
    )


def _edit(paragraphs: list[str], vocab: Vocabulary, rng: random.Random) -> list[str]:
    """A near-duplicate: a few words substituted, maybe a paragraph added or removed."""
    out = list(paragraphs)
    for _ in range(rng.randint(1, 4)):
        i = rng.randrange(len(out))
        words = out[i].split(" ")
        j = rng.randrange(1, max(2, len(words) - 1))
        words[j] = vocab.sample(rng, 1)[0]
        out[i] = " ".join(words)
    roll = rng.random()
    if roll < 0.3:
        out.insert(rng.randrange(len(out) + 1), _paragraph(vocab, rng))
    elif roll < 0.5 and len(out) > 3:
        del out[rng.randrange(len(out))]
    return out


def synthetic_pages(
    count: int,
    page_bytes: int = 20_000,
    *,
    sites: int = 8,
    near_share: float = 0.15,
    minimal_template: bool = False,
    seed: int = 7,
) -> list[Page]:
    """`count` pages of about `page_bytes` bytes from `sites` sites sharing their template.

    Each site has a head with inline CSS/JS, a banner with 30 navigation links and a search
    form, a sidebar of 20 related links and a footer of legal text and links (about 9 KB of
    HTML, ~400 visible words, the same on every page of the site). The article is
    generated text (20k-word Zipf vocabulary) filling the page to `page_bytes`. A
    `near_share` of pages are near-duplicates of an earlier article of the same site (another
    URL, a new date line, 1-4 substituted words, sometimes a paragraph added or removed).
    No exact copies: every page goes through sketching. `minimal_template` gives a 150-byte
    template instead (for the size-scaling table, where the page size must be the text).
    """
    rng = random.Random(seed)
    vocab = Vocabulary(rng)
    site_list = [make_site(vocab, rng, i, minimal_template) for i in range(sites)]
    chrome = max(len(render(s, "", "2026-01-01", [])) for s in site_list)
    budget = max(200, page_bytes - chrome - 60)
    articles: dict[int, list[tuple[str, list[str]]]] = defaultdict(list)
    pages: list[Page] = []
    for i in range(count):
        s = rng.randrange(sites)
        date = f"2026-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"
        if articles[s] and rng.random() < near_share:
            title, paras = rng.choice(articles[s])
            paras = _edit(paras, vocab, rng)
        else:
            title = " ".join(vocab.sample(rng, 6)).title()
            paras = article_paragraphs(vocab, rng, budget)
            articles[s].append((title, paras))
        html = render(site_list[s], title, date, paras)
        url = f"https://{site_list[s].name}/a/{i}"
        pages.append(
            Page(url=url, body=html.encode("utf-8"),
                 headers=(("Content-Type", "text/html; charset=utf-8"),), source=f"synth#{i}")
        )
    return pages


# --- machine, pinning, tables -----------------------------------------------------------------


def proc_status() -> dict[str, int]:
    """This process's VmRSS and VmHWM (peak), in bytes (Linux)."""
    out = {}
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(("VmRSS:", "VmHWM:")):
                key, value = line.split(":", 1)
                out[key] = int(value.split()[0]) * 1024
    return out


def _spin(n: int) -> float:
    started = time.perf_counter()
    x = 0
    for i in range(n):
        x += i * i
    return time.perf_counter() - started

def parallel_ceiling(n: int = 8_000_000) -> tuple[float, float]:
    """How much two CPU-bound processes get done together vs one alone: (one process's
    seconds, throughput of two at once relative to one; 2.0 on two free cores). On a shared
    or throttled VM this is the ceiling for any workers=2 speedup."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(2, mp_context=ctx) as pool:
        list(pool.map(_spin, [1000, 1000]))  # both workers up before the clock matters
        one = min(_spin(n) for _ in range(2))
        both = max(pool.map(_spin, [n, n]))
    return one, 2 * one / both


def pin(cpu: int | None) -> int | None:
    """Pin this process to one CPU (the last allowed one by default); returns it."""
    if not hasattr(os, "sched_setaffinity"):
        return None
    allowed = sorted(os.sched_getaffinity(0))
    chosen = allowed[-1] if cpu is None else cpu
    os.sched_setaffinity(0, {chosen})
    return chosen


def machine() -> str:
    cpu = platform.processor() or "?"
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    load = "/".join(f"{x:.2f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "?"
    return (
        f"{cpu}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
        f"{platform.system()} {platform.release()}, load avg {load}"
    )


def command_line() -> str:
    return "python " + " ".join(shlex.quote(a) for a in [_rel(sys.argv[0]), *sys.argv[1:]])


def _rel(path: str) -> str:
    try:
        return Path(path).resolve().relative_to(REPO).as_posix()
    except ValueError:
        return path


def header(title: str) -> str:
    now = dt.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
    return f"{title}\n`{command_line()}` — {now}\n{machine()}\n"


def table(headers: Sequence[str], rows: Sequence[Sequence[object]], right: bool = True) -> str:
    """A Markdown table (pastes into RESULTS.md as is); numbers right-aligned."""
    cells = [[_fmt(c) for c in r] for r in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]

    def line(vals: Sequence[str]) -> str:
        out = []
        for i, v in enumerate(vals):
            out.append(v.ljust(widths[i]) if i == 0 or not right else v.rjust(widths[i]))
        return "| " + " | ".join(out) + " |"

    sep = "|" + "|".join(
        "-" * (w + 1) + (":" if right and i else "-") for i, w in enumerate(widths)
    ) + "|"
    return "\n".join([line(list(headers)), sep] + [line(r) for r in cells])


def _fmt(v: object) -> str:
    if isinstance(v, float):
        if v != v:  # NaN
            return "–"
        if abs(v) >= 1000:
            return f"{v:,.0f}"
        if abs(v) >= 100:
            return f"{v:.0f}"
        if abs(v) >= 10:
            return f"{v:.1f}"
        return f"{v:.2f}" if abs(v) >= 0.1 or v == 0 else f"{v:.3f}"
    return str(v)
