#!/usr/bin/env python3
"""Speed of stream-dedup against a parsing ceiling and a datasketch peer, per core.

A script that prints tables (Markdown), not a test. All pages are loaded into memory first (no
I/O is timed) and the process is pinned to one CPU (os.sched_setaffinity). Sections:

speed     For each corpus (the real WARC pages, the httpbis drafts, a generated crawl of
          ~20 KB pages with shared site templates) three pipelines over the same pages,
          median of --passes passes, passes of the three interleaved so that machine noise
          hits them alike. Seconds are the pinned process's CPU time (on a shared machine,
          other processes time-slicing the core would otherwise count); wall time alongside:
          - ceiling: `bytes.decode("utf-8", "replace")` + `LexborHTMLParser(html).body.text()`.
            The plain UTF-8 decode is inside the ceiling because ours decodes too (ours
            also sniffs the charset; the ceiling does not);
          - stream-dedup: `Deduplicator(Settings()).check(page)` for every page in order,
            defaults (verification of every candidate), a fresh Deduplicator per pass;
          - peer: the ceiling's text, `\\w+` tokens of the lower-cased text, 8-word shingles
            joined by spaces, xxhash.xxh64 per shingle, datasketch MinHash(num_perm=84,
            scheme="affine64") via update_batch (permutations built once and reused), and
            MinHashLSH(num_perm=84, params=(6, 14)): query, then insert if nothing came back.
profile   Where stream-dedup's time goes, per stage: Deduplicator.check rebuilt from the
          pure core functions and the public decide() (perf_counter around each stage, the
          index wrapped to time lookups/inserts, verification seconds from the engine's
          Observer; it checks that it reaches the same decisions); the kernels inside the
          sketch step (one call in the engine) timed one at a time; cProfile's top functions.
scaling   µs per page and per KB for the three pipelines on generated pages of 1 KB … 1 MB.
memory    Index bytes per page at 1M and 10M pages of random features (6 per page, plus raw
          and canonical fingerprints) in the SortedRunMultimap structures MemoryIndex uses,
          and MemoryIndex itself (with its per-page document records) at 1M. Each size runs
          in a fresh child process so that its RSS growth is its own.

Reading the speed section: synthetic pages are two-thirds text, so the per-character work
the ceiling does not do (tokenizing, LD signature, min-hashes) weighs as much as the parse,
and every kept page's shingle set is made and stored. The one-page `check` path also runs
without the garbage-collector settings that `replay` and `serve` use.

    python bench/speed.py                 # everything (~10 min on 2 noisy cores)
    python bench/speed.py --quick         # smaller corpora and sizes, 3 passes (~2 min)
    python bench/speed.py --sections speed,profile --passes 7
"""

from __future__ import annotations

import argparse
import cProfile
import ctypes
import gc
import json
import pstats
import re
import statistics
import subprocess
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import xxhash
from datasketch import MinHash, MinHashLSH
from selectolax.lexbor import LexborHTMLParser

sys.path.insert(0, str(Path(__file__).resolve().parent))

import benchlib  # noqa: E402
from benchlib import proc_status, table  # noqa: E402

from stream_dedup import Settings  # noqa: E402
from stream_dedup.core import extract, ldsig  # noqa: E402
from stream_dedup.core import tokens as toks  # noqa: E402
from stream_dedup.core.decode import decode_html  # noqa: E402
from stream_dedup.core.sketch import Sketcher  # noqa: E402
from stream_dedup.core.tokens import Tokens  # noqa: E402
from stream_dedup.decide.step import decide_batch  # noqa: E402
from stream_dedup.index.base import Claim, StoredDoc  # noqa: E402
from stream_dedup.index.memory import MemoryIndex, SortedRunMultimap  # noqa: E402
from stream_dedup.models import Decision, Page  # noqa: E402
from stream_dedup.pipeline.deduplicator import (  # noqa: E402
    Analysis,
    Deduplicator,
    _probe,
    canonical_fingerprint,
    raw_fingerprint,
)

SECTIONS = ("speed", "profile", "scaling", "memory")

# --- the three pipelines ------------------------------------------------------------------------


def ceiling_text(page: Page) -> str:
    html = page.body.decode("utf-8", "replace")
    body = LexborHTMLParser(html).body
    return body.text() if body is not None else ""


def run_ceiling(pages: Sequence[Page]) -> Counter[str]:
    chars = 0
    for page in pages:
        chars += len(ceiling_text(page))
    return Counter(chars=chars)


