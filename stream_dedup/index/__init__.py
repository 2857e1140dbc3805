"""Feature index backends behind one protocol (see base.py)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stream_dedup.core.urls import UrlKeys
from stream_dedup.index.base import CANONICAL, RAW, FeatureIndex, StoredDoc
from stream_dedup.index.deep import NO_DEEP_KEYS, DeepLayout
from stream_dedup.index.memory import MemoryIndex

log = logging.getLogger("stream_dedup")

if TYPE_CHECKING:
    from stream_dedup.config import Settings


def _lsm(stamp: int, max_posting: int, path: Path | None) -> FeatureIndex:
    from stream_dedup.index.lsm import LsmIndex  # RocksDB is loaded only when asked for

    if path is None:
        from stream_dedup.errors import ConfigError

        raise ConfigError("--index lsm needs --index-path DIR")
    return LsmIndex(path, stamp, max_posting)


# name -> factory(stamp, max_posting, path). Every backend passes tests/test_index.py.
SUPPORTED_INDEXES: dict[str, Callable[[int, int, Path | None], FeatureIndex]] = {
    "memory": lambda stamp, max_posting, path: MemoryIndex(stamp, max_posting),
    "lsm": _lsm,
}


def index_for(settings: Settings, observe: Any = None) -> FeatureIndex:
    """The index `settings` ask for: memory (started from an LSM snapshot with warm_from),
    LSM, or Redis (`observe(operation, seconds, failed)` hears its round trips)."""
    from stream_dedup.errors import ConfigError

    s = settings
    if s.index_path and s.index != "lsm":
        raise ConfigError(f"--index-path is where an LSM index lives; it does not apply to "
                          f"{s.index} (add --index lsm to remember the pages there)")
    if s.memory_records_dir and s.index != "memory":
        raise ConfigError(f"--memory-records-dir is where the memory index keeps its records; "
                          f"it does not apply to {s.index}")
    if s.redis_records_url and s.index != "redis":
        raise ConfigError(f"--redis-records-url is where the Redis index keeps its "
                          f"verification records; it does not apply to {s.index}")
    records_dir = s.memory_records_dir if s.memory_records == "disk" else None
    url_key = UrlKeys(s.url_ignore_params).key
    if s.warm_from:
        if s.index != "memory":
            raise ConfigError(f"--warm-from fills a memory index; it does not apply to {s.index}")
        from stream_dedup.index.lsm import LsmIndex

        snapshot = LsmIndex(s.warm_from, s.params.stamp, s.max_posting, create=False)
        try:
            return MemoryIndex.warm_from(snapshot, records_dir, url_key, deep_layout(s))
        finally:
            snapshot.close()
    if s.index == "memory":
        return MemoryIndex(s.params.stamp, s.max_posting, records_dir, url_key,
                           deep_layout(s))
    if s.index == "redis":
        from stream_dedup.index.redis.backend import RedisIndex
        from stream_dedup.security import redis_security

        if s.verify_exact and not s.redis_records_url:
            log.warning("the verification records go to the index's Redis, each with its page's "
                        "shingle set for exact verification (4 B a shingle up to 8,192: ~5.2 KB "
                        "a mean web page, bench/RESULTS.md): give them a store on disk "
                        "(--redis-records-url, e.g. Kvrocks), or verify by the sketch "
                        "(--no-verify-exact: ~1.1 KB a page)")

        return RedisIndex(s.redis_url, s.params.stamp, s.max_posting,
                          retention_days=s.retention_days, threshold=s.threshold,
                          max_candidates=s.verify_max_candidates, groups=s.groups,
                          buckets=s.redis_buckets,
                          **contain_options(s),
                          records_url=s.redis_records_url, observe=observe,
                          security=redis_security(s))
    return SUPPORTED_INDEXES[s.index](s.params.stamp, s.max_posting,
                                      Path(s.index_path) if s.index_path else None)


def deep_layout(s: Settings) -> DeepLayout:
    """A MemoryIndex's deep keys under these settings."""
    return DeepLayout(s.stored_keys, s.deep_asked, s.contain_common) if s.deep_asked \
        else NO_DEEP_KEYS


def contain_options(s: Settings) -> dict[str, Any]:
    """A RedisIndex's containment arguments under these settings: the keys a probe ends
    with, contain_common and contain_max_candidates; how many of them are asked only."""
    on = s.contains_on
    return {"contain": (s.contain_asked, s.contain_common,
                        s.contain_max_candidates),
            "contain_asked": s.contain_asked - s.contain_keys if on else 0}


__all__ = ["CANONICAL", "RAW", "SUPPORTED_INDEXES", "FeatureIndex", "MemoryIndex", "StoredDoc",
           "index_for"]
