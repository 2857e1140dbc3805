"""The decide step's containment rules (decide/step.py calls `containment` for every page
with features it decided, when containment is on), pure. Broder's c(A, B) = |S(A) ∩ S(B)|
/ |S(A)|, measured on the stored shingle sets; the candidates come from the containment
keys (core/contain.py):

    a keep ─> inside an earlier kept page (c >= contain_min)? ─> drop `contained`
              else `contains`: the earlier kept pages at least that much inside it
    a verified near / near-verified drop ─> inside the page it names, which is not as
              much inside it (an excerpt, not a version)? ─> `contained`
"""

from __future__ import annotations

from dataclasses import replace
from time import perf_counter

import numpy as np

from stream_dedup.config import Settings
from stream_dedup.core.contain import deep_keys
from stream_dedup.core.sketch import overlap
from stream_dedup.decide.verdicts import Analysis, BatchDocs, Overlay, Verdict, drop_verdict
from stream_dedup.index.base import contain_candidates
from stream_dedup.models import CONTAINED, NEAR, NEAR_VERIFIED, Contained


def containment(a: Analysis, v: Verdict, postings: list[list[int]], nc: int, docs: BatchDocs,
                overlay: Overlay, s: Settings, gone: set[int],
                verified: list[tuple[int, int]]) -> Verdict:
    """A page about to be kept: dropped as `contained` when at least contain_min of its
    shingles are in an earlier kept page, else `contains` lists the earlier kept pages that
    much inside it. Candidates: the pages sharing a containment key (not one of a site's
    template: fewer than contain_common pages share it), most keys shared first, then
    oldest; measured on the shingle sets (exactly, or their MOD-m samples).
    A verified near drop (`verified`: the candidates it was verified among) of a page at
    least contain_min inside the one it names, which is not as much inside it, is an
    excerpt of that page, and says so: `contained` (its other figures kept)."""
    if v.doc is None:
        return _excerpt(a, v, docs, s, verified)
    # A kept page stores its first contain_keys containment keys (the others only asked)
    # and its deep keys
    stored = v.doc.features[: v.doc.features.shape[0] - nc + s.contain_keys]
    v.doc.features = np.concatenate((stored, deep_keys(a.shingles, s.contain_keys,
                                                       s.contain_sample))) \
        if s.deep_asked else stored
    ranked = contain_candidates(postings, nc, s.contain_common, gone) if a.shingles else []
    if not ranked:
        return v
    started = perf_counter()
    inside: list[Contained] = []
    for handle in ranked[: s.contain_max_candidates]:
        doc = docs[handle]
        if not doc.shingles:
            continue
        n_a, n_b, common = overlap(a.shingles, doc.shingles)
        if n_a and common >= s.contain_min * n_a and a.shingle_count >= s.contain_min_shingles:
            dropped = drop_verdict(a, CONTAINED, handle, docs, overlay,
                            jaccard=common / (n_a + n_b - common), verified=True,
                            containment=round(common / n_a, 4))
            dropped.verify_s = v.verify_s + perf_counter() - started
            return dropped
        if n_b >= s.contain_min_shingles and common >= s.contain_min * n_b:
            inside.append(Contained(doc.page_id, doc.url, round(common / n_b, 4)))
    if inside:
        assert v.decision is not None
        inside.sort(key=lambda c: -c.containment)
        v.decision = replace(v.decision, contains=tuple(inside))
    v.verify_s += perf_counter() - started
    return v


def _excerpt(a: Analysis, v: Verdict, docs: BatchDocs, s: Settings,
             verified: list[tuple[int, int]]) -> Verdict:
    """A verified `near` or `near-verified` drop relabelled `contained` when the page is at
    least contain_min inside the page it names and that page not as much inside it: one
    inside the other, not two versions of one text (each that much inside the other stays
    `near`). The record is the one verification read: the first of `verified` with that
    page id."""
    d = v.decision
    if d is None or not d.verified or d.reason not in (NEAR, NEAR_VERIFIED) \
            or d.duplicate_of is None or not a.shingles \
            or a.shingle_count < s.contain_min_shingles:
        return v
    for handle, _ in verified[: s.verify_max_candidates]:
        doc = docs[handle]
        if doc.page_id != d.duplicate_of.page_id:
            continue
        if not doc.shingles:
            return v
        n_a, n_b, common = overlap(a.shingles, doc.shingles)
        if common >= s.contain_min * n_a and common < s.contain_min * n_b:
            v.decision = replace(d, reason=CONTAINED, containment=round(common / n_a, 4))
        return v
    return v
