"""How deep a page can make lexbor's stack of open elements: a bound on its parse time.

lexbor's tree building walks the stack of open elements for many tags (scope checks, "any
other end tag"), so a page that nests N elements costs O(N**2): 120,000 ``<rt>`` (480 KB) took
13.9 s, and an 8 MiB page would take hours. `nesting_depth` follows the page through a model of
lexbor's tokenizer and tree builder that keeps an element open wherever it is not sure lexbor
closes it, so that capping the model's depth caps the parse, whatever the tags:

* The tokenizer's view of the text: comments, bogus comments (``<!x>``, ``<?x>``, ``</ x>``),
  CDATA in svg/math, attribute values (a quoted ``>`` or ``</div>`` is not markup),
  self-closing ``/>``, raw text (script with its escape states, style, xmp, iframe, noembed,
  noframes, noscript, textarea, title) and plaintext; a tag name runs to white space, ``/``
  or ``>`` (``<p.x>`` is not a ``<p>``), lower-cased in ASCII only.
* Every start tag pushes, except void elements (in HTML), ``html``/``head``/``body``, table
  parts outside a table or template (lexbor ignores them; inside, the rows and bodies lexbor
  implies are pushed too) and self-closing tags in svg/math. Before it, a start tag closes only
  what lexbor closes for it: a ``<p>`` in button scope for block starts, the open ``<li>``,
  ``<dd>``/``<dt>``, cell, row or ``<option>``, the open ``<a>``/``<nobr>``, ``<select>`` for
  ``<input>`` and ``<select>``. ``rt``, ``rp``, ``rb``, ``rtc`` and ``optgroup`` close nothing:
  outside ``<ruby>``/``<select>`` lexbor nests them.
* An end tag pops through the nearest open element of its name within `_SEARCH` entries, and
  is ignored where lexbor ignores it: a special element in between (formatting and other
  elements: lexbor's "any other end tag" and adoption agency), or a scope boundary in between
  (the block elements' own end tags look "in scope"). ``</form>`` removes the form alone.
* Formatting elements closed by another element's end tag are reopened before the next text
  or start tag, as lexbor reconstructs them (Noah's ark: at most three identical ones).
* In svg/math nothing closes implicitly and void names nest; the tags that leave foreign
  content in lexbor (`_BREAKOUT`, checked against the installed lexbor by the tests) pop it.

This is a model, not lexbor: where the two disagree, a later end tag can close in the model
what lexbor keeps open. tests/test_nesting.py compares it with the tree lexbor builds (seeded
hostile documents, every tag kind repeated in seven contexts: at most one level shallower),
and tests/test_fuzz.py times deep and repeated tricks. In a wider search (100,000 random
documents of the same kind, 2026-11-24) the model was shallower than lexbor's tree on 30, by
1 to 20 levels; repeated to 1 MB, none of those took more than 0.15 s to decide. The compiled
twin is `_native.nesting_depth` (_nesting.c).

This module scans the page (tags, comments, raw text, scripts) and drives the model;
nesting_tree.py holds its state and what each tag does to it.
"""

from __future__ import annotations

import re

from stream_dedup.core.nesting_tree import (
    FORMATTING,
    NS_HTML,
    NS_MATH,
    NS_SVG,
    TABLE_PARTS,
    Entry,
    Tree,
    ends_scope,
)

__all__ = ["nesting_depth", "too_deep"]