def run_ours(pages: Sequence[Page]) -> Counter[str]:
    dedup = Deduplicator(Settings())
    out: Counter[str] = Counter()
    for page in pages:
        d = dedup.check(page)
        out[f"{d.decision}/{d.reason}"] += 1
    return out


_WORD = re.compile(r"\w+")


class Peer:
    """A naive near-duplicate filter from well-known parts (see the module docstring)."""

    NUM_PERM = 84
    W = 8

    def __init__(self) -> None:
        self.lsh = MinHashLSH(threshold=0.9, num_perm=self.NUM_PERM, params=(6, 14))
        self._perms = self._minhash().permutations
        self.next_key = 0

    def _minhash(self, perms: object = None) -> MinHash:
        return MinHash(
            num_perm=self.NUM_PERM, scheme="affine64", hashfunc=xxhash.xxh64_intdigest,
            permutations=perms,
        )

    def check(self, page: Page) -> bool:
        """True = drop (a near-duplicate of an indexed page)."""
        words = _WORD.findall(ceiling_text(page).lower())
        if not words:
            return False
        w = self.W
        if len(words) >= w:
            shingles = [" ".join(words[i : i + w]).encode() for i in range(len(words) - w + 1)]
        else:
            shingles = [" ".join(words).encode()]
        m = self._minhash(self._perms)
        m.update_batch(shingles)
        if self.lsh.query(m):
            return True
        self.lsh.insert(self.next_key, m, check_duplication=False)
        self.next_key += 1
        return False


def run_peer(pages: Sequence[Page]) -> Counter[str]:
    peer = Peer()
    out: Counter[str] = Counter()
    for page in pages:
        out["drop" if peer.check(page) else "keep"] += 1
    return out


PIPELINES: dict[str, Callable[[Sequence[Page]], Counter[str]]] = {
    "ceiling (decode + lexbor text)": run_ceiling,
    "stream-dedup (check, defaults)": run_ours,
    "peer (regex + xxh64 + datasketch)": run_peer,
}
CEILING, OURS, PEER = PIPELINES


def time_pipelines(
    pages: Sequence[Page], passes: int, names: Sequence[str] = tuple(PIPELINES)
) -> tuple[dict[str, list[float]], dict[str, list[float]], dict[str, Counter[str]]]:
    """CPU and wall seconds of each pass of each pipeline (passes interleaved, so that the
    machine's noise hits them alike), and their outcomes."""
    warm = pages[: max(1, min(len(pages), 20))]
    for name in names:  # imports, lexbor, the code-point table, numpy's first calls
        PIPELINES[name](warm)
    cpu: dict[str, list[float]] = defaultdict(list)
    wall: dict[str, list[float]] = defaultdict(list)
    outcome: dict[str, Counter[str]] = {}
    for _ in range(passes):
        for name in names:
            gc.collect()
            c0, w0 = time.process_time(), time.perf_counter()
            outcome[name] = PIPELINES[name](pages)
            cpu[name].append(time.process_time() - c0)
            wall[name].append(time.perf_counter() - w0)
    return cpu, wall, outcome


def speed_table(label: str, pages: Sequence[Page], passes: int) -> tuple[str, dict[str, float]]:
    cpu, wall, outcome = time_pipelines(pages, passes)
    mb = sum(len(p.body) for p in pages) / 1e6
    med = {name: statistics.median(t) for name, t in cpu.items()}
    rows = []
    for name, t in cpu.items():
        rows.append([
            name, len(pages), mb, med[name], min(t), max(t) / min(t),
            statistics.median(wall[name]), len(pages) / med[name], mb / med[name],
            med[CEILING] / med[name], med[PEER] / med[name],
        ])
    text = table(
        ["pipeline", "pages", "MB", "CPU s (median)", "CPU s (min)", "max/min", "wall s (median)",
         "pages/s", "MB/s", "× ceiling", "× peer"],
        rows,
    )
    ours = outcome[OURS]
    mix = ", ".join(f"{k} {v}" for k, v in sorted(ours.items()))
    text += (
        f"\n\nstream-dedup decisions: {mix}. Peer: {outcome[PEER]['drop']} dropped, "
        f"{outcome[PEER]['keep']} kept."
    )
    ratios = {
        "ceiling": med[CEILING] / med[OURS],
        "peer": med[PEER] / med[OURS],
    }
    return f"### {label}\n\n{text}\n", ratios


