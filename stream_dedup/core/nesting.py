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
"""

from __future__ import annotations

import re
from collections.abc import Callable

__all__ = ["nesting_depth", "too_deep"]

_SEARCH = 64  # entries an end tag looks down the stack for its element (bounds the scan)

_VOID = frozenset(
    "area base basefont bgsound br col embed frame hr image img input keygen link meta param "
    "source track wbr".split()
)
_NO_PUSH = frozenset({"html", "head", "body"})
_SPECIAL = frozenset(
    "address applet area article aside base basefont bgsound blockquote body br button caption "
    "center col colgroup dd details dir div dl dt embed fieldset figcaption figure footer "
    "form frame frameset h1 h2 h3 h4 h5 h6 head header hgroup hr html iframe img input keygen li "
    "link listing main marquee menu meta nav noembed noframes noscript object ol p param "
    "plaintext pre script search section select source style summary table tbody td template "
    "textarea tfoot th thead title tr track ul wbr xmp".split()
)
# "In scope" stops at these (plus button for </p>, ol/ul for </li>).
# (select too: lexbor ignores the end tags of elements outside an open select)
_SCOPE = frozenset("applet caption html table td th marquee object template select".split())
# End tags that look for their element "in scope" (the others stop at any special element).
_SCOPED_END = frozenset(
    "address article aside blockquote button center details dialog dir div dl fieldset "
    "figcaption figure footer header hgroup listing main menu nav ol pre search section summary "
    "ul form p li dd dt h1 h2 h3 h4 h5 h6 applet marquee object template select table caption "
    "colgroup tbody tfoot thead tr td th".split()
)
_TABLE_PARTS = frozenset("caption col colgroup tbody tfoot thead tr td th".split())
_SECTIONS = frozenset({"tbody", "thead", "tfoot"})
_TABLE_CONTEXTS = frozenset("table tbody thead tfoot tr td th caption colgroup template".split())
_HTML, _SVG, _MATH = 0, 1, 2  # the namespace of an element's children
_FOREIGN_ROOTS = {"svg": _SVG, "math": _MATH}
# Elements of svg / MathML whose children are HTML again (and a MathML annotation-xml whose
# encoding attribute says HTML).
_INTEGRATION = {
    _SVG: frozenset({"foreignobject", "desc", "title"}),
    _MATH: frozenset({"mi", "mo", "mn", "ms", "mtext"}),
}
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
_FOREIGN_SPECIAL = {_SVG: _INTEGRATION[_SVG], _MATH: _INTEGRATION[_MATH] | {"annotation-xml"}}
_RAW = frozenset("style xmp iframe noembed noframes noscript textarea title".split())
_HEADINGS = frozenset("h1 h2 h3 h4 h5 h6".split())

# Start tags before which lexbor does not reopen closed formatting elements (blocks, headings,
# lists, tables, ruby parts and what goes to <head>); it does before text and all others.
_NO_RECONSTRUCT = frozenset(
    "address article aside blockquote center details dialog dir div dl fieldset figcaption "
    "figure footer header hgroup main menu nav ol p search section summary ul pre listing form "
    "plaintext hr h1 h2 h3 h4 h5 h6 li dd dt table caption col colgroup tbody tfoot thead tr td "
    "th rb rtc rp rt base basefont bgsound link meta noframes script style template title "
    "frameset".split()
)
# Start tags that close an open <p> (in button scope), as lexbor does.
_P_CLOSERS = frozenset(
    "address article aside blockquote center details dialog dir div dl fieldset figcaption "
    "figure footer header hgroup main menu nav ol p search section summary ul pre listing form "
    "plaintext xmp hr h1 h2 h3 h4 h5 h6 li dd dt".split()
)
_SPACE = " \t\n\f\r"
_COMMENT_END = re.compile("--!?>")
_ASCII_LOWER = {c: c + 32 for c in range(ord("A"), ord("Z") + 1)}


_FORMATTING = frozenset("a b big code em font i nobr s small strike strong tt u".split())
_MARKERS = frozenset("applet object marquee template td th caption".split())  # in `active`
_ARK = 3  # Noah's ark: at most this many identical formatting elements after a marker
_ACTIVE_MAX = 512  # a longer list of active formatting elements counts as too deep


class _Entry:
    """An element on the stack (`is_open`) or in the list of active formatting elements."""

    __slots__ = ("name", "html", "children", "special", "scope", "math_text", "identity",
                 "is_open")  # fmt: skip

    def __init__(self, name: str, ns: int = _HTML, identity: str = "") -> None:
        self.name = name
        self.html = ns == _HTML
        self.special = name in (_SPECIAL if self.html else _FOREIGN_SPECIAL[ns])
        self.scope = name in _SCOPE if self.html else self.special
        self.math_text = ns == _MATH and name in _INTEGRATION[_MATH]
        # the namespace of its children (HTML again in an integration point)
        self.children = _HTML if not self.html and name in _INTEGRATION[ns] else ns
        self.identity = identity  # name and attributes, for Noah's ark
        self.is_open = False


class _Tree:
    """The stack of open elements and the list of active formatting elements (None: marker)."""

    def __init__(self, limit: int) -> None:
        self.stack: list[_Entry] = []
        self.active: list[_Entry | None] = []
        self.limit = limit
        self.deepest = 0
        self.tables = 0  # open table and template elements: table parts are not ignored
        self.overflow = False  # the active list outgrew _ACTIVE_MAX

    def result(self) -> int:
        return self.limit + 1 if self.overflow or self.deepest > self.limit else self.deepest

    def _add_active(self, entry: _Entry | None) -> bool:
        if len(self.active) == _ACTIVE_MAX:
            self.overflow = True
            return True
        self.active.append(entry)
        return False

    def push(self, entry: _Entry) -> bool:
        """True when the stack is now deeper than the limit."""
        self.stack.append(entry)
        entry.is_open = True
        if entry.html and entry.name in _MARKERS and self._add_active(None):
            return True
        self.tables += entry.html and entry.name in ("table", "template")
        if len(self.stack) > self.deepest:
            self.deepest = len(self.stack)
        return self.deepest > self.limit

    def pop_to(self, depth: int) -> None:
        while len(self.stack) > depth:
            entry = self.stack.pop()
            entry.is_open = False
            if entry.html and entry.name in _MARKERS:
                self._clear_to_marker()
            self.tables -= entry.html and entry.name in ("table", "template")

    def _clear_to_marker(self) -> None:
        while self.active:
            if self.active.pop() is None:
                return

    def _after_marker(self) -> int:
        k = len(self.active)
        while k > 0 and self.active[k - 1] is not None:
            k -= 1
        return k

    def reconstruct(self) -> bool:
        """Reopen the formatting elements an end tag closed implicitly, as lexbor does before
        text and most start tags: the closed ones at the end of the list. True when that makes
        the stack too deep."""
        first = len(self.active)
        while first > 0:
            last = self.active[first - 1]
            if last is None or last.is_open:
                break
            first -= 1
        for k in range(first, len(self.active)):
            entry = self.active[k]
            assert entry is not None
            entry = self.active[k] = _Entry(entry.name, identity=entry.identity)
            if self.push(entry):
                return True
        return False

    def add_formatting(self, entry: _Entry) -> None:
        start = self._after_marker()
        same = [
            k
            for k in range(start, len(self.active))
            if self.active[k].identity == entry.identity  # type: ignore[union-attr]
        ]
        if len(same) >= _ARK:
            del self.active[same[0]]
        self._add_active(entry)

    def find_active(self, name: str) -> int:
        """Index in `active` of the last formatting element `name` after the last marker."""
        for k in range(len(self.active) - 1, self._after_marker() - 1, -1):
            if self.active[k].name == name:  # type: ignore[union-attr]
                return k
        return -1

    def close(
        self, names: frozenset[str] | tuple[str, ...], stop: Callable[[_Entry], bool]
    ) -> _Entry | None:
        """Pop through the nearest open HTML element named in `names` and return it, unless
        an entry for which `stop` holds comes first or it is more than `_SEARCH` entries down
        (the model then keeps it open)."""
        stack = self.stack
        for depth in range(len(stack) - 1, max(len(stack) - 1 - _SEARCH, -1), -1):
            entry = stack[depth]
            if entry.name in names and entry.html:
                self.pop_to(depth)
                return entry
            if stop(entry):
                return None
        return None

    def end_tag(self, name: str) -> None:
        if name in ("html", "head", "body", "br", "frameset"):  # lexbor may have ignored
            return  # the <frameset> (in a body): its end tag must not pop what is above it
        if name in _FORMATTING:
            k = self.find_active(name)
            if k >= 0 and not self.active[k].is_open:  # type: ignore[union-attr]
                del self.active[k]  # closed already: forgotten
                return
        if name == "form":  # lexbor removes the form alone: what is above it stays open
            for depth in range(len(self.stack) - 1, max(len(self.stack) - 1 - _SEARCH, -1), -1):
                entry = self.stack[depth]
                if entry.name == "form" and entry.html:
                    del self.stack[depth]
                    entry.is_open = False
                    return
                if entry.scope:
                    return
            return
        stack = self.stack
        for depth in range(len(stack) - 1, max(len(stack) - 1 - _SEARCH, -1), -1):
            entry = stack[depth]  # in svg/math an end tag closes its foreign element
            if entry.html:
                break
            if entry.name == name:
                self.pop_to(depth)
                return
        names = _HEADINGS if name in _HEADINGS else (name,)
        if name == "template":  # lexbor pops through the template whatever is above it
            stop = _never
        elif name not in _SCOPED_END:  # lexbor's "any other end tag", and the adoption agency
            stop = _is_special
        elif name == "p":
            stop = _ends_button_scope
        elif name == "li":
            stop = _ends_list_scope
        else:
            stop = _ends_scope
        closed = self.close(names, stop)
        if closed is not None and name in _FORMATTING and closed in self.active:
            self.active.remove(closed)

    def start_closes(self, name: str) -> None:
        """What a start tag closes before it is inserted (only what lexbor surely closes)."""
        top = self.stack[-1] if self.stack else None
        if name in ("li", "dd", "dt"):
            self.close(("li",) if name == "li" else ("dd", "dt"), _ends_item_search)
        if name in _P_CLOSERS:
            self.close(("p",), _ends_button_scope)
            top = self.stack[-1] if self.stack else None
            if name in _HEADINGS and top is not None and top.html and top.name in _HEADINGS:
                self.pop_to(len(self.stack) - 1)
        elif name in ("option", "optgroup"):
            if top is not None and top.html and top.name == "option":
                self.pop_to(len(self.stack) - 1)
        elif name == "button":
            self.close(("button",), _ends_scope)
        elif name == "input":  # ends an open select (in lexbor; <select> too, below)
            self.close(("select",), _ends_scope)
        elif name in ("a", "nobr"):
            if self.find_active(name) >= 0:
                self.end_tag(name)  # lexbor's adoption agency closes the open one first
        elif name in _TABLE_PARTS:
            if name in ("td", "th", "tr") or name in _SECTIONS:
                self.close(("td", "th"), _ends_table_scope)
            if name == "tr" or name in _SECTIONS:  # a row ends a row; a section, both
                for level in ("tr",) if name == "tr" else ("tr", "tbody", "thead", "tfoot"):
                    top = self.stack[-1] if self.stack else None
                    if top is not None and top.html and top.name == level:
                        self.pop_to(len(self.stack) - 1)

    def leave_foreign(self) -> None:
        """Pop svg/math elements, as lexbor does before a tag that has no meaning there, down
        to HTML content or an integration point."""
        stack = self.stack
        while stack and stack[-1].children != _HTML:
            self.pop_to(len(stack) - 1)

    def table_part(self, name: str) -> bool:
        """Before a table part: push what lexbor implies (a row for a cell, a body for a row).
        False if lexbor ignores the tag (no table or template is open)."""
        if not self.tables:
            return False
        top = ""
        stack = self.stack
        for depth in range(len(stack) - 1, max(len(stack) - 1 - _SEARCH, -1), -1):
            entry = stack[depth]  # the nearest table context
            if entry.html and entry.name == "colgroup" and name != "col":
                continue  # lexbor closes the column group (popped below, with the rest)
            if entry.html and entry.name in _TABLE_CONTEXTS:
                top = entry.name
                if top == "table" or top == "tr" or top in _SECTIONS:
                    self.pop_to(depth + 1)  # lexbor clears the stack back to it
                break
        if top == "table" and name in ("tr", "td", "th"):
            self.push(_Entry("tbody"))
            top = "tbody"
        if top in _SECTIONS and name in ("td", "th"):
            self.push(_Entry("tr"))
        if top == "table" and name == "col":
            self.push(_Entry("colgroup"))
        return True


def _never(entry: _Entry) -> bool:
    return False


def _is_special(entry: _Entry) -> bool:
    return entry.special


def _ends_scope(entry: _Entry) -> bool:
    return entry.scope


def _ends_button_scope(entry: _Entry) -> bool:
    return entry.scope or (entry.html and entry.name == "button")


def _ends_list_scope(entry: _Entry) -> bool:
    return entry.scope or (entry.html and entry.name in ("ol", "ul"))


def _ends_table_scope(entry: _Entry) -> bool:
    return entry.html and entry.name in ("html", "table", "template")


def _ends_item_search(entry: _Entry) -> bool:
    """<li>, <dd>, <dt> look down for an open one past anything but special elements other
    than address, div and p."""
    return entry.special and not (entry.html and entry.name in ("address", "div", "p"))


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
    tree = _Tree(limit)
    stack = tree.stack
    i = markup_end = 0
    while True:
        i = html.find("<", i)
        if i < 0 or i + 1 >= n or tree.deepest > limit or tree.overflow:
            return tree.result()
        if i > markup_end and (not stack or stack[-1].children == _HTML) and tree.reconstruct():
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
        ns = top.children if top is not None else _HTML
        if ns != _HTML and (name in ("p", "br") if closing else name in _BREAKOUT):
            tree.leave_foreign()
            top, ns = (stack[-1] if stack else None), _HTML
        if closing:
            tree.end_tag(name)
            continue
        if ns == _HTML and top is not None and top.math_text and name in _MATH_IN_TEXT:
            ns = _MATH
        if ns == _HTML and name in _FOREIGN_ROOTS:
            ns = _FOREIGN_ROOTS[name]  # the element itself is foreign: <svg/> closes itself
            if not self_closing:
                tree.reconstruct()
                tree.push(_Entry(name, ns))
        elif ns != _HTML:  # no tag ends another here; foreign void-named tags nest too
            if not self_closing:
                entry = _Entry(name, ns)
                if ns == _MATH and name == "annotation-xml" and encoding is not None:
                    if encoding.translate(_ASCII_LOWER) in _HTML_ENCODINGS:
                        entry.children = _HTML  # an HTML integration point
                tree.push(entry)
        elif name not in _NO_PUSH and (name not in _TABLE_PARTS or tree.table_part(name)):
            if name == "select" and tree.close(("select",), _ends_scope):
                continue  # a <select> in a select ends it, and is not inserted
            tree.start_closes(name)
            if (name not in _NO_RECONSTRUCT and tree.reconstruct()) or name in _VOID:
                continue
            entry = _Entry(name, identity=name + " " + html[j : end - 1].strip(_SPACE + "/"))
            tree.push(entry)
            if name in _FORMATTING:
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
