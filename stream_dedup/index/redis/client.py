"""The Redis index's transport: connecting (cluster or single), and a round of the protocol
as one pipelined round trip of script calls, one call per node (backend.py holds the protocol,
scripts.py the scripts)."""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import redis
from redis.backoff import ExponentialBackoff
from redis.cluster import RedisCluster
from redis.exceptions import (
    AuthenticationError,
    NoScriptError,
    RedisClusterException,
    RedisError,
    ResponseError,
)
from redis.retry import Retry

from stream_dedup.errors import ConfigError, IndexMismatchError, IndexUnavailable
from stream_dedup.index.redis.layout import (
    FEATURE_FIELD,
    FORMAT,
    ID_BYTES,
    LISTPACK_ENTRIES,
    LISTPACK_VALUE,
    PAGES,
    REF_BYTES,
    SHARDS,
    STAMP,
    SWEEP_S,
)
from stream_dedup.index.redis.record_scripts import RECORD_SCRIPTS
from stream_dedup.index.redis.scripts import SET_SCRIPTS
from stream_dedup.security import RedisSecurity, redact, scrub, split_urls

log = logging.getLogger("stream_dedup.index")

_CALL_KEYS = 2_000  # keys per script call at most (a call holds its node while it runs)
_NO_NODES: list[Any] = [None] * SHARDS  # a plain Redis: one node
ANY = object()  # a script call's header for any node not named
_SPARSE = {"join"}  # scripts that return (item, result, value) for some results only

_CONSTANTS = {"SWEEP_S": SWEEP_S, "FEATURE_FIELD": FEATURE_FIELD, "ID_BYTES": ID_BYTES,
              "REF_BYTES": REF_BYTES, "SHARDS": SHARDS}


def source(src: str) -> str:
    """A script's source with the layout's constants in it."""
    for name, value in _CONSTANTS.items():
        src = src.replace(name, str(value))
    return src


# every script the index runs, by name
SCRIPTS = {name: source(src) for name, src in {**SET_SCRIPTS, **RECORD_SCRIPTS}.items()}


def shard_of(key: bytes) -> int:
    return int(key[1 : key.index(b"}")])


def connect(url: str, security: RedisSecurity | None = None) -> redis.Redis | RedisCluster:
    """A cluster client when the node at `url` is in cluster mode, else a plain one. `url`
    may list several seeds, comma-separated (redis://a:7000,redis://b:7000): the first that
    answers is used (a cluster's client learns the other nodes from it). `security`: AUTH
    and TLS beyond what the URL says. An error names the URL without its password."""
    security = security or RedisSecurity()
    errors = []
    for seed in split_urls(url):
        try:
            extra = security.client_kwargs(seed)
            plain = redis.Redis.from_url(seed, socket_timeout=5, socket_connect_timeout=5,
                                         **extra)
            enabled = plain.info("cluster").get("cluster_enabled", 0)
        except AuthenticationError as exc:
            raise ConfigError(f"Redis authentication failed at {redact(seed)} ({exc}): check "
                              "the user and password (in the URL, redis_username, "
                              "redis_password or redis_password_file)") from None
        except (RedisError, ValueError, TypeError) as exc:  # TypeError: an unknown URL argument
            errors.append(f"{redact(seed)}: {_why(exc)}")
            continue
        if not enabled:
            return plain
        plain.close()
        # Few, quick retries here (a moved slot, a reconnect); a longer outage is the
        # runner's to wait out, batch by batch (IndexUnavailable).
        try:
            return RedisCluster.from_url(seed, socket_timeout=5, socket_connect_timeout=5,
                                         retry=Retry(ExponentialBackoff(cap=0.5, base=0.05), 2),
                                         **extra)
        except (RedisError, RedisClusterException) as exc:
            errors.append(f"{redact(seed)}: {_why(exc)}")
    raise ConfigError(scrub(f"cannot reach Redis at {redact(url)}: "
                            f"{'; '.join(errors) or 'no address'}", security.secrets(url)))


def _why(exc: BaseException) -> str:
    """What went wrong, and for a TLS failure the setting that decides it."""
    text = str(exc)
    if isinstance(exc, TypeError):
        return f"the URL has an argument the Redis client does not take ({text}): fix redis_url"
    if "CERTIFICATE_VERIFY_FAILED" in text or "certificate verify failed" in text:
        if "mismatch" in text:  # "Hostname mismatch", "IP address mismatch"
            return (f"TLS: the node's certificate names another host ({text}); connect by "
                    "a name it has, or turn off redis_ssl_check_hostname for a test")
        return (f"TLS: the node's certificate is not signed by a CA trusted here ({text}); "
                "give its CA as redis_ssl_cafile")
    if "WRONG_VERSION_NUMBER" in text or "wrong version number" in text:
        return f"TLS: the port does not speak TLS ({text}); use redis:// for it"
    return text


