#!/usr/bin/env python3
"""Parse cost of one Kafka message, `--input-format warc` against `json`, on the same pages.

The pages: every record of the real WARC set (../shared/corpora/warc, files that cut into
records) that `serve --input-format warc` makes a Page of. Each page becomes three messages:
- warc: the record as stored in its file (its gzip member, or plain bytes);
- json html: {"url", "html", "fetched_at", "status", "headers"}, the body decoded as the
  engine decodes it (what a producer that sends text sends);
- json b64: {"url", "body_b64", ...}, the raw body (a producer that sends bytes).
Timed: `sources.kafka.page_from_message` (what KafkaSource.item runs in the decide thread),
every message of a format in a row, best of --rounds rounds (the formats interleaved round
by round so that machine noise hits them alike), per message. Also the warc messages as
plain records (gunzipped first), and the records `serve` skips, timed alone.

    python bench/warc_messages.py --rounds 7
"""

from __future__ import annotations

import argparse
import base64
import gzip
import json
import statistics
import sys
import time
from collections.abc import Callable

from benchlib import WARCS, command_line, machine, pin

from stream_dedup.core.decode import decode_html
from stream_dedup.kafka.messages import page_from_message
from stream_dedup.models import Page, Skipped
from stream_dedup.sources.fastwarc_reader import record_bytes

LIMIT = 8 << 20


def parse(fmt: str) -> Callable[[bytes], object]:
    def one(value: bytes) -> object:
        return page_from_message(value, None, [], "t/0/0", input_format=fmt, max_bytes=LIMIT)
    return one


def messages() -> dict[str, list[bytes]]:
    out: dict[str, list[bytes]] = {"warc": [], "warc plain": [], "json html": [],
                                   "json b64": [], "warc skipped": []}
    for path in sorted(p for p in WARCS.rglob("*.warc*") if p.is_file()):
        try:
            records = [value for _, value in record_bytes(path)]
        except ValueError:
            continue
        for value in records:
            page = parse("warc")(value)
            if isinstance(page, Skipped):
                out["warc skipped"].append(value)
            if not isinstance(page, Page) or page.revisit is not None:
                continue
            meta = {"url": page.url, "fetched_at": page.fetched_at, "status": page.status,
                    "headers": [list(h) for h in page.headers]}
            text = decode_html(page.body, page.header("Content-Type"))
            out["warc"].append(value)
            out["warc plain"].append(gzip.decompress(value) if value[:2] == b"\x1f\x8b"
                                     else value)
            out["json html"].append(json.dumps({**meta, "html": text}).encode())
            out["json b64"].append(json.dumps(
                {**meta, "body_b64": base64.b64encode(page.body).decode()}).encode())
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--cpu", type=int, default=None, help="pin to this CPU (default: last)")
    args = ap.parse_args()
    if not WARCS.is_dir():
        print(f"{WARCS} is absent", file=sys.stderr)
        return 1
    cpu = pin(args.cpu)
    msgs = messages()
    runs = {name: parse("json" if name.startswith("json") else "warc") for name in msgs}
    times: dict[str, list[float]] = {name: [] for name in msgs}
    for _ in range(args.rounds):
        for name, values in msgs.items():
            fn = runs[name]
            started = time.process_time()
            for value in values:
                fn(value)
            times[name].append((time.process_time() - started) / len(values) * 1e6)
    base = min(times["json html"])
    print(f"# {command_line()}\n# {machine()}, pinned to CPU {cpu}\n")
    stored = statistics.mean(map(len, msgs["warc"]))
    as_json = statistics.mean(map(len, msgs["json html"]))
    print(f"{len(msgs['warc'])} pages (mean stored record {stored:,.0f} B, as json html "
          f"{as_json:,.0f} B)\n")
    print("| message | µs a message (best) | median | × json html |")
    print("|---|---|---|---|")
    for name, ts in times.items():
        print(f"| {name} ({len(msgs[name])}) | {min(ts):.1f} | {statistics.median(ts):.1f} | "
              f"{min(ts) / base:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