_VOID = frozenset(
    "area base basefont bgsound br col embed frame hr image img input keygen link meta param "
    "source track wbr".split()
)
_NO_PUSH = frozenset({"html", "head", "body"})
_FOREIGN_ROOTS = {"svg": NS_SVG, "math": NS_MATH}
_MATH_IN_TEXT = frozenset({"mglyph", "malignmark"})  # MathML even in mi, mo, ...
_HTML_ENCODINGS = frozenset({"text/html", "application/xhtml+xml"})  # of an annotation-xml
# Start tags that leave svg/math: the foreign elements are popped first. The spec's list, less
# `sup` (lexbor keeps it foreign) and `font` (which breaks out only with some attributes);
# tests/test_nesting.py checks it against the installed lexbor.
_BREAKOUT = frozenset(
    "b big blockquote body br center code dd div dl dt em embed h1 h2 h3 h4 h5 h6 head hr i img "
    "li listing menu meta nobr ol p pre ruby s small span strong strike sub table tt u ul "
    "var".split()
)
_RAW = frozenset("style xmp iframe noembed noframes noscript textarea title".split())
# Start tags before which lexbor does not reopen closed formatting elements (blocks, headings,
# lists, tables, ruby parts and what goes to <head>); it does before text and all others.
_NO_RECONSTRUCT = frozenset(
    "address article aside blockquote center details dialog dir div dl fieldset figcaption "
    "figure footer header hgroup main menu nav ol p search section summary ul pre listing form "
    "plaintext hr h1 h2 h3 h4 h5 h6 li dd dt table caption col colgroup tbody tfoot thead tr td "
    "th rb rtc rp rt base basefont bgsound link meta noframes script style template title "
    "frameset".split()
)
_SPACE = " \t\n\f\r"
_COMMENT_END = re.compile("--!?>")
_ASCII_LOWER = {c: c + 32 for c in range(ord("A"), ord("Z") + 1)}


def _tag_name(html: str, i: int, n: int) -> tuple[str, int]:
    """The lower-cased tag name starting at i, and where it ends."""
    j = i
    while j < n and html[j] not in _SPACE and html[j] != "/" and html[j] != ">":
        j += 1
    return html[i:j].translate(_ASCII_LOWER).replace("\0", "\ufffd"), j


def _tag_end(html: str, i: int, n: int) -> tuple[int, bool, str | None]:
    """From after the name: the index past the tag's '>' (-1 if the page ends first), whether
    it is self-closing, and its `encoding` attribute (None if it has none), with the attributes
    read as the tokenizer reads them."""
    encoding = None
    while i < n:
        c = html[i]
        if c == ">":
            return i + 1, False, encoding
        if c == "/":
            if i + 1 < n and html[i + 1] == ">":
                return i + 2, True, encoding
            i += 1
            continue
        if c in _SPACE:
            i += 1
            continue
        # an attribute name (its first character may be anything but space, / and >)
        start = i
        i += 1
        while i < n and html[i] not in _SPACE and html[i] not in "/>=":
            i += 1
        named = html[start:i].translate(_ASCII_LOWER) == "encoding" and encoding is None
        value = ""
        while i < n and html[i] in _SPACE:
            i += 1
        if i < n and html[i] == "=":
            i += 1
            while i < n and html[i] in _SPACE:
                i += 1
            if i < n and html[i] in "\"'":
                close = html.find(html[i], i + 1)
                if close < 0:
                    return -1, False, encoding
                value = html[i + 1 : close]
                i = close + 1
            else:
                start = i
                while i < n and html[i] not in _SPACE and html[i] != ">":
                    i += 1
                value = html[start:i]
        if named:
            encoding = value
    return -1, False, encoding


def _end_of_text(low: str, name: str, i: int, n: int) -> int:
    """The '<' of the end tag that closes the raw text of element `name` starting at i."""
    needle = "</" + name
    while True:
        j = low.find(needle, i)
        if j < 0:
            return n
        k = j + len(needle)
        if k >= n or low[k] in _SPACE or low[k] in "/>":
            return j
        i = k


def _end_of_script(low: str, i: int, n: int) -> int:
    """The '<' of the end tag closing a script whose text starts at i, following the script
    data escape states (``<!--``, then ``<script`` inside it, until ``-->``)."""
    state = 0  # 0: script data, 1: escaped, 2: double escaped
    k = -1  # the next "-->" at or after i (n: there is none), found once per "-->"
    while True:
        j = low.find("<", i)
        if state and k < i:
            k = low.find("-->", i)
            k = n if k < 0 else k
        if state and k < n and (j < 0 or k < j):
            state, i = 0, k + 3
            continue
        if j < 0:
            return n
        if low.startswith("<!--", j) and state == 0:
            state, i = 1, j + 2  # the dashes may end it too: <!-->
            continue
        for closing in (True, False):
            tag = "</script" if closing else "<script"
            end = j + len(tag)
            if low.startswith(tag, j) and (end >= n or low[end] in _SPACE or low[end] in "/>"):
                if closing and state != 2:
                    return j
                if closing:
                    state = 1
                elif state == 1:
                    state = 2
                break
        i = j + 1


