"""Parse cost per Kafka message of each `serve --input-format`, against `json`.

The corpus's real pages (every HTML response of ../shared/corpora/warc, read with the
project's own reader) are built once into the message each format's publisher would send
(tests/formatkit.py), then `sources.kafka.page_from_message` turns each message into a Page,
as the service's decide thread does; nothing else is timed (no analysis, no Kafka client).
Formats are timed in turn within each round, in a new order every round; the figure is the
median of the rounds, in µs per message, and its ratio to `json` (the default format with
the page as text, {"url", "html"}) in the same round: the median of the rounds' ratios and
their range (a loaded host moves the µs; the ratios move less).

    json            {"url", "html"}: the page as text (UTF-8 in the message)
    json b64        {"url", "body_b64", "headers", ...}: the raw bytes, base64
    html            the raw bytes as the value, the URL as key, metadata in Kafka headers
    scrapy-cluster  Scrapy Cluster's crawled_firehose (text in its encoding, headers as lists)
    scrapy + carry  the same with --carry-fields crawlid,appid
    json-fields     a made-up dialect, base64 body in a nested object (formatkit.MAPPING)
    warc            one uncompressed WARC/1.0 response record per message (a checkout
                    without --input-format warc lists it as not available)

    python3 bench/formats.py [--rounds 7]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import REPO, header, load_warc_pages, table  # noqa: E402  (puts REPO first)

sys.path.insert(0, str(REPO / "tests"))  # the message builders the format tests use

from formatkit import (  # noqa: E402
    MAPPING,
    Message,
    firehose,
    firehose_message,
    html_message,
    json_message,
    mapped_message,
    warc_message,
)

from stream_dedup.config import Settings  # noqa: E402
from stream_dedup.config_checks import INPUT_FORMATS  # noqa: E402
from stream_dedup.kafka.dialects import dialect_for  # noqa: E402
from stream_dedup.kafka.messages import page_from_message  # noqa: E402
from stream_dedup.models import Page, Rejected  # noqa: E402

MAX_BYTES = 8 * 1024 * 1024


def text_message(page: Page) -> Message:
    """{"url", "html"}: the page as the text the firehose sends, as UTF-8 JSON."""
    return page.url.encode(), json.dumps({"url": page.url, "html": firehose(page)["body"]},
                                         ensure_ascii=False).encode(), []


# name -> (message builder, settings of `serve`)
FORMATS: dict[str, tuple[Callable[[Page], Message], dict[str, str]]] = {
    "json": (text_message, {}),
    "json b64": (json_message, {}),
    "html": (html_message, {"input_format": "html"}),
    "scrapy-cluster": (firehose_message, {"input_format": "scrapy-cluster"}),
    "scrapy + carry": (firehose_message, {"input_format": "scrapy-cluster",
                                          "carry_fields": "crawlid,appid"}),
    "json-fields": (mapped_message, {"json_fields": MAPPING}),
    "warc": (warc_message, {"input_format": "warc"}),
}


def _parse_all(messages: list[Message], settings: Settings) -> tuple[float, int]:
    """Seconds to read every message; and how many became pages."""
    dialect = dialect_for(settings)
    fmt = settings.input_format
    pages = 0
    started = time.perf_counter()
    for i, (key, value, headers) in enumerate(messages):
        item = page_from_message(value, key, headers, f"t/0/{i}", input_format=fmt,
                                 max_bytes=MAX_BYTES, position=i, dialect=dialect)
        pages += not isinstance(item, Rejected)
    return time.perf_counter() - started, pages


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    pages = [p for p in load_warc_pages()[0] if p.revisit is None]
    print(header(f"# Parse cost per message, {len(pages)} real pages (the WARC corpus)"))
    runnable: dict[str, tuple[list[Message], Settings]] = {}
    skipped = []
    for name, (build, flags) in FORMATS.items():
        if flags.get("input_format", "json") not in INPUT_FORMATS:
            skipped.append(name)
            continue
        runnable[name] = ([build(p) for p in pages], Settings(**flags))
    times: dict[str, list[float]] = {name: [] for name in runnable}
    read: dict[str, int] = {}
    rng = random.Random(7)
    for _ in range(args.rounds):
        order = list(runnable)
        rng.shuffle(order)
        for name in order:
            seconds, read[name] = _parse_all(*runnable[name])
            times[name].append(seconds / len(pages) * 1e6)
    rows = []
    for name, (messages, _) in runnable.items():
        us = statistics.median(times[name])
        ratios = sorted(t / j for t, j in zip(times[name], times["json"], strict=True))
        size = sum(len(v) for _, v, _ in messages) / len(messages) / 1024
        rows.append((name, f"{us:.1f}", f"{min(times[name]):.1f}",
                     f"{statistics.median(ratios):.2f}", f"{ratios[0]:.2f}–{ratios[-1]:.2f}",
                     f"{size:.1f}", f"{read[name]}/{len(pages)}"))
    print(table(["format", "µs/message (median)", "min", "× json (median of rounds)",
                 "× json, range", "KB/message", "pages"], rows))
    for name in skipped:
        print(f"\n{name}: not available in this checkout (--input-format {name} is not "
              f"one of {', '.join(INPUT_FORMATS)})")
    print(f"\n{args.rounds} rounds, formats in a new order each round; "
          f"{Path(sys.executable).name} {sys.version.split()[0]}")


if __name__ == "__main__":
    main()
