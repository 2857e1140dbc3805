"""stream-dedup: a streaming near-duplicate filter for web crawls.

    from stream_dedup import Deduplicator, Settings
    dedup = Deduplicator(Settings(verify_rate=1.0))
    decision = dedup.check_html("https://example.com/a", html)
    decision.decision, decision.reason      # ("drop", "near"), ("keep", "unique") ...
"""

from .config import Settings
from .models import Decision, DuplicateOf, Page, Rejected
from .pipeline import Deduplicator

__version__ = "0.1.0"
__all__ = ["Decision", "Deduplicator", "DuplicateOf", "Page", "Rejected", "Settings", "__version__"]
