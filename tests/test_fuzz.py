"""Hostile input through the compiled kernels, against their references; re-entrant calls.

A seeded, bounded differential fuzzer (deterministic: the same documents on every run, about a
minute in all, several under tests/sanitize.sh): random bytes decoded as a crawler would,
markup soup, 1-, 2- and 4-byte str kinds, lone surrogates, NULs, huge text nodes, and deep
nesting of every tag kind. Each document goes through the compiled walk and the Python walk,
the compiled tokenizer and the numpy one, the fused sketch kernel and the numpy steps; and
`visible_text` must decide in bounded time (the nesting guard, `core/nesting.py`).

The re-entrancy tests make a garbage collection run while a kernel builds its result (a
finalizer that calls the same kernel, or hands the GIL to a thread that does): every call must
still return its own page's result.
"""

from __future__ import annotations

import gc
import os
import random
import sys
import threading
import time
from collections.abc import Callable, Iterator

import numpy as np
import pytest

from stream_dedup.config import Settings
from stream_dedup.core import extract, ldsig, tokens
from stream_dedup.core.decode import decode_html
from stream_dedup.core.sketch import Params, Sketcher, shingle_tops

try:
    from stream_dedup.core import _native
except ImportError:
    _native = None  # type: ignore[assignment]

pytestmark = pytest.mark.slow

needs_native = pytest.mark.skipif(
    _native is None or not extract.NATIVE_WALK, reason="the C extension is not built or bound"
)

SEED = 0x5EED_F022
# tests/sanitize.sh runs this file in a build several times slower (and lexbor's allocations
# through the sanitizer's malloc): fewer documents, shallower nesting, looser time bounds.
SANITIZED = bool(os.environ.get("STREAM_DEDUP_TEST_SANITIZERS"))
DOCUMENTS = 150 if SANITIZED else 400  # per kind of document generator

# Every tag the nesting guard has to survive: HTML, the ruby and select families, svg and
# MathML (with their integration points), templates, unknown and custom elements.
TAGS = (
    "a abbr address applet area article aside audio b base bdi bdo big blockquote body br "
    "button canvas caption center cite code col colgroup data datalist dd del details dfn "
    "dialog dir div dl dt em embed fieldset figcaption figure font footer form frame frameset h1 "
    "h2 h3 h4 h5 h6 head header hgroup hr html i iframe image img input ins kbd keygen label "
    "legend li link listing main map mark marquee math menu meta meter nav nobr noembed "
    "noframes noscript object ol optgroup option output p param picture plaintext pre progress "
    "q rb rp rt rtc ruby s samp script search section select selectedcontent slot small source "
    "span strike strong style sub summary sup svg table tbody td template textarea tfoot th "
    "thead time title tr track tt u ul var video wbr xmp foreignObject desc g path mi mo mn ms "
    "mtext annotation-xml mglyph malignmark x-y my-element-with-a-long-name isindex"
).split()
CONTEXTS = ("", "<svg>", "<math>", "<table>", "<select>", "<template>", "<ruby>",
            "<svg><foreignObject>", "<math><mi>", "<table><tr><td>")  # fmt: skip
_SOUP = ["x", " ", "\n", "&amp;", "&#0;", "\0", "<!--", "-->", "<!-->", "--!>", "<!x>",
         "</ x>", "<?p>", "/>", ">", '"', "'", "=", " a=", "<![CDATA[", "]]>", "</", "<",
         "\ud800", "\udfff", "\u00a0", "\u4e2d", "\U0001f600", "\u0301"]  # fmt: skip


def _piece(r: random.Random) -> str:
    k = r.random()
    if k < 0.45:
        ends = (">", ">", "/>", " a=b>", ' a="x>y">', " ", " class=c id=i>")
        return "<" + r.choice(TAGS) + r.choice(ends)
    if k < 0.75:
        return "</" + r.choice(TAGS) + r.choice([">", " >", "/>"])
    return r.choice(_SOUP)


def _soup(r: random.Random) -> str:
    return "".join(_piece(r) for _ in range(r.randint(1, 300)))


def _random_bytes(r: random.Random) -> str:
    raw = bytes(r.getrandbits(8) for _ in range(r.randint(0, 3000)))
    if r.random() < 0.5:  # markup-looking bytes
        raw = raw.replace(b"\x01", b"<").replace(b"\x02", b">").replace(b"\x03", b"</")
    return decode_html(raw, r.choice([None, "text/html; charset=utf-8", "text/html; charset=gbk"]))


