"""The pure core: canonical text, tokens, shingles, sketches, features, the filter's theory.
No I/O, no clients.

`native` is the compiled kernels (_native.c and the files it lists), for code outside the
core that calls them; None when the package was installed without a C compiler, and every
caller has a numpy path that computes the same values.
"""

from types import ModuleType

native: ModuleType | None
try:
    from stream_dedup.core import _native as native
except ImportError:
    native = None
