"""`stream-dedup report DECISIONS [CRAWL ...] -o report.html` (and `replay --report FILE`):
the files read and written around the pure report (stream_dedup/report/).

The decisions are read once, line by line (a line that is not a decision is counted and
named in the page, never a traceback); then, when crawl files are given, the pages the
sampled views show are looked up by their decisions' `source` (`file#record`): a crawl is
matched to a source's file by the path as given, else by its file name, and read only as
far as its last page wanted. What cannot be shown is said in the page, which is written
whatever it holds.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from stream_dedup.cli.clusters import decision_lines
from stream_dedup.config import Settings
from stream_dedup.models import Page
from stream_dedup.report.model import BAR, Tally
from stream_dedup.report.page import render
from stream_dedup.report.texts import PageText, page_text
from stream_dedup.sources.archive_record import Frame, convert
from stream_dedup.sources.files import input_kind, iter_inputs
from stream_dedup.sources.warc import archive_format, lenient_items, read_head, warc_items

# The settings that change decisions: what "the run" section shows
RUN_SETTINGS = (
    "shingle_words", "groups", "group_size", "threshold", "min_shingles", "boilerplate",
    "verify_rate", "verify_exact", "verify_min_jaccard", "verify_min_resemblance",
    "near_verified_min_resemblance", "verify_max_ld_ratio", "verify_single_feature",
    "bands", "band_size", "contain_min", "contain_keys", "max_page_bytes",
    "url_ignore_params", "index", "workers",
)
SUMMARY_FIGURES = ("pages", "seconds", "pages_per_second", "verification", "skipped_records",
                   "unreadable_inputs")

EPILOG = """\
examples:
  stream-dedup replay crawl.warc.gz -o d.jsonl --summary-json s.json
  stream-dedup report d.jsonl crawl.warc.gz --summary-json s.json -o report.html
  stream-dedup report d.jsonl -o report.html           # without the crawl: no texts
  stream-dedup replay crawl-*.warc.gz -o d.jsonl --report report.html   # both at once

The page (one HTML file, nothing loaded from the network; open it from disk) shows the
totals by decision and reason, charts (outcomes along the input, the scores of the drops,
cluster sizes, the top hosts, recrawl change rates), a sample of each reason's drops and
of the verified-distinct keeps side by side, borderline first, with the two pages' visible
texts and the words that differ marked when the crawls are given, and the largest
clusters. Crawl files are matched to the decisions' sources (file#record) by the path
given to replay, else by file name.

