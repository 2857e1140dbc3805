"""Feature index backends behind one protocol (see base.py)."""

from __future__ import annotations

from collections.abc import Callable

from .base import CANONICAL, RAW, FeatureIndex, StoredDoc
from .memory import MemoryIndex

# name -> factory(stamp, max_posting). Every backend here passes tests/test_index.py.
SUPPORTED_INDEXES: dict[str, Callable[[int, int], FeatureIndex]] = {
    "memory": lambda stamp, max_posting: MemoryIndex(stamp, max_posting),
}

__all__ = ["CANONICAL", "RAW", "SUPPORTED_INDEXES", "FeatureIndex", "MemoryIndex", "StoredDoc"]
