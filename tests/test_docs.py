"""The README and docs/ show commands that work: each `stream-dedup` command parses, and
the html example's messages go to a topic a `serve --input-format html` reads."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from stream_dedup.cli.main import build_parser

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def _shell_lines(path: Path) -> list[str]:
    """The lines of every shell block (sh, bash, shell, console), continuation lines
    joined, comments cut."""
    lines = []
    for block in re.findall(r"```(?:sh|bash|shell|console)\n(.*?)```", path.read_text(), re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = re.sub(r"\s#\s.*$", "", line).strip()
            if line and not line.startswith("#"):
                lines.append(line)
    return lines


def _commands(path: Path) -> list[list[str]]:
    """Each `stream-dedup ...` command in the shell blocks, as argv (after the program)."""
    return [argv for line in _shell_lines(path) for argv in _line_commands(line)]


def _line_commands(line: str) -> list[list[str]]:
    """The `stream-dedup ...` commands of one shell line, as argv (after the program)."""
    found = []
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    words: list[str] = []
    for token in [*lexer, ";"]:
        if token not in ("&&", "||", "|", ";", "&", ">", "<"):
            words.append(token)
            continue
        while words and "=" in words[0] and not words[0].startswith("-"):
            words = words[1:]  # VAR=value before the command
        if words[:1] == ["stream-dedup"]:
            found.append(words[1:])
        words = []
    return found


def _mentioning(path: Path) -> list[str]:
    """The shell lines that run `stream-dedup` (as a word, not `stream-dedup-...`)."""
    return [line for line in _shell_lines(path)
            if re.search(r"(?:^|[\s;&|(])stream-dedup(?=\s|$)", line)]


# The docs that show commands (found without the parser under test)
SHOWING = [path for path in DOCS if _mentioning(path)]


def test_the_docs_show_commands_to_check() -> None:
    assert REPO / "README.md" in SHOWING and len(SHOWING) >= 3, [p.name for p in SHOWING]


@pytest.mark.parametrize("path", SHOWING, ids=lambda p: p.name)
def test_every_documented_command_parses(path: Path) -> None:
    """Every shell line that runs stream-dedup yields its command(s), and each parses: a
    line the extraction missed fails here rather than going unchecked."""
    missed = [line for line in _mentioning(path) if not _line_commands(line)]
    assert not missed, f"{path.name}: commands not extracted, so not checked: {missed}"
    checked = 0
    for argv in _commands(path):
        if "--help" in argv:
            continue
        build_parser().parse_args(argv)  # exits (SystemExit) on an unknown flag or choice
        checked += 1
    assert checked, f"{path.name} runs stream-dedup, but no command of it was checked"


def test_the_readme_html_example_is_read_as_html() -> None:
    lines = _shell_lines(REPO / "README.md")
    sends = [shlex.split(line) for line in lines
             if line.startswith("kcat -P") and "text/html" in line]
    html_topics = {words[words.index("-t") + 1] for words in sends}
    served = {args[args.index("--input-topic") + 1] for args in _commands(REPO / "README.md")
              if args[:1] == ["serve"] and "--input-format" in args
              and args[args.index("--input-format") + 1] == "html"}
    assert html_topics and html_topics <= served