# --- stage profile: check() rebuilt from the public pieces, with a clock ---------------------

STAGES = (
    "raw fp + stored hint",
    "decode (charset)",
    "extract: depth check (_too_deep)",
    "extract: parse (lexbor)",
    "extract: walk + text",
    "tokenize (fold, classify, hash)",
    "canonical fp",
    "sketch step (one kernel call)",
    "index lookup",
    "decide step (pure)",
    "index claim",
    "verification",
    "decide: bookkeeping (rest)",
)
REST = "decide: bookkeeping (rest)"


class Clock:
    """Accumulates the time since the last lap into a stage."""

    def __init__(self) -> None:
        self.acc: dict[str, float] = dict.fromkeys(STAGES, 0.0)
        self.t = time.perf_counter()

    def lap(self, stage: str) -> None:
        now = time.perf_counter()
        self.acc[stage] += now - self.t
        self.t = now


class TimedIndex:
    """Wraps the FeatureIndex of a Deduplicator: time inside each of its calls goes to that
    call's stage, time between them to REST."""

    STAGE = {"stored": "raw fp + stored hint", "lookup": "index lookup", "claim": "index claim"}

    def __init__(self, inner: Any, clock: Clock) -> None:
        self.inner = inner
        self.clock = clock

    def __len__(self) -> int:
        return len(self.inner)

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        stage = self.STAGE.get(name)
        if stage is None:
            return attr

        def timed(*args: Any, **kwargs: Any) -> Any:
            self.clock.lap(REST)
            out = attr(*args, **kwargs)
            self.clock.lap(stage)
            return out
        return timed


class VerifyObserver:
    """Picks up the engine's own verification seconds (pipeline.Observer, if this version
    of the engine has one)."""

    def __init__(self) -> None:
        self.verify_s = 0.0

    def page(self, decision: Decision, nbytes: int, times: Any) -> None:
        self.verify_s += getattr(times, "verify_s", 0.0)

    def redelivered(self, decision: Decision) -> None:
        pass

    def batch(self, index: Any) -> None:
        pass


def new_profiled(clock: Clock) -> tuple[Deduplicator, VerifyObserver | None]:
    obs = VerifyObserver()
    try:
        dd = Deduplicator(Settings(), observer=obs)  # type: ignore[call-arg]
    except TypeError:  # an engine without observers: verification stays in REST
        dd, obs = Deduplicator(Settings()), None
    dd.index = TimedIndex(dd.index, clock)  # type: ignore[assignment]
    return dd, obs


def _visible_text_timed(html: str, clock: Clock, boilerplate: bool) -> str:
    """extract.visible_text(collapse=False), stage by stage (the same private functions, in
    the same order)."""
    if not html or html.isspace():
        return ""
    too_deep = extract._too_deep(html)
    clock.lap("extract: depth check (_too_deep)")
    if boilerplate or too_deep:
        text = extract.visible_text(html, boilerplate=boilerplate, collapse=False)
        clock.lap("extract: parse (lexbor)")
        return text
    tree = extract._parse(html)
    clock.lap("extract: parse (lexbor)")
    if tree.body is None or not extract.NATIVE_WALK:  # frameset, or no compiled kernel
        text = extract._extract(html, False, allow_noframes=True)
        clock.lap("extract: walk + text")
        return text
    text = extract._native.visible_text(tree, extract._INVISIBLE_BITS, extract._BREAKING_BITS)
    clock.lap("extract: walk + text")
    return text


def _tokenize_timed(visible: str, clock: Clock) -> Tokens:
    """tokens.tokenize as one stage (one kernel call, or numpy without the kernel)."""
    out = toks.tokenize(visible)
    clock.lap("tokenize (fold, classify, hash)")
    return out


