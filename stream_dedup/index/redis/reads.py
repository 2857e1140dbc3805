"""The Redis index's read path: each page's keys joined and their sets read in one script
call per node, the states of the pages seen (peeked, by ref), pages that wait for an older
one decided elsewhere, and members that will never count again swept out of the sets read.
backend.py holds the protocol; pages.py the write path.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from stream_dedup.errors import IndexUnavailable
from stream_dedup.index.base import Probe
from stream_dedup.index.redis.client import ANY, shard_of
from stream_dedup.index.redis.layout import BUCKET_ENDS, REF_BYTES, SHARDS, id_bytes
from stream_dedup.index.redis.pages import CACHED_STATES, RecordRounds, remember

READ_SLACK = 32  # members read beyond `cap`: pending, dropped and gone ones are skipped
NO_MEMBERS: list[int] = []


class SetRounds(RecordRounds):
    """Rounds on the sets (RedisIndex sets up the state)."""

    cap: int
    contain_asked: int  # the asked-only containment keys a probe ends with
    interrupted: threading.Event  # a stop: waiting pages give up
    _waiting: dict[int, float]  # page id -> when it first waited

    def _read(self, probes: Sequence[Probe], keys: list[list[bytes]], shards: list[list[int]],
              priors: list[Any], joined: Mapping[bytes, int] | None
              ) -> tuple[list[list[list[int]]], list[bool]]:
        """Each key's members, oldest first: exact layers their first few, features their
        most recent `cap`, plus slack for pending and dropped ones. With `joined` (the
        batch's own members per key), each page first joins its keys, in the same script
        call (so of two pages sharing a key, the later call sees the other), and the window
        has room for the batch's members (they would push stored ones out of it); then a
        key that holds only pages of this batch reads as empty. The lists are not to be
        changed (keys read as empty share one). Also, per page, whether any of its keys read
        as other than empty (False: none did)."""
        nodes = self._shard_nodes()
        items: list[tuple[Any, bytes, Sequence[Any], int]] = []
        # per item: its page's sets, the keys' indexes, the page's index
        order: list[tuple[list[list[int]], list[int], int]] = []
        out: list[list[list[int]]] = []
        hit = [joined is None] * len(probes)
        for p, page_keys, page_shards, prior in zip(probes, keys, shards, priors, strict=True):
            sets: list[list[int]] = [NO_MEMBERS] * len(page_keys)
            out.append(sets)
            if prior is not None:
                continue
            if joined is None:
                for k, (key, shard) in enumerate(zip(page_keys, page_shards, strict=True)):
                    items.append((nodes[shard], key, (key,), 1))
                    order.append((sets, [k], len(out) - 1))
                continue
            # A page's keys on one node go in one item: its member and expiry once.
            by_node: dict[Any, list[int]] = {}
            for k, shard in enumerate(page_shards):
                by_node.setdefault(nodes[shard], []).append(k)
            member, at = self._refs[p.page_id], self.expire_at(p.page_id)
            for node, ks in by_node.items():
                args: list[Any] = [member, at, len(ks)]
                for k in ks:  # each key as its bucket and its field
                    key, end = page_keys[k], BUCKET_ENDS[page_shards[k]]
                    args += (key[:end], key[end:])
                items.append((node, page_keys[ks[0]], args, len(ks)))
                order.append((sets, ks, len(out) - 1))
        if joined is None:
            header: Any = (self.cap + READ_SLACK, READ_SLACK)
        else:  # keys more than one page of the batch joins, per node
            extra: dict[Any, list[Any]] = {}
            for key, n in joined.items():
                if n != 1:
                    extra.setdefault(nodes[shard_of(key)], []).extend((key, n))
            header = {node: (self.cap + READ_SLACK, READ_SLACK, len(kv) // 2, *kv)
                      for node, kv in extra.items()}
            header[ANY] = (self.cap + READ_SLACK, READ_SLACK, 0)
        if joined is None:
            with self._call("read"):
                replies = iter(self._rounds(("read", items, header))[0])
            for sets, ks, _ in order:
                for k in ks:
                    sets[k] = sorted(map(int.from_bytes, next(replies)))
        else:
            with self._call("join"):
                found = self._rounds(("join", items, header))[0]
            for i, k, ids in found:
                sets, ks, page = order[i]
                sets[ks[k - 1]] = sorted(map(int.from_bytes, ids))
                hit[page] = True
        return out, hit

    def _asked(self, probes: Sequence[Probe], priors: list[Any]
               ) -> tuple[list[list[bytes]], list[list[list[int]]]] | None:
        """Each page's asked-only containment keys and their sets, read (not joined)."""
        n = self.contain_asked
        if not n:
            return None
        keys = [[] if p.features is None else
                [self.layout.set_key(b"", v) for v in p.features[-n:].tolist()]
                for p in probes]
        shards = [[] if p.features is None else [v % SHARDS for v in p.features[-n:].tolist()]
                  for p in probes]
        sets, _ = self._read(probes, keys, shards, priors, None)
        return keys, sets

    def _with_asked(self, probes: Sequence[Probe], keys: list[list[bytes]],
                    refs: list[list[list[int]]], hit: list[bool],
                    asked: tuple[list[list[bytes]], list[list[list[int]]]]) -> None:
        """The asked-only keys and their sets after the page's features, before its URL's
        key (the order of the probe's keys); a page whose asked sets hold anyone read."""
        for i, (p, page_asked, sets) in enumerate(zip(probes, *asked, strict=True)):
            if not page_asked:
                continue
            at = len(keys[i]) - (1 if p.url_key else 0)
            keys[i][at:at] = page_asked
            refs[i][at:at] = sets
            hit[i] = hit[i] or any(sets)

    def _peek(self, seen: Mapping[int, int], flag: bool, fresh: Collection[int] = ()
              ) -> tuple[dict[int, str], dict[int, int]]:
        """The state and the page id of each page seen, by ref (flagging a younger pending
        one, with `flag`: younger than the page of `seen` that saw it); of those in `fresh`
        a cached KEEP is read again (it may have become R since)."""
        states: dict[int, str] = {}
        ids: dict[int, int] = {}
        for r in seen:
            cached = self._final.get(r)
            if cached is not None and not (cached[0] == "K" and r in fresh):
                states[r], ids[r] = cached
        ask = [r for r in seen if r not in states]
        if not ask:
            return states, ids
        nodes = self._shard_nodes()
        items = []
        for r in ask:
            key = self.layout.ref_key(r)
            items.append((nodes[r % SHARDS], key, (key, id_bytes(seen[r]) if flag else b""), 1))
        with self._call("peek"):
            replies = self._rounds(("peek", items, (self.layout.record_buckets,)))[0]
        for r, (state, page) in zip(ask, replies, strict=True):
            state = states[r] = state.decode() if isinstance(state, bytes) else str(state)
            if page:
                q = ids[r] = int.from_bytes(page, "big")
                self._know(q, r.to_bytes(REF_BYTES, "big"))
                if state in ("K", "D", "R"):
                    remember(self._final, r, (state, q), CACHED_STATES)
        return states, ids

    def _wait(self, waiting: set[int]) -> None:
        """Pages waiting for an older page another instance is deciding: back off a little
        (they are asked again next round), longer the longer they wait (at most 0.5 s). No
        time limit: the older page's lease bounds the wait (lease.py), and the oldest
        page pending never waits. A stop (`interrupted`) gives the batch up."""
        now = time.monotonic()
        self._waiting = {p: self._waiting.get(p, now) for p in waiting}
        if not waiting:
            return
        if self.interrupted.is_set():
            self._waiting = {}
            raise IndexUnavailable(f"stopping: {len(waiting)} pages were waiting for older "
                                   "pages another instance is deciding")
        waited = now - min(self._waiting.values())
        self.interrupted.wait(min(0.5, 0.01 + waited / 8))

    def _sweep(self, keys: list[list[bytes]], members: list[list[list[int]]],
               states: Mapping[int, str], mine: Collection[int]) -> None:
        """Members of other batches that will never count again leave their sets: drops
        whose own leaving failed, and pages past their lease (an instance that died; one
        that did not joins again when it asks again). Not an absent record: it may be a
        page whose keys were written before its record, in the same round. (By ref.)"""
        gone: dict[int, dict[bytes, None]] = {}
        for page_keys, sets in zip(keys, members, strict=True):
            for key, ids in zip(page_keys, sets, strict=True):
                for q in ids:
                    if q not in mine and states.get(q) in ("X", "D", "R"):
                        gone.setdefault(q, {})[key] = None
        if gone:
            with self._call("sweep"):
                self._rounds(("leave", [item for q, q_keys in gone.items() for item in
                                        self._leave(q.to_bytes(REF_BYTES, "big"),
                                                    list(q_keys))], ()))

