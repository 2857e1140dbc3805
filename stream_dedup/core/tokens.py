"""Canonical text and word tokens, vectorized over code points.

Canonical form (Broder's "lexically equivalent"): NFKC-normalized, lower-cased, every run
of characters that is not a letter, digit or combining mark becomes one space. Two pages
whose visible text differs only in punctuation, case, markup or white space have the same
canonical text and therefore the same canonical fingerprint.

What a token is:
- a maximal run of letters/digits/marks (Latin, Cyrillic, Greek, Arabic, Hebrew, Devanagari,
  Hangul ... all separate words with spaces or punctuation);
- each single character of the scripts that do not separate words (Han ideographs, Hiragana,
  Katakana, Thai, Lao, Khmer, Myanmar, Tibetan). Segmenting those into words needs a
  dictionary per language; single characters are what CJK near-duplicate detection commonly
  uses, and w of them in a row (a character w-gram) is a shingle as specific as a short
  phrase.

Nothing here creates a Python object per token. The compiled kernel (`_native.tokenize`) does
it in one pass over the string; `tokenize_numpy` is the same definition in numpy array
operations (one uint32 array of code points, a 1.1 MB table that classifies every code point,
token hashes from reductions). It is the reference the kernel is tested against, and what
runs where the kernel could not be built.
"""

from __future__ import annotations

import sys
import threading
import unicodedata
from dataclasses import dataclass

import numpy as np

from stream_dedup.core.hashing import U64, mix64, odd_constants

try:
    from stream_dedup.core import _native
except ImportError:  # installed without a C compiler: the numpy code computes the same
    _native = None  # type: ignore[assignment]
HAVE_NATIVE = _native is not None

SEP, WORD, SOLO = 0, 1, 2
_SOLO_RANGES = (
    (0x0E00, 0x0EFF),  # Thai, Lao
    (0x0F00, 0x0FFF),  # Tibetan
    (0x1000, 0x109F),  # Myanmar
    (0x1780, 0x17FF),  # Khmer
    (0x2E80, 0x2FDF),  # CJK radicals
    (0x3040, 0x30FF),  # Hiragana, Katakana
    (0x3100, 0x31BF),  # Bopomofo
    (0x31F0, 0x31FF),  # Katakana extensions
    (0x3400, 0x4DBF),  # CJK extension A
    (0x4E00, 0x9FFF),  # CJK unified ideographs
    (0xF900, 0xFAFF),  # CJK compatibility ideographs
    (0xFF66, 0xFF9F),  # half-width Katakana
    (0x20000, 0x3134F),  # CJK extensions B..G
)


# The per-code-point tables, built once per process (~0.4 s together) or handed over by
# another process of the same interpreter (`tables`, `adopt_tables`: an analysis worker gets
# them from its parent instead of building them before its first page).
_TABLES: dict[str, np.ndarray] = {}
_BUILDING = threading.Lock()  # two threads asking at once build them once


def char_classes() -> np.ndarray:
    """SEP/WORD/SOLO for every code point (see `_char_classes`)."""
    table = _TABLES.get("classes")
    if table is None:
        with _BUILDING:
            table = _TABLES.get("classes")
            if table is None:
                table = _TABLES["classes"] = _char_classes()
    return table


def fold_table() -> tuple[np.ndarray, np.ndarray]:
    """lower(NFKC(ch)) per code point and the multi-character mappings (see `_fold_table`)."""
    if "fold" not in _TABLES:
        with _BUILDING:
            if "fold" not in _TABLES:
                _TABLES["multi"] = (built := _fold_table())[1]
                _TABLES["fold"] = built[0]
    return _TABLES["fold"], _TABLES["multi"]


def tables() -> tuple[str, np.ndarray, np.ndarray, np.ndarray]:
    """(Unicode version, classes, fold, multi), built if not yet: for `adopt_tables`."""
    fold, multi = fold_table()
    return unicodedata.unidata_version, char_classes(), fold, multi


def adopt_tables(version: str, classes: np.ndarray, fold: np.ndarray, multi: np.ndarray) -> bool:
    """Use tables another process built with the same Unicode data (else build our own on
    first use, and return False)."""
    size = (sys.maxunicode + 1,)
    if version != unicodedata.unidata_version or classes.shape != size or fold.shape != size:
        return False
    with _BUILDING:
        _TABLES.update(classes=classes, fold=fold, multi=multi)
    return True


def _char_classes() -> np.ndarray:
    """SEP/WORD/SOLO for every code point (~0.1 s)."""
    table = np.zeros(sys.maxunicode + 1, dtype=np.uint8)
    for cp in range(sys.maxunicode + 1):
        cat = unicodedata.category(chr(cp))
        if cat[0] in "LNM":
            table[cp] = WORD
    for lo, hi in _SOLO_RANGES:
        seg = table[lo : hi + 1]
        seg[seg == WORD] = SOLO
    return table


FOLD_COMPLEX = 0xFFFFFFFF
FOLD_MULTI = 0x80000000
_SIGMA = "\u03a3"  # lower() of a capital sigma depends on what follows it (final sigma)


