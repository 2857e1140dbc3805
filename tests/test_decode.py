"""Charset choice: BOM > HTTP header > <meta> prescan > UTF-8 > detection > cp1252.

Every sample is text written here and encoded on the spot, so each test states exactly which
bytes it feeds in.
"""

from __future__ import annotations

import codecs
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stream_dedup.core.decode import (
    _WINDOWS_COMMON,
    _detect,
    decode_html,
    decode_html_utf8,
    detect_charset,
    lookup_label,
)

RUSSIAN = (
    "Москва - столица России, город федерального значения, административный центр "
    "Центрального федерального округа. Крупнейший по численности населения город России. "
)
JAPANESE = "日本語のテキストです。これはテストです。東京は日本の首都です。" * 3
CHINESE = "中文网页内容测试，这是一个简单的句子。我们今天去北京。" * 3
HOWS = {"bom", "header", "meta", "mislabeled", "utf-8", "utf-8-lossy", "windows-punctuation",
        "detected", "default"}


def page(text: str, head: str = "") -> str:
    return f"<html><head>{head}</head><body><p>{text}</p></body></html>"


# --- labels ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("label", "codec"),
    [
        ("iso-8859-1", "cp1252"),
        ("latin1", "cp1252"),
        ("Latin-1", "cp1252"),
        ("US-ASCII", "cp1252"),
        ("windows-1252", "cp1252"),
        ("gb2312", "gb18030"),
        ("GBK", "gb18030"),
        ("x-sjis", "cp932"),
        ("Shift_JIS", "cp932"),
        ("euc-kr", "cp949"),
        ("utf8", "utf-8"),
        ("UTF-8", "utf-8"),
        (" 'utf-8' ", "utf-8"),
        ("koi8-r", "koi8-r"),
        ("windows-1251", "cp1251"),
        ("big5", "big5hkscs"),
        (b"EUC-JP", "euc_jp"),
    ],
)
def test_whatwg_labels(label: str | bytes, codec: str) -> None:
    assert lookup_label(label) == codec


@pytest.mark.parametrize("label", ["", None, "foo-bar", "utf-7", "rot13", "base64", "x-garbage"])
def test_unknown_labels(label: str | None) -> None:
    assert lookup_label(label) is None


# --- order of sources --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("bom", "encoding", "codec"),
    [
        (codecs.BOM_UTF8, "utf-8", "utf-8"),
        (codecs.BOM_UTF16_LE, "utf-16-le", "utf-16-le"),
        (codecs.BOM_UTF16_BE, "utf-16-be", "utf-16-be"),
    ],
)
def test_bom_beats_header_and_meta(bom: bytes, encoding: str, codec: str) -> None:
    html = page("Привет, мир", head='<meta charset="windows-1251">')
    body = bom + html.encode(encoding)
    assert detect_charset(body, "text/html; charset=ISO-8859-1") == (codec, "bom")
    assert decode_html(body, "text/html; charset=ISO-8859-1") == html  # BOM itself dropped


def test_header_beats_meta() -> None:
    body = page(RUSSIAN, head='<meta charset="koi8-r">').encode("cp1251")
    assert detect_charset(body, "text/html; charset=windows-1251") == ("cp1251", "header")
    assert RUSSIAN in decode_html(body, "text/html; charset=windows-1251")


@pytest.mark.parametrize(
    "content_type",
    [
        'text/html; charset="Shift_JIS"',
        "text/html;charset=shift_jis",
        "text/html; CHARSET = 'x-sjis' ; q=1",
    ],
)
def test_header_parameter_forms(content_type: str) -> None:
    body = page(JAPANESE).encode("shift_jis")
    assert detect_charset(body, content_type) == ("cp932", "header")
    assert JAPANESE in decode_html(body, content_type)


