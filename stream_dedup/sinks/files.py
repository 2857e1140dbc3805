"""Where replay's decisions go. A Writer takes decisions in input order; flush() hands them
to the OS, close() flushes and closes. `FileSink` is the runner's sink for `replay` over one."""

from __future__ import annotations

import asyncio
import base64
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Protocol

from stream_dedup.models import Decision, Page, Rejected
from stream_dedup.runner.edges import Batch


class Writer(Protocol):
    def write(self, decision: Decision) -> None: ...
    def flush(self) -> None: ...
    def close(self) -> None: ...


class FileSink:
    """Each decision to `writer`, each rejected input's bytes to `dead_letter` (JSONL), both
    flushed at the end of a batch (before the index commits it); `delivered` is told each
    batch's decisions then (a progress display)."""

    def __init__(self, writer: Writer, dead_letter: IO[str] | None = None,
                 delivered: Callable[[Sequence[Decision]], None] = lambda _: None) -> None:
        self.writer, self.dead_letter, self.delivered = writer, dead_letter, delivered

    async def deliver(self, batch: Batch, items: Sequence[Page | Rejected],
                      decisions: Sequence[Decision], stop: asyncio.Event) -> None:
        for item, decision in zip(items, decisions, strict=True):
            self.writer.write(decision)
            if self.dead_letter is not None and isinstance(item, Rejected):
                self.dead_letter.write(dead_letter_record(item) + "\n")
        self.writer.flush()
        if self.dead_letter is not None:
            self.dead_letter.flush()
        self.delivered(decisions)


class MemorySink:
    """Collects decisions in a list (tests)."""

    def __init__(self) -> None:
        self.decisions: list[Decision] = []

    def write(self, decision: Decision) -> None:
        self.decisions.append(decision)

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass


class JsonlSink:
    """One JSON object per line to a file, or to stdout for '-'."""

    def __init__(self, target: str | Path) -> None:
        self._own = str(target) != "-"
        self._fh: IO[str] = (
            open(target, "w", encoding="utf-8") if self._own else sys.stdout  # noqa: SIM115
        )

    def write(self, decision: Decision) -> None:
        self._fh.write(decision.to_json() + "\n")

    def flush(self) -> None:
        self._fh.flush()

    def close(self) -> None:
        self._fh.flush()
        if self._own:
            self._fh.close()


def dead_letter_record(item: Rejected) -> str:
    """The dead-letter form of a rejected input: the error plus the original bytes."""
    return json.dumps({
        "source": item.source,
        "url": item.url,
        "error": item.kind,
        "message": item.message,
        "raw_b64": None if item.raw is None else base64.b64encode(item.raw).decode("ascii"),
    })
