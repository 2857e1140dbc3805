"""The memory index's records as columns (DocArena): every field of every row comes back
as it went in, across chunk boundaries, for short pages without a sketch, 98-bit ids and
URLs that are not valid UTF-8; with the sketches, shingle sets and signatures in RAM or in
the record file (across its buffer flushes, and after a write that failed)."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import numpy as np
import pytest

from stream_dedup import Settings
from stream_dedup.errors import ConfigError, IndexStoreError
from stream_dedup.index import arena as records
from stream_dedup.index import index_for
from stream_dedup.index.arena import _CHUNK, DocArena
from stream_dedup.index.base import StoredDoc


def _doc(i: int, width: int = 84) -> StoredDoc:
    rng = np.random.default_rng(i)
    sketch = rng.integers(0, 2**32, width, dtype=np.uint32) if i % 5 else np.zeros(0, np.uint32)
    return StoredDoc(f"https://example.org/{i}/\udcff{'x' * (i % 17)}", np.zeros(6, np.uint64),
                     sketch, bytes(rng.integers(0, 256, i % 300, dtype=np.uint8)), 7 * i,
                     2**64 - 1 - i, i * 31, "2026-01-01T00:00:00Z", (i << 70) | (2**64 - 1 - i),
                     bytes(rng.integers(0, 256, 4 * (i % 7), dtype=np.uint8)))


def _same(got: StoredDoc, want: StoredDoc) -> bool:
    return (got.url == want.url and np.array_equal(got.sketch, want.sketch)
            and got.ld_signature == want.ld_signature and got.text_length == want.text_length
            and got.raw_fp == want.raw_fp >> 32 << 32  # the top halves: the rest is a key
            and got.canonical_fp == want.canonical_fp >> 32 << 32
            and got.page_id == want.page_id and got.shingles == want.shingles
            and got.fetched_at == want.fetched_at)


@pytest.mark.parametrize("on_disk, write_behind", [(False, 0), (True, 0), (True, 3000),
                                                   (True, 1 << 20)],
                         ids=["ram", "file", "file-buffered", "file-unwritten"])
def test_rows_come_back_as_stored_across_chunks(monkeypatch: pytest.MonkeyPatch,
                                                tmp_path: Path, on_disk: bool,
                                                write_behind: int) -> None:
    """Rows read back from RAM, from the file, and from the record file's buffer (written
    in pieces of ~3,000 bytes, or not yet at all)."""
    monkeypatch.setattr(records, "_WRITE_BEHIND", write_behind)
    monkeypatch.setattr(records, "_SHIFT", 4)
    monkeypatch.setattr(records, "_CHUNK", 16)
    monkeypatch.setattr(records, "_AT", 15)
    monkeypatch.setattr(records, "_IOV_MAX", 5)  # a batch in several pwritev calls
    docs = [_doc(i) for i in range(100)]
    arena = DocArena(str(tmp_path) if on_disk else None)
    for start, end in ((0, 1), (1, 15), (15, 16), (16, 50), (50, 50), (50, 100)):
        arena.extend(docs[start:end])  # short pages (i % 5 == 0) first: no sketch yet
    assert len(arena) == 100
    assert all(_same(arena[i], docs[i]) for i in range(100))
    assert arena.fingerprint_high(17, 0) == docs[17].raw_fp >> 32
    assert arena.fingerprint_high(17, 1) == docs[17].canonical_fp >> 32
    assert arena.nbytes["url"] == sum(len(d.url.encode("utf-8", "surrogatepass")) for d in docs)
    with pytest.raises(IndexError):
        arena[100]
    verification = sum(4 * d.sketch.shape[0] + 4 + len(d.shingles) + len(d.ld_signature)
                       + 1 + len(d.fetched_at or "") for d in docs)
    in_ram = arena.nbytes["records (sketch, shingles, LD)"]
    on_disk_bytes = arena.nbytes["on_disk"]
    assert (in_ram, on_disk_bytes) == ((0, verification) if on_disk else (verification, 0))
    if on_disk:
        assert list(tmp_path.iterdir()) == []  # unlinked from the start: nothing left behind
    arena.close()


def test_a_failed_write_adds_nothing_and_loses_nothing(monkeypatch: pytest.MonkeyPatch,
                                                       tmp_path: Path) -> None:
    """The disk full while writing a batch: that batch raises and is not added (part of it
    was written); the rows before it still read back, and the next batch, once there is
    room, lands where it belongs."""
    monkeypatch.setattr(records, "_IOV_MAX", 4)
    monkeypatch.setattr(records, "_WRITE_BEHIND", 0)  # every batch written at once
    docs = [_doc(i) for i in range(1, 60)]
    arena = DocArena(str(tmp_path))
    arena.extend(docs[:20])
    real, calls = os.pwritev, [0]

    def short(fd: int, views: list[memoryview], offset: int) -> int:
        return real(fd, [bytes(b"".join(views))[:50]], offset)  # 50 bytes a call at most

    monkeypatch.setattr(records.os, "pwritev", short)
    arena.extend(docs[20:25])  # short writes are continued where they stopped
    assert all(_same(arena[i], docs[i]) for i in range(25))

    def full(fd: int, views: list[memoryview], offset: int) -> int:
        calls[0] += 1
        if calls[0] < 3:  # a short write, a whole one, then the disk is full
            return real(fd, [views[0][:7]] if calls[0] == 1 else views, offset)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(records.os, "pwritev", full)
    with pytest.raises(IndexStoreError, match="No space left.*--memory-records-dir"):
        arena.extend(docs[25:40])
    assert len(arena) == 25 and calls[0] == 3
    assert all(_same(arena[i], docs[i]) for i in range(25))
    monkeypatch.setattr(records.os, "pwritev", real)
    held = len(arena)
    arena.extend(docs[held:])
    assert len(arena) == 59 and all(_same(arena[i], docs[i]) for i in range(59))
    arena.close()


def test_a_failed_write_of_the_buffer_keeps_its_rows(monkeypatch: pytest.MonkeyPatch,
                                                     tmp_path: Path) -> None:
    """The disk full when the buffered rows go out: the call raises and adds nothing, the
    rows before it stay readable from the buffer, and they reach the file with the next
    write, in order."""
    docs = [_doc(i) for i in range(1, 40)]
    arena = DocArena(str(tmp_path))
    monkeypatch.setattr(records, "_WRITE_BEHIND", 10**9)
    arena.extend(docs[:10])
    real, written = os.pwritev, []

    def full(fd: int, views: list[memoryview], offset: int) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(records.os, "pwritev", full)
    monkeypatch.setattr(records, "_WRITE_BEHIND", 1)
    with pytest.raises(IndexStoreError, match="No space left"):
        arena.extend(docs[10:12])
    assert len(arena) == 10 and all(_same(arena[i], docs[i]) for i in range(10))

    def counted(fd: int, views: list[memoryview], offset: int) -> int:
        written.append((offset, sum(map(len, views))))
        return real(fd, views, offset)

    monkeypatch.setattr(records.os, "pwritev", counted)
    arena.extend(docs[10:20])
    assert written == [(0, arena.nbytes["on_disk"])]  # the buffer and the batch, at once
    monkeypatch.setattr(records.os, "pwritev", full)  # now read from the file, not the buffer
    assert len(arena) == 20 and all(_same(arena[i], docs[i]) for i in range(20))
    arena.close()


def test_where_the_records_go_is_a_setting(tmp_path: Path) -> None:
    ram = index_for(Settings(memory_records="ram"))
    assert isinstance(ram._docs._records, records._RamRecords)
    ram.close()
    disk = index_for(Settings(memory_records_dir=str(tmp_path)))
    assert disk._docs._records._where == str(tmp_path)
    disk.close()
    with pytest.raises(IndexStoreError, match="--memory-records ram"):
        index_for(Settings(memory_records_dir=str(tmp_path / "missing")))
    with pytest.raises(ConfigError, match="does not apply to lsm"):
        index_for(Settings(index="lsm", index_path=str(tmp_path / "i"),
                           memory_records_dir=str(tmp_path)))
    with pytest.raises(ConfigError, match="disk or ram"):
        Settings(memory_records="ssd")


def test_a_sketch_of_another_width_is_refused() -> None:
    arena = DocArena()
    arena.extend([_doc(1)])
    with pytest.raises(ValueError, match="sketches of"):
        arena.extend([_doc(2, width=42)])


def test_the_record_file_is_not_put_in_ram_by_default(monkeypatch: pytest.MonkeyPatch,
                                                      tmp_path: Path,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    """/tmp is a tmpfs on many systems (the file would take RAM there): the default is
    $TMPDIR, else /var/tmp; a directory that lives in RAM is named in a warning."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    assert records.records_home("") == str(tmp_path)
    assert records.records_home("/elsewhere") == "/elsewhere"
    monkeypatch.delenv("TMPDIR")
    if os.access("/var/tmp", os.W_OK | os.X_OK):
        assert records.records_home("") == "/var/tmp"
    if not os.path.ismount("/dev/shm"):  # (Linux mounts a tmpfs there)
        pytest.skip("no /dev/shm here")
    assert records.in_ram("/dev/shm") == "tmpfs"
    arena = DocArena("/dev/shm")
    assert "/dev/shm, a tmpfs: it takes RAM" in caplog.text
    arena.close()


def test_a_rows_namespace_and_url_fields_read_back() -> None:
    arena = DocArena(None)
    n = _CHUNK + 10  # across a chunk's end
    arena.extend([StoredDoc(f"http://h/{i}", np.zeros(0, np.uint64), np.zeros(0, np.uint32),
                            b"", 0, 0, 0, page_id=i + 7, namespace="a" if i % 3 else "")
                  for i in range(n)])
    assert arena[4].namespace == "a" and arena[4].url == "http://h/4"
    assert arena[3].namespace == "" and arena.url(3) == "http://h/3"
    for first, end in ((0, n), (5, _CHUNK + 3), (_CHUNK - 1, _CHUNK + 1), (_CHUNK, n), (0, 1)):
        assert arena.url_fields(first, end) == [arena.url_field(r) for r in range(first, end)]
    assert arena.rows_of([7, _CHUNK + 8, 10**30]) == [0, _CHUNK + 1]
    assert arena.page_id(_CHUNK + 1) == _CHUNK + 8
