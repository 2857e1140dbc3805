#!/usr/bin/env bash
# The compiled kernels under AddressSanitizer + UndefinedBehaviorSanitizer.
#
# Builds a sanitizer copy of the extension (stream_dedup/core/_native.c and its files) in a
# temporary copy of the package (the in-place build the normal test run uses is left alone)
# and runs the kernel tests, the nesting model's tests, the containment keys' kernel against its
# numpy and plain twins, and the differential fuzz test against
# it twice: with the block path the CPU picks, and with the portable block path forced
# (STREAM_DEDUP_TEST_BLOCK_PATH=generic, read by tests/conftest.py). The fuzz test is scaled
# down there (STREAM_DEDUP_TEST_SANITIZERS). Any sanitizer report ends the run with a
# non-zero status.
#
#   tests/sanitize.sh                 # the kernel tests + the fuzz test
#   tests/sanitize.sh tests/test_x.py # other test files instead
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
work=$(mktemp -d /tmp/stream-dedup-sanitize.XXXXXX)
trap 'rm -rf "$work"' EXIT

# Our own files only (and the decision schema the tests check against); the third-party
# corpora stay in ../shared (the corpus tests skip).
tar -c --exclude='__pycache__' --exclude='*.so' setup.py pyproject.toml stream_dedup tests \
    docs/decision.schema.json |
  tar -x -C "$work"
(
  cd "$work"
  CFLAGS="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer -O1 -g" \
    LDFLAGS="-fsanitize=address,undefined" \
    python3 setup.py -q build_ext --inplace --force >"$work/build.log" 2>&1 ||
    { cat "$work/build.log"; exit 1; }
)
ls "$work"/stream_dedup/core/_native*.so >/dev/null  # optional=True must not hide a failed build

tests=("$@")
[ ${#tests[@]} -gt 0 ] || tests=(tests/test_native.py tests/test_fuzz.py tests/test_nesting.py tests/test_selectolax_versions.py
                                 tests/test_contain_keys.py::test_the_kernel_numpy_and_the_reference_agree
                                 tests/test_contain_keys.py::test_a_sampled_set_has_its_sets_smallest
                                 tests/test_deep_keys.py)
preload="$(gcc -print-file-name=libasan.so):$(gcc -print-file-name=libubsan.so)"
for path in native generic; do
  echo "== sanitizers, block path: $path"
  (
    cd "$work"
    env LD_PRELOAD="$preload" PYTHONPATH="$work" PYTHONMALLOC=malloc \
      ASAN_OPTIONS=detect_leaks=0:abort_on_error=1:halt_on_error=1 \
      UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
      STREAM_DEDUP_TEST_SANITIZERS=1 \
      STREAM_DEDUP_TEST_BLOCK_PATH=$([ $path = generic ] && echo generic || echo "") \
      python3 -m pytest -q -p no:cacheprovider --capture=sys -x "${tests[@]}"
  )
done
