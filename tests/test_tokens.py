"""Canonical text and tokens."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from stream_dedup.core.tokens import token_strings, tokenize


def test_punctuation_case_and_spacing_do_not_matter() -> None:
    a = tokenize("Hello,   World! It's 2024.")
    b = tokenize("hello world it s 2024")
    assert a.text == b.text == "hello world it s 2024"
    assert a.hashes.tolist() == b.hashes.tolist()


def test_same_word_same_hash_anywhere() -> None:
    t = tokenize("rose is a rose is a rose")
    h = t.hashes.tolist()
    assert h[0] == h[3] == h[6] and h[1] == h[4] and h[2] == h[5]
    assert len(set(h)) == 3


def test_words_that_differ_hash_differently() -> None:
    t = tokenize("ab ba abc a b aa")
    assert len(set(t.hashes.tolist())) == 6


def test_cjk_characters_are_tokens_and_other_scripts_are_words() -> None:
    t = tokenize("東京都は日本の首都です。 Привет, мир! مرحبا بالعالم हिन्दी भाषा ภาษาไทย")
    toks = token_strings(t)
    assert toks[:4] == ["東", "京", "都", "は"]
    assert "привет" in toks and "мир" in toks and "مرحبا" in toks
    assert "हिन्दी" in toks  # combining marks stay inside the word
    assert "ภ" in toks  # Thai has no spaces either: one character per token
    assert len(t) == len(toks)


def test_nfkc_folds_compatibility_forms() -> None:
    assert tokenize("ﬁne Ｔｅｘｔ").text == tokenize("fine text").text


def test_empty_and_punctuation_only() -> None:
    assert len(tokenize("")) == 0
    assert len(tokenize(" .,;!? — … ")) == 0
    assert tokenize("...").text == ""


@settings(max_examples=200, deadline=None)
@given(st.text())
def test_any_text_tokenizes(text: str) -> None:
    t = tokenize(text)
    assert len(t) == len(token_strings(t))
    assert " " not in t.text.strip(" ") or "  " not in t.text