def _wide(r: random.Random) -> str:
    """Markup in a 2- or 4-byte str, or with lone surrogates and NULs sprinkled in."""
    text = _soup(r)
    extra = r.choice(["\u0101", "\U0001f600", "\ud83d", "\0", "\udc00x"])
    k = r.randint(0, len(text))
    return text[:k] + extra + text[k:]


def _huge_text(r: random.Random) -> str:
    word = r.choice(["a", "word ", "\u00e9t\u00e9 ", "\u4e2d\u6587", "x" * 300, "\U0001f600 "])
    body = word * r.randint(10_000, 60_000)
    return r.choice(["<p>{}</p>", "{}", "<pre>{}", "<div><b>{}</b></div>"]).format(body)


GENERATORS: dict[str, Callable[[random.Random], str]] = {
    "soup": _soup, "bytes": _random_bytes, "wide": _wide,
}  # fmt: skip


def documents(kind: str, count: int) -> Iterator[str]:
    r = random.Random(f"{SEED}-{kind}")
    make = GENERATORS[kind]
    for _ in range(count):
        yield make(r)


def python_walk(html: str, **kwargs: bool) -> str:
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(extract, "NATIVE_WALK", False)
        return extract.visible_text(html, **kwargs)


def assert_kernels_match(html: str) -> None:
    for boilerplate in (False, True):
        native = extract.visible_text(html, boilerplate=boilerplate, collapse=False)
        assert native == python_walk(html, boilerplate=boilerplate, collapse=False), html[:300]
    for text in (native, html):  # the page's text, and the raw markup as text
        a, b = tokens.tokenize(text), tokens.tokenize_numpy(text)
        assert a.codepoints.tolist() == b.codepoints.tolist()
        assert a.hashes.tolist() == b.hashes.tolist()
    sk = _SKETCHER
    sketch, keys, sig, tops = sk.page(a.hashes, a.codepoints)
    shingles = sk.shingles_numpy(a.hashes)
    ref = sk.sketch_numpy(shingles)
    assert sketch.tolist() == ref.tolist()
    assert keys.tolist() == sk.keys(ref).tolist()
    assert sig == ldsig.signature_numpy(a.codepoints, _PARAMS.ld_c, _PARAMS.ld_n)
    assert tops == shingle_tops(shingles)


_PARAMS = Params()
_SETTINGS = Settings()
_SKETCHER = Sketcher(_PARAMS, (_SETTINGS.bands, _SETTINGS.band_size))


@needs_native
@pytest.mark.parametrize("kind", sorted(GENERATORS))
def test_kernels_match_references_on_hostile_documents(kind: str) -> None:
    for html in documents(kind, DOCUMENTS):
        assert_kernels_match(html)


@needs_native
def test_kernels_match_references_on_huge_text_nodes() -> None:
    r = random.Random(f"{SEED}-huge")
    for _ in range(6):
        assert_kernels_match(_huge_text(r))


# --- bounded work whatever the nesting ------------------------------------------------------
DEEP = 30_000 if SANITIZED else 100_000
SECONDS_PER_PAGE = 30.0 if SANITIZED else 3.0


def _decide_time(html: str) -> float:
    start = time.perf_counter()
    extract.visible_text(html)
    return time.perf_counter() - start


@pytest.mark.parametrize("tag", TAGS)
def test_deep_nesting_of_every_tag_decides_in_bounded_time(tag: str) -> None:
    """100,000 nested start tags of one kind (~0.5-1.5 MB), in body and, for every tenth tag
    kind, in each context that changes how lexbor nests (foreign content, tables, select,
    template, ruby)."""
    contexts = CONTEXTS if TAGS.index(tag) % 10 == 0 else ("",)
    units = (f"<{tag}>", f"<{tag} a=1>x", f"<{tag}></x-y>")
    for context in contexts:
        for unit in units[:1] if SANITIZED else units:
            html = context + unit * DEEP
            seconds = _decide_time(html)
            assert seconds < SECONDS_PER_PAGE, (context, unit, seconds)


