"""What the Redis index stores, and where: key names and record encodings (the scripts
that run on the server: scripts.py; the client side of the protocol: backend.py).

Ids are 13 bytes, big-endian `models.position_id`, so ids sort by time. Every key carries one
of SHARDS hash tags, `{n}`, from its fingerprint, feature or page id, so that a cluster
spreads the index evenly over its nodes (a round of the protocol is one script call per node).
Nothing is a key of its own per page but the verification record: a Redis key costs ~70-100
bytes of overhead, so a page's entries are parts of *bucket* keys, a fixed number per hash
tag (from `buckets`, fixed when the index is made):

    {n}S<bucket>  string: the sets of the features, band keys and containment keys: entries
                  of <field (3 bytes)><id (13)>, or with retention <field><id><expiry (4)>;
                  a key's entries are adjacent, in id order (a page's "key": a set of ids)
    {n}X<bucket>  string: the same for raw and canonical fingerprints and URL keys, with
                  7-byte fields (the URL's set: its kept version, and pages of it being
                  decided)
    {n}P<bucket>  hash; field <id>: the page's state and expiry, then its lease or (final)
                  its decision (see redis_scripts._RECORD); R: a kept version a newer one
                  replaced
    {n}D<id>      string: a kept page's verification record (encode_doc), ~730 bytes; in
                  the index's Redis or in a records store (backend.py)
    stream-dedup:stamp  "<sketch stamp>:<SHARDS>:<FORMAT>:<buckets>"
    stream-dedup:pages  pages kept

A set bucket is a plain string, not a hash: a hash stays a compact listpack only up to
`hash-max-listpack-entries` fields (128 by default) of `hash-max-listpack-value` bytes (64),
past which it costs 2-3 times as much, and a listpack spends 2-3 bytes a field and a value
on their lengths. A string has neither limit: a bucket costs its entries, ~16 bytes each,
whatever the server's settings. The bucket and hash tag of an entry hold 10 + log2(buckets)
bits of its 64-bit key, so the field holds only the next bits: 24 for a feature (41 bits of
it in all at 128 buckets: two of a bucket's ~100 keys at 1M pages look alike with
probability ~6e-6 a key looked up; the memory index compares 32 bits), and all of them for
a fingerprint or a URL key (exact: a match there is a decision).

The client names an entry by one *key* string, `{n}S<bucket, 3 bytes><field>` (or X, P),
which a script splits in two; its hash tag routes it like any key. With retention an entry
carries its own expiry (Redis 7.0 cannot expire a hash's fields or part of a string): one
past it reads as absent, leaves when its set is written, and a bucket drops all of its own
at most every SWEEP_S (a set bucket's header, a record bucket's field `~`, holds when next);
a bucket expires with its newest entry.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass

import numpy as np

from stream_dedup.index.base import Probe, StoredDoc
from stream_dedup.index.namespaces import pack_url, unpack_url
from stream_dedup.models import Contained, Decision, DuplicateOf, Previous

ID_BYTES = 13  # 98-bit ids (models.position_id)
# A page's ref: its hash tag's count of pages registered there when it was, times SHARDS,
# plus the tag (2**38 pages a tag before it wraps)
REF_BYTES = 6
# Keys are spread over SHARDS hash tags, so a cluster can spread the index evenly over up
# to ~SHARDS / 10 primaries. Part of the layout: every instance must agree (it is stored
# with the stamp, with the buckets).
SHARDS = 1024
# 4: records carry the shingle set (exact verification); 5: keys and URL key; 6: set buckets
# are strings of fixed-width entries of 3-byte (7) fields and refs, not ids
FORMAT = 6
BUCKETS = 128  # feature buckets per hash tag by default: ~100 entries each at 1M pages held
# A page has 13 feature entries (6 features, 5 band keys, 2 containment keys), 3 exact ones
# (raw, canonical, URL), a record and a ref entry: fewer buckets of the others, and so many
# that record and ref buckets hold ~30 each at 1M pages held (Redis's default listpack
# holds up to 128: to ~4M pages held with the default buckets)
EXACT_BUCKETS_PER, RECORD_BUCKETS_PER = 4, 4
FEATURE_FIELD, EXACT_FIELD = 3, 7  # bytes of a set entry's field
# Redis's defaults: a hash stays a compact listpack (~2 bytes a field or value besides its
# bytes) only up to so many fields of at most so many bytes. The record and ref buckets hold
# ~60 fields at 1M pages held (a warning if the server allows fewer); a record longer than
# the server allows (most drops': the decision names a page and its URL) keeps its
# decision in a key of its own. The set buckets are strings: no limit.
LISTPACK_ENTRIES, LISTPACK_VALUE = 128, 64
SWEEP_S = 3600  # with retention, how often a bucket drops the entries past their time
STAMP, PAGES = b"stream-dedup:stamp", b"stream-dedup:pages"
# raw fp, canonical fp, text length, sketch values, signature and shingle set bytes, URL
# key, features (and band keys), crawl time bytes, then the url (outside the default
# namespace "\0<namespace>\0<url>": namespaces.pack_url). The features are read only to
# take a replaced version out of its keys (a dropped page's keys: its probe's).
_DOC_HEAD = struct.Struct("<QQIHIIQHB")
_NO_FEATURES = np.zeros(0, dtype=np.uint64)
_NO_SKETCH = np.zeros(0, dtype=np.uint32)
_JSON = json.JSONEncoder(separators=(",", ":"))  # (json.dumps builds one per call)


def id_bytes(page_id: int) -> bytes:
    return page_id.to_bytes(ID_BYTES, "big")


_TAGS = [b"{%d}" % shard for shard in range(SHARDS)]
BUCKET_ENDS = [len(tag) + 4 for tag in _TAGS]  # where a key's bucket name ends, by shard
_SETS, _EXACT, _RECS, _REFS = ([tag + letter for tag in _TAGS]
                               for letter in (b"S", b"X", b"P", b"Q"))
# An exact entry's field: its kind in the top 2 bits of 56, then its key's bits above the
# bucket's (at most 54)
_KINDS = {b"r": 1 << 54, b"c": 2 << 54, b"u": 3 << 54}
_FEATURE_MASK = (1 << 8 * FEATURE_FIELD) - 1
_RAW, _CANONICAL, _URL = b"r", b"c", b"u"


@dataclass(frozen=True)
class Layout:
    """Where each entry lives, for an index of `buckets` feature buckets per hash tag."""

    buckets: int = BUCKETS

    @property
    def exact_buckets(self) -> int:
        return max(1, self.buckets // EXACT_BUCKETS_PER)

    @property
    def record_buckets(self) -> int:
        return max(1, self.buckets // RECORD_BUCKETS_PER)

    def record_key(self, page_id: int) -> bytes:
        # (of the id's low 32 bits: a script finds the bucket from the id's bytes)
        bucket = ((page_id & 0xFFFFFFFF) // SHARDS) % self.record_buckets
        return _RECS[page_id % SHARDS] + bucket.to_bytes(3, "big") + id_bytes(page_id)

    @staticmethod
    def record_bucket(shard: int, bucket: int) -> bytes:
        """A record bucket's key (every one: shards x record_buckets; a scan of the kept
        pages reads them all)."""
        return _RECS[shard] + bucket.to_bytes(3, "big")

    def ref_key(self, ref: int) -> bytes:
        """The entry that holds the id of the page `ref` names (in the page's hash tag)."""
        bucket = (ref // SHARDS) % self.record_buckets
        return _REFS[ref % SHARDS] + bucket.to_bytes(3, "big") + ref.to_bytes(REF_BYTES, "big")

    @staticmethod
    def doc_key(page_id: int) -> bytes:
        """The key of a kept page's verification record."""
        return _TAGS[page_id % SHARDS] + b"D" + id_bytes(page_id)

    def set_key(self, kind: bytes, value: int) -> bytes:
        """The entry of a raw (r) or canonical (c) fingerprint, a URL key (u), or a feature
        (b""): the hash tag's shard, a bucket number of 3 bytes, the field."""
        rest = value // SHARDS
        if not kind:
            bucket, field = rest % self.buckets, (rest // self.buckets) & _FEATURE_MASK
            return (_SETS[value % SHARDS] + bucket.to_bytes(3, "big")
                    + field.to_bytes(FEATURE_FIELD, "big"))
        n = self.exact_buckets
        return (_EXACT[value % SHARDS] + (rest % n).to_bytes(3, "big")
                + (_KINDS[kind] | rest // n).to_bytes(EXACT_FIELD, "big"))

    def probe_shards(self, p: Probe) -> tuple[list[bytes], list[int]]:
        """The entries a page joins (raw, canonical if it has text, one per feature, its
        URL's last if it has a URL key), and the shard (hash tag) of each."""
        values = [p.raw_fp]
        kinds = [_RAW]
        if p.canonical_fp is not None:
            values.append(p.canonical_fp)
            kinds.append(_CANONICAL)
        if p.features is not None:
            features = p.features.tolist()
            values += features
            kinds += [b""] * len(features)
        if p.url_key:
            values.append(p.url_key)
            kinds.append(_URL)
        keys = [self.set_key(k, v) for k, v in zip(kinds, values, strict=True)]
        return keys, [v % SHARDS for v in values]


def set_members(bucket: bytes | None, key: bytes) -> dict[int, int]:
    """The members (refs) of the set of entry `key` in its bucket's value (as GET gives
    it), each with its expiry (epoch s, 0: none): what the scripts read (tests)."""
    if not bucket:
        return {}
    field = key[key.index(b"}") + 5 :]
    head, width = (5, len(field) + REF_BYTES + 4) if bucket[:1] == b"e" else \
        (1, len(field) + REF_BYTES)
    out = {}
    for p in range(head, len(bucket), width):
        if bucket[p : p + len(field)] == field:
            q = p + len(field)
            expiry = int.from_bytes(bucket[q + REF_BYTES : q + REF_BYTES + 4], "big") \
                if head == 5 else 0
            out[int.from_bytes(bucket[q : q + REF_BYTES], "big")] = expiry
    return out


def encode_doc(doc: StoredDoc) -> bytes:
    """The verification record: what the decide step reads of a stored page."""
    fetched = (doc.fetched_at or "").encode("utf-8", "replace")[:255]
    head = _DOC_HEAD.pack(doc.raw_fp, doc.canonical_fp, doc.text_length, doc.sketch.shape[0],
                          len(doc.ld_signature), len(doc.shingles), doc.url_key,
                          doc.features.shape[0], len(fetched))
    return b"".join((head, doc.sketch.astype("<u4").tobytes(), doc.ld_signature,
                     doc.shingles, doc.features.astype("<u8").tobytes(), fetched,
                     pack_url(doc.namespace, doc.url)))


def decode_doc(raw: bytes, page_id: int) -> StoredDoc:
    raw_fp, canonical_fp, text_length, n, n_sig, n_tops, url_key, n_features, n_fetched = \
        _DOC_HEAD.unpack_from(raw)
    pos = _DOC_HEAD.size
    sketch = np.frombuffer(raw, "<u4", n, pos).astype(np.uint32)
    pos += 4 * n
    sig = bytes(raw[pos : pos + n_sig])
    pos += n_sig
    tops = bytes(raw[pos : pos + n_tops])
    pos += n_tops
    features = (np.frombuffer(raw, "<u8", n_features, pos).astype(np.uint64) if n_features
                else _NO_FEATURES)
    pos += 8 * n_features
    fetched = raw[pos : pos + n_fetched].decode("utf-8", "replace") or None
    namespace, url = unpack_url(raw[pos + n_fetched :])
    return StoredDoc(url, features, sketch, sig, text_length, raw_fp, canonical_fp, fetched,
                     page_id, tops, url_key, namespace)


# Where a record's sketch, signature and shingle set start, and their lengths, in its head:
# what a scan of the kept pages skips (forget.py reads the head and what follows them)
DOC_HEAD_BYTES = _DOC_HEAD.size


def skipped_bytes(head: bytes) -> int:
    """Bytes of a record's sketch, signature and shingle set, from its head."""
    _, _, _, n, n_sig, n_tops, _, _, _ = _DOC_HEAD.unpack_from(head)
    return 4 * n + n_sig + n_tops


def decode_light(raw: bytes, page_id: int) -> StoredDoc:
    """A record as a scan reads it: its head, then its features, crawl time and URL (no
    sketch, signature or shingle set: enough to match it, count it and take its keys)."""
    raw_fp, canonical_fp, text_length, _, _, _, url_key, n_features, n_fetched = \
        _DOC_HEAD.unpack_from(raw)
    pos = _DOC_HEAD.size
    features = (np.frombuffer(raw, "<u8", n_features, pos).astype(np.uint64) if n_features
                else _NO_FEATURES)
    pos += 8 * n_features
    fetched = raw[pos : pos + n_fetched].decode("utf-8", "replace") or None
    namespace, url = unpack_url(raw[pos + n_fetched :])
    return StoredDoc(url, features, _NO_SKETCH, b"", text_length, raw_fp, canonical_fp,
                     fetched, page_id, b"", url_key, namespace)


def doc_probe(doc: StoredDoc) -> Probe:
    """A stored page's keys as its own probe gave them (to take them away: a replaced
    version)."""
    return Probe(doc.page_id, doc.raw_fp, doc.canonical_fp if doc.text_length > 0 else None,
                 doc.features, doc.url_key)


# A plain keep (most kept pages) is recorded in one byte: its id is the record's.
_UNIQUE, _SHORT = b"u", b"s"


def encode_decision(d: Decision) -> bytes:
    """What a re-delivery needs to get the same decision (its url, source and fetched_at
    are its own: the page's)."""
    if (d.decision == "keep" and d.reason == "unique" and not d.shared_features
            and d.resemblance is None and d.ld_estimate is None and d.jaccard is None
            and d.previous is None and d.payload_digest is None and not d.contains):
        return _SHORT if d.short else _UNIQUE
    dup, prev = d.duplicate_of, d.previous
    row = [d.decision, d.reason, d.page_id, dup and dup.page_id, dup and dup.url,
           d.shared_features, d.resemblance, d.ld_estimate, d.verified, d.short, d.jaccard]
    if prev is not None or d.payload_digest is not None or d.containment is not None \
            or d.contains:  # recrawls, containment
        row += [prev and [prev.page_id, prev.url, prev.fetched_at, prev.match],
                d.payload_digest, d.containment,
                [[c.page_id, c.url, c.containment] for c in d.contains]]
    return _JSON.encode(row).encode()


def decode_decision(raw: bytes, page_id: int) -> Decision:
    """A recorded decision, without the url, source and fetched_at (the re-delivered page
    has them)."""
    if raw in (_UNIQUE, _SHORT):
        return Decision(None, "keep", "unique", page_id=page_id, short=raw == _SHORT,
                        cluster=page_id)
    row = json.loads(raw)
    kind, reason, pid, dup_id, dup_url, shared, res, ld, verified, short, j = row[:11]
    prev, digest, containment, contains = (*row[11:13], None, []) if len(row) == 13 else \
        row[11:] if len(row) > 11 else (None, None, None, [])
    dup = None if dup_id is None else DuplicateOf(dup_id, dup_url)
    previous = None if prev is None else Previous(*prev)
    # The cluster follows from the rest (decide/step.py): the page's own id, else its duplicate's,
    # else its URL's version's
    cluster = pid if kind == "keep" else dup.page_id if dup is not None else \
        previous.page_id if previous is not None else None
    return Decision(None, kind, reason, page_id=pid, duplicate_of=dup,
                    shared_features=shared, resemblance=res, ld_estimate=ld, jaccard=j,
                    verified=verified, short=short, previous=previous,
                    payload_digest=digest, containment=containment,
                    contains=tuple(Contained(*c) for c in contains), cluster=cluster)
