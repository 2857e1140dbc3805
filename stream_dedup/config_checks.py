"""What a Settings must satisfy (config.py calls `check` once it is built): every rule a
value or a combination of values must meet, each with the error a user reads; the input
formats and the message field names (json_fields, carry_fields) they are checked against."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from stream_dedup.core.contain import CONTAIN_MAX
from stream_dedup.errors import ConfigError

if TYPE_CHECKING:
    from stream_dedup.config import Settings

JSON_FORMATS = ("json", "scrapy-cluster")  # Kafka input formats whose value is JSON
INPUT_FORMATS = (*JSON_FORMATS, "html", "warc")
# The page fields a json_fields mapping may read from a message (kafka/dialects.py)
JSON_PAGE_FIELDS = ("url", "html", "body_b64", "encoding", "status", "fetched_at", "headers")
MAX_CARRY_FIELDS = 32
FieldPath = tuple[str, ...]  # "meta.url" -> ("meta", "url"): a field of a nested object
_FIELD_NAME = re.compile(r"[^\s,=|]+")
_TOPIC = re.compile(r"[a-zA-Z0-9._-]{1,249}")


def check(s: Settings) -> None:
    """Raise ConfigError naming the first setting out of its range or at odds with another."""
    if not 1 <= s.threshold <= s.groups:
        raise ConfigError(f"threshold must be in 1..groups={s.groups}, got {s.threshold}")
    if not 0.0 <= s.verify_rate <= 1.0:
        raise ConfigError(f"verify_rate must be in [0, 1], got {s.verify_rate}")
    if not 0.0 <= s.verify_min_resemblance <= 1.0:
        raise ConfigError("verify_min_resemblance must be in [0, 1]")
    if not 0.0 <= s.near_verified_min_resemblance <= 1.0:
        raise ConfigError("near_verified_min_resemblance must be in [0, 1]")
    if not 0.0 <= s.verify_min_jaccard <= 1.0:
        raise ConfigError("verify_min_jaccard must be in [0, 1]")
    if not 0.0 <= s.contain_min <= 1.0:
        raise ConfigError("contain_min must be in [0, 1] (0: no containment)")
    if s.contain_sample < 0 or s.contain_deep_asked < 0:
        raise ConfigError("contain_sample and contain_deep_asked must be >= 0")
    if s.contain_keys < 0 or s.contain_common < 1 or s.contain_max_candidates < 1:
        raise ConfigError("contain_keys must be >= 0, contain_common and "
                          "contain_max_candidates >= 1")
    if not s.contain_keys <= s.contain_query_keys <= CONTAIN_MAX:
        raise ConfigError(f"contain_query_keys must be in contain_keys..{CONTAIN_MAX}, "
                          f"got {s.contain_query_keys}")
    if s.bands < 0 or s.band_size < 1 or \
            s.bands * s.band_size > s.params.num_perm:
        raise ConfigError(f"bands ({s.bands}) x band_size ({s.band_size}) must fit "
                          f"in the {s.params.num_perm} min-hashes (bands >= 0, band_size "
                          ">= 1)")
    if not 0.0 <= s.verify_max_ld_ratio <= 1.0:
        raise ConfigError("verify_max_ld_ratio must be in [0, 1]")
    if s.min_shingles < 1:
        raise ConfigError("min_shingles must be >= 1")
    if s.max_posting < 1 or s.verify_max_candidates < 1:
        raise ConfigError("max_posting and verify_max_candidates must be >= 1")
    if s.max_page_bytes < 1:
        raise ConfigError("max_page_bytes must be >= 1")
    if s.index not in ("memory", "lsm", "redis"):
        raise ConfigError(f"index must be memory, lsm or redis, got {s.index!r}")
    if s.memory_records not in ("disk", "ram"):
        raise ConfigError(f"memory_records must be disk or ram, got {s.memory_records!r}")
    if s.index == "redis" and not s.redis_url:
        raise ConfigError("--index redis needs --redis-url redis://HOST:PORT (any node "
                          "of the cluster)")
    if s.index == "lsm" and not s.index_path:
        raise ConfigError("--index lsm needs --index-path DIR (where the index lives)")
    if not 1 <= s.redis_buckets <= 1 << 24:
        raise ConfigError(f"redis_buckets must be 1 to {1 << 24}, got {s.redis_buckets}")
    if s.retention_days < 0:
        raise ConfigError("retention_days must be >= 0")
    if s.input_format not in INPUT_FORMATS:
        raise ConfigError(f"input_format must be one of {', '.join(INPUT_FORMATS)}, got "
                          f"{s.input_format!r}")
    if s.json_fields and s.input_format not in JSON_FORMATS:
        raise ConfigError(f"json_fields maps the fields of a JSON message; input_format "
                          f"{s.input_format!r} is not JSON ({' or '.join(JSON_FORMATS)})")
    json_field_map(s.json_fields)
    carry_names(s.carry_fields)
    _check_namespaces(s)
    if s.batch_size < 1 or s.workers < 1 or s.recent_decisions < 0:
        raise ConfigError("batch_size and workers must be >= 1, recent_decisions >= 0")
    if not s.input_topic or not s.decisions_topic or not s.dead_letter_topic:
        raise ConfigError("input, decisions and dead-letter topics must be named")
    for topic in (s.input_topic, s.decisions_topic, s.kept_topic,
                  s.dead_letter_topic, s.changelog_topic):
        if topic and (not _TOPIC.fullmatch(topic) or topic in (".", "..")):
            raise ConfigError(f"{topic!r} is not a valid Kafka topic name (1-249 of "
                              "a-z A-Z 0-9 . _ -)")
    outputs = [t for t in (s.decisions_topic, s.kept_topic, s.dead_letter_topic)
               if t]
    if s.input_topic in outputs or len(set(outputs)) < len(outputs):
        raise ConfigError("the input, decisions, kept and dead-letter topics must be four "
                          "different topics (an output written to the input topic would "
                          "be read again, without end)")
    if s.exactly_once and s.changelog() in (s.input_topic, *outputs):
        raise ConfigError(f"the changelog topic {s.changelog()!r} must be a topic of "
                          "its own (not the input or an output)")
    if s.exactly_once and s.warm_from:
        raise ConfigError("warm_from cannot be used with exactly_once: the memory index "
                          "is restored from the changelog topic")
    if s.transaction_timeout_s <= 0:
        raise ConfigError("transaction_timeout_s must be > 0")
    if not 0 <= s.http_port <= 65535:
        raise ConfigError(f"http_port must be in 0..65535 (0 = off), got {s.http_port}")
    if s.stall_seconds <= 0:
        raise ConfigError("stall_seconds must be > 0")


def _check_namespaces(s: Settings) -> None:
    from stream_dedup.index.namespaces import NamespaceError, check_name

    try:
        if s.namespace:
            check_name(s.namespace, "namespace")
        for name in s.read_namespaces:
            check_name(name, "namespace_read")
    except NamespaceError as exc:
        raise ConfigError(str(exc)) from None
    if s.namespace_field:
        _field_path(s.namespace_field, "namespace_field")


def json_field_map(text: str) -> dict[str, tuple[FieldPath, ...]]:
    """A json_fields mapping as {page field: the message fields to try, first present wins}:
    "url=response_url|url,html=body,fetched_at=meta.time" (a dot reads a nested object's
    field). A ConfigError says what is wrong with it."""
    out: dict[str, tuple[FieldPath, ...]] = {}
    for entry in filter(None, (e.strip() for e in text.split(","))):
        page_field, eq, message_fields = (part.strip() for part in entry.partition("="))
        if not eq:
            raise ConfigError(f"json_fields: {entry!r} is not PAGE_FIELD=MESSAGE_FIELD "
                              f"(e.g. url=response_url,html=body)")
        if page_field not in JSON_PAGE_FIELDS:
            raise ConfigError(f"json_fields: {page_field!r} is not a page field; the page "
                              f"fields are {', '.join(JSON_PAGE_FIELDS)}")
        if page_field in out:
            raise ConfigError(f"json_fields: {page_field!r} is mapped twice (try fields in "
                              f"turn with |, e.g. url=response_url|url)")
        out[page_field] = tuple(_field_path(name, "json_fields")
                                for name in message_fields.split("|"))
    return out


def carry_names(text: str) -> tuple[str, ...]:
    """The carry_fields names, in order: message fields ("meta.id" a nested one) or, with
    the html input format, Kafka header names. A ConfigError says what is wrong."""
    names = tuple(name.strip() for name in text.split(",") if name.strip())
    for name in names:
        _field_path(name, "carry_fields")
    if len(set(names)) < len(names):
        raise ConfigError(f"carry_fields names a field twice: {text!r}")
    if len(names) > MAX_CARRY_FIELDS:
        # each value may be 1,024 characters: the decision then stays far below a topic's
        # 1 MB message limit, as its reduced form must
        raise ConfigError(f"carry_fields names {len(names)} fields; at most "
                          f"{MAX_CARRY_FIELDS}")
    return names


def _field_path(name: str, setting: str) -> FieldPath:
    path = tuple(name.strip().split("."))
    if not all(_FIELD_NAME.fullmatch(part) for part in path):
        raise ConfigError(f"{setting}: {name.strip()!r} is not a field name (a name, or "
                          f"names joined by dots for a nested field)")
    return path
