"""Exceptions of stream-dedup.

    StreamDedupError                 root: everything we raise on purpose
    ├── ConfigError                  bad settings (never retriable)
    ├── IndexMismatchError           an index built with other sketch parameters
    ├── IndexStoreError              index directory missing/corrupt/unwritable
    ├── IndexUnavailable             a shared index cannot answer now (retriable)
    ├── KafkaDeliveryError           Kafka refused an operation for good (not retriable)
    └── PageError                    one bad input page; becomes a `reject` decision
                                     (`kind` is the decision's reason, e.g. "bad-json")

Library errors (selectolax, fastwarc, json, base64 ...) are translated into these once,
at the edge that calls the library; the core never sees a third-party exception.
"""

from __future__ import annotations


class StreamDedupError(Exception):
    """Root of every error stream-dedup raises on purpose."""

    retriable: bool = False


class ConfigError(StreamDedupError):
    """A setting is out of range or inconsistent."""


class IndexMismatchError(StreamDedupError):
    """An index was built with other sketch parameters; comparing would be meaningless."""


class IndexStoreError(StreamDedupError):
    """The index directory is missing, not an index, corrupt, or cannot be written (disk
    full). Nothing is overwritten; the service stops with a non-zero exit."""


class IndexUnavailable(StreamDedupError):
    """A shared index (Redis) cannot answer now: a node is down or failing over, or a page
    this batch must wait for is still being decided elsewhere. Nothing of the batch is
    final; deciding it again later is safe (every index step is idempotent)."""

    retriable = True


class KafkaDeliveryError(StreamDedupError):
    """Kafka refused an operation in a way retrying cannot fix (not authorized, an invalid
    topic name, an unsupported broker): the service stops with this message, and nothing
    after the last commit is committed. Retriable errors never become this."""


class PageError(StreamDedupError):
    """One input page cannot be processed. Becomes a `reject` decision, never a crash."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(f"{kind}: {message}")
        self.kind = kind
        self.message = message
