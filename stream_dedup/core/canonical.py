"""Page bytes → canonical tokens: the first (and most expensive) stage of the pipeline."""

from __future__ import annotations

from .decode import decode_html
from .extract import visible_text
from .tokens import Tokens, tokenize


def canonicalize(body: bytes, content_type: str | None, *, boilerplate: bool) -> Tokens:
    """Decode the charset, keep the visible text, normalize and tokenize it."""
    html = decode_html(body, content_type)
    return tokenize(visible_text(html, boilerplate=boilerplate, collapse=False))
