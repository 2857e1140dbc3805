"""The nesting model (core/nesting.py, _native.nesting_depth) against lexbor and against itself.

* The compiled model gives exactly the Python model's depth, on any markup and string kind.
* The model never nests shallower than lexbor does: compared on seeded hostile documents with
  the depth of the tree lexbor builds. That tree is a proxy for lexbor's stack of open elements
  (an element popped at once, like ``<br>``, is in the tree for a moment, so one level of
  slack is allowed; ``</form>`` takes the form off the stack but leaves its children under it
  in the tree, so documents with one are left out).
* The model's list of tags that leave svg/math is the installed lexbor's.
* No page of the WARC corpus is deep enough to be extracted by regexes.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from selectolax.lexbor import LexborDocumentOptions, LexborHTMLParser

from stream_dedup.core import extract, nesting, nesting_tree
from stream_dedup.core.decode import decode_html
from stream_dedup.models import Page
from stream_dedup.sources.files import iter_inputs

try:
    from stream_dedup.core import _native
except ImportError:
    _native = None  # type: ignore[assignment]

from test_fuzz import TAGS, _piece

CORPORA = Path(__file__).resolve().parents[2] / "shared" / "corpora"


def _documents(seed: str, count: int) -> list[str]:
    r = random.Random(seed)
    return ["".join(_piece(r) for _ in range(r.randint(1, 400))) for _ in range(count)]


@pytest.mark.skipif(_native is None, reason="the C extension is not built")
@pytest.mark.parametrize("wide", ["", "\u0101", "\U0001f600", "\0"])
def test_compiled_model_is_the_python_model(wide: str) -> None:
    for k, html in enumerate(_documents(f"c-vs-python-{wide!r}", 300)):
        html = html.replace("x", wide) if k % 2 else html + wide
        for limit in (0, 3, 10, 100_000):
            assert _native.nesting_depth(html, limit) == nesting.nesting_depth(html, limit), html


@pytest.mark.skipif(_native is None, reason="the C extension is not built")
def test_compiled_model_validates_its_limit() -> None:
    with pytest.raises(ValueError, match="limit"):
        _native.nesting_depth("<div>", -1)
    with pytest.raises(ValueError, match="limit"):
        _native.too_deep("<div>", 0, 2**40)


def _model_depth(html: str) -> int:
    """The model on what selectolax parses (it drops lone surrogates, as extract does)."""
    return nesting.nesting_depth(html.encode(errors="ignore").decode(), 10**6)


def _tree_depth(html: str) -> int:
    """Depth of the deepest element lexbor's tree holds under <body> (a childless element one
    less: it may have been on the stack only for a moment)."""
    tree = LexborHTMLParser(html, options=LexborDocumentOptions.WO_EVENTS, scripting=True)
    deepest = 0
    todo = [(tree.root, 1)] if tree.root is not None else []
    while todo:
        node, depth = todo.pop()
        deepest = max(deepest, depth)
        child = node.child
        while child is not None:
            if child.tag and not child.tag.startswith("-"):
                todo.append((child, depth + 1 if child.child is not None else depth))
            child = child.next
    return deepest - 2  # <html>, <body>


def test_model_never_nests_shallower_than_lexbor() -> None:
    for html in _documents("model-vs-lexbor", 3000):
        if "</form" not in html:  # its children stay in the tree, not on the stack
            assert _model_depth(html) >= _tree_depth(html) - 1, html


@pytest.mark.parametrize("tag", TAGS)
def test_model_of_one_tag_repeated_is_not_shallower_than_lexbor(tag: str) -> None:
    for context in ("", "<svg>", "<math>", "<table>", "<select>", "<ruby>", "<template>"):
        html = context + f"<{tag}>x" * 300
        assert _model_depth(html) >= _tree_depth(html) - 1, html


def test_breakout_tags_are_lexbors() -> None:
    """Which start tags end svg content in the installed lexbor (the model pops for them)."""
    candidates = set(TAGS) - {"svg", "math"}
    leaves = set()
    for tag in sorted(candidates):
        tree = LexborHTMLParser(f"<svg><g><{tag}>x</{tag}><i-probe></i-probe>")
        probe = tree.css_first("i-probe")
        node = probe.parent if probe is not None else None
        while node is not None and node.tag != "svg":
            node = node.parent
        if node is None:
            leaves.add(tag.lower())
    assert leaves == set(nesting._BREAKOUT)


def _probe_parents(html: str) -> list[str]:
    tree = LexborHTMLParser(html, options=LexborDocumentOptions.WO_EVENTS, scripting=True)
    node = tree.css_first("i-probe")
    parents = []
    node = node.parent if node is not None else None
    while node is not None:
        parents.append(node.tag)
        node = node.parent
    return parents


# Tags whose own rules decide what these probes see (raw text, tables, forms, lists...).
_NOT_PROBED = frozenset(
    "html head body frameset frame plaintext template table svg math textarea title style "
    "script xmp iframe noembed noframes noscript image isindex td th tr tbody thead tfoot "
    "caption col colgroup option optgroup li dd dt p div button form select a nobr".split()
) | nesting._VOID


def test_special_and_scope_elements_are_lexbors() -> None:
    """An element is special if lexbor ignores an inline end tag across it, and a scope
    boundary if it ignores </div> across it: the model's lists, for every probed tag."""
    tags = {t.lower() for t in TAGS} - _NOT_PROBED
    special = {t for t in tags if "x-a" in _probe_parents(f"<x-a><{t}></x-a><i-probe>")}
    scope = {t for t in tags if "div" in _probe_parents(f"<div><{t}></div><i-probe>")}
    assert special == nesting_tree._SPECIAL & tags
    assert scope == nesting_tree._SCOPE & tags


@pytest.mark.slow
@pytest.mark.corpus
@pytest.mark.skipif(not CORPORA.is_dir(), reason="../shared/corpora is not here")
def test_no_corpus_page_is_too_deep() -> None:
    """Real pages are nowhere near the limit, so the guard changes no decision on them."""
    files = sorted(
        p for p in (CORPORA / "warc").rglob("*") if ".arc" in p.name or ".warc" in p.name
    )
    pages = [item for item in iter_inputs(files) if isinstance(item, Page)]
    assert len(pages) > 800
    deepest = 0
    for page in pages:
        html = decode_html(page.body, page.header("content-type"))
        deepest = max(deepest, nesting.nesting_depth(html, extract._MAX_DEPTH))
    assert deepest < extract._MAX_DEPTH // 4
