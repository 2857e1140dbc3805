"""Decisions -> Kafka messages (pure: no client here): what the runner sends for a record.

For every consumed record: one decision on the decisions topic (key = the page's URL); for a
`keep`, the original message on the kept topic (if configured); for a `reject`, the original
bytes and the error on the dead-letter topic.

Each message is checked against the largest one its topic accepts (the broker's
`message.max.bytes` or the topic's `max.message.bytes`, read at start). One that would be
refused is sent reduced, never dropped, so a batch always completes:
- a decision keeps every field but clips the long ones (URL, error, duplicate's URL, key) to
  `CLIP` characters; header `stream-dedup-reduced` gives the full size;
- a kept page too large for the kept topic is sent as a reference: an empty value with
  headers `stream-dedup-ref` (topic/partition/offset of the original on the input topic),
  `stream-dedup-error: too-large` and a message giving both sizes;
- a dead letter keeps the start of the original bytes that fits, with
  `stream-dedup-truncated` giving the original length.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field

from stream_dedup.kafka.batches import KafkaHeaders, is_utf8, source_of
from stream_dedup.models import Decision, DuplicateOf, Rejected

CLIP = 1024  # characters kept of a long URL, key or error in a reduced message
# A one-record v2 batch: 61 bytes of batch header, at most 5 varints of 5 bytes and the
# attributes byte of record framing, and per header two varints.
BATCH_OVERHEAD = 61 + 26
HEADER_OVERHEAD = 10
ERROR_MESSAGE_MAX = 4096


@dataclass(frozen=True, slots=True)
class Message:
    output: str  # "decision", "kept" or "dead-letter" (a metrics label)
    topic: str
    value: bytes
    key: bytes | None
    headers: tuple[tuple[str, bytes], ...] = ()
    # Makes a smaller form, for a topic that accepts at most `cap` bytes (0: the smallest
    # that still says what it must: the reduced decision, the reference, the dead letter
    # without the record's bytes); None when this message is that smallest form.
    shrink: Callable[[Message, int], Message] | None = field(default=None, compare=False)

    def size(self) -> int:
        """Bytes of a batch holding only this message (what the broker compares)."""
        return (BATCH_OVERHEAD + len(self.value) + len(self.key or b"")
                + sum(len(k.encode()) + len(v) + HEADER_OVERHEAD for k, v in self.headers))

    def floor(self) -> Message | None:
        """The smallest form, for a broker that refused this one; None if this is it."""
        return None if self.shrink is None else self.shrink(self, 0)


@dataclass(frozen=True, slots=True)
class Topics:
    decisions: str
    kept: str  # "" = off
    dead_letter: str


@dataclass(frozen=True, slots=True)
class Record:
    """What a message is built from: the consumed record's coordinates and bytes."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: KafkaHeaders


def messages_for(rec: Record, item: object, d: Decision, topics: Topics,
                 limit: Callable[[str], int]) -> tuple[list[Message], list[str]]:
    """The messages for one record, each within its topic's limit, and the outputs that had
    to be reduced."""
    out: list[Message] = []
    reduced: list[str] = []

    def add(full: Message) -> None:
        cap = limit(full.topic)
        if full.size() <= cap:
            out.append(full)
        else:
            assert full.shrink is not None
            out.append(full.shrink(full, cap))
            reduced.append(full.output)

    # Never a null key on our own topics (a compacted topic refuses one): the URL, else the
    # record's key, else its input position. The kept topic gets the original message.
    position = source_of(rec.topic, rec.partition, rec.offset).encode()
    url_key = d.url.encode("utf-8", "replace") if d.url else rec.key or position
    add(Message("decision", topics.decisions, d.to_json().encode(), url_key, (),
                _reduce_decision(d)))
    headers = _safe_headers(rec.headers)
    if d.decision == "keep" and topics.kept:
        add(Message("kept", topics.kept, rec.value or b"", rec.key, headers, _reference(rec)))
    elif d.decision == "reject":
        if not isinstance(item, Rejected):  # a page the engine rejected (revisit-unknown,
            # an analysis error): the decision says why
            item = Rejected(d.url, d.reason, d.error or "", d.source, rec.value)
        add(Message("dead-letter", topics.dead_letter, rec.value or b"", rec.key or position,
                    headers + error_headers(item), _truncate(item)))
    return out, reduced


def error_headers(item: Rejected) -> tuple[tuple[str, bytes], ...]:
    return (
        ("stream-dedup-error", item.kind.encode()),
        ("stream-dedup-message", item.message.encode("utf-8", "replace")[:ERROR_MESSAGE_MAX]),
        ("stream-dedup-source", (item.source or "").encode()),
    )


def _reduce_decision(d: Decision) -> Callable[[Message, int], Message]:
    def smaller(full: Message, cap: int) -> Message:
        dup = d.duplicate_of
        short = dataclasses.replace(
            d, url=_clip(d.url), error=_clip(d.error),
            duplicate_of=None if dup is None else DuplicateOf(dup.page_id, _clip(dup.url)))
        return Message(full.output, full.topic, short.to_json().encode(), _clip_bytes(full.key),
                       (("stream-dedup-reduced", str(full.size()).encode()),))
    return smaller


def _reference(rec: Record) -> Callable[[Message, int], Message]:
    def smaller(full: Message, cap: int) -> Message:
        return Message(full.output, full.topic, b"", _clip_bytes(full.key), (
            ("stream-dedup-ref", source_of(rec.topic, rec.partition, rec.offset).encode()),
            ("stream-dedup-error", b"too-large"),
            ("stream-dedup-message", f"the page's message is {full.size()} bytes; the topic "
                                     f"accepts {cap}: read it at stream-dedup-ref".encode()),
        ))
    return smaller


def _truncate(item: Rejected) -> Callable[[Message, int], Message]:
    def smaller(full: Message, cap: int) -> Message:
        headers = (*error_headers(item),
                   ("stream-dedup-truncated", str(len(item.raw or b"")).encode()))
        key = _clip_bytes(full.key)
        room = cap - Message(full.output, full.topic, b"", key, headers).size()
        value = full.value[:max(0, room)]
        return Message(full.output, full.topic, value, key, headers, smaller if value else None)
    return smaller


def _safe_headers(headers: KafkaHeaders) -> tuple[tuple[str, bytes], ...]:
    """Headers as the producer can send them: a key that arrived as bytes that are not UTF-8
    (see kafka/batches.py) gets U+FFFD for them."""
    return tuple((name if is_utf8(name) else
                  name.encode("utf-8", "surrogateescape").decode("utf-8", "replace"),
                  value or b"") for name, value in headers)


def _clip(text: str | None) -> str | None:
    return text if text is None or len(text) <= CLIP else text[:CLIP] + "..."


def _clip_bytes(raw: bytes | None) -> bytes | None:
    return raw if raw is None or len(raw) <= CLIP else raw[:CLIP]


def as_record(rec: object) -> Record:
    """An aiokafka ConsumerRecord (or anything of its shape) as a Record."""
    return Record(rec.topic, rec.partition, rec.offset, rec.key, rec.value,  # type: ignore[attr-defined]
                  tuple(rec.headers or ()))  # type: ignore[attr-defined]

