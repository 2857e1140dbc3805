"""Unicode HTML -> the text a reader sees, one space between words.

Duplicates are judged on words, so the two things that matter are: no invisible text (script,
style, markup-ish payloads) and correct word boundaries. selectolax's ``text(separator=...)``
puts the separator between *every* pair of text nodes, which splits ``wo<b>rd</b>``; with no
separator ``<td>a</td><td>b</td>`` glues into ``ab``. So we insert a space text node before and
after every element that breaks words when rendered (blocks, cells, list items, ``br``,
``img``...), then take the plain text and collapse whitespace. Inline elements (and unknown
ones, which render inline) never split a word. The compiled kernel (`_native.visible_text`)
does this in one walk over lexbor's tree without changing it, at about the cost of a bare
``body.text()``; `_walk` is the same rule through selectolax's Python API (about 3x that),
used where the kernel is not available and in boilerplate mode.

Choices: ``<title>`` and the rest of ``<head>`` are excluded (not in the page body; titles are
often shared by a whole site, and a template title would make pages look alike). ``math`` is
dropped (its token soup and TeX annotations are not prose), as are ruby annotations (``rt``,
``rp``) so that the base CJK text stays contiguous. A frameset page has no body; its
``<noframes>`` content is what a reader without frames sees, so that is what we return.

``boilerplate=True`` also drops page furniture shared by the pages of one site; see
``_strip_boilerplate``. lexbor's tree building is quadratic in the nesting depth (100k nested
``<div>`` take ~12 s, 120k ``<rt>`` 13.9 s), so pages that `nesting` finds could nest too deep
are stripped with regexes instead of being parsed.
"""

from __future__ import annotations

import html as htmllib
import re

import selectolax.lexbor
from selectolax.lexbor import LexborDocumentOptions, LexborHTMLParser, LexborNode

from stream_dedup.core import nesting

try:
    from stream_dedup.core import _native
except ImportError:  # installed without a C compiler: selectolax's Python API does it
    _native = None  # type: ignore[assignment]

__all__ = ["visible_text"]

# Never rendered as text, or text that is not prose. `noframes`/`noembed` are raw text (markup
# as a string) in a page that has a body. (<head> is never inside <body>, so it needs no entry.)
_INVISIBLE = (
    "script", "style", "noscript", "template", "svg", "math", "iframe", "object", "embed",
    "applet", "title", "video", "audio", "canvas", "datalist", "noembed", "noframes", "rt",
    "rp", "param",
)  # fmt: skip
# Elements whose rendering separates the words around them. Row groups and rows are left out:
# their cells already separate, and `tr` alone is ~5 % of all elements.
_BREAKING = (
    "address", "article", "aside", "blockquote", "br", "button", "caption", "center", "dd",
    "details", "dialog", "dir", "div", "dl", "dt", "fieldset", "figcaption", "figure", "footer",
    "form", "frame", "h1", "h2", "h3", "h4", "h5", "h6", "header", "hgroup", "hr", "img",
    "input", "legend", "li", "listing", "main", "menu", "nav", "ol", "optgroup", "option", "p",
    "plaintext", "pre", "section", "select", "summary", "table", "td", "textarea", "th", "ul",
    "xmp",
)  # fmt: skip


def _tag_ids(names: tuple[str, ...]) -> frozenset[int]:
    """lexbor's ids of standard HTML tags are fixed; matching them in Python over one
    ``css("*")`` walk costs half of a 53-way ``:is()`` selector, which tests every alternative
    on every element."""
    doc = LexborHTMLParser("")
    return frozenset(doc.create_node(name).tag_id for name in names)


_OPTIONS = LexborDocumentOptions.WO_EVENTS
_INVISIBLE_IDS = _tag_ids(_INVISIBLE)
_BREAKING_IDS = _tag_ids(_BREAKING)
_TAG_BITS = 1024  # as in _native.c; standard tag ids are below it