def profiled_check(dd: Deduplicator, page: Page, clock: Clock, check_copy: bool) -> Decision:
    """Deduplicator.check rebuilt from its pieces, with a lap after each stage: the stored
    hint (an exact copy of a stored page is only fingerprinted), the pure stages, then one
    lookup, the pure decide step (verification inside it is counted apart) and the claim.
    Pages that do not parse cleanly (rejects) and exact copies go through the real check."""
    s = dd.settings
    clock.lap(REST)
    raw_fp = raw_fingerprint(page.body)
    if dd.index.stored([raw_fp])[0] or len(page.body) > s.max_page_bytes:
        d = dd.check(page)
        clock.lap(REST)
        return d
    try:
        html = decode_html(page.body, page.header("content-type"))
        clock.lap("decode (charset)")
        visible = _visible_text_timed(html, clock, s.boilerplate)
        tokens = _tokenize_timed(visible, clock)
    except Exception:
        clock.lap(REST)
        return dd.check(page)
    if check_copy:
        ref = toks.tokenize(extract.visible_text(html, boilerplate=s.boilerplate, collapse=False))
        if not (np.array_equal(ref.codepoints, tokens.codepoints)
                and np.array_equal(ref.hashes, tokens.hashes)):
            raise SystemExit("bench/speed.py's copy of tokenize/visible_text no longer matches "
                             "stream_dedup.core: update _tokenize_timed/_visible_text_timed")
        clock.t = time.perf_counter()
    a = Analysis(
        page, raw_fp, canonical_fingerprint(tokens),
        text_length=int(tokens.codepoints.shape[0]),
        shingle_count=max(0, len(tokens) - s.shingle_words + 1),
    )
    clock.lap("canonical fp")
    if a.shingle_count >= s.min_shingles:
        sk, feats, sig = dd.analyzer.sketcher.page(tokens.hashes, tokens.codepoints)
        clock.lap("sketch step (one kernel call)")
        a = replace(a, sketch=sk, features=feats, ld_signature=sig)
    pid = dd.index.local_ids(1)[0]
    probe = _probe(a, pid)
    answers = dd.index.lookup([probe])
    verdict = decide_batch([a], [pid], answers, s)[0]
    clock.lap("decide step (pure)")
    clock.acc["verification"] += verdict.verify_s
    clock.acc["decide step (pure)"] -= verdict.verify_s
    dd.index.claim([Claim(probe, verdict.doc, verdict.decision, verdict.depends_on)])
    assert verdict.decision is not None
    return verdict.decision


def _same(a: Decision, b: Decision) -> bool:
    ida = a.duplicate_of.page_id if a.duplicate_of else None
    idb = b.duplicate_of.page_id if b.duplicate_of else None
    return (a.decision, a.reason, a.page_id, ida) == (b.decision, b.reason, b.page_id, idb)


def stage_profile(corpora: dict[str, Sequence[Page]], passes: int) -> str:
    cols: dict[str, dict[str, float]] = {}
    notes = []
    for label, pages in corpora.items():
        real = Deduplicator(Settings())
        reference = [real.check(p) for p in pages]
        real_times = []
        for _ in range(passes):
            gc.collect()
            t0 = time.perf_counter()
            run_ours(pages)
            real_times.append(time.perf_counter() - t0)
        best: dict[str, float] = {}
        for i in range(passes + 1):
            clock = Clock()
            dd, obs = new_profiled(clock)
            gc.collect()
            clock.t = time.perf_counter()
            mirror = [profiled_check(dd, p, clock, check_copy=(i == 0)) for p in pages]
            clock.lap(REST)
            if obs is not None:  # the engine's own verification seconds, inside REST
                clock.acc["verification"] += obs.verify_s
                clock.acc[REST] -= obs.verify_s
            if i == 0:
                same = sum(_same(x, y) for x, y in zip(mirror, reference, strict=True))
                if same != len(pages):
                    raise SystemExit(f"{label}: instrumented check disagrees on "
                                     f"{len(pages) - same} pages; update profiled_check")
                continue  # the first pass also runs the copy check: not timed
            for k, v in clock.acc.items():  # noise only adds: the least time per stage
                best[k] = min(best.get(k, v), v)
        cols[label] = {k: v / len(pages) * 1e6 for k, v in best.items()}
        total = sum(best.values())
        notes.append(
            f"{label}: sum of the stages {total / len(pages) * 1e6:,.0f} µs/page vs "
            f"Deduplicator.check {min(real_times) / len(pages) * 1e6:,.0f} µs/page (fastest of "
            f"{passes} wall-clock passes); decisions identical on all {len(pages)} pages."
        )
    labels = list(cols)
    rows = []
    for stage in STAGES:
        row: list[object] = [stage]
        for label in labels:
            us = cols[label][stage]
            row += [us, 100 * us / sum(cols[label].values())]
        rows.append(row)
    totals: list[object] = ["total"]
    for label in labels:
        totals += [sum(cols[label].values()), 100.0]
    rows.append(totals)
    heads = ["stage"]
    for label in labels:
        heads += [f"{label} µs/page", "%"]
    return table(heads, rows) + "\n\n" + "\n".join(f"- {n}" for n in notes) + "\n"