@pytest.mark.parametrize(
    "html",
    [
        "<div></span>" * DEEP,  # end tags lexbor ignores
        '<div a="</div>">' * DEEP,  # markup inside attribute values
        "<div><!--</div>-->" * DEEP,  # ... and inside comments
        "<div><script></div></script>" * DEEP,  # ... and inside raw text
        "<p.x>" * DEEP,  # not a <p>: a name runs to space, / or >
        "<svg>" + "<option>" * DEEP,  # no implicit closing in foreign content
        "<svg>" + "<input>" * DEEP,  # no void elements either
        "<p><strike><ol></p>" * (DEEP // 4),  # <ol> closes the <p> in button scope
        "".join(f"<b a={i}>" for i in range(DEEP // 2)),  # Noah's ark does not apply
        "<table><hgroup><th>" * (DEEP // 4),
        # an annotation-xml without an HTML encoding is left by <hr>: no CDATA after it
        "<math x</span><annotation-xml><hr><![CDATA[<annotation-xml><article><figure><legend>"
        "\n<time/><mi></ x>" * (DEEP // 10),
        "<table><colgroup>x" + "<span>" * 50 + "</colgroup>" * (DEEP // 50),
    ],
    ids=lambda html: repr(html[:24]),
)
def test_nesting_tricks_decide_in_bounded_time(html: str) -> None:
    assert _decide_time(html) < SECONDS_PER_PAGE


# --- re-entrancy ----------------------------------------------------------------------------
class _Reenter:
    """Cyclic garbage whose finalizer runs `call` (during the next collection)."""

    def __init__(self, call: Callable[[], object]) -> None:
        self.cycle = self
        self.call = call

    def __del__(self) -> None:
        self.call()


def _collect_during(call: Callable[[], object], inner: Callable[[], object]) -> list[object]:
    """`call()` with a collection forced at each of its first allocations in turn, whose
    finalizer runs `inner()`; the results of all the calls."""
    results = []
    old = gc.get_threshold()
    try:
        for threshold in range(1, 8):
            for _ in range(6):
                gc.collect()
                gc.set_threshold(threshold)
                _Reenter(inner)
                results.append(call())
                gc.set_threshold(*old)
    finally:
        gc.set_threshold(*old)
    return results


def _kernel_calls() -> dict[str, tuple[Callable[[], object], Callable[[], object]]]:
    """Per kernel, a call on a small page and a call on a large different one."""
    fold, multi = tokens.fold_table()

    def tok(text: str) -> Callable[[], object]:
        return lambda: _native.tokenize(text, tokens.char_classes(), tokens._OFFSET_KEYS, fold,
                                        multi)  # fmt: skip

    small, large = tokens.tokenize("hello world " * 10), tokens.tokenize("zz yy " * 40_000)

    def page(t: tokens.Tokens) -> Callable[[], object]:
        return lambda: _SKETCHER.page(t.hashes, t.codepoints)

    def sig(t: tokens.Tokens) -> Callable[[], object]:
        return lambda: ldsig.signature(t.codepoints, 8, 4)

    def walk(html: str) -> Callable[[], object]:
        return lambda: extract.visible_text(html)

    return {
        "tokenize": (tok("hello world " * 10), tok("zz " * 50_000)),
        "sketch_page": (page(small), page(large)),
        "ld_signature": (sig(small), sig(large)),
        "visible_text": (walk("<p>hello <b>world</b></p>"), walk("<div>zz</div>" * 20_000)),
    }


def _same(a: object, b: object) -> bool:
    if isinstance(a, tuple) and isinstance(b, tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.tolist() == b.tolist()
    return a == b


@needs_native
@pytest.mark.parametrize("kernel", ["tokenize", "sketch_page", "ld_signature", "visible_text"])
def test_a_finalizer_calling_the_kernel_during_result_building(kernel: str) -> None:
    call, inner = _kernel_calls()[kernel]
    expected = call()
    results = _collect_during(call, inner)
    wrong = sum(not _same(r, expected) for r in results)
    assert wrong == 0, f"{wrong} of {len(results)} calls returned another page's result"


@needs_native
@pytest.mark.parametrize("kernel", ["tokenize", "sketch_page", "ld_signature", "visible_text"])
def test_another_thread_calling_the_kernel_during_result_building(kernel: str) -> None:
    """The finalizer sleeps, so the GIL goes to a thread that calls the kernel in a loop."""
    call, inner = _kernel_calls()[kernel]
    expected = call()
    stop = threading.Event()

    def other() -> None:
        while not stop.is_set():
            inner()

    thread = threading.Thread(target=other)
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    thread.start()
    try:
        results = _collect_during(call, lambda: time.sleep(0.002))
    finally:
        stop.set()
        thread.join()
        sys.setswitchinterval(interval)
    wrong = sum(not _same(r, expected) for r in results)
    assert wrong == 0, f"{wrong} of {len(results)} calls returned another page's result"