def _bitmap(ids: frozenset[int]) -> bytes:
    bits = bytearray(_TAG_BITS // 8)
    for tag in ids:
        bits[tag >> 3] |= 1 << (tag & 7)
    return bytes(bits)


_INVISIBLE_BITS = _bitmap(_INVISIBLE_IDS)
_BREAKING_BITS = _bitmap(_BREAKING_IDS)


def _bind_native() -> bool:
    """Bind the kernel's walk to the loaded selectolax, calibrated on a text node of a
    document made for it. False (and the Python walk) if this selectolax does not export what
    the kernel needs or its text nodes are not laid out as the calibration requires."""
    if _native is None or max(_INVISIBLE_IDS | _BREAKING_IDS) >= _TAG_BITS:
        return False
    marker = "stream-dedup calibration text 0123456789"
    doc = LexborHTMLParser(f"<p>{marker}</p>")
    node = doc.css_first("p")
    text = node.first_child if node is not None else None
    if text is None:
        return False
    try:
        _native.bind_lexbor(selectolax.lexbor.__file__, text, marker.encode(), b"recalibrated")
    except ImportError:
        return False
    return True


NATIVE_WALK = _bind_native()

# --- boilerplate mode ------------------------------------------------------------------------
_MAIN = "main, [role~=main i]"
# Landmarks, controls and hidden elements (header/footer only outside articles and sections).
_FURNITURE = (
    ":is(nav, aside, form, select, button, dialog, [role~=navigation i], [role~=banner i], "
    "[role~=contentinfo i], [role~=complementary i], [role~=search i], [role~=dialog i], "
    "[role~=alertdialog i], [aria-hidden=true i], [hidden], header, footer)"
)
# Never content, however much of the page they hold (a <select> of 200 countries).
_UNAMBIGUOUS_TAGS = {"nav", "select", "button"}
_UNAMBIGUOUS_ROLES = {"navigation", "search"}
_SECTIONING = {"article", "aside", "main", "nav", "section"}
_HIDDEN_STYLE = re.compile(r"display\s*:\s*none|visibility\s*:\s*hidden", re.IGNORECASE)
_LINK_BLOCKS = ":is(ul, ol, menu, dl, table, div, p, td):has(a[href])"
_LINK_DENSITY = 0.5  # link text / all text above which a short block is navigation
_SHORT = 1000  # non-space characters; longer link-heavy blocks (TOCs, references) stay

# --- pathological nesting ------------------------------------------------------------------
# lexbor's tree building is quadratic in how deep the stack of open elements gets; `nesting`
# models that depth whatever the tags. Below _TAG_COUNT_CHECK '<' even the worst page parses
# in about 0.1 s; the deepest page of the WARC corpus reaches 138 in the model.
_TAG_COUNT_CHECK = 10_000
_MAX_DEPTH = 1_000
_RAW_BLOCKS = re.compile(
    r"<!--.*?(?:-->|$)|<(script|style|noscript|template|svg|math|head|title|iframe|object)\b"
    r".*?(?:</\1\s*>|$)",
    re.IGNORECASE | re.DOTALL,
)
_BREAKING_TAG = re.compile(rf"</?(?:{'|'.join(_BREAKING)})\b[^>]*>", re.IGNORECASE)
_ANY_TAG = re.compile(r"<[^>]*>")


def visible_text(html: str, *, boilerplate: bool = False, collapse: bool = True,
                 utf8: bytes | None = None) -> str:
    """The words a reader sees on the page, separated by single spaces.

    ``collapse=False`` leaves white space as the page has it (a run of white space may stand
    where one space would): tokenizing treats both alike and skips the copy. ``utf8``, when
    given, must be exactly ``html`` in UTF-8 (`decode.decode_html_utf8` says when the page's
    body is): the parser then reads it as it is, not a new encoding of ``html``.

    Robust to any string (broken markup, no body, frameset, lone surrogates, deep nesting);
    returns "" when there is no visible text. With ``boilerplate=True`` a page that is all
    navigation (a portal's home page) can come back empty, which is the honest answer: it has
    no content of its own. Pathologically nested pages get a regex extraction without
    boilerplate removal.
    """
    if not html or html.isspace():
        return ""
    if _too_deep(html, checked=utf8 is not None):
        return _regex_text(html)
    text = _extract(utf8 if utf8 is not None else html, boilerplate, allow_noframes=True)
    return " ".join(text.split()) if collapse else text


def _extract(html: str | bytes, boilerplate: bool, *, allow_noframes: bool) -> str:
    tree = _parse(html)
    if tree.body is None:  # frameset: what a browser without frames shows
        if not allow_noframes:
            return ""
        noframes = tree.css("noframes")
        texts = (_extract(n.text(), boilerplate, allow_noframes=False) for n in noframes)
        return " ".join(texts)
    body = tree.body
    drop = _INVISIBLE_IDS
    if boilerplate:  # furniture is judged on visible text: drop the invisible first
        _walk(body, drop, frozenset())
        _strip_boilerplate(body)
        drop = frozenset()
    if NATIVE_WALK:
        return _native.visible_text(tree, _INVISIBLE_BITS, _BREAKING_BITS)
    _walk(body, drop, _BREAKING_IDS)
    return body.text()


def _walk(body: LexborNode, drop: frozenset[int], separate: frozenset[int]) -> None:
    """One pass over the elements: unlink the invisible ones, pad word-breaking ones with spaces.

    Unlinking keeps the subtree's memory (lexbor frees it with the document), so the elements
    of a dropped subtree that come later in the list are still safe to touch.
    """
    for node in body.css("*"):
        tag_id = node.tag_id
        if tag_id in drop:
            node.decompose()
        elif tag_id in separate:
            node.insert_before(" ")
            node.insert_after(" ")


def _parse(html: str | bytes) -> LexborHTMLParser:
    """Parse as a browser that runs scripts would: <noscript> is then one raw text node (not
    markup that closes <head> early and spills into the body). Without mutation events, which
    we do not need, and which would copy the selected <option> into <selectedcontent>."""
    try:
        return LexborHTMLParser(html, options=_OPTIONS, scripting=True)
    except UnicodeError:  # lone surrogates from a careless caller
        assert isinstance(html, str)
        return LexborHTMLParser(html.encode("utf-8", "replace"), options=_OPTIONS, scripting=True)


def _chars(text: str) -> int:
    """Non-space characters: indentation must not count as content (4 C scans, no copies)."""
    return len(text) - text.count(" ") - text.count("\n") - text.count("\t") - text.count("\r")


def _strip_boilerplate(body: LexborNode) -> None:
    """Drop furniture that the pages of one site share, so that they do not look alike.

    1. Landmarks and controls (nav, aside, form, select, button, dialogs, ARIA banner/
       contentinfo/complementary/search roles), ``header``/``footer`` unless they belong to an
       article or section (the spec's rule for when they are banner/contentinfo), and hidden
       elements (``hidden``, ``aria-hidden=true``, inline ``display:none``/``visibility:hidden``).
    2. Short link-dense blocks: lists, tables, cells, divs and paragraphs of at most ``_SHORT``
       non-space characters whose link text is more than half of their text (menus, footers
       of links, tag clouds, "share" rows).

    Safeguards: an element that contains the main content (``main``/``role=main``, or, if the
    page has none, ``article``) is kept, and so is one holding more than half of the page's
    text (ASP.NET pages wrap everything in a ``form``; some pages are hidden until a script
    shows them), unless it is navigation or a control (``_unambiguous``).
    """
    protect = _MAIN if body.css_first(_MAIN) is not None else "article"
    has_protected = body.css_first(protect) is not None
    page = _chars(body.text())

    def keep(node: LexborNode, chars: int) -> bool:
        if has_protected and node.css_first(protect) is not None:
            return True
        return chars * 2 > page and not _unambiguous(node)

    doomed: list[LexborNode] = []
    for node in body.css(_FURNITURE):
        if node.tag in ("header", "footer") and _in_section(node):
            continue
        if not keep(node, _chars(node.text())):
            doomed.append(node)
    for node in body.css("[style]"):
        if _HIDDEN_STYLE.search(node.attributes.get("style") or "") and not keep(
            node, _chars(node.text())
        ):
            doomed.append(node)
    for node in doomed:  # decided first, removed after: removal only unlinks, so it is safe
        node.decompose()

    page = _chars(body.text())
    doomed = []
    for node in body.css(_LINK_BLOCKS):
        chars = _chars(node.text())
        if chars == 0 or chars > _SHORT:
            continue
        links = _chars("".join([a.text() for a in node.css("a[href]")]))
        if links > _LINK_DENSITY * chars and not keep(node, chars):
            doomed.append(node)
    for node in doomed:
        node.decompose()


def _unambiguous(node: LexborNode) -> bool:
    if node.tag in _UNAMBIGUOUS_TAGS:
        return True
    role = (node.attributes.get("role") or "").lower().split()
    return not _UNAMBIGUOUS_ROLES.isdisjoint(role)


def _in_section(node: LexborNode) -> bool:
    parent = node.parent
    while parent is not None:
        if parent.tag in _SECTIONING:
            return True
        parent = parent.parent
    return False


def _too_deep(html: str, *, checked: bool = False) -> bool:
    """True if the page could nest elements so deeply that lexbor would take seconds to parse
    it (see `nesting`). Only pages with many tags can be slow, so only they pay for the scan.
    `checked`: the text is known to hold no lone surrogate (it was decoded from bytes)."""
    if len(html) < 3 * _TAG_COUNT_CHECK:  # a start tag takes 3 characters at least: "<a>"
        return False
    if not checked and not html.isascii():
        try:
            html.encode()
        except UnicodeEncodeError:  # selectolax drops lone surrogates: so must the model
            html = html.encode(errors="ignore").decode()
    if _native is not None:
        return bool(_native.too_deep(html, _TAG_COUNT_CHECK, _MAX_DEPTH))
    return nesting.too_deep(html, _TAG_COUNT_CHECK, _MAX_DEPTH)


def _regex_text(html: str) -> str:
    """Degraded extraction for pathological pages: drop invisible blocks and tags by regex."""
    text = _RAW_BLOCKS.sub(" ", html)
    text = _ANY_TAG.sub("", _BREAKING_TAG.sub(" ", text))
    return " ".join(htmllib.unescape(text).split())