def sketch_step_breakdown(corpora: dict[str, Sequence[Page]], passes: int) -> str:
    """The kernels inside the sketch step, each called alone on every page's tokens (the
    same kernels `Sketcher.page` runs in one call; features are what the call adds)."""
    s = Settings()
    rows = []
    for label, pages in corpora.items():
        tokens = [toks.tokenize(extract.visible_text(decode_html(p.body, p.header(
            "content-type")), collapse=False)) for p in pages]
        tokens = [t for t in tokens if len(t) - s.shingle_words + 1 >= s.min_shingles]
        rows.append([label, len(tokens), *_sketch_steps(s, tokens, passes)])
    return table(["corpus", "sketched pages", "shingles µs", "84 min-hashes µs",
                  "LD signature µs", "sketch_page (all + features) µs"], rows) + "\n"


def _sketch_steps(s: Settings, tokens: list[Tokens], passes: int) -> list[float]:
    sk = Sketcher(s.params)
    shingles = [sk.shingles(t.hashes) for t in tokens]
    steps: list[Callable[[], object]] = [
        lambda: [sk.shingles(t.hashes) for t in tokens],
        lambda: [sk.sketch(x) for x in shingles],
        lambda: [ldsig.signature(t.codepoints, s.ld_c, s.ld_n) for t in tokens],
        lambda: [sk.page(t.hashes, t.codepoints) for t in tokens],
    ]
    out = []
    for run in steps:
        best = float("inf")
        for _ in range(passes):
            t0 = time.process_time()
            run()
            best = min(best, time.process_time() - t0)
        out.append(best / max(1, len(tokens)) * 1e6)
    return out


def cprofile_top(pages: Sequence[Page], label: str, top: int = 15) -> str:
    prof = cProfile.Profile()
    dd = Deduplicator(Settings())
    prof.enable()
    for p in pages:
        dd.check(p)
    prof.disable()
    st = pstats.Stats(prof)
    entries = []
    for (file, line, func), (_cc, nc, tt, ct, _callers) in st.stats.items():  # type: ignore[attr-defined]
        where = Path(file).name if file != "~" else ""
        name = f"{where}:{line}({func})" if where else func
        entries.append((tt, ct, nc, name))
    entries.sort(reverse=True)
    total = sum(e[0] for e in entries)
    rows = [
        [name, nc / len(pages), tt / len(pages) * 1e6, 100 * tt / total, ct / len(pages) * 1e6]
        for tt, ct, nc, name in entries[:top]
    ]
    return (
        f"cProfile, {label} ({len(pages)} pages; cProfile's per-call overhead inflates "
        "Python-heavy functions):\n\n"
        + table(["function", "calls/page", "own µs/page", "own %", "cum µs/page"], rows)
        + "\n"
    )


# --- size scaling -------------------------------------------------------------------------------

SIZES_KB = (1, 4, 16, 64, 256, 1024)


def scaling(passes: int, budget_mb: float) -> str:
    rows = []
    for kb in SIZES_KB:
        count = int(max(6, min(1500, budget_mb * 1024 / kb)))
        pages = benchlib.synthetic_pages(
            count, kb * 1024, minimal_template=True, near_share=0.0, seed=kb
        )
        times, _, _ = time_pipelines(pages, passes)
        mean_kb = sum(len(p.body) for p in pages) / len(pages) / 1024
        med = {n: statistics.median(t) / len(pages) * 1e6 for n, t in times.items()}
        rows.append([
            f"{kb} KB", count, mean_kb,
            med[CEILING], med[OURS], med[PEER],
            med[CEILING] / mean_kb, med[OURS] / mean_kb, med[PEER] / mean_kb,
            med[CEILING] / med[OURS], med[PEER] / med[OURS],
        ])
    return table(
        ["size", "pages", "mean KB", "ceiling µs/page", "ours µs/page", "peer µs/page",
         "ceiling µs/KB", "ours µs/KB", "peer µs/KB", "ours × ceiling", "ours × peer"],
        rows,
    ) + "\n"


# --- memory -------------------------------------------------------------------------------------

_CHUNK = 10_000  # pages generated at a time (small: their transient memory is in the RSS)


