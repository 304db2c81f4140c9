#!/usr/bin/env bash
# Build and run the C++ unit tests of the core (csrc/tests) with ctest.
#
#   .ci/sanitize.sh          AddressSanitizer + UndefinedBehaviorSanitizer (build/sanitize)
#   .ci/sanitize.sh plain    the normal Release build (build/ctest)
#   .ci/sanitize.sh python   the extension _core built with ASan+UBSan (build/sanitize-py),
#                            then tests/test_core*.py run against it (libasan preloaded)
#
# The first two build only the pure C++ classes (GEAR_RUNTIME_BUILD_PYTHON=OFF): no Python, no
# numpy, no pybind11. Exits non-zero on a build error, a failed test or any sanitizer report
# (halt_on_error). Environment: BUILD_ROOT (default <repo>/build), JOBS (default 2), PYTHON
# (python mode; default python3, which needs numpy, pytest, hypothesis and pybind11: CMake
# takes numpy's C headers from that interpreter, FindPython's NumPy component).
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
  python)
    dir="$build_root/sanitize-py"
    py="${PYTHON:-python3}"
    flags="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
    cmake -S "$repo" -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DGEAR_RUNTIME_WERROR=ON \
      -DPython_EXECUTABLE="$(command -v "$py")" \
      -Dpybind11_DIR="$("$py" -c 'import pybind11; print(pybind11.get_cmake_dir())')" \
      -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_MODULE_LINKER_FLAGS="-fsanitize=address,undefined"
    cmake --build "$dir" -j "$jobs" --target _core
    # A private copy of the package with the sanitized extension, imported first.
    pkg="$(mktemp -d)"
    trap 'rm -rf "$pkg"' EXIT
    cp -r "$repo/gear_runtime" "$pkg/"
    rm -f "$pkg"/gear_runtime/_core*.so
    cp "$dir"/_core*.so "$pkg/gear_runtime/"
    preload="$(${CXX:-g++} -print-file-name=libasan.so) $(${CXX:-g++} -print-file-name=libubsan.so)"
    cd "$pkg"  # not the repo: its gear_runtime/ must not shadow the copy
    PYTHONPATH="$pkg" LD_PRELOAD="$preload" \
      ASAN_OPTIONS="halt_on_error=1:detect_leaks=0" \
      UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1" \
      "$py" - "$repo" "$pkg" <<'PY'
import sys

import pytest

repo, pkg = sys.argv[1], sys.argv[2]
code = pytest.main([f"{repo}/tests/test_core.py", f"{repo}/tests/test_core_parity.py", "-q",
                    "-p", "no:cacheprovider", f"--rootdir={repo}", "-c",
                    f"{repo}/pyproject.toml"])
import gear_runtime._core as core  # noqa: E402

if not core.__file__.startswith(pkg):
    sys.exit(f"tested {core.__file__}, not the sanitized build")
sys.exit(int(code))
PY
    exit $?
    ;;
  *)
    echo "usage: $0 [sanitize|plain|python]" >&2
    exit 2
    ;;
esac

cmake --build "$dir" -j "$jobs"
ctest --test-dir "$dir" --output-on-failure