@pytest.mark.parametrize(
    "meta",
    [
        '<meta charset="koi8-r">',
        "<META CHARSET=KOI8-R>",
        "<meta charset = 'koi8-r' />",
        '<meta name="x" charset=" koi8-r ">',
        '<meta http-equiv="Content-Type" content="text/html; charset=koi8-r">',
        "<meta content='text/html;charset=KOI8-R' http-equiv=content-type>",
        '<meta http-equiv="content-type" content="text/html; charset = \'koi8-r\'">',
    ],
)
def test_meta_prescan_forms(meta: str) -> None:
    body = page(RUSSIAN, head=meta).encode("koi8-r")
    assert detect_charset(body, "text/html") == ("koi8-r", "meta")
    assert RUSSIAN in decode_html(body, None)


def test_meta_in_comment_is_ignored_and_first_known_label_wins() -> None:
    head = '<!-- <meta charset="koi8-r"> --><meta charset="bogus"><meta charset="windows-1251">'
    body = page(RUSSIAN, head=head).encode("cp1251")
    assert detect_charset(body, None) == ("cp1251", "meta")


def test_meta_beyond_prescan_window_is_ignored() -> None:
    head = "<!--" + "x" * 5000 + '--><meta charset="koi8-r">'
    body = page("plain ascii and " + RUSSIAN, head=head).encode("utf-8")
    assert detect_charset(body, None) == ("utf-8", "utf-8")


def test_http_equiv_other_than_content_type_is_ignored() -> None:
    head = '<meta http-equiv="refresh" content="0; charset=koi8-r">'
    body = page(RUSSIAN, head=head).encode("utf-8")
    assert detect_charset(body, None) == ("utf-8", "utf-8")


def test_unknown_header_label_falls_through_to_meta() -> None:
    body = page(RUSSIAN, head='<meta charset="windows-1251">').encode("cp1251")
    assert detect_charset(body, "text/html; charset=no-such-charset") == ("cp1251", "meta")


def test_meta_utf16_means_utf8() -> None:
    body = page("Ünïcödé", head='<meta charset="utf-16">').encode("utf-8")
    assert detect_charset(body, None) == ("utf-8", "meta")
    assert "Ünïcödé" in decode_html(body, None)


def test_utf16_header_without_nul_bytes_is_ignored() -> None:
    body = page("Ünïcödé").encode("utf-8")
    assert detect_charset(body, "text/html; charset=utf-16") == ("utf-8", "utf-8")


def test_utf16_header_on_utf16_body() -> None:
    html = page("Ünïcödé")
    assert decode_html(html.encode("utf-16-le"), "text/html; charset=UTF-16") == html


def test_latin1_label_means_windows_1252() -> None:
    body = page("\u201cquoted\u201d \u2013 caf\u00e9").encode("cp1252")
    assert b"\x93" in body
    text = decode_html(body, "text/html; charset=iso-8859-1")
    assert "\u201cquoted\u201d \u2013 caf\u00e9" in text  # not C1 control characters


# --- mislabels ---------------------------------------------------------------------------------


def test_utf8_labelled_latin1_is_utf8() -> None:
    body = page(RUSSIAN).encode("utf-8")
    assert detect_charset(body, "text/html; charset=ISO-8859-1") == ("utf-8", "mislabeled")
    assert RUSSIAN in decode_html(body, "text/html; charset=ISO-8859-1")


def test_utf8_labelled_shift_jis_is_utf8_when_shift_jis_fails() -> None:
    body = page(JAPANESE).encode("utf-8")
    with pytest.raises(UnicodeDecodeError):
        body.decode("cp932")
    assert detect_charset(body, "text/html; charset=shift_jis") == ("utf-8", "mislabeled")


def test_valid_declared_multibyte_charset_is_trusted() -> None:
    body = page(CHINESE, head='<meta charset="gb2312">').encode("gb18030")
    assert detect_charset(body, None) == ("gb18030", "meta")
    assert CHINESE in decode_html(body, None)


