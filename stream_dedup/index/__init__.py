"""Feature index backends behind one protocol (see base.py)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .base import CANONICAL, RAW, FeatureIndex, StoredDoc
from .memory import MemoryIndex

if TYPE_CHECKING:
    from ..config import Settings


def _lsm(stamp: int, max_posting: int, path: Path | None) -> FeatureIndex:
    from .lsm import LsmIndex  # RocksDB is loaded only when asked for

    if path is None:
        from ..errors import ConfigError

        raise ConfigError("--index lsm needs --index-path DIR")
    return LsmIndex(path, stamp, max_posting)


# name -> factory(stamp, max_posting, path). Every backend passes tests/test_index.py.
SUPPORTED_INDEXES: dict[str, Callable[[int, int, Path | None], FeatureIndex]] = {
    "memory": lambda stamp, max_posting, path: MemoryIndex(stamp, max_posting),
    "lsm": _lsm,
}


def open_index(kind: str, stamp: int, max_posting: int, path: str = "",
               warm_from: str = "") -> FeatureIndex:
    """The memory or LSM index the settings ask for; a memory index may start from an LSM
    snapshot. (The Redis index needs more settings: `index_for`.)"""
    if warm_from:
        if kind != "memory":
            from ..errors import ConfigError

            raise ConfigError("--warm-from fills a memory index; it does not apply to lsm")
        from .lsm import LsmIndex

        snapshot = LsmIndex(warm_from, stamp, max_posting, create=False)
        try:
            return MemoryIndex.warm_from(snapshot)
        finally:
            snapshot.close()
    return SUPPORTED_INDEXES[kind](stamp, max_posting, Path(path) if path else None)


def index_for(settings: Settings, observe: Any = None) -> FeatureIndex:
    """The index `settings` ask for (`observe(operation, seconds, failed)`: Redis calls)."""
    s = settings
    if s.index == "redis":
        from .redis import RedisIndex

        return RedisIndex(s.redis_url, s.params.stamp, s.max_posting,
                          retention_days=s.retention_days, threshold=s.threshold,
                          max_candidates=s.verify_max_candidates, observe=observe)
    return open_index(s.index, s.params.stamp, s.max_posting, s.index_path, s.warm_from)


__all__ = ["CANONICAL", "RAW", "SUPPORTED_INDEXES", "FeatureIndex", "MemoryIndex", "StoredDoc",
           "index_for", "open_index"]
