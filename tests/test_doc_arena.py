"""The memory index's records as columns (DocArena): every field of every row comes back
as it went in, across chunk boundaries, for short pages without a sketch, 98-bit ids and
URLs that are not valid UTF-8."""

from __future__ import annotations

import numpy as np
import pytest

from stream_dedup.index import memory
from stream_dedup.index.base import StoredDoc
from stream_dedup.index.memory import DocArena


def _doc(i: int, width: int = 84) -> StoredDoc:
    rng = np.random.default_rng(i)
    sketch = rng.integers(0, 2**32, width, dtype=np.uint32) if i % 5 else np.zeros(0, np.uint32)
    return StoredDoc(f"https://example.org/{i}/\udcff{'x' * (i % 17)}", np.zeros(6, np.uint64),
                     sketch, bytes(rng.integers(0, 256, i % 300, dtype=np.uint8)), 7 * i,
                     2**64 - 1 - i, i * 31, "2026-01-01T00:00:00Z", (i << 70) | (2**64 - 1 - i))


def _same(got: StoredDoc, want: StoredDoc) -> bool:
    return (got.url == want.url and np.array_equal(got.sketch, want.sketch)
            and got.ld_signature == want.ld_signature and got.text_length == want.text_length
            and got.raw_fp == want.raw_fp and got.canonical_fp == want.canonical_fp
            and got.page_id == want.page_id)


def test_rows_come_back_as_stored_across_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(memory, "_SHIFT", 4)
    monkeypatch.setattr(memory, "_CHUNK", 16)
    monkeypatch.setattr(memory, "_AT", 15)
    docs = [_doc(i) for i in range(100)]
    arena = DocArena()
    for start, end in ((0, 1), (1, 15), (15, 16), (16, 50), (50, 50), (50, 100)):
        arena.extend(docs[start:end])  # short pages (i % 5 == 0) first: no sketch yet
    assert len(arena) == 100
    assert all(_same(arena[i], docs[i]) for i in range(100))
    assert arena.fingerprint(17, 0) == docs[17].raw_fp
    assert arena.fingerprint(17, 1) == docs[17].canonical_fp
    assert arena.nbytes["url"] == sum(len(d.url.encode("utf-8", "surrogatepass")) for d in docs)
    with pytest.raises(IndexError):
        arena[100]


def test_a_sketch_of_another_width_is_refused() -> None:
    arena = DocArena()
    arena.extend([_doc(1)])
    with pytest.raises(ValueError, match="sketches of"):
        arena.extend([_doc(2, width=42)])
