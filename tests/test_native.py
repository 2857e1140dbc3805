"""The compiled kernels (stream_dedup/core/_native.c) against the numpy and Python reference code.

Every kernel must give exactly the values of the code it replaces: the same canonical code
points and token hashes as `tokenize_numpy`, the same shingles and min-hashes as
`Sketcher.shingles_numpy`/`sketch_numpy`, the same LD signatures as `signature_numpy`, the
same (sketch, features, signature) from the one-call `Sketcher.page` as from those steps, the
same visible text as the Python walk of `extract` (`extract.NATIVE_WALK = False`), and the
same verdict on pathological nesting as the Python nesting model (`core/nesting.py`).
Nothing here hard-codes an output: each test computes both sides.

All markup here is written for these tests; the corpus test reads ../shared/corpora in place.
"""

from __future__ import annotations

import os
import string
from dataclasses import replace
from functools import cache
from pathlib import Path

import numpy as np
import pytest
import selectolax.lexbor
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from selectolax.lexbor import LexborHTMLParser

from stream_dedup.core import extract, ldsig, tokens
from stream_dedup.core.decode import decode_html
from stream_dedup.core.sketch import FAMILIES, Params, Sketcher, shingle_tops
from stream_dedup.models import Page
from stream_dedup.sources.files import iter_inputs

try:
    from stream_dedup.core import _native
except ImportError:  # no C compiler at install time: the tests below say so or skip
    _native = None  # type: ignore[assignment]
BUILT = _native is not None and extract.NATIVE_WALK
# The comparisons below would compare the reference with itself without the kernel; they are
# skipped then, and test_kernel_is_built_and_bound fails with the reason.
needs_native = pytest.mark.skipif(not BUILT, reason="the C extension is not built or not bound")

CORPORA = Path(__file__).resolve().parents[2] / "shared" / "corpora"
WARCS = CORPORA / "warc"


def test_kernel_is_built_and_bound() -> None:
    assert _native is not None, (
        "the C extension stream_dedup/core/_native.c was not built (it needs a C compiler at "
        "install time: setup.py marks it optional, so pip skips it silently)"
    )
    assert extract.NATIVE_WALK is True, (
        "the C extension was not built or could not bind to selectolax's lexbor "
        "(extract.NATIVE_WALK is False: visible_text runs the Python walk)"
    )


# --- tokens -------------------------------------------------------------------------------------


def assert_same_tokens(text: str) -> None:
    native = tokens.tokenize(text)
    ref = tokens.tokenize_numpy(text)
    assert native.codepoints.dtype == ref.codepoints.dtype == np.uint32
    assert native.hashes.dtype == ref.hashes.dtype == np.uint64
    assert native.codepoints.tolist() == ref.codepoints.tolist(), (native.text, ref.text)
    assert native.hashes.tolist() == ref.hashes.tolist()


