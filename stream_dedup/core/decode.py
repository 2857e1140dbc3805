"""Bytes of a crawled page -> Unicode HTML, choosing the charset the way a browser would.

Near-duplicate detection compares text, so two captures of one page must decode to the same
characters whatever their headers say, and a page must never be lost to a bad label. Order:

1. byte order mark (UTF-8, UTF-16LE/BE): stronger than any label, as in browsers;
2. ``charset`` parameter of the HTTP ``Content-Type``;
3. ``<meta charset>`` / ``<meta http-equiv=Content-Type>`` in the first 4 KB (a byte prescan,
   as in the HTML spec: the text cannot be parsed before it is decoded);
4. strict UTF-8, if the body is valid UTF-8 (pure ASCII, the common case, stops here at once),
   or "mostly UTF-8" (at least 4 valid non-ASCII characters per bad byte: a page assembled
   from UTF-8 and Latin-1 parts);
5. charset-normalizer on a bounded prefix (it is slow: ~ms per page), restricted to the web's
   encodings, ties broken towards the common ones;
6. cp1252 with replacement characters.

Labels are mapped the WHATWG way (``latin1``/``us-ascii`` -> cp1252, ``gb2312`` -> gb18030,
``shift_jis`` -> cp932, ``euc-kr`` -> cp949); unknown labels are skipped. Beyond browsers, a
declared charset loses to UTF-8 when the body is valid, non-ASCII UTF-8 and the declared charset
either fails to decode or is a single-byte legacy one: servers that label everything
ISO-8859-1 are common, while legacy text that happens to be valid UTF-8 is vanishingly rare.
Nothing here raises on any input; undecodable bytes become U+FFFD.
"""

from __future__ import annotations

import codecs
import re
from functools import lru_cache

__all__ = ["decode_html", "decode_html_utf8", "detect_charset", "lookup_label"]