def test_broken_declared_charset_decodes_with_replacement() -> None:
    body = page("caf\u00e9 cr\u00e8me").encode("latin-1")  # not UTF-8
    assert detect_charset(body, "text/html; charset=utf-8") == ("utf-8", "header")
    text = decode_html(body, "text/html; charset=utf-8")
    assert "caf\ufffd cr\ufffdme" in text


# --- no declaration ----------------------------------------------------------------------------


def test_ascii_is_utf8() -> None:
    assert detect_charset(b"<p>hello</p>", None) == ("utf-8", "utf-8")
    assert decode_html(b"", None) == ""


def test_valid_utf8_without_declaration() -> None:
    body = page(RUSSIAN + JAPANESE).encode("utf-8")
    assert detect_charset(body, "text/html") == ("utf-8", "utf-8")


def test_utf8_cut_mid_character_stays_utf8() -> None:
    body = page(RUSSIAN).encode("utf-8")[:-16] + "Ж".encode()[:1]
    assert detect_charset(body, None) == ("utf-8", "utf-8")
    assert decode_html(body, None).endswith("\ufffd")


def test_mostly_utf8_with_a_bad_byte() -> None:
    body = page(RUSSIAN * 3).encode("utf-8").replace(b"<p>", b"<p>\xff", 1)
    assert detect_charset(body, None) == ("utf-8", "utf-8-lossy")
    assert decode_html(body, None).count("\ufffd") == 1


@pytest.mark.parametrize(
    ("text", "encoding", "codec"),
    [
        (RUSSIAN * 2, "cp1251", "cp1251"),
        (RUSSIAN * 2, "koi8-r", "koi8-r"),
        (JAPANESE, "shift_jis", "cp932"),
        (JAPANESE, "euc_jp", "euc_jp"),
        (CHINESE, "gb18030", "gb18030"),
    ],
)
def test_detection_without_any_declaration(text: str, encoding: str, codec: str) -> None:
    body = page(text).encode(encoding)
    assert detect_charset(body, "text/html") == (codec, "detected")
    assert text in decode_html(body, "text/html")


def test_english_with_curly_quotes_reads_as_windows_1252_without_detection() -> None:
    text = "It\u2019s the \u201cbest\u201d offer \u2013 really\u2026 " * 20
    body = page(text).encode("cp1252")
    assert detect_charset(body, None) == ("cp1252", "windows-punctuation")
    assert text in decode_html(body, None)


@pytest.mark.parametrize("seed", range(12))
def test_windows_punctuation_is_the_text_detection_gives(seed: int) -> None:
    """The shortcut against what it skips: charset-normalizer's choice for ASCII text with
    the shared Windows punctuation scattered in reads it as the same text."""
    rng = random.Random(seed)
    words = [rng.choice(["the", "offer", "page", "crawl", "It", "best", "a", "of"])
             for _ in range(rng.randrange(20, 400))]
    for _ in range(rng.randrange(1, 30)):
        at = rng.randrange(len(words))
        words[at] = rng.choice(["\u201c%s\u201d", "\u2018%s\u2019", "%s\u2026", "%s \u2013",
                                "%s\u2014", "\u2022 %s", "%s\xa0"]) % words[at]
    body = page(" ".join(words)).encode("cp1252")
    detected = _detect(body)
    assert detected is not None
    assert body.decode(detected) == decode_html(body, None)
    assert detect_charset(body, None) == ("cp1252", "windows-punctuation")


def test_the_shared_punctuation_reads_alike_in_every_windows_code_page() -> None:
    pages = [f"cp{n}" for n in range(1250, 1259)] + ["cp874"]
    high = bytes(b for b in _WINDOWS_COMMON if b >= 0x80)
    assert len({high.decode(codec) for codec in pages}) == 1
    for b in set(range(0x80, 0x100)) - set(high):  # and no other byte does
        assert len({bytes([b]).decode(codec, "replace") for codec in pages}) > 1


