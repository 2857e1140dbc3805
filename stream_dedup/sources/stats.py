"""What the readers of a replay's inputs saw (every reader counts into one `SourceStats`)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


@dataclass
class SourceStats:
    """What the readers saw, for the replay summary; updated as items are yielded."""

    files: int = 0
    records: int = 0  # archive records / non-blank JSONL lines, broken ones included
    pages: int = 0
    non_2xx: int = 0  # pages whose HTTP status is not 2xx (yielded all the same)
    revisits: int = 0  # revisit records yielded (decided against the version they name)
    skipped: Counter[str] = field(default_factory=Counter)  # record type, or "non-html"
    rejected: Counter[str] = field(default_factory=Counter)  # Rejected kind
    unreadable: list[str] = field(default_factory=list)  # "path: why", a file or its rest
    repeated: list[str] = field(default_factory=list)  # inputs given again, not read again
    # big archives one process had to read whole, being one gzip stream (replay/parts.py)
    unsplit: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, object]:
        return {k: dict(v) if isinstance(v, Counter) else v for k, v in vars(self).items()}

    def skipped_summary(self) -> dict[str, int]:
        """Skipped records by reason (record type or "non-html"), most frequent first."""
        return dict(self.skipped.most_common())