# Python codec -> WHATWG labels (https://encoding.spec.whatwg.org/#names-and-labels), plus the
# Python names themselves so that charset-normalizer's answers go through the same table.
_WHATWG = {
    "utf-8": "unicode-1-1-utf-8 unicode11utf8 unicode20utf8 utf-8 utf8 x-unicode20utf8 utf_8",
    "cp866": "866 cp866 csibm866 ibm866",
    "iso8859-2": "csisolatin2 iso-8859-2 iso-ir-101 iso8859-2 iso88592 iso_8859-2 "
    "iso_8859-2:1987 l2 latin2",
    "iso8859-3": "csisolatin3 iso-8859-3 iso-ir-109 iso8859-3 iso88593 iso_8859-3 "
    "iso_8859-3:1988 l3 latin3",
    "iso8859-4": "csisolatin4 iso-8859-4 iso-ir-110 iso8859-4 iso88594 iso_8859-4 "
    "iso_8859-4:1988 l4 latin4",
    "iso8859-5": "csisolatincyrillic cyrillic iso-8859-5 iso-ir-144 iso8859-5 iso88595 "
    "iso_8859-5 iso_8859-5:1988",
    "iso8859-6": "arabic asmo-708 csiso88596e csiso88596i csisolatinarabic ecma-114 iso-8859-6 "
    "iso-8859-6-e iso-8859-6-i iso-ir-127 iso8859-6 iso88596 iso_8859-6 iso_8859-6:1987",
    "iso8859-7": "csisolatingreek ecma-118 elot_928 greek greek8 iso-8859-7 iso-ir-126 "
    "iso8859-7 iso88597 iso_8859-7 iso_8859-7:1987 sun_eu_greek",
    "iso8859-8": "csiso88598e csisolatinhebrew hebrew iso-8859-8 iso-8859-8-e iso-ir-138 "
    "iso8859-8 iso88598 iso_8859-8 iso_8859-8:1988 visual csiso88598i iso-8859-8-i logical",
    "iso8859-10": "csisolatin6 iso-8859-10 iso-ir-157 iso8859-10 iso885910 l6 latin6",
    "iso8859-13": "iso-8859-13 iso8859-13 iso885913",
    "iso8859-14": "iso-8859-14 iso8859-14 iso885914",
    "iso8859-15": "csisolatin9 iso-8859-15 iso8859-15 iso885915 iso_8859-15 l9",
    "iso8859-16": "iso-8859-16",
    "koi8-r": "cskoi8r koi koi8 koi8-r koi8_r",
    "koi8-u": "koi8-ru koi8-u",
    "mac-roman": "csmacintosh mac macintosh x-mac-roman mac_roman",
    "cp874": "dos-874 iso-8859-11 iso8859-11 iso885911 tis-620 windows-874 cp874",
    "cp1250": "cp1250 windows-1250 x-cp1250",
    "cp1251": "cp1251 windows-1251 x-cp1251 win-1251",
    "cp1252": "ansi_x3.4-1968 ascii cp1252 cp819 csisolatin1 ibm819 iso-8859-1 iso-ir-100 "
    "iso8859-1 iso88591 iso_8859-1 iso_8859-1:1987 l1 latin1 latin_1 us-ascii windows-1252 "
    "x-cp1252 x-user-defined",
    "cp1253": "cp1253 windows-1253 x-cp1253",
    "cp1254": "cp1254 csisolatin5 iso-8859-9 iso-ir-148 iso8859-9 iso88599 iso_8859-9 "
    "iso_8859-9:1989 l5 latin5 windows-1254 x-cp1254",
    "cp1255": "cp1255 windows-1255 x-cp1255",
    "cp1256": "cp1256 windows-1256 x-cp1256",
    "cp1257": "cp1257 windows-1257 x-cp1257",
    "cp1258": "cp1258 windows-1258 x-cp1258",
    "mac-cyrillic": "x-mac-cyrillic x-mac-ukrainian mac_cyrillic",
    "gb18030": "chinese csgb2312 csiso58gb231280 gb2312 gb_2312 gb_2312-80 gbk iso-ir-58 x-gbk "
    "gb18030",
    "big5hkscs": "big5 big5-hkscs cn-big5 csbig5 x-x-big5",
    "euc_jp": "cseucpkdfmtjapanese euc-jp x-euc-jp",
    "iso2022_jp": "csiso2022jp iso-2022-jp",
    "cp932": "csshiftjis ms932 ms_kanji shift-jis shift_jis sjis windows-31j x-sjis cp932",
    "cp949": "cseuckr csksc56011987 euc-kr iso-ir-149 korean ks_c_5601-1987 ks_c_5601-1989 "
    "ksc5601 ksc_5601 windows-949 cp949",
    # WHATWG maps these to its "replacement" decoder (an XSS guard); we want the text.
    "iso2022_kr": "csiso2022kr iso-2022-kr",
    "hz": "hz-gb-2312",
    "utf-16-le": "csunicode iso-10646-ucs-2 ucs-2 unicode unicodefeff utf-16 utf-16le",
    "utf-16-be": "unicodefffe utf-16be",
}
_LABELS = {label: codec for codec, labels in _WHATWG.items() for label in labels.split()}
# "Latin-1", "UTF_8", "windows1251", "Shift JIS": same label, other punctuation.
_SQUASH = re.compile(r"[\s_\-]+")
_SQUASHED = {_SQUASH.sub("", label): codec for label, codec in _LABELS.items()}
_MULTIBYTE = {
    "utf-8",
    "utf-16-le",
    "utf-16-be",
    "gb18030",
    "big5hkscs",
    "euc_jp",
    "iso2022_jp",
    "cp932",
    "cp949",
    "iso2022_kr",
    "hz",
}
# Tie-breaking order for detection, most common on the web first.
_PREVALENCE = ("utf-8", "cp1252", "gb18030", "cp1251", "cp932", "cp949", "euc_jp", "big5hkscs")


@lru_cache(maxsize=1)
def _detectable() -> list[str]:
    """The codecs detection chooses among: looked up at the first page that needs it (the
    lookups import ~35 codec modules, 30-45 ms that most runs do not need)."""
    return [
        codecs.lookup(codec).name.replace("-", "_")
        for codec in _WHATWG
        if codec not in ("utf-16-le", "utf-16-be", "hz", "iso2022_kr")
    ]


# Charsets in which ASCII bytes do not mean ASCII text (so the ASCII fast path must not apply).
_NOT_ASCII_COMPATIBLE = {"utf-16-le", "utf-16-be", "iso2022_jp", "iso2022_kr", "hz"}

