"""Page bytes → canonical tokens: the first (and most expensive) stage of the pipeline."""

from __future__ import annotations

from stream_dedup.core import extract, tokens
from stream_dedup.core.decode import decode_html_utf8
from stream_dedup.core.extract import visible_text
from stream_dedup.core.tokens import Tokens, tokenize


def canonicalize(body: bytes, content_type: str | None, *, boilerplate: bool) -> Tokens:
    """Decode the charset, keep the visible text, normalize and tokenize it."""
    html, utf8 = decode_html_utf8(body, content_type)
    return tokenize(visible_text(html, boilerplate=boilerplate, collapse=False, utf8=utf8))


def kernels() -> str:
    """Which code computes the pure stages: "compiled" (the C kernels, bound to this
    selectolax), "numpy" (the extension was not built: same values, 3-5x slower) or
    "compiled, Python tree walk" (this selectolax does not export what the walk needs)."""
    if not tokens.HAVE_NATIVE:
        return "numpy"
    return "compiled" if extract.NATIVE_WALK else "compiled, Python tree walk"
