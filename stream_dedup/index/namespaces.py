"""Namespaces and forgetting, the index's lifecycle (pure: no I/O).

A namespace is a key space of one index. Every key a page puts in the index (its raw and
canonical fingerprints, its features, band and containment keys, its URL's key) is XORed
with the namespace's *salt*, a 64-bit hash of its name: pages of two namespaces share no
key, so they never match, and each namespace has its own URL versions (and so its own
clusters and counts). The default namespace, "", has salt 0: an index written before
namespaces existed is that namespace, unchanged, and it costs nothing. What the decide step
compares within a batch (the Overlay) is kept per namespace, unsalted; the salt is applied
where a page meets the index: its probe and its stored record (`salted_probe`,
`salted_doc`). A stored record also names its namespace (`StoredDoc.namespace`), for
forgetting and for `index stats`.

A namespace read (`--namespace-read`) is a second, read-only lookup of the same page under
another namespace's salt; `merge_answers` joins it to the page's own answer: its exact and
near matches count, its URL versions do not (a page is never a new version of a URL of
another namespace, so nothing of that namespace is ever replaced or written).

`Forget` selects the held pages to forget: one namespace, and a URL, a host, a time or all.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import numpy as np

if TYPE_CHECKING:
    from stream_dedup.index.base import Probe, StoredDoc

DEFAULT = ""
MAX_NAME = 128
# Printable, no spaces or separators a label, a path or a Kafka header would trip on.
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@+\-/]{0,127}")
_HOST = re.compile(r"[^\s/?#@]+")  # a host (and port) as given: no space, no URL separator
_salts: dict[str, int] = {DEFAULT: 0}
_np_salts: dict[str, np.uint64] = {DEFAULT: np.uint64(0)}


class NamespaceError(ValueError):
    """A namespace name or a forget selector that cannot be used (says why)."""


def check_name(name: str, what: str = "namespace") -> str:
    """`name` if it can name a namespace: 1-128 characters, letters, digits and . _ : @ + - /,
    starting with a letter or digit."""
    if not isinstance(name, str) or not name:
        raise NamespaceError(f"{what}: a namespace needs a name (an empty one is the default "
                             "namespace: leave it out)")
    if len(name) > MAX_NAME or not _NAME.fullmatch(name):
        raise NamespaceError(f"{what}: {name[:60]!r} is not a namespace name (1-{MAX_NAME} "
                             "letters, digits and . _ : @ + - /, starting with a letter or "
                             "a digit)")
    return name


def salt(name: str) -> int:
    """The namespace's 64-bit salt (0: the default namespace); never 0 for another one."""
    got = _salts.get(name)
    if got is None:
        digest = hashlib.blake2b(name.encode(), digest_size=8, person=b"sd-ns").digest()
        got = int.from_bytes(digest, "little") or 1
        if len(_salts) < 4096:
            _salts[name] = got
            _np_salts[name] = np.uint64(got)
    return got


def _np_salt(name: str) -> np.uint64:
    got = _np_salts.get(name)
    return np.uint64(salt(name)) if got is None else got


def salted_probe(p: Probe, name: str) -> Probe:
    """The probe as the index sees it in namespace `name` (itself in the default one)."""
    if not name:
        return p
    s = salt(name)
    return type(p)(p.page_id, p.raw_fp ^ s, None if p.canonical_fp is None else p.canonical_fp ^ s,
                   None if p.features is None else p.features ^ _np_salt(name),
                   p.url_key ^ s if p.url_key else 0)


def salted_doc(doc: StoredDoc | None, name: str) -> StoredDoc | None:
    """A kept page's record as the index stores it in namespace `name`."""
    if doc is None or not name:
        return doc
    s = salt(name)
    return type(doc)(doc.url, doc.features ^ _np_salt(name), doc.sketch, doc.ld_signature,
                     doc.text_length, doc.raw_fp ^ s, doc.canonical_fp ^ s, doc.fetched_at,
                     doc.page_id, doc.shingles, doc.url_key ^ s if doc.url_key else 0, name)


def unsalted_url_key(doc: StoredDoc) -> int:
    """A stored record's URL key as its URL gives it (without its namespace's salt)."""
    return doc.url_key ^ salt(doc.namespace) if doc.url_key else 0


# --- a stored record's URL field: "\0<namespace>\0<url>" outside the default namespace ------

def pack_url(namespace: str, url: str) -> bytes:
    """The URL field of a stored record, naming its namespace (a URL holds no NUL)."""
    raw = url.encode("utf-8", "surrogatepass")
    return b"\0" + namespace.encode() + b"\0" + raw if namespace else raw