def _fold_table() -> tuple[np.ndarray, np.ndarray]:
    """lower(NFKC(ch)) per code point, for the kernel to apply character by character (~0.3 s).

    That equals lower(NFKC(text)) as long as no character of the text interacts with its
    neighbours in NFKC or in lower(): those are FOLD_COMPLEX, and a text holding one is
    normalized as a whole instead. Complex are combining marks (canonical reordering,
    composition), characters that compose with the one before them (second halves of
    canonical pairs, Hangul vowel and trailing jamo), characters whose mapping contains such
    a character, and a capital sigma anywhere in the mapping. A mapping to several
    characters (``…`` → ``...``) is FOLD_MULTI | index into `multi`, where its length and
    code points are stored.
    """
    seconds = set(range(0x1161, 0x1176)) | set(range(0x11A8, 0x11C3))
    assigned: list[tuple[int, str]] = []  # (code point, lower(NFKC)); the rest map to themselves
    sigma: set[int] = set()
    for cp in range(sys.maxunicode + 1):
        ch = chr(cp)
        if unicodedata.category(ch) in ("Cn", "Co", "Cs"):
            continue
        dec = unicodedata.decomposition(ch).split()
        if len(dec) == 2 and not dec[0].startswith("<"):
            seconds.add(int(dec[1], 16))
        nfkc = unicodedata.normalize("NFKC", ch)
        if _SIGMA in nfkc:
            sigma.add(cp)
        assigned.append((cp, nfkc.lower()))
    fold = np.arange(sys.maxunicode + 1, dtype=np.uint32)
    multi: list[int] = []
    for cp, out in assigned:
        if cp in sigma or any(unicodedata.combining(x) or ord(x) in seconds for x in out) or (
            cp in seconds or unicodedata.combining(chr(cp))
        ):
            fold[cp] = FOLD_COMPLEX
        elif len(out) > 1:
            fold[cp] = FOLD_MULTI | len(multi)
            multi += [len(out), *map(ord, out)]
        elif out != chr(cp):
            fold[cp] = ord(out)
    return fold, np.array(multi, dtype=np.uint32)


@dataclass(frozen=True, slots=True)
class Tokens:
    """The canonical text of a page and its token hashes."""

    codepoints: np.ndarray  # uint32: canonical text, one space between tokens (none in SOLO runs)
    hashes: np.ndarray  # uint64: one per token, in order

    @property
    def text(self) -> str:
        return self.codepoints.tobytes().decode("utf-32-le")

    def __len__(self) -> int:
        return int(self.hashes.shape[0])


_EMPTY_U32 = np.zeros(0, dtype=np.uint32)
_EMPTY_U64 = np.zeros(0, dtype=np.uint64)
_MAX_OFFSET = 255  # characters past this offset in one token share the last constant
_OFFSET_KEYS = odd_constants(0x70CE_4A54, _MAX_OFFSET + 1, salt=11)


def normalize(visible_text: str) -> str:
    """NFKC, then lower case (the kernels classify and hash the code points of this)."""
    if visible_text.isascii():  # NFKC leaves ASCII as it is; skip the scan
        return visible_text.lower()
    return unicodedata.normalize("NFKC", visible_text).lower()


def tokenize(visible_text: str) -> Tokens:
    """Visible text → canonical code points and one 64-bit hash per token."""
    if _native is None:
        return tokenize_numpy(visible_text)
    fold, multi = fold_table()
    out = _native.tokenize(visible_text, char_classes(), _OFFSET_KEYS, fold, multi)
    if out is None:  # a character that needs NFKC over the whole string
        out = _native.tokenize(normalize(visible_text), char_classes(), _OFFSET_KEYS, None, multi)
    assert out is not None, "without a fold table the kernel always tokenizes"
    canon, hashes = out
    return Tokens(np.frombuffer(canon, dtype=np.uint32), np.frombuffer(hashes, dtype=np.uint64))


def tokenize_numpy(visible_text: str) -> Tokens:
    """`tokenize` in numpy array operations (the reference definition)."""
    text = normalize(visible_text)
    if not text:
        return Tokens(_EMPTY_U32, _EMPTY_U64)
    cp = np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
    cls = np.take(char_classes(), cp.astype(np.intp))
    word = cls != SEP
    if not word.any():
        return Tokens(_EMPTY_U32, _EMPTY_U64)
    solo = cls == SOLO
    prev_word = np.concatenate(([False], word[:-1]))
    prev_solo = np.concatenate(([False], solo[:-1]))
    start = word & (~prev_word | solo | prev_solo)

    # Canonical text: word characters, plus one space where a separator run follows a word.
    # Spaces are not added between SOLO characters (CJK stays as written).
    keep = word | (~word & prev_word)
    canon = np.where(word, cp, np.uint32(32))[keep]
    if canon[-1] == 32:
        canon = canon[:-1]

    # Token hash: a multilinear hash, sum of (code point + 1) * K[offset in token] over the
    # token's characters (K: random odd 64-bit constants), then mixed. Two numpy operations
    # per character; the mixing runs once per token.
    wcp = cp[word].astype(np.uint64)
    wstart = start[word]
    token_of = np.cumsum(wstart) - 1
    first_index = np.flatnonzero(wstart)
    offset = np.arange(wcp.shape[0]) - first_index[token_of]
    wcp += U64(1)
    wcp *= _OFFSET_KEYS[np.minimum(offset, _MAX_OFFSET)]
    sums = np.add.reduceat(wcp, first_index)
    return Tokens(np.ascontiguousarray(canon), mix64(sums))


def token_strings(tokens: Tokens) -> list[str]:
    """The tokens as strings (tests and debugging only: one object per token)."""
    out: list[str] = []
    for part in tokens.text.split(" "):
        if not part:
            continue
        chars = np.frombuffer(part.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
        cls = char_classes()[chars]
        buf = ""
        for ch, c in zip(part, cls, strict=True):
            if c == SOLO:
                if buf:
                    out.append(buf)
                    buf = ""
                out.append(ch)
            else:
                buf += ch
        if buf:
            out.append(buf)
    return out
