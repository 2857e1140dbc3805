"""Two pages' visible texts, side by side, with the words that differ marked (pure).

The text is the filter's own: the body decoded as `core/decode.py` decodes it and the
visible text `core/extract.py` keeps (with the run's boilerplate setting), so what a
person reads is what was compared. Words are compared as the tokenizer sees them (NFKC,
lower case, punctuation out), so "Word," and "word" are the same word here too. Long runs
the two pages share are folded to a few words of context each side: a reader looks for
what differs. A page past `max_words` is cut there, and the view says so.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from difflib import SequenceMatcher

from stream_dedup.core.decode import decode_html_utf8
from stream_dedup.core.extract import visible_text
from stream_dedup.core.tokens import normalize

MAX_WORDS = 1500  # words of a page compared and shown
CONTEXT = 12  # words kept each side of a difference
_NOT_WORD = re.compile(r"[\W_]+")


@dataclass(frozen=True)
class PageText:
    words: list[str]
    total: int  # words on the page (more than shown when cut)
    note: str = ""  # why the text is missing or cut

    @property
    def cut(self) -> bool:
        return self.total > len(self.words)


def page_text(body: bytes, content_type: str | None, *, boilerplate: bool = False,
              max_words: int = MAX_WORDS, max_bytes: int = 8 << 20) -> PageText:
    """The visible words of a page body (at most `max_words`); never raises."""
    note = ""
    if len(body) > max_bytes:
        note = f"body of {len(body):,} bytes: the first {max_bytes:,} read"
        body = body[:max_bytes]
    try:
        html, utf8 = decode_html_utf8(body, content_type)
        words = visible_text(html, boilerplate=boilerplate, utf8=utf8).split()
    except Exception as exc:  # a parser bug must cost one view, not the report
        return PageText([], 0, f"its text could not be extracted ({type(exc).__name__})")
    if len(words) > max_words:
        extra = f"cut at {max_words:,} of {len(words):,} words"
        note = f"{note}; {extra}" if note else extra
    return PageText(words[:max_words], len(words), note)


def _key(word: str) -> str:
    return _NOT_WORD.sub("", normalize(word))


# A side: runs of (kind, words): "same", "diff" (only on this side), or "fold" (n shared
# words not shown; the words list holds one item, the count as text).
Run = tuple[str, list[str]]


def side_by_side(a: list[str], b: list[str], context: int = CONTEXT
                 ) -> tuple[list[Run], list[Run], float]:
    """The two word lists as runs to show, and the share of words they have in common."""
    ka, kb = [_key(w) for w in a], [_key(w) for w in b]
    ops = SequenceMatcher(None, ka, kb, autojunk=False).get_opcodes()
    if len(ops) == 1 and ops[0][0] == "equal" and len(a) > 4 * context:  # the same words
        shown = 3 * context
        return ([("same", a[:shown]), ("fold", [str(len(a) - shown)])],
                [("same", b[:shown]), ("fold", [str(len(b) - shown)])], 1.0)
    left: list[Run] = []
    right: list[Run] = []
    common = 0
    for tag, i1, i2, j1, j2 in ops:
        if tag == "equal":
            common += i2 - i1
            _same(left, a[i1:i2], context)
            _same(right, b[j1:j2], context)
        else:
            if i2 > i1:
                left.append(("diff", a[i1:i2]))
            if j2 > j1:
                right.append(("diff", b[j1:j2]))
    share = 2 * common / (len(a) + len(b)) if a or b else 1.0
    return left, right, share


def _same(runs: list[Run], words: list[str], context: int) -> None:
    """Shared words: all of a short run; a long one folded between `context` words of it
    after the difference before and before the one after."""
    if len(words) <= 2 * context + 3:
        runs.append(("same", words))
        return
    head = words[:context] if runs else []  # at the start, nothing before to show
    tail = words[-context:]
    if head:
        runs.append(("same", head))
    runs.append(("fold", [str(len(words) - len(head) - len(tail))]))
    runs.append(("same", tail))
