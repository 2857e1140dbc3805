"""The compiled walk over lexbor's tree against the ways of getting visible text without it.

Per corpus, microseconds a page (best of --passes, each pass over every page) and how often
the text gives the same tokens as ours (`tokens.tokenize` hashes equal), with the mean token-set
Jaccard similarity where it does not:

* parse only                   lexbor's parse through selectolax: the floor for all but resiliparse
* ours (compiled walk)         extract.visible_text: parse + one C walk through lexbor's accessors
* selectolax, Python walk      the same rule through selectolax's API (extract._walk + text())
* selectolax, traversal        a depth-first walk over node.child / node.next in Python
* resiliparse HTML2Text        its own lexbor parse and extract_plain_text (main_content=False);
                               needs `pip install resiliparse` (skipped without it)

    python bench/walk_alternatives.py [--passes 3] [--synthetic-pages 400]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import benchlib  # noqa: E402
from benchlib import table  # noqa: E402

from stream_dedup.core import extract, tokens  # noqa: E402
from stream_dedup.core.decode import decode_html  # noqa: E402

try:
    from resiliparse.extract.html2text import extract_plain_text
    from resiliparse.parse.html import HTMLTree
except ImportError:
    HTMLTree = None


def ours(html: str) -> str:
    return extract.visible_text(html)


def python_walk(html: str) -> str:
    extract.NATIVE_WALK = False
    try:
        return extract.visible_text(html)
    finally:
        extract.NATIVE_WALK = True


def parse_only(html: str) -> str:
    extract._parse(html)
    return ""


def traversal(html: str) -> str:
    """The rule of extract with selectolax's node navigation instead of the C walk."""
    tree = extract._parse(html)
    body = tree.body
    if body is None:
        return extract.visible_text(html)
    out: list[str] = []
    drop, brk = extract._INVISIBLE_IDS, extract._BREAKING_IDS
    todo = [body.child]
    while todo:
        node = todo.pop()
        while node is not None:
            tag = node.tag_id
            if tag == 2:  # a text node
                out.append(node.text_content or "")
            elif tag not in drop:
                if tag in brk:
                    out.append(" ")
                    todo.append(node.next)
                    todo.append(None)  # the space after it, when its subtree is done
                    node = node.child
                    continue
                if node.child is not None:
                    todo.append(node.next)
                    node = node.child
                    continue
            node = node.next
        if todo and todo[-1] is None:
            todo.pop()
            out.append(" ")
    return " ".join("".join(out).split())


def resiliparse(html: str) -> str:
    tree = HTMLTree.parse(html)
    return extract_plain_text(
        tree, main_content=False, preserve_formatting=False, alt_texts=False, links=False,
        form_fields=False, noscript=False,
    )  # fmt: skip


METHODS: dict[str, Callable[[str], str]] = {
    "parse only": parse_only,
    "ours (compiled walk)": ours,
    "selectolax, Python walk": python_walk,
    "selectolax, traversal": traversal,
}
if HTMLTree is not None:
    METHODS["resiliparse HTML2Text"] = resiliparse


def _jaccard(a: str, b: str) -> float:
    x, y = set(tokens.tokenize(a).hashes.tolist()), set(tokens.tokenize(b).hashes.tolist())
    return len(x & y) / len(x | y) if x | y else 1.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--synthetic-pages", type=int, default=400)
    ap.add_argument("--cpu", type=int, default=None)
    args = ap.parse_args()
    cpu = benchlib.pin(args.cpu)
    print(benchlib.header(f"bench/walk_alternatives.py (pinned to CPU {cpu})"))
    warc, _ = benchlib.load_warc_pages()
    corpora = {
        "WARC": [decode_html(p.body, p.header("content-type")) for p in warc],
        "synthetic": [p.body.decode() for p in benchlib.synthetic_pages(args.synthetic_pages)],
    }
    rows = []
    for corpus, pages in corpora.items():
        reference = [ours(h) for h in pages]
        ref_tokens = [tokens.tokenize(t).hashes.tolist() for t in reference]
        for name, method in METHODS.items():
            best = float("inf")
            for _ in range(args.passes):
                start = time.perf_counter()
                for html in pages:
                    method(html)
                best = min(best, time.perf_counter() - start)
            same = jac = 0.0
            if name != "parse only":
                texts = [method(h) for h in pages]
                pairs = list(zip(texts, reference, ref_tokens, strict=True))
                same = sum(tokens.tokenize(t).hashes.tolist() == r for t, _, r in pairs)
                same /= len(pairs)
                jac = sum(_jaccard(t, ref) for t, ref, _ in pairs) / len(pairs)
            rows.append([corpus, name, f"{best / len(pages) * 1e6:.0f}",
                         "" if name == "parse only" else f"{same:.1%}",
                         "" if name == "parse only" else f"{jac:.3f}"])  # fmt: skip
    print(table(["corpus", "method", "µs/page", "same tokens", "mean Jaccard"], rows))


if __name__ == "__main__":
    main()
