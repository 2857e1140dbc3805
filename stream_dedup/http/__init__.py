"""The HTTP API: aiohttp routes (app.py) and a threaded server for synchronous callers."""

from stream_dedup.http.app import STATE, ApiState, Check, build_app

__all__ = ["STATE", "ApiState", "Check", "build_app"]
