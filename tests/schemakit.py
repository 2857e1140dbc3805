"""The decision's published JSON Schema (docs/decision.schema.json), compiled once, and the
checks the tests make with it.

- Every decision the Deduplicator gives out in the test process, and every one serialized
  there, is checked (`WATCH`, installed for the whole session by conftest.py): its JSON form
  must match the schema. A bad one is recorded, not raised, so no error handler of the code
  under test can swallow it; the test during which it was made fails (conftest.py).
  (Not when a Decision is constructed: decide/step.py builds some in steps, through
  `dataclasses.replace`, and only the last is given out.)
- Decisions written by another process (a `serve` child on Kafka, a replay subprocess) are
  checked where the tests read them back (`decision_of`), including I-JSON's bound on every
  integer in the raw text, which a parsed Python int would no longer show.
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator

from stream_dedup.models import Decision
from stream_dedup.pipeline.deduplicator import Deduplicator

SCHEMA_PATH = Path(__file__).resolve().parents[1] / "docs" / "decision.schema.json"
SCHEMA = json.loads(SCHEMA_PATH.read_text())
Draft202012Validator.check_schema(SCHEMA)
PUBLISHED = Draft202012Validator(SCHEMA)


def inlined(node: Any, defs: dict[str, Any]) -> Any:
    """`node` with each local `$ref` ("#/$defs/NAME") replaced by what it names: the same
    rules, checked faster (jsonschema resolves a `$ref` again on every use)."""
    if isinstance(node, list):
        return [inlined(v, defs) for v in node]
    if not isinstance(node, dict):
        return node
    out = {k: inlined(v, defs) for k, v in node.items() if k != "$ref"}
    if "$ref" in node:
        prefix = "#/$defs/"
        assert node["$ref"].startswith(prefix), node["$ref"]
        target = inlined(defs[node["$ref"][len(prefix):]], defs)
        assert not (set(out) & set(target)) - {"description"}, node
        out = {**target, **out}
    return out


# What the tests check with (test_decision_schema.py: it agrees with PUBLISHED)
VALIDATOR = Draft202012Validator(inlined({k: v for k, v in SCHEMA.items() if k != "$defs"},
                                         SCHEMA["$defs"]))
VALID_HELD = 50_000  # decisions found valid, held to skip equal ones (Watch)
I_JSON_MAX = 2**53 - 1  # RFC 7493 2.2: integers in [-(2**53)+1, 2**53-1]


def problems(d: object) -> list[str]:
    """What is wrong with `d` as a decision (empty: nothing)."""
    if VALIDATOR.is_valid(d):  # the fast path: iter_errors costs more
        return []
    return [f"{'/'.join(map(str, e.absolute_path)) or '(the object)'}: {e.message}"
            for e in VALIDATOR.iter_errors(d)]


def iints(text: str | bytes) -> list[int]:
    """Every integer literal in a JSON text."""
    found: list[int] = []

    def integer(literal: str) -> int:
        found.append(int(literal))
        return found[-1]

    json.loads(text, parse_int=integer)
    return found


def decision_of(raw: str | bytes) -> dict[str, Any]:
    """One decision as another process wrote it: parsed, and checked (an AssertionError
    says what is wrong)."""
    if raw in _CHECKED:  # tests poll a topic, reading the same messages again
        return dict(json.loads(raw))
    big = [n for n in iints(raw) if abs(n) > I_JSON_MAX]
    assert not big, f"integers beyond I-JSON's range {big} in {raw!r}"
    d = json.loads(raw)
    wrong = problems(d)
    assert not wrong, f"not a valid decision: {wrong} in {raw!r}"
    _CHECKED.add(raw)
    return dict(d)


_CHECKED: set[str | bytes] = set()


def decisions_in(lines: Iterable[str | bytes]) -> list[dict[str, Any]]:
    """The decisions of JSON lines (replay's output), each checked."""
    return [decision_of(line) for line in lines if line.strip()]


class Watch:
    """The in-process check, while installed: the JSON form of every decision the
    Deduplicator gives out (check_batch and what calls it, would_decide, reject) and of
    every decision serialized (`to_dict`, which `to_json` calls: the Kafka sink, replay's
    output, the HTTP API, decisions a test builds by hand). `bad` holds (the decision, its
    problems) of each that failed.

    A decision equal to one found valid is not checked again (Decision is frozen and
    compares by value: an equal one has the same JSON): the Deduplicator's decisions are
    serialized again by sinks, and tests decide the same pages on several backends."""

    def __init__(self) -> None:
        self.bad: list[tuple[Decision, list[str]]] = []
        self.seen = 0  # decisions given out or serialized
        self.checked = 0  # of them, checked against the schema (the others: equal to one)
        self.seconds = 0.0  # the checks' time, and the CPU time of this thread in them
        self.cpu_seconds = 0.0
        self._valid: set[Decision] = set()
        self._saved: list[tuple[type, str, Any]] = []

    def install(self) -> None:
        watch = self
        to_dict = Decision.to_dict

        def checked_to_dict(d: Decision) -> dict[str, Any]:
            out = to_dict(d)
            watch.seen += 1
            if d in watch._valid:
                return out
            started, cpu = time.perf_counter(), time.thread_time()
            wrong = problems(out)
            watch.seconds += time.perf_counter() - started
            watch.cpu_seconds += time.thread_time() - cpu
            watch.checked += 1
            if wrong:
                watch.bad.append((d, wrong))
            else:
                if len(watch._valid) >= VALID_HELD:
                    watch._valid.clear()
                watch._valid.add(d)
            return out

        self._patch(Decision, "to_dict", checked_to_dict)
        for name in ("check_batch", "would_decide", "reject"):
            self._patch(Deduplicator, name, _serializing(getattr(Deduplicator, name)))

    def _patch(self, cls: type, name: str, new: Any) -> None:
        self._saved.append((cls, name, getattr(cls, name)))
        setattr(cls, name, new)

    def uninstall(self) -> None:
        while self._saved:
            cls, name, old = self._saved.pop()
            setattr(cls, name, old)


def _serializing(method: Any) -> Any:
    """`method`, whose result (a Decision or a list of them) is serialized, so checked."""
    @functools.wraps(method)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        out = method(*args, **kwargs)
        for d in out if isinstance(out, list) else [out]:
            d.to_dict()
        return out
    return wrapper


WATCH = Watch()
