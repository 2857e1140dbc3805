"""`stream-dedup index stats | compact | export | forget`: an operator's commands on an index.

    stats     pages, bytes, namespaces (pages, oldest) as JSON    LSM (offline) or Redis
    compact   merge an LSM index's files                          LSM
    export    a consistent copy of an LSM index                   LSM
    forget    forget held pages: one namespace's, by URL, host,   LSM (offline) or Redis
              crawl time, or all                                  (online)

An LSM index is opened with the parameter stamp it holds (these commands compare no
features), while no service holds it (RocksDB locks the directory). A Redis index is opened
as `serve` opens it, with the settings' stamp: sketch settings other than those it was built
with are refused before anything is read or changed, and instances may run meanwhile. A
forget's selector is checked before any index is opened: bad words change nothing (exit 2).
The forget itself is `Deduplicator.forget` (the URL key as the deduplicator computes it,
with the settings' --url-ignore-params), the same call `POST /v1/forget` makes.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import TYPE_CHECKING, Any

from stream_dedup.cli.settings import setting_flags, settings_of
from stream_dedup.config import Settings
from stream_dedup.errors import ConfigError
from stream_dedup.index.namespaces import SELECTORS, Forget, NamespaceError, check_name, selector

if TYPE_CHECKING:
    from stream_dedup.index.base import FeatureIndex

EPILOG = """\
examples:
  stream-dedup index stats --index-path /var/lib/sd          # an LSM index (offline)
  stream-dedup index stats --index redis --redis-url redis://10.0.0.5:7000
  stream-dedup index compact --index-path /var/lib/sd
  stream-dedup index export /backup/sd-2026-11-21 --index-path /var/lib/sd
  stream-dedup index forget --host example.com --namespace crawl-7 --index-path /var/lib/sd
  stream-dedup index forget --url https://example.com/a --index redis \\
      --redis-url redis://10.0.0.5:7000 --config /etc/stream-dedup.toml
  stream-dedup index forget --before 2026-01-01 --index-path /var/lib/sd
  stream-dedup index forget --all --namespace crawl-7 --index-path /var/lib/sd

forget: exactly one of --url, --host, --before, --all, within one namespace (--namespace,
else the settings' namespace: the default one unless STREAM_DEDUP_NAMESPACE or --config
names another). A page forgotten is decided, when it comes again, as if never seen. It
prints {"forgotten": N, "namespace": ..., "selector": {...}, "seconds": ...}.
--before takes an ISO 8601 date or time (UTC unless it names a zone) and compares each
page's crawl time (fetched_at), else the time it was stored.

A Redis index needs the sketch settings it was built with (the flags or --config of the
instances that run on it): other ones are refused, and nothing is changed. A URL is matched
by its key, so give the instances' --url-ignore-params too.

An LSM index a `serve --exactly-once` restores from its changelog is forgotten through
that service (POST /v1/forget writes the changelog too): here it is refused.

