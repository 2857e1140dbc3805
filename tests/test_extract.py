"""Visible text: what is dropped, where words break, and what boilerplate mode removes.

All markup here is written for these tests.
"""

from __future__ import annotations

import html as htmllib
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stream_dedup.core.extract import visible_text

ARTICLE = (
    "The committee met on Tuesday to discuss the new bridge across the river. "
    "Engineers presented three designs, and residents asked about noise and traffic. "
    "A decision is expected after the public consultation closes next month. "
) * 3


def test_invisible_elements_are_dropped() -> None:
    html = (
        "<html><head><title>TitleWord</title><style>p{color:red}</style></head><body>"
        "alpha<script>var scriptword = 1;</script> beta"
        "<style>.stylerule{}</style><noscript>noscriptword</noscript>"
        "<template><p>templateword</p></template><!-- commentword -->"
        "<svg><text>svgword</text><title>svgtitle</title></svg>"
        "<math><mi>mathword</mi></math><iframe>iframeword</iframe>"
        "<object>objectword</object><video>videoword</video> gamma</body></html>"
    )
    assert visible_text(html) == "alpha beta gamma"


def test_noscript_in_head_does_not_leak_into_body() -> None:
    html = "<head><noscript><p>enable js</p></noscript></head><body><p>content</p></body>"
    assert visible_text(html) == "content"


def test_title_is_not_body_text() -> None:
    assert visible_text("<title>Site name</title><p>Body words</p>") == "Body words"
    assert visible_text("<body>a<title>stray title</title>b</body>") == "ab"


@pytest.mark.parametrize(
    ("html", "expected"),
    [
        ("<table><tr><td>a</td><td>b</td></tr><tr><td>c</td></tr></table>", "a b c"),
        ("<table><tr><th>head</th></tr><tr><td>cell</td></tr></table>", "head cell"),
        ("<p>x</p><p>y</p>", "x y"),
        ("<div>one</div><div>two</div>after", "one two after"),
        ("before<div>inside</div>", "before inside"),
        ("<ul><li>first</li><li>second</li></ul>", "first second"),
        ("<h1>Title</h1><p>Text</p>", "Title Text"),
        ("<dl><dt>term</dt><dd>definition</dd></dl>", "term definition"),
        ("line<br>break<hr>rule", "line break rule"),
        ("icon<img src=x>label", "icon label"),
        ("<select><option>red</option><option>blue</option></select>", "red blue"),
        ("<section>s</section><article>a</article><aside>b</aside>", "s a b"),
    ],
)
def test_word_breaking_elements_separate_words(html: str, expected: str) -> None:
    assert visible_text(html) == expected


@pytest.mark.parametrize(
    ("html", "expected"),
    [
        ("wo<b>rd</b>", "word"),
        ("<i>it</i><em>al</em><strong>ic</strong>", "italic"),
        ("un<span class=x>break</span>able", "unbreakable"),
        ("<a href=/x>lin</a>ked", "linked"),
        ("super<wbr>califragilistic", "supercalifragilistic"),
        ("com<!-- hidden -->ment", "comment"),
        ("H<sub>2</sub>O and E=mc<sup>2</sup>", "H2O and E=mc2"),
        ("<font color=red>f</font><x-custom>oo</x-custom>", "foo"),
        ("<ruby>漢<rp>(</rp><rt>kan</rt><rp>)</rp>字</ruby>", "漢字"),
    ],
)
def test_inline_elements_do_not_split_words(html: str, expected: str) -> None:
    assert visible_text(html) == expected


@pytest.mark.parametrize(
    ("html", "expected"),
    [
        ("<p>  many \n\t spaces&nbsp;&nbsp;and\u3000ideographic  </p>\n\n<p>\r\nnext</p>",
         "many spaces and ideographic next"),
        ("<p>fish &amp; chips &lt;3 &eacute;t&#233;</p>", "fish & chips <3 été"),
    ],
)  # fmt: skip
def test_whitespace_collapsed_and_entities_decoded(html: str, expected: str) -> None:
    assert visible_text(html) == expected


@pytest.mark.parametrize(
    "text",
    [
        "Привет, мир! Это проверка кириллицы.",
        "これは日本語の文章です。東京タワー",
        "这是中文网页的正文内容。",
        "مرحبا بالعالم، هذه صفحة عربية.",
        "שלום עולם",
        "한국어 문장입니다.",
        "नमस्ते दुनिया",
    ],
)
def test_non_latin_scripts_survive(text: str) -> None:
    html = f"<div><nav><a href=/>Home</a></nav><article><p>{text}</p></article></div>"
    assert visible_text(html) == f"Home {text}"
    assert visible_text(html, boilerplate=True) == text


