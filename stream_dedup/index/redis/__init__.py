"""The Redis backend of the feature index: one index many instances share (docs/scale-out.md).

backend.py is RedisIndex; layout.py the keys and values; client.py the connection and the
scripts (scripts.py, record_scripts.py, lua.py); lease.py, pages.py, reads.py and forget.py
the protocol's parts."""
