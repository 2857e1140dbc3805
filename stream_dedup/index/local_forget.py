"""Forgetting in the memory index: when its rows were kept, and which rows a Forget selects.

The memory index keeps no time a page (its record file holds the crawl time, one pread
away). Rows are kept in time order, so a `Timeline` of spans does: a span begins with the
first row kept a minute or more after the last span began, and holds, per namespace, its
live rows and the earliest and latest time of their pages (crawl, else the span's start:
namespaces.page_time). A few dozen bytes a minute, not bytes a page. It answers
`namespaces()` (pages and oldest per namespace) and narrows `before`: a span whose latest
page is older than the cutoff is forgotten whole, one whose earliest is not is skipped, and
only the rows of a span across the cutoff have their record read.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from stream_dedup.index.namespaces import Forget, host_of, page_time, unpack_url

SPAN_S = 60.0


@dataclass(slots=True)
class Span:
    first_row: int
    stored_at: float
    # namespace -> [live rows, earliest page time, latest page time]
    spaces: dict[str, list[float]] = field(default_factory=dict)


class Timeline:
    def __init__(self) -> None:
        self.starts: list[int] = []
        self.spans: list[Span] = []

    def add(self, row: int, namespace: str, fetched_at: str | None, now: float) -> None:
        """Row `row` (the next one) kept at `now`."""
        if not self.spans or now - self.spans[-1].stored_at >= SPAN_S:
            self.starts.append(row)
            self.spans.append(Span(row, now))
        span = self.spans[-1]
        when = page_time(fetched_at, span.stored_at)
        assert when is not None
        got = span.spaces.get(namespace)
        if got is None:
            span.spaces[namespace] = [1, when, when]
        else:
            got[0] += 1
            got[1] = min(got[1], when)
            got[2] = max(got[2], when)

    def span_of(self, row: int) -> Span:
        return self.spans[bisect.bisect_right(self.starts, row) - 1]

    def remove(self, row: int, namespace: str) -> None:
        """A row retired or forgotten (it was live)."""
        span = self.span_of(row)
        got = span.spaces[namespace]
        got[0] -= 1
        if not got[0]:
            del span.spaces[namespace]

    def end_of(self, i: int, rows: int) -> int:
        return self.starts[i + 1] if i + 1 < len(self.starts) else rows

    def namespaces(self) -> dict[str, dict[str, Any]]:
        out: dict[str, list[float]] = {}
        for span in self.spans:
            for name, (n, earliest, _) in span.spaces.items():
                got = out.setdefault(name, [0, earliest])
                got[0] += n
                got[1] = min(got[1], earliest)
        return {name: {"pages": int(n), "oldest": iso(earliest)}
                for name, (n, earliest) in sorted(out.items())}


def iso(when: float | None) -> str | None:
    return None if when is None else datetime.fromtimestamp(when, UTC).isoformat()


def selected_rows(timeline: Timeline, rows: int, what: Forget, live: Callable[[int], bool],
                  url_fields: Callable[[int, int], list[bytes]],
                  fetched_at: Callable[[int], str | None]) -> Iterator[tuple[int, str]]:
    """(row, namespace) of every live row `what` selects by namespace, host, time or all
    (a URL and page ids are looked up, not scanned: MemoryIndex.forget)."""
    ns = what.namespace
    for i, span in enumerate(timeline.spans):
        if ns is not None and ns not in span.spaces:
            continue
        if what.before is not None:
            spaces = list(span.spaces.values()) if ns is None else [span.spaces[ns]]
            if not any(earliest < what.before for _, earliest, _ in spaces):
                continue
            whole = all(latest < what.before for _, _, latest in spaces)
        first = span.first_row
        host = None if what.host is None else what.host.encode()
        for row, stored in enumerate(url_fields(first, timeline.end_of(i, rows)), first):
            if host is not None and host not in stored.lower() or not live(row):
                continue
            name, url = unpack_url(stored)
            if ns is not None and name != ns:
                continue
            if what.host is not None and host_of(url) != what.host:
                continue
            if what.before is not None and not whole:
                when = page_time(fetched_at(row), span.stored_at)
                if when is None or when >= what.before:
                    continue
            if what.host is None and what.before is None and not what.all:
                continue
            yield row, name
        if what.before is not None:  # what is left of it is not older than the cutoff
            for name, got in span.spaces.items():
                if ns is None or name == ns:
                    got[1] = max(got[1], what.before)