def test_a_letter_beyond_the_shared_punctuation_is_still_detected() -> None:
    body = page("Caf\u00e9 \u201cbest\u201d " * 20).encode("cp1252")
    assert detect_charset(body, None)[1] == "detected"


def test_iso2022jp_escapes_in_ascii_body() -> None:
    body = page(JAPANESE).encode("iso2022_jp")
    assert body.isascii()
    assert detect_charset(body, None) == ("iso2022_jp", "detected")
    assert JAPANESE in decode_html(body, None)


def test_undetectable_bytes_fall_back_to_windows_1252() -> None:
    body = bytes(range(128, 256))  # every high byte once: no charset explains it
    assert detect_charset(body, None) == ("cp1252", "default")
    assert decode_html(body, None) == body.decode("cp1252", "replace")


# --- never raises ------------------------------------------------------------------------------

labels = st.sampled_from(["utf-8", "utf-16", "shift_jis", "koi8-r", "gbk", "bogus", "", "'"])
content_types = st.one_of(
    st.none(),
    st.text(max_size=40),
    labels.map(lambda label: f"text/html; charset={label}"),
)
bodies = st.one_of(
    st.binary(max_size=2000),
    st.tuples(labels, st.binary(max_size=300)).map(
        lambda t: b"<meta charset=" + t[0].encode() + b">" + t[1]
    ),
    st.tuples(st.sampled_from([codecs.BOM_UTF8, codecs.BOM_UTF16_LE, b"\x1b$B"]), st.binary()).map(
        lambda t: t[0] + t[1]
    ),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=bodies, content_type=content_types)
def test_any_bytes_never_raise(body: bytes, content_type: str | None) -> None:
    codec, how = detect_charset(body, content_type)
    assert how in HOWS
    codecs.lookup(codec)
    text = decode_html(body, content_type)
    assert isinstance(text, str)
    text.encode("utf-8")  # no lone surrogates


@settings(max_examples=200, deadline=None)
@given(st.text().filter(lambda s: not s.startswith("\ufeff") and "\x1b" not in s))
def test_undeclared_utf8_round_trips(text: str) -> None:
    assert decode_html(text.encode("utf-8"), None) == text


utf8_bodies = st.one_of(
    bodies,
    st.text(max_size=300).map(lambda t: t.encode("utf-8")),
    st.text(min_size=1, max_size=100).map(lambda t: t.encode("utf-8")[:-1]),  # cut mid-char
    st.text(max_size=100).map(lambda t: t.encode("utf-8") + b"\xef\xbf\xbd"),  # U+FFFD spelt
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=utf8_bodies, content_type=content_types)
def test_utf8_passthrough_is_the_texts_utf8(body: bytes, content_type: str | None) -> None:
    # The parser is given these bytes instead of the text: they must be exactly its UTF-8.
    text, utf8 = decode_html_utf8(body, content_type)
    assert text == decode_html(body, content_type)
    assert utf8 is None or utf8 == text.encode("utf-8")


@pytest.mark.parametrize(
    ("body", "content_type", "passed"),
    [
        (b"<p>plain</p>", "text/html; charset=iso-8859-1", True),  # ASCII: any such charset
        ("<p>caf\u00e9</p>".encode(), None, True),
        ("<p>caf\u00e9</p>".encode()[:-5], None, False),  # cut inside the last character
        (b"<p>caf\xe9</p>", "text/html; charset=windows-1252", False),  # a new encoding
        (codecs.BOM_UTF8 + b"<p>x</p>", None, False),  # the BOM is not text
        ("<p>caf\u00e9 \ufffd</p>".encode(), None, True),  # U+FFFD in the page itself
        (b"<p>a\xff\xfe b</p>" + "\u00e9".encode() * 20, None, False),  # lossy: bytes replaced
    ],
)
def test_utf8_passthrough_cases(body: bytes, content_type: str | None, passed: bool) -> None:
    assert (decode_html_utf8(body, content_type)[1] is not None) == passed
