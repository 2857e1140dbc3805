"""stream-dedup: a streaming near-duplicate filter for web crawls.

    from stream_dedup import Deduplicator, Settings
    dedup = Deduplicator(Settings(verify_rate=1.0))
    decision = dedup.check_html("https://example.com/a", html)
    decision.decision, decision.reason      # ("drop", "near"), ("keep", "unique") ...
"""

import os as _os
import sys as _sys

# The command line (`stream-dedup`, `python -m stream_dedup`, whose package is imported while
# sys.argv[0] is "-m") uses no BLAS: numpy's OpenBLAS would start a thread a CPU at import,
# spinning 0.1-0.2 s of CPU for nothing. A library user's process keeps its own setting.
if _sys.argv[:1] == ["-m"] or _os.path.basename(_sys.argv[0] if _sys.argv else "") == \
        "stream-dedup":
    _os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    if _sys.argv[1:2] == ["serve"]:  # a SIGTERM from now on stops it (runner/signals.py)
        from stream_dedup.runner.signals import SIGNALS as _SIGNALS

        _SIGNALS.install()

from stream_dedup.config import Settings  # noqa: E402
from stream_dedup.models import Decision, DuplicateOf, Page, Rejected  # noqa: E402
from stream_dedup.pipeline.deduplicator import Deduplicator  # noqa: E402
from stream_dedup.version import __version__  # noqa: E402

__all__ = ["Decision", "Deduplicator", "DuplicateOf", "Page", "Rejected", "Settings", "__version__"]
