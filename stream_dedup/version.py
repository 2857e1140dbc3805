"""The version of stream-dedup (its own module: the metrics, the HTTP API and the command line
say it, and none of them should import the package's public API to learn it)."""

__version__ = "0.1.0"