exit status: 0 written; 1 written, but some lines of the decisions were not decisions
(counted and named in the page); 2 a missing input or an output that cannot be written.
"""


def add_parser(sub: Any) -> None:
    p = sub.add_parser("report", help="one HTML page of a run's decisions: totals, charts, "
                       "drops side by side with the pages they name",
                       description="Write a self-contained HTML report of a run's decisions "
                       "(replay -o, or the decisions topic), with the pages' texts side by "
                       "side when the crawl files are given.",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("decisions", metavar="DECISIONS", help="decisions, JSON lines ('-': stdin)")
    p.add_argument("crawls", nargs="*", metavar="CRAWL",
                   help="the WARC/ARC/JSONL files the decisions were made from (optional)")
    p.add_argument("-o", "--output", metavar="FILE", required=True, help="the HTML file")
    p.add_argument("--summary-json", metavar="FILE",
                   help="replay's --summary-json: the run's figures and settings, shown too")
    p.add_argument("--per-reason", type=int, default=12, metavar="N",
                   help="side-by-side views of each reason, borderline first (12)")
    p.add_argument("--boilerplate", action="store_true",
                   help="extract texts as a --boilerplate run did (read from the summary "
                   "when it says)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    missing = [p for p in [args.decisions, *args.crawls] if p != "-" and not Path(p).is_file()]
    if missing:
        print(f"stream-dedup: no such file: {', '.join(missing)}", file=sys.stderr)
        return 2
    out = Path(args.output)
    if not out.absolute().parent.is_dir():
        print(f"stream-dedup: -o {out}: the directory {out.parent} does not exist",
              file=sys.stderr)
        return 2
    notes: list[str] = []
    run_info = _summary(args.summary_json, notes) if args.summary_json else {}
    settings = run_info.get("settings")
    boilerplate = args.boilerplate or isinstance(settings, dict) and settings.get("boilerplate")
    tally = write_report(args.decisions, args.crawls, out, run_info=run_info,
                         boilerplate=bool(boilerplate), per_reason=args.per_reason, notes=notes)
    for note in notes:
        print(f"stream-dedup: {note}", file=sys.stderr)
    print(f"wrote {out} ({out.stat().st_size:,} bytes: {tally.pages:,} decisions)",
          file=sys.stderr)
    return 1 if tally.bad_lines else 0


def run_settings(settings: Settings) -> dict[str, Any]:
    return {name: getattr(settings, name) for name in RUN_SETTINGS}


def write_report(decisions: str, crawls: Sequence[str], out: Path, *,
                 run_info: Mapping[str, Any] | None = None, boilerplate: bool = False,
                 per_reason: int = 12, notes: list[str] | None = None) -> Tally:
    """Read the decisions (and the pages they show from `crawls`), write the page."""
    notes = notes if notes is not None else []
    settings = (run_info or {}).get("settings")
    run_info = {**{k: v for k, v in (run_info or {}).items() if k in SUMMARY_FIGURES},
                **(settings if isinstance(settings, dict) else {})}
    bar = run_info.get("verify_min_jaccard")
    tally = Tally(per_reason=max(per_reason, 0),
                  bar=bar if isinstance(bar, float) and 0 < bar <= 1 else BAR)
    read_decisions(decisions, tally)
    if tally.pages == 0:
        notes.append(f"{decisions} holds no decisions" + (
            f": none of its {tally.bad_lines:,} lines is a decision (is it a crawl file? "
            "the decisions come first, then the crawls)" if tally.bad_lines else " (empty)"))
    texts: dict[str, PageText | None] = {}
    if crawls:
        texts = find_texts(tally, crawls, boilerplate, notes)
    html = render(tally, texts, title="stream-dedup report", inputs=[decisions],
                  notes=notes, run=run_info, crawls_given=bool(crawls),
                  made_at=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()))
    out.write_text(html, encoding="utf-8")
    return tally


def read_decisions(path: str, tally: Tally) -> None:
    for n, d in decision_lines(path):
        if isinstance(d, str):
            tally.bad(f"line {n}: {d}")
        else:
            tally.add(d, f"line {n}")


def _summary(path: str, notes: list[str]) -> dict[str, Any]:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        notes.append(f"--summary-json {path} could not be read ({exc}): the run's figures "
                     "are not shown")
        return {}
    if not isinstance(data, dict):
        notes.append(f"--summary-json {path} is not a replay summary")
        return {}
    return {k: data[k] for k in (*SUMMARY_FIGURES, "settings") if k in data}


def find_texts(tally: Tally, crawls: Sequence[str], boilerplate: bool,
               notes: list[str]) -> dict[str, PageText | None]:
    """The texts of the pages the views show, by source; None for one not found."""
    wanted = {s for ps in tally.pairs().values() for p in ps
              for s in (p.source, p.other_source) if s}
    by_file: dict[str, dict[int, str]] = {}  # crawl path -> record ordinal -> source
    unmatched: set[str] = set()
    for source in wanted:
        name, _, n = source.rpartition("#")
        crawl = _crawl_of(name, crawls)
        if crawl is None or not n.isdigit():
            unmatched.add(name or source)
            continue
        by_file.setdefault(crawl, {})[int(n)] = source
    texts: dict[str, PageText | None] = dict.fromkeys(wanted)
    for crawl, ordinals in by_file.items():
        for item in _pages(crawl, ordinals):
            source, page = item
            if page.revisit is not None:
                texts[source] = PageText([], 0, "a revisit record: no payload of its own")
            else:
                texts[source] = page_text(page.body, page.header("content-type"),
                                          boilerplate=boilerplate)
    lost = sorted(s for s, t in texts.items() if t is None)
    if unmatched:
        notes.append("no crawl file given matches the source(s) "
                     + ", ".join(sorted(unmatched)[:5]) + (" …" if len(unmatched) > 5 else "")
                     + ": give the crawl files the decisions were made from")
    if lost:
        notes.append(f"{len(lost):,} of the {len(wanted):,} pages to show side by side were "
                     f"not found in the crawl files (e.g. {lost[0]}): their texts are missing")
    return texts


def _crawl_of(name: str, crawls: Iterable[str]) -> str | None:
    crawls = list(crawls)
    for crawl in crawls:
        if crawl == name:
            return crawl
    same = [c for c in crawls if Path(c).name == Path(name).name]
    return same[0] if len(same) == 1 else None


def _pages(crawl: str, ordinals: dict[int, str]) -> Iterator[tuple[str, Page]]:
    """The pages of `crawl` at those record ordinals, read no further than the last. An
    archive's other records are framed but not converted (half the time of reading it)."""
    last = max(ordinals)
    path = Path(crawl)
    try:
        fmt = archive_format(read_head(path)) if input_kind(path) == "archive" else None
    except OSError:
        fmt = None
    if fmt is not None:
        items = warc_items(path) if fmt == "warc" else lenient_items(path, "arc")
        for n, item in enumerate(items):  # the ordinals replay gives (sources/warc.py)
            if n in ordinals and isinstance(item, Frame):
                page = convert(item, ordinals[n])
                if isinstance(page, Page):
                    yield ordinals[n], page
            if n >= last:
                return
        return
    for page in iter_inputs([crawl]):
        _, _, line = (page.source or "").rpartition("#")
        if not line.isdigit():
            continue
        if int(line) in ordinals and isinstance(page, Page):
            yield ordinals[int(line)], page
        if int(line) >= last:
            return
