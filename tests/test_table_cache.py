"""The tokenizer tables kept on disk between runs (workers/table_cache.py): loaded when they fit,
built again when they do not, and the same tokens either way. Each case is a fresh process:
the tables are per process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

TEXT = "Ünïcode ΣΊΣΥΦΟΣ straße ﬁne 東京タワー l'été Ⅻ"
SCRIPT = f"""
from stream_dedup.core.tokens import tokenize
from stream_dedup.workers.table_cache import load_tables, table_path
how = load_tables()
tokens = tokenize({TEXT!r})
print(how, table_path(), tokens.text, tokens.hashes.tolist())
"""


def run(cache: Path) -> tuple[str, Path, str]:
    env = {**os.environ, "STREAM_DEDUP_CACHE_DIR": str(cache)}
    out = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True,
                         text=True, timeout=120, check=True).stdout.split(" ", 2)
    return out[0], Path(out[1]), out[2]


def test_tables_are_built_once_then_loaded_with_the_same_tokens(tmp_path: Path) -> None:
    how, path, tokens = run(tmp_path)
    assert how == "built" and path.parent == tmp_path and path.is_file()
    again, same_path, same_tokens = run(tmp_path)
    assert (again, same_path, same_tokens) == ("loaded", path, tokens)
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary file left


def test_a_damaged_file_is_built_again(tmp_path: Path) -> None:
    _, path, tokens = run(tmp_path)
    path.write_bytes(path.read_bytes()[: 1 << 20])  # cut short (a full disk, a crash)
    how, _, again = run(tmp_path)
    assert (how, again) == ("built", tokens)
    assert run(tmp_path)[0] == "loaded"  # and stored whole again


def test_an_unwritable_directory_costs_only_the_build(tmp_path: Path) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    _, _, tokens = run(tmp_path / "ok")
    how, _, same = run(blocked / "cache")
    assert (how, same) == ("built", tokens)