_TOKEN_PIECES = [
    *string.ascii_letters,
    *string.digits,
    *string.punctuation,
    *" \t\n\r\x0b\x0c",
    # Latin-1, with the no-break space, diaeresis and acute accent (NFKC: space + mark)
    *"àéîõüçñßÿÀÉÖ\u00a0\u00a8\u00b4\u00aa\u00b2\u00b5\u00bf",
    # combining marks (reordering, composition; U+0344 decomposes to two marks)
    *"\u0301\u0308\u0344\u0345\u0327\u0323\u094d",
    # Greek: capital sigma (final sigma depends on what follows), small sigmas, others
    *"\u03a3\u03c3\u03c2\u0391\u03b1\u0392\u03b2\u03a9\u03c9\u0390\u1fbe",
    # compatibility characters: ellipsis, fi ligature, fullwidth A, one half, circled 1,
    # Kelvin and Ohm signs, Arabic ligature (18 characters in NFKC), Thai sara am
    *"\u2026\ufb01\uff21\u00bd\u2460\u212a\u2126\ufdfa\u0e33",
    # Han, Hiragana (with a decomposable one), Katakana, half-width Katakana and sound mark,
    # and squared words whose NFKC is several Han characters
    *"\u4e2d\u6587\u3042\u304c\u3099\u30a2\uff8a\uff9e\u337f\u32ff",
    # Thai, Hangul syllables, conjoining jamo (L, V, T), compatibility jamo
    *"\u0e20\u0e32\u0e29\u0e32\ud55c\uae00\uac00\u1100\u1161\u11a8\u3131\u314f",
    # Turkish dotted capital I and dotless i, Cyrillic, Arabic, Devanagari
    *"\u0130\u0131\u0401\u0451\u0645\u0631\u0915\u0937",
    # math alphanumerics (bold A; bold capital sigma folds to a sigma)
    *"\U0001d400\U0001d6ba",
    # emoji, a skin-tone modifier, zero-width joiner, variation selector
    *"\U0001f600\U0001f44d\U0001f3fd\u200d\ufe0f",
    # lone surrogates
    *"\ud800\udc00",
    # unassigned and private use
    *"\u0378\ue000",
    # multi-character pieces that interact with their neighbours
    "\u03a3\u0391\u03a3",
    "e\u0301",
    "a\u0344",
    "\u1100\u1161\u11a8",
    "\uac00\u11a8",
    "\u0130stanbul",
    "x" * 300,  # longer than the 256 per-offset constants
]
token_texts = st.lists(st.sampled_from(_TOKEN_PIECES), max_size=120).map("".join)


@needs_native
@settings(max_examples=600, deadline=None)
@given(token_texts)
@example("")
@example("     ")
@example("\u03a3\u0391\u03a3 \u03a3\u0391\u03a3.")
@example("e\u0301")
@example("a\u0344")
@example("\u1100\u1161\u11a8")
@example("one\u2026two \u2026 three\u2026")
@example("ends with a separator. ")
@example("ends with a separator!")
@example("\u4e2d\u6587 ")
@example("\u4e2d\ufb01\u4e2d\u00bd \u3042\u2460x\u337fy \u337f\u337f.")
@example("caf\u00e9 \u00bd\u00a0\u00aa\u00b2 ÿ")  # one byte per character
@example("a" * 257 + " " + "b" * 1000 + "\u0301")
@example("\ud800")
def test_tokenize_matches_numpy_on_mixed_scripts(text: str) -> None:
    assert_same_tokens(text)


@needs_native
@settings(max_examples=400, deadline=None)
@given(st.text())
def test_tokenize_matches_numpy_on_any_text(text: str) -> None:
    assert_same_tokens(text)