# --- robustness ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("html", "expected"),
    [
        ("", ""),
        ("   \n ", ""),
        ("just text", "just text"),
        ("<p>unclosed <b>bold <i>both</p> after", "unclosed bold both after"),
        ("</div></p></body>stray ends<div>", "stray ends"),
        ("<table><tr>foster<td>cell", "foster cell"),
        ("<html><head><title>only head</title></head></html>", ""),
        ("<<<>>> < p >text", "<<<>>> < p >text"),
        ("<frameset><frame src=a></frameset>", ""),
        ("<frameset><noframes><p>No <b>fr</b>ames</p><p>here</p></noframes></frameset>",
         "No frames here"),
        ("<body><noframes>alternative</noframes>main</body>", "main"),
        ("a\udc80b", "ab"),  # lone surrogate from a careless caller
        ("a\x00b", "ab"),  # NUL in body text is dropped, as the HTML spec says
    ],
)  # fmt: skip
def test_broken_and_odd_documents(html: str, expected: str) -> None:
    assert visible_text(html) == expected
    visible_text(html, boilerplate=True)


def test_deep_nesting_is_parsed() -> None:
    html = "<div>" * 3000 + "deep" + "</div>" * 3000 + "<p>tail</p>"
    assert visible_text(html) == "deep tail"


def test_pathological_nesting_is_fast() -> None:
    # lexbor's tree builder is quadratic here: this would take ~1 min to parse.
    html = "<div>x" * 200_000 + "<script>hidden()</script><p>end &amp; done"
    start = time.perf_counter()
    text = visible_text(html, boilerplate=True)
    assert time.perf_counter() - start < 10
    assert text.startswith("x x x") and text.endswith("end & done")
    assert "hidden" not in text


def test_large_page() -> None:
    row = "<tr><td>cell {0}</td><td><a href='/{0}'>link {0}</a></td></tr>"
    html = "<table>" + "".join(row.format(i) for i in range(40_000)) + "</table>"
    assert len(html) > 1_000_000
    start = time.perf_counter()
    text = visible_text(html)
    assert time.perf_counter() - start < 5
    assert text.startswith("cell 0 link 0 cell 1 link 1") and text.endswith("link 39999")


# --- boilerplate mode ------------------------------------------------------------------------

SITE = f"""<html><body>
<header><a href="/">Logo</a><h2>Example Site</h2></header>
<nav><ul><li><a href="/a">About</a></li><li><a href="/b">Blog</a></li></ul></nav>
<div class="wrap">
  <aside><h3>Related</h3><p>Sidebar teaser text.</p></aside>
  <article>
    <header><h1>Bridge plans</h1><p>By A. Writer</p></header>
    <p>{ARTICLE}</p>
    <p>Read the <a href="/report">full report</a> for the details of the consultation.</p>
    <footer>Filed under: city</footer>
  </article>
  <div class="share"><a href="/fb">Facebook</a> | <a href="/tw">Twitter</a> |
    <a href="/m">Mail</a></div>
  <form action="/subscribe"><label>Email</label><input name=e><button>Subscribe</button></form>
  <div role="complementary">Complementary box</div>
  <div hidden>hidden attribute text</div>
  <div style="color: red; DISPLAY : none">display none text</div>
  <span aria-hidden="true">aria hidden text</span>
</div>
<footer><p>Copyright 2024 Example</p><a href="/privacy">Privacy</a></footer>
</body></html>"""


def test_default_mode_keeps_furniture() -> None:
    text = visible_text(SITE)
    furniture = "Logo About Sidebar Facebook Subscribe Copyright Complementary hidden display aria"
    for word in furniture.split():
        assert word in text, word
    assert ARTICLE.strip() in text


def test_boilerplate_mode_keeps_only_the_article() -> None:
    text = visible_text(SITE, boilerplate=True)
    expected = (
        "Bridge plans By A. Writer "
        + ARTICLE.strip()
        + " Read the full report for the details of the consultation. Filed under: city"
    )
    assert text == expected


def test_link_dense_lists_and_tables_go_but_prose_with_links_stays() -> None:
    links = "".join(f"<li><a href='/p{i}'>Product {i}</a></li>" for i in range(12))
    table = "<table><tr><td><a href=/x>Home</a></td><td><a href=/y>Shop</a></td></tr></table>"
    prose = "<p>We wrote about <a href='/b'>bridges</a> before; this is a much longer text.</p>"
    html = f"<body><ul>{links}</ul>{table}{prose}<div>{ARTICLE}</div></body>"
    text = visible_text(html, boilerplate=True)
    assert "Product" not in text and "Shop" not in text
    assert "We wrote about bridges before" in text and ARTICLE.strip() in text


def test_long_link_lists_are_kept() -> None:
    # A table of contents or reference list longer than _SHORT is content.
    toc = "".join(f"<li><a href='#s{i}'>Section {i}: a long descriptive heading</a></li>"
                  for i in range(60))  # fmt: skip
    html = f"<body><ol>{toc}</ol><p>{ARTICLE}</p></body>"
    assert "Section 59" in visible_text(html, boilerplate=True)


def test_main_content_inside_furniture_is_kept() -> None:
    # ASP.NET-style: the whole page sits in one <form>.
    html = (
        "<body><form id=aspnet><nav><a href=/>Home</a> <a href=/x>Other</a></nav>"
        f"<main><p>{ARTICLE}</p></main><footer>Legal</footer></form></body>"
    )
    assert visible_text(html, boilerplate=True) == ARTICLE.strip()


