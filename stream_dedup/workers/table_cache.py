"""The tokenizer's per-code-point tables, kept on disk between runs.

Every process that tokenizes builds them from Python's Unicode data (`core.tokens.tables`,
~0.4 s): most of the time of a replay of a small file. `serve` and `replay` load them from
here instead (~10 ms) and build and store them only when none fit:

    $STREAM_DEDUP_CACHE_DIR, else $XDG_CACHE_HOME/stream-dedup, else ~/.cache/stream-dedup
    tables-<key>.npz   key: the Unicode version and the source of core/tokens.py, so a Python
                       with other Unicode data, or other code, never reads tables it did not
                       build; written to a temporary file and renamed (never half a file)

A file that does not load as expected is built again; a directory that cannot be written
costs only the build (said at debug level).
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
import unicodedata
import zipfile
from pathlib import Path

import numpy as np

from stream_dedup.core import tokens

log = logging.getLogger("stream_dedup")
_DTYPES = {"classes": np.uint8, "fold": np.uint32, "multi": np.uint32}


def cache_dir() -> Path:
    given = os.environ.get("STREAM_DEDUP_CACHE_DIR")
    if given:
        return Path(given)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "stream-dedup"


def table_path() -> Path:
    source = Path(tokens.__file__).read_bytes()
    key = hashlib.sha256(unicodedata.unidata_version.encode() + b"\0" + source).hexdigest()
    return cache_dir() / f"tables-{key[:16]}.npz"


def load_tables() -> str:
    """Make this process's tokenizer use the stored tables, or build them and store them.
    Returns "loaded" or "built"."""
    path = table_path()
    try:
        with np.load(path) as stored:
            arrays = {name: stored[name] for name in _DTYPES}
            version = str(stored["version"])
        if (all(arrays[name].dtype == dtype for name, dtype in _DTYPES.items())
                and tokens.adopt_tables(version, arrays["classes"], arrays["fold"],
                                        arrays["multi"])):
            return "loaded"
        log.debug("tokenizer tables at %s do not fit this Python: building them", path)
    except FileNotFoundError:
        pass
    except (OSError, ValueError, KeyError, zipfile.BadZipFile) as exc:
        log.debug("tokenizer tables at %s unreadable (%s): building them", path, exc)
    version, classes, fold, multi = tokens.tables()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tables-", suffix=".npz")
        try:
            with os.fdopen(fd, "wb") as out:
                np.savez(out, version=np.array(version), classes=classes, fold=fold,
                         multi=multi)
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    except OSError as exc:
        log.debug("could not keep the tokenizer tables in %s: %s", path.parent, exc)
    return "built"
