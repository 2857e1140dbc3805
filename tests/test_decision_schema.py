"""The decision's JSON Schema (docs/decision.schema.json) says what every decision is, and
every decision's ids travel as strings: readers that hold integers in 64 bits or a double
(Java, Go, Elasticsearch, JavaScript) read them exactly."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from opskit import reordered_pair, wait_for
from schemakit import (
    I_JSON_MAX,
    PUBLISHED,
    SCHEMA,
    VALIDATOR,
    WATCH,
    decision_of,
    decisions_in,
    iints,
    problems,
)
from test_service import (  # noqa: F401 (service: a fixture)
    create_topics,
    kcat_consume,
    kcat_produce,
    names,
    service,
)

from stream_dedup import models
from stream_dedup.cli.sample import write_sample
from stream_dedup.models import Contained, Decision, DuplicateOf, Previous, position_id

REPO = Path(__file__).resolve().parents[1]
KAFKA_ID = position_id(1_764_000_000_000, 3, 12_345)  # 2025-11-24, partition 3: ~1.3e29


def _keep_reasons() -> set[str]:
    return set(SCHEMA["then"]["properties"]["reason"]["enum"])


def _drop_reasons() -> set[str]:
    return set(SCHEMA["else"]["then"]["properties"]["reason"]["enum"])


def test_the_schema_names_every_field_and_every_reason() -> None:
    fields = list(Decision("u", "keep", "unique").to_dict())
    assert SCHEMA["required"] == [f for f in fields if f != "carried"]
    assert set(SCHEMA["properties"]) == {*fields, "carried", "namespace"}  # both optional
    assert SCHEMA["additionalProperties"] is False
    reasons = {v for k, v in vars(models).items() if k.isupper() and isinstance(v, str)}
    assert _keep_reasons() | _drop_reasons() == reasons and not _keep_reasons() & _drop_reasons()
    # every reject kind in the code is one the schema accepts
    kinds = set()
    for path in (REPO / "stream_dedup").rglob("*.py"):
        text = path.read_text()
        kinds |= set(re.findall(r'PageError\(\s*"([^"]+)"', text))
        kinds |= set(re.findall(r'Rejected\([^()]*?,\s*(?:kind=)?"([^"]+)"', text))
        kinds |= set(re.findall(r'"reject",\s*"([^"]+)"', text))
    assert {"bad-json", "no-url", "too-large", "bad-record", "revisit-unknown"} <= kinds
    pattern = SCHEMA["$defs"]["error_kind"]["pattern"]
    assert [k for k in kinds if not re.fullmatch(pattern, k)] == []
    assert not re.fullmatch(pattern, "Bad JSON")  # the pattern can refuse


def test_ids_travel_as_decimal_strings_and_come_back_exactly() -> None:
    ref = DuplicateOf(KAFKA_ID - 1, "https://a.example/")
    d = Decision("https://b.example/", "drop", "near", duplicate_of=ref, shared_features=3,
                 resemblance=0.91, ld_estimate=12.0, verified=True, cluster=KAFKA_ID - 1,
                 source="pages/3/12345", previous=Previous(KAFKA_ID - 7, "https://b.example/"))
    out = d.to_dict()
    assert problems(out) == []
    assert out["duplicate_of"]["page_id"] == str(KAFKA_ID - 1) == out["cluster"]
    assert int(out["previous"]["page_id"]) == KAFKA_ID - 7  # exact, unlike a double
    assert float(KAFKA_ID - 7) == float(KAFKA_ID - 1)  # what a double makes of them
    # the text a Kafka consumer reads holds no integer beyond I-JSON's range
    assert max(map(abs, iints(d.to_json()))) <= I_JSON_MAX
    assert decision_of(d.to_json()) == out
    kept = Decision("https://c.example/", "keep", "unique", page_id=KAFKA_ID, cluster=KAFKA_ID,
                    contains=(Contained(KAFKA_ID - 1, "https://a.example/", 0.95),))
    assert kept.to_dict()["contains"][0]["page_id"] == str(KAFKA_ID - 1)
    assert problems(kept.to_dict()) == []


def test_a_98_bit_integer_id_is_refused() -> None:
    """The schema, and the check of what another process wrote, refuse a decision that
    carries an id as a JSON number, as decisions did before."""
    good = Decision("https://c.example/", "keep", "unique", page_id=KAFKA_ID,
                    cluster=KAFKA_ID).to_dict()
    assert KAFKA_ID.bit_length() > 64
    for field in ("page_id", "cluster"):
        wrong = problems({**good, field: KAFKA_ID})
        assert wrong and wrong[0].startswith(field), wrong
    raw = json.dumps({**good, "page_id": KAFKA_ID, "cluster": KAFKA_ID})
    with pytest.raises(AssertionError, match="beyond I-JSON"):
        decision_of(raw)
    small = json.dumps({**good, "page_id": 7, "cluster": "7"})  # a number, even in range
    with pytest.raises(AssertionError, match="not a valid decision"):
        decision_of(small)
    # and the rules between fields: a drop names what it duplicates and its cluster
    drop = {**good, "decision": "drop", "reason": "exact", "page_id": None, "cluster": None}
    assert {w.split(":")[0] for w in problems(drop)} == {"duplicate_of", "cluster"}
    assert problems({**good, "decision": "maybe"})
    assert problems({**good, "extra": 1})
    assert problems({k: v for k, v in good.items() if k != "source"})


def test_the_watch_catches_a_bad_decision_made_in_the_test_process() -> None:
    """conftest.py checks every decision serialized (and every one the Deduplicator gives
    out) in this process; a bad one fails the test during which it was made."""
    before = len(WATCH.bad)
    bad = Decision("https://d.example/", "drop", "near")  # no duplicate_of, no cluster
    bad.to_json()
    caught = WATCH.bad[before:]
    del WATCH.bad[before:]  # this test made it on purpose
    assert [d for d, _ in caught] == [bad]
    assert any("duplicate_of" in w for w in caught[0][1])
    good = replace(bad, duplicate_of=DuplicateOf(1, "https://a.example/"), cluster=1)
    good.to_json()
    assert len(WATCH.bad) == before


def test_carried_fields_are_flat_and_within_i_json() -> None:
    good = Decision("https://c.example/", "keep", "unique", page_id=1, cluster=1).to_dict()
    ok = {"crawlid": "abc", "appid": 7, "score": 0.5, "live": True, "none": None}
    assert problems({**good, "carried": ok}) == []
    assert problems({**good, "carried": None}) == []
    assert problems({**good, "carried": {"big": 2**60}})  # an integer a double rounds
    assert problems({**good, "carried": {"nested": {"a": 1}}})


def test_the_documented_decision_examples_match_the_schema() -> None:
    shown = []
    for path in (REPO / "README.md", REPO / "docs" / "reference.md"):
        for block in re.findall(r"```json\n(.*?)```", path.read_text(), re.S):
            if '"decision"' in block:  # one or more objects, each on lines of its own
                shown += [json.loads(text) for text in re.split(r"\n(?=\{)", block.strip())]
    assert len(shown) >= 2
    assert [problems(d) for d in shown] == [[]] * len(shown)


def test_a_replay_in_another_process_writes_valid_decisions(tmp_path: Path) -> None:
    warc, jsonl, pages = write_sample(tmp_path / "crawl")
    out = tmp_path / "decisions.jsonl"
    subprocess.run([sys.executable, "-m", "stream_dedup", "replay", str(warc), str(jsonl),
                    "-o", str(out), "-q"], check=True, timeout=300, capture_output=True)
    got = decisions_in(out.read_text().splitlines())
    assert len(got) > len(pages)  # every page, the revisit record and the bad line
    assert {d["decision"] for d in got} == {"keep", "drop", "reject"}
    assert all(isinstance(d["cluster"], str) for d in got if d["decision"] != "reject")


@pytest.mark.kafka
def test_a_decision_served_through_kafka_holds_only_i_json_integers(
        kafka_bootstrap: str, service) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    """Pages through `serve` on a real broker: every integer in every decision's text is
    within I-JSON's range, and each id is the string of its record's position id
    (timestamp, partition, offset), which no 64-bit integer nor double could hold."""
    t = names("ids")
    create_topics(kafka_bootstrap, [t["input"]], partitions=1)
    first, extended = reordered_pair()  # the second is kept and contains the first
    sends = [("https://i.example/a", first), ("https://i.example/copy", first),
             ("https://i.example/a", first), ("https://i.example/long", extended)]
    kcat_produce(kafka_bootstrap, t["input"], [(url, json.dumps(
        {"url": url, "html": html}).encode()) for url, html in sends])
    svc = service(t, "--batch-size", "1")
    wait_for("decisions", lambda: len(kcat_consume(kafka_bootstrap, t["decisions"]))
             >= len(sends))
    assert svc.stop() == 0
    records = kcat_consume(kafka_bootstrap, t["input"])
    texts = [m["payload"] for m in kcat_consume(kafka_bootstrap, t["decisions"])]
    assert all(max(map(abs, iints(text))) <= I_JSON_MAX for text in texts)
    got = [decision_of(text) for text in texts]  # the schema, and I-JSON's range again
    assert [d["source"] for d in got] == [f"{t['input']}/0/{i}" for i in range(len(sends))]
    ids = [str(position_id(m["ts"], m["partition"], m["offset"])) for m in records]
    a, copy, again, extended_d = got
    assert [(d["decision"], d["reason"]) for d in got] == [
        ("keep", "unique"), ("drop", "exact"), ("drop", "unchanged"),
        ("keep", "verified-distinct")]
    assert a["page_id"] == a["cluster"] == ids[0]
    assert int(a["page_id"]) > 2**64  # as a JSON number, a 64-bit reader fails on it
    assert copy["duplicate_of"]["page_id"] == copy["cluster"] == ids[0]
    assert again["previous"]["page_id"] == again["cluster"] == ids[0]
    assert extended_d["page_id"] == extended_d["cluster"] == ids[3]
    assert [c["page_id"] for c in extended_d["contains"]] == [ids[0]]


def test_the_validator_the_tests_use_agrees_with_the_published_schema() -> None:
    """schemakit checks with the schema's `$ref`s inlined (faster): the same verdicts."""
    good = [Decision("https://c.example/", "keep", "unique", page_id=KAFKA_ID,
                     cluster=KAFKA_ID).to_dict(),
            Decision("https://b.example/", "drop", "unchanged", cluster=3,
                     previous=Previous(3, "https://b.example/", None, "exact")).to_dict(),
            Decision(None, "reject", "bad-json", error="not JSON").to_dict()]
    bad = [{**good[0], "page_id": KAFKA_ID}, {**good[0], "page_id": "007"},
           {**good[1], "cluster": None}, {**good[1], "previous": None},
           {**good[1], "duplicate_of": {"page_id": 3}}, {**good[2], "reason": "Bad"},
           {**good[2], "cluster": "1"}, {**good[0], "contains": [{"page_id": "1", "url": "u"}]}]
    for d in good + bad:
        assert PUBLISHED.is_valid(d) == VALIDATOR.is_valid(d) == (d in good), d