def test_furniture_holding_most_of_the_page_is_kept() -> None:
    html = f"<body><form><p>{ARTICLE}</p><button>Send</button></form><p>Short</p></body>"
    assert visible_text(html, boilerplate=True) == ARTICLE.strip() + " Short"
    hidden_until_js = f'<body><div style="display:none"><p>{ARTICLE}</p></div></body>'
    assert visible_text(hidden_until_js, boilerplate=True) == ARTICLE.strip()


def test_select_and_nav_go_even_when_they_dominate() -> None:
    options = "".join(f"<option>Country number {i}</option>" for i in range(100))
    html = f"<body><p>Pick one:</p><select>{options}</select></body>"
    assert visible_text(html, boilerplate=True) == "Pick one:"


def test_article_protected_only_when_there_is_no_main() -> None:
    teaser = "<aside><article><p>Teaser of another story</p></article></aside>"
    with_main = f"<body><main><p>{ARTICLE}</p></main>{teaser}</body>"
    without_main = f"<body><div><p>{ARTICLE}</p></div>{teaser}</body>"
    assert "Teaser" not in visible_text(with_main, boilerplate=True)
    assert "Teaser" in visible_text(without_main, boilerplate=True)


def test_navigation_goes_but_a_link_block_holding_most_of_the_page_stays() -> None:
    html = "<body><nav><a href=/a>Alpha</a> <a href=/b>Beta</a></nav><ul><li><a href=/c>C</a></ul>"
    assert visible_text(html) == "Alpha Beta C"
    assert visible_text(html, boilerplate=True) == "C"
    html += "<ul><li><a href=/d>D</a></ul>"  # now no single list holds more than half
    assert visible_text(html, boilerplate=True) == ""


# --- properties --------------------------------------------------------------------------------

words = st.text(
    alphabet=st.characters(whitelist_categories=("L", "N", "P", "S", "Zs")), max_size=200
)


@settings(max_examples=200, deadline=None)
@given(words)
def test_escaped_text_comes_back_whitespace_normalised(text: str) -> None:
    assert visible_text(f"<p>{htmllib.escape(text)}</p>") == " ".join(text.split())


fragments = st.lists(
    st.one_of(
        st.sampled_from([
            "<p>", "</p>", "<div>", "</div>", "<b>", "</b>", "<td>", "<table>", "<tr>", "<li>",
            "<script>", "</script>", "<!--", "-->", "<svg>", "<nav>", "</nav>", "<a href=x>",
            "</a>", "<frameset>", "<noframes>", "<form>", "<select>", "<option>", "&amp;", "&",
            "<style>", "<title>", "<template>", "<br>", "<main>", "<article>", "<", ">", "\x00",
            "<div hidden>", "<p style='display:none'>", "<header>", "<footer>", "<aside>",
        ]),
        st.text(max_size=12),
    ),
    max_size=60,
).map("".join)  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(fragments, st.booleans())
def test_any_markup_never_raises(html: str, boilerplate: bool) -> None:
    text = visible_text(html, boilerplate=boilerplate)
    assert text == " ".join(text.split())


# --- the nesting-depth guard: compiled scan vs the Python rule ----------------------------------
_DEPTH_PIECES = ["<div>", "</div>", "<p>", "</p>", "<li>", "<span>", "</span>", "<", "</", "<1",
                 "x", "é", "中", "<td>", "</DIV>", "<optgroup>", "<optgroups>", "<Col", "</col>",
                 "<a-b", "<x_y>", "<<div>", "</ div>"]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(_DEPTH_PIECES), max_size=120), st.sampled_from([0, 10, 40]))
def test_depth_scan_in_c_agrees_with_the_python_rule(pieces: list[str], min_tags: int) -> None:
    from stream_dedup.core import extract

    if extract._native is None:
        pytest.skip("compiled kernels not built")
    html = "".join(pieces)
    saved = extract._TAG_COUNT_CHECK, extract._MAX_DEPTH, extract._native
    # small limits, so that short strings exercise both answers
    extract._TAG_COUNT_CHECK, extract._MAX_DEPTH = min_tags, 6
    try:
        compiled = extract._too_deep(html)
        extract._native = None
        assert compiled == extract._too_deep(html), html
    finally:
        extract._TAG_COUNT_CHECK, extract._MAX_DEPTH, extract._native = saved


@pytest.mark.parametrize("html", [
    "<p>caf\u00e9 <b>cr\u00e8me</b></p><script>x</script>",
    "<html><body><td>\u4e2d\u6587</td><td>\U0001f600 text</td></body></html>",
    "<frameset><noframes><p>\u00fcber</p></noframes></frameset>",
    "<div>" * 3 + "\u00e9" * 40_000 + "</div>" * 3,
])
def test_utf8_given_gives_the_same_text(html: str) -> None:
    assert visible_text(html, utf8=html.encode()) == visible_text(html)
