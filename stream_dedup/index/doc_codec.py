"""A document record (StoredDoc) as bytes and back: the LSM index's `docs` values and the
changelog's records (kafka/changelog.py) are the same encoding. The URL field names the page's
namespace outside the default one (namespaces.pack_url); a record written before
namespaces is of the default one."""

from __future__ import annotations

import struct
from typing import NamedTuple

import numpy as np

from stream_dedup.index.base import StoredDoc
from stream_dedup.index.namespaces import pack_url, unpack_url

# raw fp, canonical fp, stored at, text length, k, k*s, then byte lengths: fetched_at, sig, url
_DOC_HEAD = struct.Struct("<QQdIHHIII")
_ID_BYTES = 16  # a page id: an input position packs into 98 bits (models.position_id)


def encode_doc(doc: StoredDoc, stored_at: float) -> bytes:
    url = pack_url(doc.namespace, doc.url)
    fetched = (doc.fetched_at or "").encode("utf-8", "replace")
    head = _DOC_HEAD.pack(doc.raw_fp, doc.canonical_fp, stored_at, doc.text_length,
                          doc.features.shape[0], doc.sketch.shape[0], len(fetched),
                          len(doc.ld_signature), len(url))
    return b"".join((head, doc.features.astype("<u8").tobytes(),
                     doc.sketch.astype("<u4").tobytes(), fetched, doc.ld_signature, url,
                     doc.page_id.to_bytes(_ID_BYTES, "big"), doc.shingles))


def decode_doc(raw: bytes, row: int) -> tuple[StoredDoc, float]:
    """A record and when it was stored; a record without a page id (format 1) has its
    row as its id; the shingle set (for exact verification) is what follows the id, none in
    records written before it was kept."""
    raw_fp, canonical_fp, stored_at, text_len, k, n, n_fetched, n_sig, n_url = (
        _DOC_HEAD.unpack_from(raw))
    pos = _DOC_HEAD.size
    features = np.frombuffer(raw, dtype="<u8", count=k, offset=pos).astype(np.uint64)
    pos += 8 * k
    sketch = np.frombuffer(raw, dtype="<u4", count=n, offset=pos).astype(np.uint32)
    pos += 4 * n
    fetched = raw[pos : pos + n_fetched].decode("utf-8", "replace") or None
    pos += n_fetched
    sig = bytes(raw[pos : pos + n_sig])
    pos += n_sig
    namespace, url = unpack_url(bytes(raw[pos : pos + n_url]))
    pos += n_url
    page_id = int.from_bytes(raw[pos : pos + _ID_BYTES], "big") if len(raw) > pos else row
    doc = StoredDoc(url=url, features=features, sketch=sketch, ld_signature=sig,
                    text_length=text_len, raw_fp=raw_fp, canonical_fp=canonical_fp,
                    fetched_at=fetched, page_id=page_id, shingles=bytes(raw[pos + _ID_BYTES:]),
                    namespace=namespace)
    return doc, stored_at


class Peek(NamedTuple):
    """What forgetting reads of a record: no arrays built, sketch and shingles skipped."""

    raw_fp: int
    canonical_fp: int
    stored_at: float
    features: tuple[int, ...]
    fetched_at: str | None
    url_field: bytes  # namespaces.unpack_url gives (namespace, url)
    page_id: int


def url_field(raw: bytes) -> bytes:
    """A record's URL field alone (a scan by host reads no more of most records)."""
    _, _, _, _, k, n, n_fetched, n_sig, n_url = _DOC_HEAD.unpack_from(raw)
    pos = _DOC_HEAD.size + 8 * k + 4 * n + n_fetched + n_sig
    return raw[pos : pos + n_url]


def peek(raw: bytes, row: int) -> Peek:
    """A record's keys, times, URL field and page id (~1 µs; decode_doc builds arrays)."""
    raw_fp, canonical_fp, stored_at, _, k, n, n_fetched, n_sig, n_url = (
        _DOC_HEAD.unpack_from(raw))
    pos = _DOC_HEAD.size
    features = struct.unpack_from(f"<{k}Q", raw, pos)
    pos += 8 * k + 4 * n
    fetched = raw[pos : pos + n_fetched].decode("utf-8", "replace") or None
    pos += n_fetched + n_sig
    url_field = raw[pos : pos + n_url]
    pos += n_url
    page_id = int.from_bytes(raw[pos : pos + _ID_BYTES], "big") if len(raw) > pos else row
    return Peek(raw_fp, canonical_fp, stored_at, features, fetched, url_field, page_id)