_BOMS = (
    (codecs.BOM_UTF8, "utf-8"),
    (codecs.BOM_UTF16_LE, "utf-16-le"),
    (codecs.BOM_UTF16_BE, "utf-16-be"),
)
_CT_CHARSET = re.compile(r"""charset\s*=\s*["']?\s*([^"';,\s]+)""", re.IGNORECASE)
_PRESCAN_BYTES = 4096
_DETECT_BYTES = 32768
_MOSTLY = 4  # valid non-ASCII UTF-8 characters per bad byte above which a page is "mostly UTF-8"
# ASCII, and the high bytes every Windows code page (1250-1258, 874) reads as the same
# character: ellipsis, curly quotes, bullet, en and em dash, no-break space. A body of only
# these reads the same whichever of them detection would pick.
_WINDOWS_COMMON = bytes(range(0x80)) + bytes([0x85, *range(0x91, 0x98), 0xA0])
_COMMENT = re.compile(rb"<!--.*?-->", re.DOTALL)
_META = re.compile(rb"<meta[\s/]([^>]*)", re.IGNORECASE)
_ATTR = re.compile(rb"""([^\s=/>]+)(?:\s*=\s*(?:"([^"]*)"|'([^']*)'|([^\s>]*)))?""")
_META_CHARSET = re.compile(rb"""charset\s*=\s*(?:"([^"]*)"|'([^']*)'|([^\s;"']+))""", re.I)


def lookup_label(label: str | bytes | None) -> str | None:
    """Python codec for a charset label, or None if unknown (unknown labels are skipped)."""
    if not label:
        return None
    if isinstance(label, bytes):
        label = label.decode("ascii", "replace")
    label = label.strip().strip("\"'").strip().lower()
    return _LABELS.get(label) or _SQUASHED.get(_SQUASH.sub("", label))


def _strict(body: bytes, codec: str) -> str | None:
    """Decode strictly, but forgive a multi-byte character cut off at the very end.

    Crawlers truncate bodies at a size limit, which routinely splits the last character;
    that must not demote a valid UTF-8 page to statistical detection.
    """
    if codec == "utf-8":  # the common case: one call, no incremental decoder
        try:
            return body.decode("utf-8")
        except UnicodeDecodeError:
            pass
    decoder = codecs.getincrementaldecoder(codec)("strict")
    try:
        text = decoder.decode(body, final=False)
    except (UnicodeDecodeError, ValueError):
        return None
    try:
        decoder.decode(b"", final=True)
    except (UnicodeDecodeError, ValueError):
        text += "\ufffd"
    return text


def _header_codec(content_type: str | None) -> str | None:
    if not content_type:
        return None
    match = _CT_CHARSET.search(content_type)
    return lookup_label(match.group(1)) if match else None


def _meta_codec(body: bytes) -> str | None:
    """The HTML spec's prescan, approximated with regexes on the first 4 KB of bytes.

    Comments are skipped (a commented-out <meta> does not count); the first <meta> that names
    a known charset wins; a UTF-16 label in <meta> means UTF-8, because a page whose meta tag
    can be read as ASCII bytes is not UTF-16.
    """
    head = body[:_PRESCAN_BYTES]
    if b"<" not in head:
        return None
    head = _COMMENT.sub(b" ", head)
    unclosed = head.find(b"<!--")
    if unclosed >= 0:
        head = head[:unclosed]
    for meta in _META.finditer(head):
        attrs: dict[bytes, bytes] = {}
        for name, dq, sq, bare in _ATTR.findall(meta.group(1)):
            attrs.setdefault(name.lower(), dq or sq or bare)
        codec = None
        if b"charset" in attrs:
            codec = lookup_label(attrs[b"charset"])
        elif attrs.get(b"http-equiv", b"").strip().lower() == b"content-type":
            found = _META_CHARSET.search(attrs.get(b"content", b""))
            if found:
                codec = lookup_label(found.group(1) or found.group(2) or found.group(3))
        if codec is not None:
            return "utf-8" if codec.startswith("utf-16") else codec
    return None


def _detect(body: bytes) -> str | None:
    """charset-normalizer's guess on a bounded prefix, among the encodings the web uses.

    Left to all of Python's codecs it calls KOI8-R "Shift_JIS-2004" and cp866 "cp1125". It
    often scores several encodings equally (English with curly quotes fits cp1250 and cp1252; a
    few hanzi fit big5, gbk and euc-kr) and then picks the alphabetically first; ties go to the
    encoding that is more common on the web instead.
    """
    try:
        from charset_normalizer import from_bytes

        results = from_bytes(body[:_DETECT_BYTES], cp_isolation=_detectable())
        best = results.best()
        if best is None:
            return None
        tied = {
            codec
            for match in results
            if match.chaos <= best.chaos and match.coherence >= best.coherence
            for codec in map(lookup_label, match.could_be_from_charset)
            if codec is not None
        }
    except Exception:  # a heuristic library must not take the pipeline down
        return None
    for codec in _PREVALENCE:
        if codec in tied:
            return codec
    return lookup_label(best.encoding)


