"""The URL normal form (core/urls.py): w3lib's canonicalize_url, the default port dropped,
ignored query parameters; the shortcut for URLs already in normal form agrees with w3lib."""

from __future__ import annotations

import random
import string

import pytest
from w3lib.url import canonicalize_url

from stream_dedup.core.urls import _PLAIN, UrlKeys


@pytest.mark.parametrize(("a", "b"), [
    ("HTTP://Example.COM/a", "http://example.com/a"),  # scheme and host case
    ("http://example.com:80/a", "http://example.com/a"),  # default ports
    ("https://example.com:443/a", "https://example.com/a"),
    ("https://example.com/a#section-2", "https://example.com/a"),  # fragment
    ("https://example.com/%7Euser/a%2fb", "https://example.com/~user/a%2Fb"),  # escapes
    ("https://example.com/a/./b/../c", "https://example.com/a/c"),  # dot segments
    ("https://example.com/?b=2&a=1", "https://example.com/?a=1&b=2"),  # query order
    ("https://example.com", "https://example.com/"),
    ("http://bücher.example/x", "http://xn--bcher-kva.example/x"),  # IDNA
])
def test_the_same_url(a: str, b: str) -> None:
    urls = UrlKeys()
    assert urls.normal(a) == urls.normal(b)
    assert urls.key(a) == urls.key(b)


@pytest.mark.parametrize(("a", "b"), [
    ("https://example.com:8443/a", "https://example.com/a"),
    ("http://example.com/a", "https://example.com/a"),
    ("https://example.com/A", "https://example.com/a"),  # paths are case-sensitive
    ("https://example.com/?a=1", "https://example.com/?a=2"),
    ("https://example.com/?utm_source=x", "https://example.com/"),  # not ignored by default
])
def test_other_urls(a: str, b: str) -> None:
    assert UrlKeys().key(a) != UrlKeys().key(b)


def test_ignored_query_parameters() -> None:
    urls = UrlKeys("utm_*, sessionid")
    assert urls.normal("https://e.com/p?id=3&utm_source=a&utm_medium=b&sessionid=Z#x") == \
        "https://e.com/p?id=3"
    assert urls.normal("https://e.com/p?utm_source=a") == "https://e.com/p"
    assert urls.key("https://e.com/p?sessionid=1") == urls.key("https://e.com/p?sessionid=2")
    assert urls.normal("https://e.com/p?xutm_source=a") == "https://e.com/p?xutm_source=a"


def test_what_is_not_an_absolute_http_url_is_its_own_normal_form() -> None:
    urls = UrlKeys()
    assert urls.normal(" draft-ietf-httpbis-p1-messaging.html ") == \
        "draft-ietf-httpbis-p1-messaging.html"
    assert urls.normal("ftp://Example.com/a") == "ftp://Example.com/a"
    assert urls.normal("http://example.com:notaport/") == "http://example.com:notaport/"


def test_the_shortcut_gives_w3libs_answer() -> None:
    """Random URLs near the shortcut's pattern: whenever it takes one, it must agree with
    w3lib (and with the default port rule, which plain URLs never carry)."""
    rng = random.Random(7)
    parts = ["a", "b", "-", "_", "~", ".", "..", "/", "%41", "A", "0", "é", "?", "#", ":",
             "!", "$", "&", "'", "(", ")", "*", "+", ",", ";", "=", "@", ":80", "http:", "//"]
    taken = 0
    for _ in range(20_000):
        host = "".join(rng.choice(string.ascii_lowercase + "-.E0") for _ in
                       range(rng.randrange(1, 9)))
        path = "".join(rng.choice(parts) for _ in range(rng.randrange(0, 8)))
        slash = "/" if rng.random() < 0.8 else ""
        url = f"{rng.choice(['http', 'https'])}://{host}{slash}{path}"
        if _PLAIN.fullmatch(url):
            taken += 1
            try:
                want = canonicalize_url(url)
            except ValueError:
                continue
            assert UrlKeys().normal(url) == want, url
    assert taken > 1000


@pytest.mark.parametrize("ignore", ["", "utm_*,a", "b*"])
def test_the_query_shortcut_gives_w3libs_answer(ignore: str) -> None:
    """Random URLs with queries near the plain name=value pattern, with and without ignored
    names: whenever the shortcut takes one, w3lib (after dropping the ignored names) gives
    the same normal form."""
    rng = random.Random(11)
    parts = ["a", "b", "A", "0", "-", "_", "~", ".", "=", "&", "%41", "+", ";", "#", ":",
             "/", "é", "utm_x", "a=", "=b", "&&", " "]
    urls = UrlKeys(ignore)
    taken = 0
    for _ in range(60_000):
        host = "".join(rng.choice(string.ascii_lowercase + "-.E0")
                       for _ in range(rng.randrange(1, 6)))
        path = "".join(rng.choice(["a", "/", "b", ".", "-"]) for _ in range(rng.randrange(0, 5)))
        query = "".join(rng.choice(parts) for _ in range(rng.randrange(0, 10)))
        slash = "/" if rng.random() < 0.7 else ""
        url = f"{rng.choice(['http', 'https'])}://{host}{slash}{path}?{query}"
        got = urls._plain_query(url)
        if got is not None:
            taken += 1
            assert got == urls._by_w3lib(url), url
    assert taken > 500