def unpack_url(field: bytes) -> tuple[str, str]:
    """(namespace, url) of a stored record's URL field."""
    if field[:1] == b"\0":
        end = field.index(b"\0", 1)
        return field[1:end].decode(), field[end + 1 :].decode("utf-8", "surrogatepass")
    return DEFAULT, field.decode("utf-8", "surrogatepass")


# --- reading other namespaces -------------------------------------------------------------

# --- forgetting ---------------------------------------------------------------------------

SELECTORS = ("url", "host", "before", "all")


@dataclass(frozen=True, slots=True)
class Forget:
    """The held pages to forget: of `namespace` (None: of every namespace), and those of
    one selector: a URL (its URL key, `url_key`, as the deduplicator computes it,
    unsalted), a host, crawled (or, without a crawl time, stored) before `before` (POSIX
    seconds), or all; or, restoring a changelog, the pages with these ids."""

    namespace: str | None = DEFAULT
    url: str | None = None
    url_key: int = 0
    host: str | None = None
    before: float | None = None
    all: bool = False
    page_ids: frozenset[int] = frozenset()

    def describe(self) -> str:
        ns = (" of every namespace" if self.namespace is None else
              f" of namespace {self.namespace!r}" if self.namespace else "")
        if self.url is not None:
            return f"the page of {self.url}{ns}"
        if self.host is not None:
            return f"the pages of host {self.host}{ns}"
        if self.before is not None:
            when = datetime.fromtimestamp(self.before, UTC).isoformat()
            return f"the pages{ns} crawled before {when}"
        if self.page_ids:
            return f"{len(self.page_ids)} pages by id"
        return f"every page{ns}"

    def matches(self, namespace: str, url: str, when: float | None, page_id: int) -> bool:
        """Whether a held page (its namespace, URL, crawl or store time, id) is selected."""
        if self.page_ids:
            return page_id in self.page_ids
        if self.namespace is not None and namespace != self.namespace:
            return False
        if self.host is not None:
            return host_of(url) == self.host
        if self.before is not None:
            return when is not None and when < self.before
        if self.url is not None:
            return url == self.url
        return self.all

    @property
    def salted_url_key(self) -> int:
        return self.url_key ^ salt(self.namespace or DEFAULT) if self.url_key else 0


def host_of(url: str) -> str:
    """A URL's host, lower-case, without a port or a trailing dot ("" if it has none)."""
    try:
        host = urlsplit(url.strip()).hostname or ""
    except ValueError:
        return ""
    return host.rstrip(".")


def parse_when(text: str) -> float:
    """An ISO 8601 date or time (UTC when it names no zone) -> POSIX seconds."""
    try:
        when = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except (ValueError, AttributeError):
        raise NamespaceError(f"--before: {str(text)[:60]!r} is not a date (ISO 8601, e.g. "
                             "2026-11-01 or 2026-11-01T12:00:00Z)") from None
    return (when if when.tzinfo else when.replace(tzinfo=UTC)).timestamp()


def page_time(fetched_at: str | None, stored_at: float | None = None) -> float | None:
    """When a held page was crawled (its fetched_at), else stored; None: unknown."""
    if fetched_at:
        try:
            return parse_when(fetched_at)
        except NamespaceError:
            pass
    return stored_at


def selector(*, namespace: str = DEFAULT, url: str | None = None, host: str | None = None,
             before: str | None = None, all: bool = False,
             url_key: int = 0) -> Forget:
    """A Forget from an operator's words (the CLI's flags, /v1/forget's JSON): exactly one
    of url, host, before, all; the namespace checked (an empty name: the default)."""
    given = [name for name, v in (("url", url), ("host", host), ("before", before),
                                  ("all", all or None)) if v is not None and v is not False]
    if len(given) != 1:
        raise NamespaceError(f"forget needs exactly one of --url, --host, --before, --all "
                             f"(got {', '.join(given) or 'none'})")
    if namespace:
        check_name(namespace)
    if url is not None:
        if not isinstance(url, str) or not url.strip():
            raise NamespaceError("--url: give the page's URL")
        return Forget(namespace, url=url.strip(), url_key=url_key)
    if host is not None:
        given = host.strip() if isinstance(host, str) else ""
        name = host_of(f"http://{given}/") if _HOST.fullmatch(given) else ""
        if not name:
            raise NamespaceError(f"--host: {str(host)[:60]!r} is not a host name (e.g. "
                                 "example.com, without a scheme or a path)")
        return Forget(namespace, host=name)
    if before is not None:
        return Forget(namespace, before=parse_when(before))
    return Forget(namespace, all=True)
