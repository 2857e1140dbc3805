"""The nesting model's state (see nesting.py, which scans the page and drives it): lexbor's
stack of open elements and list of active formatting elements, and what a start or end tag
does to them. The compiled twin is _tree.c.
"""

from __future__ import annotations

from collections.abc import Callable

_SEARCH = 64  # entries an end tag looks down the stack for its element (bounds the scan)

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

TABLE_PARTS = frozenset("caption col colgroup tbody tfoot thead tr td th".split())

_SECTIONS = frozenset({"tbody", "thead", "tfoot"})

_TABLE_CONTEXTS = frozenset("table tbody thead tfoot tr td th caption colgroup template".split())

NS_HTML, NS_SVG, NS_MATH = 0, 1, 2  # the namespace of an element's children

# Elements of svg / MathML whose children are HTML again (and a MathML annotation-xml whose
# encoding attribute says HTML).
_INTEGRATION = {
    NS_SVG: frozenset({"foreignobject", "desc", "title"}),
    NS_MATH: frozenset({"mi", "mo", "mn", "ms", "mtext"}),
}

_FOREIGN_SPECIAL = {NS_SVG: _INTEGRATION[NS_SVG],
                    NS_MATH: _INTEGRATION[NS_MATH] | {"annotation-xml"}}

_HEADINGS = frozenset("h1 h2 h3 h4 h5 h6".split())

# Start tags that close an open <p> (in button scope), as lexbor does.
_P_CLOSERS = frozenset(
    "address article aside blockquote center details dialog dir div dl fieldset figcaption "
    "figure footer header hgroup main menu nav ol p search section summary ul pre listing form "
    "plaintext xmp hr h1 h2 h3 h4 h5 h6 li dd dt".split()
)

FORMATTING = frozenset("a b big code em font i nobr s small strike strong tt u".split())

_MARKERS = frozenset("applet object marquee template td th caption".split())  # in `active`

_ARK = 3  # Noah's ark: at most this many identical formatting elements after a marker

_ACTIVE_MAX = 512  # a longer list of active formatting elements counts as too deep

class Entry:
    """An element on the stack (`is_open`) or in the list of active formatting elements."""

    __slots__ = ("name", "html", "children", "special", "scope", "math_text", "identity",
                 "is_open")  # fmt: skip

    def __init__(self, name: str, ns: int = NS_HTML, identity: str = "") -> None:
        self.name = name
        self.html = ns == NS_HTML
        self.special = name in (_SPECIAL if self.html else _FOREIGN_SPECIAL[ns])
        self.scope = name in _SCOPE if self.html else self.special
        self.math_text = ns == NS_MATH and name in _INTEGRATION[NS_MATH]
        # the namespace of its children (HTML again in an integration point)
        self.children = NS_HTML if not self.html and name in _INTEGRATION[ns] else ns
        self.identity = identity  # name and attributes, for Noah's ark
        self.is_open = False

class Tree:
    """The stack of open elements and the list of active formatting elements (None: marker)."""

    def __init__(self, limit: int) -> None:
        self.stack: list[Entry] = []
        self.active: list[Entry | None] = []
        self.limit = limit
        self.deepest = 0
        self.tables = 0  # open table and template elements: table parts are not ignored
        self.overflow = False  # the active list outgrew _ACTIVE_MAX

    def result(self) -> int:
        return self.limit + 1 if self.overflow or self.deepest > self.limit else self.deepest

    def _add_active(self, entry: Entry | None) -> bool:
        if len(self.active) == _ACTIVE_MAX:
            self.overflow = True
            return True
        self.active.append(entry)
        return False

    def push(self, entry: Entry) -> bool:
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
            entry = self.active[k] = Entry(entry.name, identity=entry.identity)
            if self.push(entry):
                return True
        return False

    def add_formatting(self, entry: Entry) -> None:
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
        self, names: frozenset[str] | tuple[str, ...], stop: Callable[[Entry], bool]
    ) -> Entry | None:
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
        if name in FORMATTING:
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
            stop = ends_scope
        closed = self.close(names, stop)
        if closed is not None and name in FORMATTING and closed in self.active:
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
            self.close(("button",), ends_scope)
        elif name == "input":  # ends an open select (in lexbor; <select> too, below)
            self.close(("select",), ends_scope)
        elif name in ("a", "nobr"):
            if self.find_active(name) >= 0:
                self.end_tag(name)  # lexbor's adoption agency closes the open one first
        elif name in TABLE_PARTS:
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
        while stack and stack[-1].children != NS_HTML:
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
            self.push(Entry("tbody"))
            top = "tbody"
        if top in _SECTIONS and name in ("td", "th"):
            self.push(Entry("tr"))
        if top == "table" and name == "col":
            self.push(Entry("colgroup"))
        return True

def _never(entry: Entry) -> bool:
    return False

def _is_special(entry: Entry) -> bool:
    return entry.special

def ends_scope(entry: Entry) -> bool:
    return entry.scope

def _ends_button_scope(entry: Entry) -> bool:
    return entry.scope or (entry.html and entry.name == "button")

def _ends_list_scope(entry: Entry) -> bool:
    return entry.scope or (entry.html and entry.name in ("ol", "ul"))

def _ends_table_scope(entry: Entry) -> bool:
    return entry.html and entry.name in ("html", "table", "template")

def _ends_item_search(entry: Entry) -> bool:
    """<li>, <dd>, <dt> look down for an open one past anything but special elements other
    than address, div and p."""
    return entry.special and not (entry.html and entry.name in ("address", "div", "p"))
