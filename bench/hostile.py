"""Worst case of hostile HTML: seconds per MiB for a page to be decided, by nesting trick.

Each trick is one unit repeated to a page of about the given sizes (up to `max_page_bytes`,
8 MiB), and the time is one full `Deduplicator.check` of the page (decode, the nesting guard,
parse or regex extraction, tokens, sketch, decision). Below the guard's gate (10,000 '<') a page
is parsed whatever its nesting, so the small sizes show what that costs.

    python bench/hostile.py                  # sizes 38 KiB (under the gate), 1 MiB, 8 MiB
    python bench/hostile.py --sizes 0.04,1   # MiB
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import benchlib  # noqa: E402
from benchlib import table  # noqa: E402

from stream_dedup import Deduplicator, Settings  # noqa: E402
from stream_dedup.models import Page  # noqa: E402

TRICKS = {
    "<rt>": "<rt>",
    "<rp>x": "<rp>x",
    "<optgroup>": "<optgroup>",
    "<div>": "<div>",
    "<div></span>": "<div></span>",
    '<div a="</div>">': '<div a="</div>">',
    "<div><!--</div>-->": "<div><!--</div>-->",
    "<p><strike><ol></p>": "<p><strike><ol></p>",
    "<b a=N>": None,  # distinct attributes: Noah's ark does not merge them
    "<svg><option>": "<option>",
    "<template><td>": "<td>",
    "<x-custom-element>": "<x-custom-element>",
    "<a></x-y>": "<a></x-y>",
}
PREFIX = {"<svg><option>": "<svg>", "<template><td>": "<template>"}


def page_of(trick: str, size: int) -> str:
    unit = TRICKS[trick]
    if unit is None:
        parts, total, i = [], 0, 0
        while total < size - 64:
            parts.append(f"<b a={i}>")
            total += len(parts[-1])
            i += 1
        return "".join(parts)
    return PREFIX.get(trick, "") + unit * max(1, (size - 64) // len(unit))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--sizes", default="0.038,1,8", help="page sizes in MiB (default 0.038,1,8)")
    args = ap.parse_args()
    sizes = [int(float(s) * 2**20) for s in args.sizes.split(",")]
    print(benchlib.header("bench/hostile.py: seconds to decide a hostile page"))
    dd = Deduplicator(Settings())
    dd.check_html("https://warm.example/", "<p>warm up: the tables are built once</p>")
    rows = []
    worst = (0.0, "", 0)
    for trick in TRICKS:
        row: list[object] = [trick]
        for size in sizes:
            html = page_of(trick, size)
            body = html.encode("utf-8")
            page = Page(url=f"https://hostile.example/{trick}", body=body,
                        headers=(("Content-Type", "text/html; charset=utf-8"),),
                        source=f"hostile:{trick}:{size}")
            start = time.perf_counter()
            decision = dd.check(page)
            seconds = time.perf_counter() - start
            per_mib = seconds / (len(body) / 2**20)
            row.append(f"{seconds:.3f} s ({per_mib:.2f} s/MiB) {decision.decision}")
            if per_mib > worst[0]:
                worst = (per_mib, trick, len(body))
        rows.append(row)
    print(table(["trick"] + [f"{s / 2**20:.3g} MiB" for s in sizes], rows, right=False))
    print(f"\nworst case: {worst[0]:.2f} s/MiB ({worst[1]!r}, {worst[2]:,} bytes)")


if __name__ == "__main__":
    main()