Observe = Callable[[str, float, bool], None]  # operation, seconds, failed


class ScriptClient:
    """Script calls on a Redis (Cluster), a round trip at a time, timed and counted; and
    what an operator asks of it (ping, its configuration; stats: forget.py)."""

    def __init__(self, url: str, client: Any, observe: Observe | None,
                 security: RedisSecurity | None = None) -> None:
        self.url = redact(url)  # as it is printed: without a password
        self.observe: Observe = observe or (lambda op, s, failed: None)
        self.client = client if client is not None else connect(url, security)
        self.records: Any = None  # another store for the verification records (backend.py)
        self.listpack_value = LISTPACK_VALUE  # (_check_config)
        self.round_trips = 0  # pipelined round trips so far
        self._nodes_of: tuple[Any, list[Any]] = (None, [])  # slot map, shard -> node
        self._sha = {name: hashlib.sha1(src.encode()).hexdigest() for name, src in SCRIPTS.items()}

    def _rounds(self, *calls: tuple[str, Sequence[tuple[Any, bytes, Sequence[Any], int]], Any],
                count: int = 0) -> list[list[Any]]:
        """One pipelined round trip: for each (script, items, header), one script call per
        node its items are on (per about _CALL_KEYS results). An item is (node, a key of it
        on that node, its arguments, how many results it gets); a call's arguments are the
        header (the same for every node, or per node: {node: header}, ANY for the rest),
        then its items'. Per call, the results of its items, in order (of a _SPARSE script:
        (item index, result number from 1, result) for the results it gives). `count`: the
        count of pages kept grows by that much, in the same round trip."""
        groups = []
        for script, items, header in calls:
            chunks: dict[Any, list[list[int]]] = {}  # node -> its calls, each a list of items
            sizes: dict[Any, int] = {}
            for i, item in enumerate(items):
                node, n = item[0], item[3]
                node_chunks = chunks.get(node)
                if node_chunks is None or sizes[node] + n > _CALL_KEYS:
                    if node_chunks is None:
                        node_chunks = chunks[node] = []
                    node_chunks.append([])
                    sizes[node] = 0
                node_chunks[-1].append(i)
                sizes[node] += n
            groups.append((script, items, header, chunks))
        if not any(items for _, items, _, _ in groups) and not count:
            return [[] for _ in calls]
        for attempt in range(2):
            pipe = self.client.pipeline(transaction=False)
            for script, items, header, chunks in groups:
                for node, node_chunks in chunks.items():
                    head = header.get(node, header[ANY]) if isinstance(header, dict) else header
                    for idx in node_chunks:
                        args = list(head)
                        for i in idx:
                            args += items[i][2]
                        # KEYS[1] routes the call to the node; the keys are in ARGV
                        pipe.execute_command("EVALSHA", self._sha[script], 1, items[idx[0]][1],
                                             *args)
            if count and not attempt:  # (a failed attempt ran it)
                pipe.incrby(PAGES, count)
            try:
                replies = iter(self._execute(pipe))
                break
            except NoScriptError:  # a new node (failover) or a flushed script cache
                if attempt:
                    raise
                self._load_scripts()
        out = []
        for script, items, _, chunks in groups:
            if script in _SPARSE:  # per chunk: item (from 1), result (from 1), value
                found = []
                for node_chunks in chunks.values():
                    for idx in node_chunks:
                        reply = next(replies)
                        found += [(idx[reply[j] - 1], reply[j + 1], reply[j + 2])
                                  for j in range(0, len(reply), 3)]
                out.append(found)
                continue
            offsets, total = [], 0
            for item in items:
                offsets.append(total)
                total += item[3]
            results: list[Any] = [None] * total
            for node_chunks in chunks.values():
                for idx in node_chunks:
                    reply = next(replies)
                    if not isinstance(reply, list):
                        continue
                    pos = 0
                    for i in idx:
                        n = items[i][3]
                        if n == 1:
                            results[offsets[i]] = reply[pos]
                        elif n:
                            results[offsets[i] : offsets[i] + n] = reply[pos : pos + n]
                        pos += n
            out.append(results)
        return out

    def _check_stamp(self, mine: str, wanted: int, buckets: int) -> None:
        """This index's stamp (sketch parameters, layout) is the one the Redis holds."""
        with self._call("stamp"):
            self.client.set(STAMP, mine, nx=True)
            stored = self.client.get(STAMP).decode("utf-8", "replace")
        if stored == mine:
            return
        try:
            stamp, shards, layout, *rest = (int(v) for v in stored.split(":"))
        except ValueError:
            raise IndexMismatchError(
                f"the Redis at {self.url} holds something else at {STAMP.decode()} "
                f"({stored[:40]!r}): not a stream-dedup index; use another Redis or "
                "database") from None
        if stamp != wanted:
            why = (f"built with other sketch parameters (stamp {stamp:#x}, these settings "
                   f"give {wanted:#x}): features would not be comparable")
        elif (shards, layout) != (SHARDS, FORMAT):
            why = (f"laid out by another version (shards {shards}, format {layout}; this "
                   f"version's is {FORMAT}): it cannot read it (no migration: start this "
                   "version on an empty Redis, and let the old index go with retention)")
        else:
            why = (f"made with --redis-buckets {rest[0] if rest else '?'} (these settings "
                   f"give {buckets}): every instance must use the same")
        raise IndexMismatchError(f"the Redis index at {self.url} was {why}. Use the same "
                                 "settings and version, or another Redis.")

    def _check_config(self) -> None:
        """Warn about settings that lose pages (eviction) or cost much more memory; learn
        how long a record may be and stay in its bucket's listpack (`listpack_value`)."""
        self.listpack_value = LISTPACK_VALUE  # Redis's default, if CONFIG is not allowed
        try:
            config = self.client.config_get("maxmemory-policy")
            config.update(self.client.config_get("hash-max-listpack-*"))
            entries = int(config.get("hash-max-listpack-entries", LISTPACK_ENTRIES))
            self.listpack_value = int(config.get("hash-max-listpack-value", LISTPACK_VALUE))
        except (RedisError, RedisClusterException, ValueError):
            return  # CONFIG is often disabled on managed Redis: nothing to say
        policy = config.get("maxmemory-policy", "noeviction")
        if policy != "noeviction":
            log.warning("Redis at %s evicts keys when full (maxmemory-policy %s): it would "
                        "forget pages and decisions silently; set noeviction, so a full "
                        "index fails writes (the batch waits, /readyz says so)", self.url,
                        policy)
        if entries < LISTPACK_ENTRIES:
            log.warning("Redis at %s has hash-max-listpack-entries %d: a bucket of the "
                        "index's records with more records is stored as a hash table, 2-3 "
                        "times larger; set it to %d at least (Redis's default)", self.url,
                        entries, LISTPACK_ENTRIES)

    def ping(self) -> bool:
        """Does every primary answer now (/readyz)?"""
        try:
            with self._call("ping"):
                for client in (self.client, self.records):
                    if isinstance(client, RedisCluster):
                        client.ping(target_nodes=RedisCluster.PRIMARIES)
                    elif client is not None:
                        client.ping()
            return True
        except IndexUnavailable:
            return False

    def __len__(self) -> int:
        with self._call("count"):
            return int(self.client.get(PAGES) or 0)

    def _shard_nodes(self) -> list[Any]:
        """The node serving each shard (hash tag) now (None for a plain Redis), remembered
        until the client learns a new slot map."""
        if not isinstance(self.client, RedisCluster):
            return _NO_NODES
        nodes = self.client.nodes_manager
        if self._nodes_of[0] is not nodes.slots_cache:
            self._nodes_of = (nodes.slots_cache, [
                nodes.get_node_from_slot(self.client.keyslot(b"{%d}" % shard)).name
                for shard in range(SHARDS)])
        return self._nodes_of[1]

    def _load_scripts(self) -> None:
        for source in SCRIPTS.values():
            if isinstance(self.client, RedisCluster):
                self.client.execute_command("SCRIPT LOAD", source,
                                            target_nodes=RedisCluster.PRIMARIES)
            else:
                self.client.script_load(source)

    def _execute(self, pipe: Any) -> list[Any]:
        self.round_trips += 1
        return list(pipe.execute())

    @contextmanager
    def _call(self, operation: str) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        except (RedisError, RedisClusterException) as exc:  # the latter: no node answers
            self.observe(operation, time.perf_counter() - started, True)
            if isinstance(exc, ResponseError) and "OOM" in str(exc):
                raise IndexUnavailable(f"Redis is out of memory ({operation}): {exc}") from exc
            raise IndexUnavailable(f"Redis {operation} failed: {type(exc).__name__}: "
                                   f"{exc}") from exc
        self.observe(operation, time.perf_counter() - started, False)


def memory(client: Any) -> tuple[int, int]:
    """Keys and used_memory, summed over every primary."""
    if isinstance(client, RedisCluster):
        primaries = RedisCluster.PRIMARIES
        infos = list(client.info("memory", target_nodes=primaries).values())
        keys = client.dbsize(target_nodes=primaries)  # summed by redis-py
    else:
        infos, keys = [client.info("memory")], client.dbsize()
    return keys, sum(int(info["used_memory"]) for info in infos)
