"""Which URLs are the same: a normal form, and its 64-bit key (the index's URL map).

The normal form is w3lib's `canonicalize_url` (the one Scrapy uses for its request
fingerprints): scheme and host lower-cased, the host IDNA-encoded, dot segments removed,
percent-encoding made uniform (unreserved characters decoded, the rest upper-case escapes),
query arguments sorted, the fragment dropped. On top of it, one step w3lib leaves out: the
default port of the scheme goes (`:80` for http, `:443` for https). Query parameters named
by `ignore` (names or fnmatch patterns, e.g. `utm_*,sessionid`) are removed first.

w3lib costs 50-170 µs a URL here (more with a query, which it parses and encodes again);
most crawled URLs are already in normal form, so two strict patterns that show what w3lib
would return skip it: a plain URL (http/https, lower-case host, a path of unreserved
characters and of the delimiters w3lib keeps as they are, `!$&'()*+,=:@`, without dot
segments, no query, no fragment, no port: returned as it is; not `;`, since w3lib drops an
empty `;params`), and a plain URL with a query of name=value pairs of unreserved characters
(the pairs sorted here, ignored names dropped). On the 6,204 URLs of a 65 MB WARC of the
corpus's pages, a key takes 4.5 µs (plain), 8.5 (plain with delimiters; 50 through w3lib),
21 (plain query; 78) and 172 (the rest, w3lib), 9.6 µs on average against 17.5 without the
second pattern and the delimiters (tests/test_urls.py holds both shortcuts to w3lib's
answer). A string that is not an absolute http(s) URL (a file name, say) is its own normal
form, trimmed.
"""

from __future__ import annotations

import fnmatch
import re
from functools import lru_cache
from urllib.parse import parse_qsl, urlsplit

import xxhash
from w3lib.url import canonicalize_url, url_query_cleaner

_PLAIN = re.compile(r"https?://[a-z0-9](?:[a-z0-9-]*[a-z0-9])?(?:\.[a-z0-9](?:[a-z0-9-]*[a-z0-9])?)*"
                    r"(?:/(?:[A-Za-z0-9_~!$&'()*+,=:@-]|\.(?![./]|$))*)*")
_PAIR = re.compile(r"[A-Za-z0-9_.~-]+=[A-Za-z0-9_.~-]*")  # a query argument w3lib keeps as it is
_DEFAULT_PORT = re.compile(r"^(http://[^/?#]*?):80(?=[/?]|$)|^(https://[^/?#]*?):443(?=[/?]|$)")


class UrlKeys:
    """`normal(url)`: the URL's normal form; `key(url)`: a 64-bit hash of it."""

    def __init__(self, ignore: str = "") -> None:
        self.patterns = tuple(p.strip() for p in ignore.split(",") if p.strip())

    def __eq__(self, other: object) -> bool:  # equal: the same normal forms (and keys)
        return isinstance(other, UrlKeys) and other.patterns == self.patterns

    def __hash__(self) -> int:
        return hash(self.patterns)

    def normal(self, url: str) -> str:
        url = url.strip()
        if _PLAIN.fullmatch(url):
            return _rooted(url)
        if "?" in url:
            plain = self._plain_query(url)
            if plain is not None:
                return plain
        return self._by_w3lib(url)

    def _plain_query(self, url: str) -> str | None:
        """w3lib's answer for a plain URL whose query is name=value pairs of unreserved
        characters: the pairs sorted by name, then value, ignored names dropped; None for
        any other URL."""
        base, _, query = url.partition("?")
        if not query or "#" in query or not _PLAIN.fullmatch(base):
            return None
        pairs = query.split("&")
        if not all(_PAIR.fullmatch(p) for p in pairs):
            return None
        args = sorted(tuple(p.split("=", 1)) for p in pairs)
        if self.patterns:
            args = [a for a in args
                    if not any(fnmatch.fnmatchcase(a[0], p) for p in self.patterns)]
        base = _rooted(base)
        return base + "?" + "&".join(f"{k}={v}" for k, v in args) if args else base

    def _by_w3lib(self, url: str) -> str:
        low = url[:8].lower()
        if not (low.startswith("http://") or low.startswith("https://")):
            return url
        try:
            if self.patterns and "?" in url:
                url = self._without_ignored(url)
            normal = canonicalize_url(url)
        except ValueError:  # e.g. a port that is not a number, a bad IPv6 literal
            return url
        return _DEFAULT_PORT.sub(lambda m: m.group(1) or m.group(2), normal, count=1)

    def key(self, url: str) -> int:
        return _key(self, url)

    def _without_ignored(self, url: str) -> str:
        names = {k for k, _ in parse_qsl(urlsplit(url).query, keep_blank_values=True)}
        drop = [n for n in names if any(fnmatch.fnmatchcase(n, p) for p in self.patterns)]
        return url_query_cleaner(url, drop, remove=True, keep_fragments=True) if drop else url


@lru_cache(maxsize=4096)
def _key(keys: UrlKeys, url: str) -> int:
    """The key of `url`, remembered for the last 4,096 URLs keyed by equal UrlKeys: the URL
    map confirms a stored version by keying its URL again, most often the very URL whose
    page the pipeline keyed a moment before (a recrawl's), which then costs no normal form
    (a recrawl-rich WARC: 1.3 % of the replay's CPU)."""
    return xxhash.xxh3_64_intdigest(keys.normal(url).encode("utf-8", "surrogatepass"))


def _rooted(plain: str) -> str:
    """A plain URL (`_PLAIN`) with its empty path made "/", as w3lib makes it."""
    return plain if "/" in plain[8:] else plain + "/"
