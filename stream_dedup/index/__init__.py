"""Feature index backends behind one protocol (see base.py)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from .base import CANONICAL, RAW, FeatureIndex, StoredDoc
from .memory import MemoryIndex


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
    """The index the settings ask for; a memory index may start from an LSM snapshot."""
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


__all__ = ["CANONICAL", "RAW", "SUPPORTED_INDEXES", "FeatureIndex", "MemoryIndex", "StoredDoc",
           "open_index"]
