"""Where decisions go. A sink takes decisions in input order; close() flushes."""

from __future__ import annotations

import base64
import json
import sys
from pathlib import Path
from typing import IO, Protocol

from ..models import Decision, Rejected


class Sink(Protocol):
    def write(self, decision: Decision) -> None: ...
    def close(self) -> None: ...


class MemorySink:
    """Collects decisions in a list (tests)."""

    def __init__(self) -> None:
        self.decisions: list[Decision] = []

    def write(self, decision: Decision) -> None:
        self.decisions.append(decision)

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
