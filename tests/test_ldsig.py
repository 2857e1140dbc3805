"""Coates' estimated Levenshtein distance on signatures."""

from __future__ import annotations

import random

from rapidfuzz.distance import Levenshtein

from stream_dedup.core import ldsig
from stream_dedup.core.tokens import tokenize

_LETTERS = "etaoinshrdlcumwfgypbvkjxqz"
WORDS = [
    "".join(random.Random(i).choices(_LETTERS, weights=range(26, 0, -1), k=2 + i % 8))
    for i in range(3000)
]


def _text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


def _sig(text: str, c: int = 32, n: int = 4) -> tuple[bytes, int]:
    cp = tokenize(text).codepoints
    return ldsig.signature(cp, c, n), cp.shape[0]


def test_identical_texts_estimate_zero_and_length_is_about_len_over_c() -> None:
    text = _text(random.Random(1), 3000)
    sig, length = _sig(text)
    assert ldsig.estimate(sig, sig, 32) == 0
    assert 0.7 < len(sig) / (length / 32) < 1.3


def test_signature_is_local_embedding_changes_only_ends() -> None:
    rng = random.Random(2)
    core = _text(rng, 2000)
    inner, _ = _sig(core)
    outer, _ = _sig(_text(rng, 300) + " " + core + " " + _text(rng, 300))
    assert inner in outer or Levenshtein.distance(inner, outer) <= len(outer) - len(inner) + 4


def test_estimate_tracks_true_distance() -> None:
    rng = random.Random(3)
    base = _text(rng, 4000)
    sig_base, length = _sig(base)
    previous = -1.0
    for edits in (5, 50, 300):
        words = base.split()
        for _ in range(edits):
            words[rng.randrange(len(words))] = rng.choice(WORDS)
        changed = " ".join(words)
        true = Levenshtein.distance(tokenize(base).text, tokenize(changed).text)
        sig_changed, _ = _sig(changed)
        est = ldsig.estimate(sig_base, sig_changed, 32)
        # Few edits: close. Many scattered edits: Coates' known over-estimate (each edit
        # can flip the symbols of every window over it), still well below "unrelated".
        bound = 0.05 if edits <= 50 else 0.25
        assert abs(est - true) / length < bound, (edits, est, true)
        assert est >= previous
        previous = est


def test_unrelated_texts_are_far_apart() -> None:
    rng = random.Random(4)
    a, la = _sig(_text(rng, 3000))
    b, lb = _sig(_text(rng, 3000))
    assert ldsig.ratio(ldsig.estimate(a, b, 32), la, lb) > 0.6


def test_short_texts_have_empty_signatures() -> None:
    assert _sig("tiny")[0] == b""
    assert ldsig.ratio(0, 0, 0) == 0.0


def test_a_limit_keeps_every_estimate_at_or_below_it_exact() -> None:
    rng = random.Random(5)
    base = _text(rng, 3000)
    sig_base, length = _sig(base)
    seen_above = False
    for edits in (0, 10, 100, 400, 1500):
        words = base.split()
        for _ in range(edits):
            words[rng.randrange(len(words))] = rng.choice(WORDS)
        sig, _ = _sig(" ".join(words))
        exact = ldsig.estimate(sig_base, sig, 32)
        for limit in (0.0, 0.05 * length, 0.2 * length, exact, exact - 1, exact + 31):
            bounded = ldsig.estimate(sig_base, sig, 32, limit)
            if exact <= limit:
                assert bounded == exact, (edits, limit)
            else:
                assert bounded > limit, (edits, limit)
                seen_above = True
    assert seen_above