def nesting_depth(html: str, limit: int) -> int:
    """The deepest stack of open elements the model reaches (see the module docstring), or
    limit + 1 as soon as it exceeds `limit`."""
    low = html.translate(_ASCII_LOWER)  # lexbor lower-cases ASCII only; same length
    n = len(html)
    tree = Tree(limit)
    stack = tree.stack
    i = markup_end = 0
    while True:
        i = html.find("<", i)
        if i < 0 or i + 1 >= n or tree.deepest > limit or tree.overflow:
            return tree.result()
        if i > markup_end and (not stack or stack[-1].children == NS_HTML) and tree.reconstruct():
            continue  # text: reopen formatting elements
        c = html[i + 1]
        if html.startswith("<![CDATA[", i) and stack and not stack[-1].html:
            k = html.find("]]>", i + 9)  # text in svg/math (even in their integration points)
            if k < 0:
                return tree.result()
            i = markup_end = k + 3
            continue
        if low.startswith("<!--", i):
            if low.startswith("<!-->", i) or low.startswith("<!--->", i):
                i = markup_end = i + 5 + (html[i + 4] == "-")
                continue
            ends = _COMMENT_END.search(html, i + 4)
            if ends is None:
                return tree.result()
            i = markup_end = ends.end()
            continue
        closing = c == "/"
        first = html[i + 2] if closing and i + 2 < n else c
        if closing and first == ">":  # </> is nothing
            i = markup_end = i + 3
            continue
        if not (first.isascii() and first.isalpha()):
            if c in "!?" or closing:  # a bogus comment, to the next '>'
                k = html.find(">", i + 2)
                if k < 0:
                    return tree.result()
                i = markup_end = k + 1
            else:
                i += 1  # a '<' that is text
            continue
        name, j = _tag_name(html, i + 1 + closing, n)
        end, self_closing, encoding = _tag_end(html, j, n)
        if end < 0:  # the page ends inside the tag: no tag
            return tree.result()
        i = markup_end = end
        top = stack[-1] if stack else None
        ns = top.children if top is not None else NS_HTML
        if ns != NS_HTML and (name in ("p", "br") if closing else name in _BREAKOUT):
            tree.leave_foreign()
            top, ns = (stack[-1] if stack else None), NS_HTML
        if closing:
            tree.end_tag(name)
            continue
        if ns == NS_HTML and top is not None and top.math_text and name in _MATH_IN_TEXT:
            ns = NS_MATH
        if ns == NS_HTML and name in _FOREIGN_ROOTS:
            ns = _FOREIGN_ROOTS[name]  # the element itself is foreign: <svg/> closes itself
            if not self_closing:
                tree.reconstruct()
                tree.push(Entry(name, ns))
        elif ns != NS_HTML:  # no tag ends another here; foreign void-named tags nest too
            if not self_closing:
                entry = Entry(name, ns)
                if ns == NS_MATH and name == "annotation-xml" and encoding is not None:
                    if encoding.translate(_ASCII_LOWER) in _HTML_ENCODINGS:
                        entry.children = NS_HTML  # an HTML integration point
                tree.push(entry)
        elif name not in _NO_PUSH and (name not in TABLE_PARTS or tree.table_part(name)):
            if name == "select" and tree.close(("select",), ends_scope):
                continue  # a <select> in a select ends it, and is not inserted
            tree.start_closes(name)
            if (name not in _NO_RECONSTRUCT and tree.reconstruct()) or name in _VOID:
                continue
            entry = Entry(name, identity=name + " " + html[j : end - 1].strip(_SPACE + "/"))
            tree.push(entry)
            if name in FORMATTING:
                tree.add_formatting(entry)
            if name == "plaintext":
                return tree.result()
            if name == "script":
                i = markup_end = _end_of_script(low, i, n)
            elif name in _RAW:
                i = markup_end = _end_of_text(low, name, i, n)


def too_deep(html: str, min_tags: int, limit: int) -> bool:
    """At least `min_tags` '<' and a model stack deeper than `limit` (`_native.too_deep`)."""
    return html.count("<") >= min_tags and nesting_depth(html, limit) > limit