def memory_child(kind: str, n: int) -> dict[str, float]:
    """Insert n pages of random features into `kind`; runs in its own process."""
    rng = np.random.default_rng(20261121)
    gc.collect()
    before = proc_status()
    spent = 0.0
    perf = time.perf_counter
    if kind == "multimaps":
        feats = SortedRunMultimap(64, "last")
        raw, canon = SortedRunMultimap(2, "first"), SortedRunMultimap(2, "first")
        for lo in range(0, n, _CHUNK):
            m = min(_CHUNK, n - lo)
            f = rng.integers(0, 2**64 - 1, size=(m, 6), dtype=np.uint64, endpoint=True).tolist()
            fp = rng.integers(0, 2**64 - 1, size=(m, 2), dtype=np.uint64, endpoint=True).tolist()
            t0 = perf()
            for i in range(m):
                pid = lo + i
                for x in f[i]:
                    feats.add(x, pid)
                raw.add(fp[i][0], pid)
                canon.add(fp[i][1], pid)
            spent += perf() - t0
        t0 = perf()
        for mm in (feats, raw, canon):
            mm.flush()
        spent += perf() - t0
        maps = (feats, raw, canon)
        docs_bytes = 0.0
    elif kind == "memoryindex":
        index = MemoryIndex(Settings().params.stamp, 64)
        for lo in range(0, n, _CHUNK):
            m = min(_CHUNK, n - lo)
            f = rng.integers(0, 2**64 - 1, size=(m, 6), dtype=np.uint64, endpoint=True)
            sk = rng.integers(0, 2**32 - 1, size=(m, 84), dtype=np.uint32, endpoint=True)
            fp = rng.integers(0, 2**64 - 1, size=(m, 2), dtype=np.uint64, endpoint=True).tolist()
            sig = rng.integers(0, 255, size=(m, 200), dtype=np.uint8, endpoint=True)
            docs = [
                StoredDoc(
                    url=f"https://site{(lo + i) % 1000}.example/articles/{lo + i}",
                    features=f[i].copy(), sketch=sk[i].copy(), ld_signature=sig[i].tobytes(),
                    text_length=6400, raw_fp=fp[i][0], canonical_fp=fp[i][1],
                )
                for i in range(m)
            ]
            del f, sk, sig
            t0 = perf()
            for doc in docs:
                index.insert(doc)
            spent += perf() - t0
            del docs
        maps = (index._features, *index._exact)
        t0 = perf()
        for mm in maps:
            mm.flush()
        spent += perf() - t0
        docs_bytes = float(index.stats()["doc_store_bytes"])
    else:
        raise SystemExit(f"unknown memory kind {kind}")
    gc.collect()
    after = proc_status()
    trimmed = after
    try:  # give freed heap pages (merge temporaries) back to the OS, then look again
        ctypes.CDLL("libc.so.6").malloc_trim(0)
        trimmed = proc_status()
    except (OSError, AttributeError):
        pass
    return {
        "pages": n,
        "seconds": spent,
        "feature_bytes": maps[0].nbytes(),
        "raw_bytes": maps[1].nbytes(),
        "canonical_bytes": maps[2].nbytes(),
        "runs": len(maps[0]._runs),
        "doc_store_bytes": docs_bytes,
        "rss_delta": after["VmRSS"] - before["VmRSS"],
        "rss_trimmed": trimmed["VmRSS"] - before["VmRSS"],
        "peak_delta": after["VmHWM"] - before["VmRSS"],
    }


def memory(sizes: Sequence[int], doc_sizes: Sequence[int], cpu: int | None) -> str:
    rows = []
    for kind, ns in (("multimaps", sizes), ("memoryindex", doc_sizes)):
        for n in ns:
            cmd = [sys.executable, __file__, "--memory-child", kind, str(n)]
            if cpu is not None:
                cmd += ["--cpu", str(cpu)]
            done = subprocess.run(cmd, capture_output=True, text=True, check=False)
            if done.returncode != 0:
                rows.append([kind, f"{n:,}", "failed: " + done.stderr.strip()[-200:]] + [""] * 9)
                continue
            r = json.loads(done.stdout.strip().splitlines()[-1])
            index = r["feature_bytes"] + r["raw_bytes"] + r["canonical_bytes"]
            rows.append([
                "SortedRunMultimap ×3" if kind == "multimaps" else "MemoryIndex.insert",
                f"{n:,}", n / r["seconds"], r["feature_bytes"] / n, r["raw_bytes"] / n,
                r["canonical_bytes"] / n, index / n,
                "yes" if index / n <= 64 else "no",
                r["doc_store_bytes"] / n if kind == "memoryindex" else float("nan"),
                r["rss_delta"] / n, r["rss_trimmed"] / n, r["peak_delta"] / 2**20,
            ])
    return table(
        ["structure", "pages", "inserts/s", "features B/page", "raw fp B/page",
         "canonical fp B/page", "index B/page", "≤ 64 B?", "doc records B/page (nbytes)",
         "RSS Δ B/page", "… after malloc_trim", "peak RSS Δ MiB"],
        rows,
    ) + "\n"