# Mostly-ASCII text long enough for the kernel's block path (64 code points at a time): words
# of every length across block edges (1..20, and past the 256 per-offset constants), separator
# runs (with the no-break space, which the block path takes too), and now and then a non-ASCII
# piece that sends its block through the scalar loop.
_ASCII_WORDS = st.one_of(
    st.text(string.ascii_letters + string.digits, min_size=1, max_size=20),
    st.integers(250, 270).map(lambda n: "Ab9" * (n // 3)),
)
_ASCII_SEPS = st.text(string.punctuation + " \t\n\u00a0", min_size=1, max_size=9)
_RARE = st.sampled_from(_TOKEN_PIECES[62:])
ascii_heavy = st.lists(
    st.one_of(_ASCII_WORDS, _ASCII_WORDS, _ASCII_SEPS, _ASCII_SEPS, _RARE), min_size=20,
    max_size=200,
).map("".join)


@needs_native
@settings(max_examples=300, deadline=None)
@given(ascii_heavy, st.sampled_from(["", "\u0101", "\U0001f600"]))
@example("hello world " * 20, "")
@example("x" * 64 + " " + "y" * 63 + ".. " * 30, "")
@example(" " * 64 + "w" * 64 + " " * 64 + "z" * 100, "\u0101")
def test_tokenize_block_path_matches_numpy(text: str, wide: str) -> None:
    """`wide` at the end makes the string 1-, 2- or 4-byte per code point. Both builds of
    the block path (AVX-512 where the CPU has it, and the portable one) are checked."""
    for path in _BLOCK_PATHS:
        _native.block_path(path)
        try:
            assert_same_tokens(text + wide)
            assert_same_tokens(wide + text)
        finally:
            _native.block_path(_DEFAULT_PATH)


def _block_paths() -> tuple[str, ...]:
    if _native is None:
        return ()
    default = _native.block_path()
    try:
        _native.block_path("avx512")
        return ("generic", "avx512")
    except ValueError:
        return ("generic",)
    finally:
        _native.block_path(default)


_DEFAULT_PATH = _native.block_path() if _native is not None else ""
_BLOCK_PATHS = _block_paths()


@needs_native
@pytest.mark.skipif(
    bool(os.environ.get("STREAM_DEDUP_TEST_BLOCK_PATH")), reason="a block path is forced"
)
def test_block_path_is_the_fastest_the_cpu_has() -> None:
    assert _DEFAULT_PATH == _BLOCK_PATHS[-1]
    with pytest.raises(ValueError, match="no block path"):
        _native.block_path("sse9")


# --- shingles and sketches ----------------------------------------------------------------------

u64_arrays = arrays(np.uint64, st.integers(0, 200))
params_st = st.builds(
    lambda family, w, ks, seed: Params(
        family=family, shingle_words=w, groups=ks[0], group_size=ks[1], seed=seed
    ),
    st.sampled_from(FAMILIES),
    st.sampled_from([1, 3, 8]),
    st.sampled_from([(6, 14), (3, 5), (1, 1), (2, 16), (8, 8), (5, 13)]),
    st.sampled_from([Params().seed, 0, 987_654_321]),
)


@cache
def sketcher(params: Params) -> Sketcher:
    return Sketcher(params)


@needs_native
@settings(max_examples=300, deadline=None)
@given(hashes=u64_arrays, params=params_st, strided=st.booleans())
@example(hashes=np.zeros(0, dtype=np.uint64), params=Params(), strided=False)
@example(hashes=np.arange(7, dtype=np.uint64), params=Params(), strided=False)
@example(hashes=np.arange(1, dtype=np.uint64), params=Params(shingle_words=1), strided=False)
@example(
    hashes=np.full(3, 2**64 - 1, dtype=np.uint64),
    params=Params(groups=3, group_size=5, shingle_words=3, family="mix64"),
    strided=False,
)
def test_shingles_and_sketch_match_numpy(hashes: np.ndarray, params: Params, strided: bool) -> None:
    if strided:  # a non-contiguous view, as a slice of a larger array would be
        hashes = np.repeat(hashes, 2)[::2]
    sk = sketcher(params)
    native = sk.shingles(hashes)
    ref = sk.shingles_numpy(hashes)
    assert native.dtype == ref.dtype == np.uint64
    assert native.tolist() == ref.tolist()
    assert native.shape[0] == max(0, hashes.shape[0] - params.shingle_words + 1)
    native_sketch = sk.sketch(native)
    ref_sketch = sk.sketch_numpy(ref)
    assert native_sketch.dtype == ref_sketch.dtype == np.uint32
    assert native_sketch.shape == (params.num_perm,)
    assert native_sketch.tolist() == ref_sketch.tolist()


@needs_native
@settings(max_examples=200, deadline=None)
@given(shingles=arrays(np.uint64, st.integers(0, 500)), params=params_st)
def test_sketch_of_any_shingle_set_matches_numpy(shingles: np.ndarray, params: Params) -> None:
    sk = sketcher(params)
    assert sk.sketch(shingles).tolist() == sk.sketch_numpy(shingles).tolist()


@needs_native
@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize(("groups", "group_size"), [(6, 14), (3, 5), (1, 1)])
def test_empty_shingle_set_sketches_to_all_ones(family: str, groups: int, group_size: int) -> None:
    sk = Sketcher(Params(family=family, groups=groups, group_size=group_size))
    empty = np.zeros(0, dtype=np.uint64)
    assert sk.shingles(empty).shape == (0,)
    native = sk.sketch(empty)
    assert native.dtype == np.uint32
    assert (
        native.tolist() == sk.sketch_numpy(empty).tolist() == [0xFFFFFFFF] * (groups * group_size)
    )


@needs_native
@pytest.mark.parametrize("family", FAMILIES)
def test_many_shingles_match_numpy(family: str) -> None:
    # More shingles than sketch_numpy's block of 4096, and more permutations than one C pass.
    sk = Sketcher(Params(family=family, groups=12, group_size=14))
    hashes = np.random.default_rng(5).integers(0, 2**64, size=20_000, dtype=np.uint64)
    shingles = sk.shingles(hashes)
    assert shingles.tolist() == sk.shingles_numpy(hashes).tolist()
    assert sk.sketch(shingles).tolist() == sk.sketch_numpy(shingles).tolist()


@needs_native
@settings(max_examples=150, deadline=None)
@given(
    hashes=u64_arrays, params=params_st, cps=arrays(np.uint32, st.integers(0, 400)),
    cn=st.sampled_from([(32, 4), (7, 3), (2, 1)]),
    bands=st.tuples(st.integers(0, 8), st.integers(1, 6)),
    sets=st.booleans(),
)
@example(hashes=np.zeros(0, dtype=np.uint64), params=Params(), cps=np.zeros(0, np.uint32),
         cn=(32, 4), bands=(5, 4), sets=True)
def test_sketch_page_is_the_steps_in_numpy(
    hashes: np.ndarray, params: Params, cps: np.ndarray, cn: tuple[int, int],
    bands: tuple[int, int], sets: bool,
) -> None:
    """The fused kernel gives what the numpy definitions of its steps give, one by one."""
    params = replace(params, ld_c=cn[0], ld_n=cn[1])
    b, r = bands
    sk = Sketcher(params, (min(b, params.num_perm // r), r), sets)
    sketch, keys, sig, tops = sk.page(hashes, cps)
    shingles = sk.shingles_numpy(hashes)
    ref_sketch = sk.sketch_numpy(shingles)
    assert sketch.dtype == np.uint32 and keys.dtype == np.uint64
    assert sketch.tolist() == ref_sketch.tolist()
    assert keys.tolist() == sk.keys(ref_sketch).tolist()
    assert keys[: params.groups].tolist() == sk.features(ref_sketch).tolist()
    assert keys.shape == (params.groups + sk.bands[0],)
    assert sig == ldsig.signature_numpy(cps, *cn)
    assert tops == (shingle_tops(shingles) if sets else b"")


# --- LD signatures ------------------------------------------------------------------------------


@st.composite
def codepoint_arrays(draw: st.DrawFn) -> np.ndarray:
    length = draw(st.integers(0, 3000))
    how = draw(st.sampled_from(["hypothesis", "unicode", "uint32", "small"]))
    if how == "hypothesis":  # shrinkable, mostly one repeated value
        return draw(arrays(np.uint32, length))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    high = {"unicode": 0x110000, "uint32": 2**32, "small": 4}[how]
    return rng.integers(0, high, size=length, dtype=np.uint32)


@needs_native
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    cps=codepoint_arrays(),
    cn=st.sampled_from([(32, 4), (1, 1), (7, 3), (64, 8), (100, 4)]),
    seed=st.sampled_from([0, 0x5EED, 2**63 + 12345]),
)
@example(cps=np.zeros(0, dtype=np.uint32), cn=(32, 4), seed=0)
@example(cps=np.arange(3, dtype=np.uint32), cn=(64, 8), seed=7)
@example(cps=np.full(2500, 2**32 - 1, dtype=np.uint32), cn=(1, 1), seed=0x5EED)
def test_ld_signature_matches_numpy(cps: np.ndarray, cn: tuple[int, int], seed: int) -> None:
    c, n = cn
    native = ldsig.signature(cps, c, n, seed)
    ref = ldsig.signature_numpy(cps, c, n, seed)
    assert isinstance(native, bytes) and isinstance(ref, bytes)
    assert native == ref


# --- visible text -------------------------------------------------------------------------------


_MARKER = b"stream-dedup calibration text 0123456789"


@needs_native
def test_calibration_refuses_without_reading_past_the_node() -> None:
    """Text nodes that do not hold the marker, many of them (some sit at the end of one of
    lexbor's memory chunks): the calibration reads each node's own allocation only, and
    refuses (tests/sanitize.sh checks that not a byte past it is read)."""
    doc = LexborHTMLParser("".join(f"<p>text {i}</p>" for i in range(3000)))
    try:
        for p in doc.css("p"):
            with pytest.raises(ImportError, match="characters"):
                _native.bind_lexbor(selectolax.lexbor.__file__, p.first_child, _MARKER,
                                    b"recalibrated")  # fmt: skip
        with pytest.raises(RuntimeError, match="bind_lexbor"):
            _native.visible_text(doc, extract._INVISIBLE_BITS, extract._BREAKING_BITS)
    finally:
        assert extract._bind_native()


@needs_native
def test_walk_takes_objects_not_addresses() -> None:
    doc = LexborHTMLParser("<p>text</p>")
    bits = extract._INVISIBLE_BITS, extract._BREAKING_BITS
    assert _native.visible_text(doc, *bits).split() == ["text"]
    for wrong in (doc.body.mem_id, doc.body, None, "<p>text</p>"):
        with pytest.raises(TypeError):
            _native.visible_text(wrong, *bits)
    with pytest.raises(TypeError):
        _native.bind_lexbor(selectolax.lexbor.__file__, doc.body.first_child.mem_id, _MARKER,
                            b"recalibrated")  # fmt: skip
    assert extract._bind_native()


def python_walk(html: str, **kwargs: bool) -> str:
    """visible_text through selectolax's Python API instead of the kernel."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(extract, "NATIVE_WALK", False)
        return extract.visible_text(html, **kwargs)


def assert_same_text(html: str) -> None:
    for boilerplate in (False, True):
        for collapse in (True, False):
            native = extract.visible_text(html, boilerplate=boilerplate, collapse=collapse)
            python = python_walk(html, boilerplate=boilerplate, collapse=collapse)
            assert native == python, (boilerplate, collapse)


_SITE = (
    "<html><head><title>Site</title><style>p{}</style></head><body>"
    "<header><a href=/>Logo</a><h2>Example</h2></header>"
    "<nav><ul><li><a href=/a>About</a><li><a href=/b>Blog</a></ul></nav>"
    "<main><article><h1>Head</h1><p>Some <b>bold</b> prose and a <a href=/x>link</a>.</p>"
    "<p>More prose, long enough to be the main content of the page.</p>"
    "<footer>Filed under x</footer></article></main>"
    "<aside>Side</aside><form><input name=q><button>Go</button></form>"
    "<div hidden>hidden</div><div style='display:none'>none</div>"
    "<footer><a href=/p>Privacy</a> <a href=/t>Terms</a></footer></body></html>"
)

SNIPPETS = [
    "wo<b>rd</b>",
    "a<span>b<i>c</i></span>d<em>e</em>",
    "<p>a</p><p>b</p>",
    "<div>one</div><div>two</div>after",
    "before<div>inside</div>",
    "line<br>break<br/>again<br>",
    "icon<img src=x.png alt=alt>label<img>",
    "<table><tr><td>a</td><td>b</td></tr><tr><th>c</th></tr></table>",
    "<table><caption>cap</caption><tr><td>a<td>b<tr><td>c</table>after",
    "<table>foster<tr><td>cell</td></tr>more</table>",
    "<script>var s = '<p>x</p>';</script>text",
    "a<style>p{color:red}</style>b<noscript><p>ns</p></noscript>c",
    "a<template><p>t</p></template>b",
    "a<svg><text>s</text><title>t</title></svg>b",
    "a<svg><foreignObject><p>fo</p></foreignObject></svg>b",
    "a<math><mi>x</mi><annotation>\\frac{1}{2}</annotation></math>b",
    "<div>a<script>x</script>b</div><p>c<style>y</style>d</p>",
    "<td><div><script>s</script></div></td><li><noscript>n</noscript>x</li>",
    "<p>x<svg><p>breaks out of svg</p></svg>y</p>",
    "<div><p>a<svg><g><text>deep</text></g></svg></p></div>",
    "<span>" * 3000 + "deep" + "</span>" * 3000 + "tail",
    "<div>" * 500 + "deep" + "</div>" * 500 + "<p>tail</p>",
    "<div>" * 500 + "x<script>y</script><b>z</b>" + "</div>" * 500,
    "<div>x</div>" * 2000,
    "com<!-- hidden -->ment<!-- <p>not text</p> -->",
    "<!-- only a comment -->",
    "<my-el>x</my-el>y",
    "<my-el><p>a</p></my-el><x-foo>b</x-foo>c<foo>d</foo>",
    "<frameset><frame src=a><noframes><p>No <b>fr</b>ames</p><p>here</p></noframes></frameset>",
    "<frameset cols=50%,50%><frame><frame></frameset><noframes>alt <i>text</i></noframes>",
    "<frameset><frame src=a></frameset>",
    "<body><noframes>alternative</noframes>main</body>",
    "<html><body></body></html>",
    "<html><head><title>only head</title></head></html>",
    "<body>   \n\t </body>",
    " \n ",
    "",
    "<p>  many \n\t spaces&nbsp;&nbsp;and\u3000ideographic  </p>\n\n<p>\r\nnext</p>",
    "Привет, <b>мир</b>! 東京<ruby>漢<rp>(</rp><rt>kan</rt><rp>)</rp>字</ruby> مرحبا שלום",
    "<p>\u03a3\u0391\u03a3 e\u0301 \u1100\u1161\u11a8 \U0001f600 \ufb01ne</p>",
    "fish &amp; chips &lt;3 &eacute;t&#233; &nbsp;x&nbsp;y &#x1F600; &bogus; &#0; &#xD800;",
    "<pre>  keep\n  spaces  </pre><textarea>ta <b>raw</b></textarea><xmp><b>raw</b></xmp>",
    "<ul><li>one<li>two</ul><dl><dt>t<dd>d</dl><ol><li>x</ol>",
    "<select><option>a<option>b<optgroup label=g><option>c</select><button>go</button>",
    "<input value=v><label>l</label><fieldset><legend>lg</legend>f</fieldset>",
    "<h1>T</h1>x<hr>y<h6>z</h6>",
    "<details><summary>s</summary>d</details><dialog>dl</dialog>",
    "<center>c</center><address>addr</address><blockquote>q</blockquote>",
    "<p>a<br></p><p>\n</p><div><div></div></div>",
    "<img><img><br><hr>",
    "<plaintext><p>the rest is text</p>",
    "a\x00b",
    "a\udc80b",
    "<iframe>i</iframe><object>o</object><embed><video>v</video><audio>a</audio>x",
    "<canvas>c</canvas><datalist><option>d</datalist><noembed>ne</noembed><applet>ap</applet>y",
    "<p>unclosed <b>bold <i>both</p> after",
    "</div></p></body>stray ends<div>",
    "<title>x</title>body only",
    "<body>a<title>stray title</title>b</body>",
    "<head><noscript><p>enable js</p></noscript></head><body><p>content</p></body>",
    "<<<>>> < p >text",
    "super<wbr>califragilistic H<sub>2</sub>O",
    "</p>",
    "<p>x</p>",
    "text after html</html><p>late</p>",
    _SITE,
    "<p>x" * 50_001,  # enough tags for the nesting scan, shallow enough to be parsed
    "<div>x" * 2_100 + "<br>" * 48_000,  # too deep: both take the regex extraction
]


@needs_native
@pytest.mark.parametrize("html", SNIPPETS)
def test_native_walk_matches_python_walk(html: str) -> None:
    assert_same_text(html)


_BLOCK = ["div", "p", "li", "td", "th", "table", "tr", "h2", "pre", "ul", "dl", "dd", "option"]
_INLINE = ["b", "i", "span", "em", "a href=x", "sub", "font", "label", "ruby"]
_INVISIBLE = ["script", "style", "noscript", "template", "svg", "math", "title", "iframe",
              "noframes", "rt", "object", "textarea"]  # fmt: skip
_CUSTOM = ["my-el", "x-foo", "foo", "blink"]
_FURNITURE = ["nav", "header", "footer", "aside", "form", "main", "article", "section",
              "select", "button", "div hidden", "div style='display:none'",
              "div role=navigation", "span aria-hidden=true"]  # fmt: skip
_VOID = ["<br>", "<img>", "<hr>", "<input>", "<wbr>"]
_STRAY = ["</p>", "</div>", "</td>", "<!--", "-->", "<!-- c -->", "&amp;", "&", "<", ">", "\x00"]
_WORDS = ["word", "wo", "rd", " ", "\n", "\t", "\u00a0", "Σ", "中文", "é", "e\u0301", "&nbsp;",
          "&lt;p&gt;", "tail "]  # fmt: skip

_leaves = st.one_of(
    st.lists(st.sampled_from(_WORDS), min_size=1, max_size=4).map("".join),
    st.text(max_size=6),
    st.sampled_from(_VOID + _STRAY),
)


def _element(parts: tuple[str, list[str], bool]) -> str:
    tag, children, close = parts
    end = f"</{tag.split()[0]}>" if close else ""
    return f"<{tag}>{''.join(children)}{end}"


def _extend(children: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    tags = st.sampled_from(_BLOCK + _INLINE + _INVISIBLE + _CUSTOM + _FURNITURE)
    return st.tuples(tags, st.lists(children, max_size=4), st.booleans()).map(_element)


_html_trees = st.recursive(_leaves, _extend, max_leaves=25)
html_documents = st.tuples(
    st.sampled_from(
        [
            "{}",
            "<html><head><title>t</title></head><body>{}</body></html>",
            "<frameset><noframes>{}</noframes></frameset>",
            "<body><main>{}</main></body>",
        ]
    ),
    st.lists(_html_trees, min_size=1, max_size=4).map("".join),
).map(lambda parts: parts[0].format(parts[1]))


@needs_native
@settings(max_examples=500, deadline=None)
@given(html_documents)
def test_native_walk_matches_python_walk_on_random_markup(html: str) -> None:
    assert_same_text(html)


# --- nesting depth ------------------------------------------------------------------------------


def assert_same_depth_verdict(html: str, limit: int | None = None, gate: int | None = None) -> None:
    """extract._too_deep by the kernel and by the Python model (`extract._native = None`)."""
    with pytest.MonkeyPatch.context() as mp:
        if limit is not None:
            mp.setattr(extract, "_MAX_DEPTH", limit)
        if gate is not None:
            mp.setattr(extract, "_TAG_COUNT_CHECK", gate)
        native = extract._too_deep(html)
        mp.setattr(extract, "_native", None)
        python = extract._too_deep(html)
    assert native is python


_DEPTH_PIECES = [
    "<div>", "</div>", "<DIV", "</Div >", "<span class=x>", "</span>", "<p>", "</P>", "<li>",
    "<Li>", "<td>", "<TBODY>", "<optgroup>", "<optgroups>", "<colgroup>", "<caption>",
    "<captions>", "<br/>", "<p-x>", "<my-el>", "</my-el>", "<a1>", "<1>", "</1", "<", "</",
    "<<div>", "</ div>", "<-x>", "x", " ", "\u4e2d", "\U0001f600", "<\u212a>", "<li\u0130>",
    "<\u00e9>", "<!-- <div> -->",
]  # fmt: skip


@needs_native
@settings(max_examples=500, deadline=None)
@given(
    html=st.lists(st.sampled_from(_DEPTH_PIECES), max_size=40).map("".join),
    limit=st.integers(0, 6),
    gate=st.integers(0, 12),
)
@example(html="<div><", limit=0, gate=2)
@example(html="\u4e2d<div><", limit=0, gate=2)
def test_nesting_scan_matches_python(html: str, limit: int, gate: int) -> None:
    # `gate`: the number of '<' (and of characters) below which the scan is not made
    assert_same_depth_verdict(html, limit=limit, gate=gate)


@needs_native
@pytest.mark.parametrize(
    "html",
    [
        "<div>" * 49_999 + "x" * 10,
        "<div>" * 50_000,
        "<div>" * 49_999 + "<",  # the last '<' is the 50000th
        "<div>" * 2_000 + "<br>" * 50_000,
        "<div>" * 2_001 + "<br>" * 50_000,
        "<DIV class=a>" * 2_001 + "</div>" * 2 + "<td>" * 50_000,
        "<section>" * 3_000 + "</section>" * 1_500 + "<span>" * 499 + "<optgroup>" * 50_000,
        "<section>" * 3_000 + "</section>" * 1_500 + "<span>" * 501 + "<optgroup>" * 50_000,
        "\u4e2d<x-el>" * 2_001 + "<" * 50_000,
        "\U0001f600<x-el>" * 1_000 + "<</>" * 50_000,
    ],
)
def test_nesting_scan_matches_python_on_large_pages(html: str) -> None:
    assert_same_depth_verdict(html)


# --- real pages ---------------------------------------------------------------------------------


@pytest.mark.slow
@needs_native
@pytest.mark.corpus
@pytest.mark.skipif(not CORPORA.is_dir(), reason="../shared/corpora is not here")
def test_every_warc_page_matches_reference() -> None:
    files = sorted(p for p in WARCS.rglob("*") if ".arc" in p.name or ".warc" in p.name)
    pages = [item for item in iter_inputs(files) if isinstance(item, Page)]
    assert len(pages) > 800
    text_mismatch: list[str | None] = []
    token_mismatch: list[str | None] = []
    for page in pages:
        html = decode_html(page.body, page.header("content-type"))
        for boilerplate in (False, True):
            native = extract.visible_text(html, boilerplate=boilerplate, collapse=False)
            if native != python_walk(html, boilerplate=boilerplate, collapse=False):
                text_mismatch.append(page.source)
            a, b = tokens.tokenize(native), tokens.tokenize_numpy(native)
            if a.codepoints.tolist() != b.codepoints.tolist() or (
                a.hashes.tolist() != b.hashes.tolist()
            ):
                token_mismatch.append(page.source)
    assert not text_mismatch, text_mismatch[:10]
    assert not token_mismatch, token_mismatch[:10]


@needs_native
@settings(max_examples=300, deadline=None)
@given(x=st.lists(st.integers(0, 2**32 - 1), max_size=300),
       y=st.lists(st.integers(0, 2**32 - 1), max_size=300),
       common=st.lists(st.integers(0, 2**32 - 1), max_size=300),
       crowd=st.booleans(), shift=st.integers(0, 3), offset=st.integers(0, 3))
def test_set_overlap_counts_the_sets_and_their_intersection(
        x: list[int], y: list[int], common: list[int], crowd: bool, shift: int,
        offset: int) -> None:
    """Two pages' values in any order with repeats, through buffers at any byte offset,
    counting only the values = 0 mod 2**shift; `crowd`: values that share their top bits
    (one slot of the table: past the probe budget, where both are sorted instead)."""
    if crowd:  # ~2,000 values in one slot's run: ~2M probes, far past 16 a value
        x, y = ([v & 0xFFFF for v in vs] for vs in (x, y))
        common = [v & 0xFFFF for v in common] + list(range(0, 2000 << 3, 8))
    a, b = x + common + x[: len(x) // 2], common[::-1] + y + y[:3]
    bufs = [memoryview(bytes(offset) + np.array(v, "<u4").tobytes())[offset:] for v in (a, b)]
    mask = (1 << shift) - 1
    got = _native.set_overlap(*bufs, mask)
    sa, sb = ({v for v in vs if v & mask == 0} for vs in (a, b))
    assert got == (len(sa), len(sb), len(sa & sb))


@needs_native
def test_set_overlap_refuses_sizes_it_cannot_hold() -> None:
    """The table's size is checked before it is computed: past 2**28 values a page, a
    ValueError (the mapping is never touched, so it costs no memory)."""
    import mmap

    huge = mmap.mmap(-1, 4 * ((1 << 28) + 1))
    with pytest.raises(ValueError, match="2\\*\\*28"):
        _native.set_overlap(huge, b"", 0)
    with pytest.raises(ValueError, match="2\\*\\*28"):
        _native.set_overlap(b"\x01\x00\x00\x00", huge, 0)
    huge.close()
