#!/usr/bin/env bash
# Build and run the C++ unit tests of the core (csrc/tests) with ctest.
#
#   .ci/sanitize.sh          AddressSanitizer + UndefinedBehaviorSanitizer (build/sanitize)
#   .ci/sanitize.sh plain    the normal Release build (build/ctest)
#
# Only the pure C++ classes are built (GEAR_RUNTIME_BUILD_PYTHON=OFF): no Python, no pybind11.
# Exits non-zero on a build error, a failed test or any sanitizer report (halt_on_error).
# Environment: BUILD_ROOT (default <repo>/build), JOBS (default 2).
set -euo pipefail

mode="${1:-sanitize}"
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build_root="${BUILD_ROOT:-$repo/build}"
jobs="${JOBS:-2}"

case "$mode" in
  sanitize)
    dir="$build_root/sanitize"
    flags="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
    cmake -S "$repo" -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
      -DGEAR_RUNTIME_BUILD_PYTHON=OFF -DGEAR_RUNTIME_BUILD_TESTS=ON -DGEAR_RUNTIME_WERROR=ON \
      -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined"
    export ASAN_OPTIONS="halt_on_error=1:abort_on_error=0:detect_leaks=1:strict_string_checks=1"
    export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1"
    ;;
  plain)
    dir="$build_root/ctest"
    cmake -S "$repo" -B "$dir" -DCMAKE_BUILD_TYPE=Release \
      -DGEAR_RUNTIME_BUILD_PYTHON=OFF -DGEAR_RUNTIME_BUILD_TESTS=ON -DGEAR_RUNTIME_WERROR=ON
    ;;
  *)
    echo "usage: $0 [sanitize|plain]" >&2
    exit 2
    ;;
esac

cmake --build "$dir" -j "$jobs"
ctest --test-dir "$dir" --output-on-failure
