"""The compiled kernels (stream_dedup/core/_native.c and the files it lists); everything else
is in pyproject.toml.

`optional=True`: without a C compiler the package still installs and runs on its numpy code,
which computes the same values more slowly.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "stream_dedup.core._native",
            [f"stream_dedup/core/{name}.c"
             for name in ("_native", "_tokens", "_ascii", "_sketch", "_ldsig", "_memtable", "_deep",
                          "_nesting", "_tree", "_names")],
            depends=["stream_dedup/core/_native.h", "stream_dedup/core/_nesting.h",
                     "stream_dedup/core/_tokens.h"],
            extra_compile_args=["-O3", "-std=c11"],
            optional=True,
        )
    ]
)