# --- main ---------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--passes", type=int, default=None, help="timed passes (default 5; quick 3)")
    ap.add_argument("--quick", action="store_true", help="smaller corpora and sizes")
    ap.add_argument("--sections", default=",".join(SECTIONS), help=f"subset of {SECTIONS}")
    ap.add_argument("--cpu", type=int, default=None, help="CPU to pin to (default: last)")
    ap.add_argument("--synthetic-pages", type=int, default=None, help="default 2000 (quick 400)")
    ap.add_argument("--memory-child", nargs=2, metavar=("KIND", "N"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    cpu = benchlib.pin(args.cpu)
    if args.memory_child:
        print(json.dumps(memory_child(args.memory_child[0], int(args.memory_child[1]))))
        return 0
    sections = [s.strip() for s in args.sections.split(",") if s.strip()]
    unknown = set(sections) - set(SECTIONS)
    if unknown:
        ap.error(f"unknown sections {sorted(unknown)}")
    passes = args.passes or (3 if args.quick else 5)
    print(benchlib.header(f"# bench/speed.py (pinned to CPU {cpu}, {passes} passes)"))

    corpora: dict[str, Sequence[Page]] = {}
    if {"speed", "profile"} & set(sections):
        warc, _ = benchlib.load_warc_pages()
        httpbis = benchlib.load_httpbis_pages()
        n_synth = args.synthetic_pages or (400 if args.quick else 2000)
        if args.quick:
            warc, httpbis = warc[::3], httpbis[::4]
        corpora = {
            "WARC": warc,
            "httpbis": httpbis,
            "synthetic": benchlib.synthetic_pages(n_synth),
        }

    if "speed" in sections:
        print("## Throughput, one core (CPU time of the pinned process: other processes "
              "time-slicing the core do not count; wall time alongside)\n")
        summary = []
        for label, pages in corpora.items():
            text, ratios = speed_table(f"{label} ({len(pages)} pages)", pages, passes)
            print(text, flush=True)
            summary.append([label, ratios["ceiling"], ratios["peer"]])
        print("Summary (stream-dedup throughput as a share of the others'; targets: ≥ 0.7 of "
              "the ceiling everywhere, ≥ 2.5× the peer on real pages, ≥ 5× on synthetic):\n")
        print(table(["corpus", "ours / ceiling", "ours / peer"], summary) + "\n", flush=True)

    if "profile" in sections:
        print("## Where stream-dedup's time goes (instrumented check; per stage, the least "
              "wall time of 3 passes)\n")
        small = benchlib.synthetic_pages(
            500 if args.quick else 1500, 1024, minimal_template=True, near_share=0.0, seed=1
        )
        print(stage_profile({**corpora, "1 KB pages": small}, 3), flush=True)
        print("Inside the sketch step: its kernels called one at a time on the same tokens "
              "(least CPU time of 3 passes, per sketched page):\n")
        print(sketch_step_breakdown(corpora, 3), flush=True)
        for label in ("WARC", "synthetic"):
            print(cprofile_top(corpora[label], label), flush=True)

    if "scaling" in sections:
        print("## Per-page cost by page size (generated pages, minimal template, no dups; "
              "median CPU time)\n")
        print(scaling(max(1, min(passes, 3)), 2.0 if args.quick else 6.0), flush=True)

    if "memory" in sections:
        print("## Index memory (random features; each row a fresh process)\n")
        sizes = (100_000, 1_000_000) if args.quick else (1_000_000, 10_000_000)
        doc_sizes = (100_000,) if args.quick else (1_000_000,)
        print(memory(sizes, doc_sizes, cpu), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