def _decide(body: bytes, content_type: str | None) -> tuple[str, str, str, bool]:
    """(codec, how, text, exact): the decision and the text it produced, so nothing decodes
    twice; `exact` when the body is the text's UTF-8 (`decode_html_utf8`)."""
    for bom, bom_codec in _BOMS:
        if body.startswith(bom):
            return bom_codec, "bom", body[len(bom) :].decode(bom_codec, "replace"), False
    codec: str | None = _header_codec(content_type)
    how = "header"
    if codec is not None and codec.startswith("utf-16") and b"\x00" not in body[:_PRESCAN_BYTES]:
        codec = None  # UTF-16 HTML is full of NUL bytes; without them the label is wrong
    if codec is None:
        codec, how = _meta_codec(body), "meta"
    if body.isascii() and codec not in _NOT_ASCII_COMPATIBLE:
        # The common case: every ASCII-compatible charset gives the same text.
        if codec is not None:
            return codec, how, body.decode("ascii"), True
        if b"\x1b$" in body:  # ISO-2022-JP escape sequences, the only 7-bit charset still seen
            text = _strict(body, "iso2022_jp")
            if text is not None:
                return "iso2022_jp", "detected", text, False
        return "utf-8", "utf-8", body.decode("ascii"), True
    if codec is not None:
        text = _strict(body, codec)
        if codec != "utf-8" and (text is None or codec not in _MULTIBYTE):
            utf8 = _strict(body, "utf-8")
            if utf8 is not None:
                return "utf-8", "mislabeled", utf8, _whole(utf8, body)
        if text is None:
            return codec, how, body.decode(codec, "replace"), False
        return codec, how, text, codec == "utf-8" and _whole(text, body)
    text = _strict(body, "utf-8")
    if text is not None:
        return "utf-8", "utf-8", text, _whole(text, body)
    text = body.decode("utf-8", "replace")
    errors = text.count("\ufffd")
    valid = len(text) - len(text.encode("ascii", "ignore")) - errors  # non-ASCII characters
    if valid >= _MOSTLY * errors:  # UTF-8 with a few bad bytes; legacy text is never that
        return "utf-8", "utf-8-lossy", text, False
    if not body.translate(None, _WINDOWS_COMMON):
        # English with Word's quotes and dashes, the common undeclared legacy page: not
        # worth detection (charset-normalizer, ~5 ms a page; 8 % of serve's CPU on the
        # latency benchmark's pages, where 1 body in 124 is one).
        return "cp1252", "windows-punctuation", body.decode("cp1252"), False
    codec = _detect(body)
    if codec is not None:
        return codec, "detected", body.decode(codec, "replace"), False
    return "cp1252", "default", body.decode("cp1252", "replace"), False


def _whole(text: str, body: bytes) -> bool:
    """Whether `_strict`'s UTF-8 text is the whole body (no U+FFFD for a cut last character)."""
    return not text.endswith("\ufffd") or body.endswith(b"\xef\xbf\xbd")


def detect_charset(body: bytes, content_type: str | None) -> tuple[str, str]:
    """(Python codec, how it was chosen) for a page body; never raises.

    ``how`` is one of ``bom``, ``header``, ``meta``, ``mislabeled`` (a declared charset
    overridden because the body is valid UTF-8), ``utf-8`` (no usable declaration, the body is
    valid UTF-8 or ASCII), ``utf-8-lossy`` (mostly valid UTF-8, bad bytes replaced),
    ``windows-punctuation`` (no declaration, and the only non-ASCII bytes are quotes, dashes
    and the like that every Windows code page reads alike: Windows-1252 without detection),
    ``detected`` (charset-normalizer, or ISO-2022-JP escapes) or ``default`` (cp1252).
    Cost: this decodes the body; call ``decode_html`` if you also need the text.
    """
    codec, how, _, _ = _decide(bytes(body), content_type)
    return codec, how


def decode_html(body: bytes, content_type: str | None) -> str:
    """Unicode text of an HTML body. Never raises: bad bytes become U+FFFD."""
    return _decide(bytes(body), content_type)[2]


def decode_html_utf8(body: bytes, content_type: str | None) -> tuple[str, bytes | None]:
    """`decode_html`, and the body itself when it is exactly the text's UTF-8 (else None),
    so that a parser reading UTF-8 (lexbor) can take the bytes as they are instead of a new
    encoding of the text: an ASCII body in an ASCII-compatible charset, or a body decoded
    strictly as UTF-8, whole and without a byte order mark."""
    body = bytes(body)
    _, _, text, exact = _decide(body, content_type)
    return text, body if exact else None