exit status: 0 done; 2 bad words, an index that cannot be opened, or other settings
(a one-line reason on stderr; nothing changed).
"""

ACTIONS = ("stats", "compact", "export", "forget")


def add_parser(sub: Any) -> None:
    """The `index` command, on the CLI's subparsers."""
    ip = sub.add_parser("index", help="inspect, maintain or forget pages of an index (LSM "
                        "or Redis): stats, compact, export, forget",
                        description="Operator commands on a persistent index: an LSM "
                        "directory (--index-path DIR; run them while no service holds it, "
                        "RocksDB locks it) or a Redis index (--index redis --redis-url URL: "
                        "stats and forget, while instances run).",
                        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    ip.add_argument("action", choices=ACTIONS,
                    help="stats: pages, bytes, namespaces (and an LSM index's offsets) as "
                    "JSON; compact: merge files (LSM); export DIR: a consistent copy, also "
                    "a snapshot --warm-from can load (LSM); forget: forget the pages one "
                    "selector below chooses")
    ip.add_argument("target", nargs="?", metavar="DIR", help="export: where the copy goes")
    forget = ip.add_argument_group("forget: which pages (exactly one)")
    forget.add_argument("--url", metavar="URL", help="the page held for this URL (its "
                        "normal form: see --url-ignore-params)")
    forget.add_argument("--host", metavar="HOST", help="every page of this host, e.g. "
                        "example.com (not its subdomains)")
    forget.add_argument("--before", metavar="DATE", help="every page crawled (or, without a "
                        "crawl time, stored) before this ISO 8601 date or time, e.g. "
                        "2026-11-01 or 2026-11-01T12:00:00Z")
    forget.add_argument("--all", action="store_true", help="every page of the namespace")
    setting_flags(ip, serve=False)
    ip.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    words = {name: getattr(args, name) for name in SELECTORS
             if getattr(args, name) not in (None, False)}
    if args.action != "forget" and words:
        return _usage(f"{', '.join('--' + w for w in words)}: only `index forget` takes "
                      "a selector")
    if args.action != "export" and args.target:
        return _usage(f"{args.action} takes no DIR ({args.target!r}); only export does")
    settings = settings_of(args)
    what = None
    if args.action == "forget":
        try:
            if args.namespace is not None:  # given, even empty: it must name a namespace
                check_name(args.namespace, "--namespace")
            what = selector(namespace=settings.namespace, **words)
        except NamespaceError as exc:
            return _usage(str(exc))
    kind = args.index or ("lsm" if settings.index_path else settings.index)
    if kind == "redis":
        if args.action in ("compact", "export"):
            raise ConfigError(f"index {args.action} works on an LSM index directory "
                              "(--index-path DIR); a Redis index has no files of ours: "
                              "Redis keeps and compacts its own (BGSAVE, BGREWRITEAOF)")
        return _redis(args.action, settings, what, words)
    if kind != "lsm" or not settings.index_path:
        raise ConfigError(f"index {args.action} needs an index: --index-path DIR (an LSM "
                          "index) or --index redis --redis-url URL (a memory index lives "
                          "and dies with its process)")
    return _lsm(args, settings, what, words)


def _usage(reason: str) -> int:
    print(f"stream-dedup: index: {reason}", file=sys.stderr)
    return 2


def _lsm(args: argparse.Namespace, settings: Settings, what: Forget | None,
         words: dict[str, Any]) -> int:
    from stream_dedup.index.lsm import LsmIndex

    index = LsmIndex(settings.index_path, stamp=None, create=False)
    try:
        if args.action == "stats":
            _print({**_stats(index), "offsets": index.offsets()})
        elif args.action == "forget":
            assert what is not None
            changelog = _changelog_of(index.offsets(), settings)
            if changelog:
                raise ConfigError(
                    f"this index is restored from the changelog {changelog} (serve "
                    "--exactly-once): a forget here would not be written there, and the "
                    "next restore would bring the pages back. Forget through the running "
                    "service, which writes the changelog: POST /v1/forget")
            _forget(settings, index, what, words)
        elif args.action == "compact":
            before = index.stats()["disk_bytes"]
            index.compact()
            print(f"compacted {settings.index_path}: {before:,.0f} -> "
                  f"{index.stats()['disk_bytes']:,.0f} bytes", file=sys.stderr)
        else:
            if not args.target:
                return _usage("export needs a target DIR")
            index.export(args.target)
            print(f"exported a consistent copy of {settings.index_path} to {args.target}",
                  file=sys.stderr)
    finally:
        index.close()
    return 0


def _redis(action: str, settings: Settings, what: Forget | None, words: dict[str, Any]
           ) -> int:
    from stream_dedup.index import index_for

    if not settings.redis_url:
        raise ConfigError("--index redis needs --redis-url URL (any node of the cluster)")
    index = index_for(settings)  # the settings' stamp: other sketch parameters are refused
    try:
        if action == "stats":
            _print(_stats(index))
        else:
            assert what is not None
            _forget(settings, index, what, words)
    finally:
        index.close()
    return 0


def _changelog_of(offsets: dict[str, int], settings: Settings) -> str:
    """The changelog topic an LSM index has read (its position is one of its offsets): the
    settings' (their group's), or one of the default name; "" for none."""
    for stream in offsets:
        topic = stream.rsplit("/", 1)[0]
        if topic == settings.changelog() or topic.endswith("-index-changelog"):
            return topic
    return ""


def _stats(index: FeatureIndex) -> dict[str, Any]:
    return {**index.stats(), "namespaces": index.namespaces(), "stamp": f"{index.stamp:#x}"}


def _forget(settings: Settings, index: FeatureIndex, what: Forget,
            words: dict[str, Any]) -> None:
    """Forget with the deduplicator's own call (its URL keys), durably, and say what was
    done as POST /v1/forget does: the selector as the operator gave it."""
    from stream_dedup.pipeline.deduplicator import Deduplicator

    dedup = Deduplicator(settings, index=index)
    started = time.perf_counter()
    gone = dedup.forget(what)
    dedup.commit()  # an LSM index: written before the directory is let go
    print(f"stream-dedup: forgot {len(gone)} page(s): {what.describe()}", file=sys.stderr)
    _print({"forgotten": len(gone), "namespace": what.namespace, "selector": words,
            "seconds": round(time.perf_counter() - started, 3)})


def _print(body: dict[str, Any]) -> None:
    print(json.dumps(body, indent=2))
