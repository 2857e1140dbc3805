"""How long other instances wait for a page this one is deciding: as long as this instance
is alive and deciding, and not a moment longer (docs/scale-out.md, "Leases").

A page's record is PENDING from its registration until its claim, with a lease: a time (on
the record's own node's clock) after which every instance reads it as gone. The lease is
short (LEASE_MS), and a thread of this instance renews the leases of the pages it holds
every RENEW_EVERY_S, for as long as its deciding loop makes progress (a round within
STUCK_S). So
- a page of a live instance is waited for however long its batch takes (a chain of older
  pages ahead of it, a slow round): its lease is never let run out;
- a page of an instance that died (SIGKILL, a lost host), or froze, is read as gone at
  most LEASE_MS after its last renewal;
- a page of an instance that stops deciding it (a batch given up, a stop, the index
  closed) is released at once: its lease ends now.
A renewal never revives a lease that ran out (the script refuses it): other instances may
have gone on without the page, so it must register and read again before a claim of it
can hold, and its claim checks the lease on the same node, atomically.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from stream_dedup.errors import IndexUnavailable
from stream_dedup.index.redis.client import Observe, ScriptClient
from stream_dedup.index.redis.layout import SHARDS
from stream_dedup.security import RedisSecurity

log = logging.getLogger("stream_dedup.index")

LEASE_MS = 8_000  # a PENDING record not renewed within this is read as gone
RENEW_EVERY_S = 2.0  # leases are renewed this often (a quarter of the lease)
STUCK_S = 60.0  # no round of the deciding loop in this long: its leases are let run out


class Leases(ScriptClient):
    """The pages this instance is deciding (registered, not yet final), and the thread
    that renews their leases. Its own connection: the deciding thread may be in a round
    trip of its own meanwhile."""

    def __init__(self, url: str, record_key: Callable[[int], bytes],
                 observe: Observe | None = None, client: Any = None,
                 security: RedisSecurity | None = None) -> None:
        super().__init__(url, client, observe, security)
        self.lease_ms = LEASE_MS
        self._record_key = record_key
        self._held: dict[int, None] = {}
        self._lock = threading.Lock()
        self._progress = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._renew_loop, name="redis-leases",
                                         daemon=True)
        self._thread.start()

    def hold(self, page_ids: Iterable[int]) -> None:
        """Pages registered (again) by this instance: their leases are renewed."""
        with self._lock:
            self._held.update(dict.fromkeys(page_ids))
        self._progress = time.monotonic()

    def drop(self, page_ids: Iterable[int]) -> None:
        """Pages whose records are final (or another's to finish): nothing to renew."""
        with self._lock:
            for q in page_ids:
                self._held.pop(q, None)
        self._progress = time.monotonic()

    def held(self) -> list[int]:
        with self._lock:
            return list(self._held)

    def release(self, page_ids: Iterable[int]) -> None:
        """This instance stops deciding these pages: their leases end now (best effort: if
        Redis does not answer, they run out within LEASE_MS)."""
        ids = list(page_ids)
        self.drop(ids)
        if not ids:
            return
        try:
            self._on_records("release", ids, 0)
        except IndexUnavailable as exc:
            log.info("could not release %d pages' leases (%s): they run out within %.0f s",
                     len(ids), exc, self.lease_ms / 1000)

    def renew(self) -> int:
        """Renew the leases of the pages held now (one round trip); how many were."""
        ids = self.held()
        if not ids:
            return 0
        return sum(int(n or 0) for n in self._on_records("renew", ids, self.lease_ms))

    def close(self, release: bool = True) -> None:
        """Stop renewing; with `release`, the pages still held are released (a stop, the
        index closed); without, they run out as a dead instance's would (tests)."""
        self._stop.set()
        self._thread.join(timeout=RENEW_EVERY_S + 6)
        if release:
            self.release(self.held())
        self.client.close()

    def _on_records(self, operation: str, page_ids: list[int], lease_ms: int
                    ) -> list[Any]:
        """One round trip of the lease script (lease_ms 0: release) on `page_ids`' records."""
        nodes = self._shard_nodes()
        items = []
        for q in page_ids:
            key = self._record_key(q)
            items.append((nodes[q % SHARDS], key, (key,), 1))
        with self._call(operation):
            return self._rounds(("lease", items, (lease_ms,)))[0]

    def _renew_loop(self) -> None:
        while not self._stop.wait(RENEW_EVERY_S):
            if time.monotonic() - self._progress > STUCK_S:
                continue  # the deciding loop is stuck: let its leases run out
            try:
                self.renew()
            except IndexUnavailable as exc:  # the deciding thread sees it too
                log.debug("renewing leases failed: %s", exc)
            except Exception:  # never let the thread die quietly: others would wait
                log.exception("renewing leases raised")
