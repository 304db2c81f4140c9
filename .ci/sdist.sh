#!/usr/bin/env bash
# The sdist is complete: build it, install it into a fresh virtual environment (pip builds the
# C++ core from it with CMake, in its own isolated build environment), and run the installed
# package from outside the repository, so nothing of the checkout can stand in for it.
#
#   bash .ci/sdist.sh        (PYTHON: the interpreter of the fresh venv, default python3)
#
# Needs `build` in the calling environment (.ci/run installs it). pip's cache is reused, so
# the time is the C++ build's: the 2-core CI machine spends most of its ~1-2 minutes there.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# built from a clean copy (what a fresh checkout has, .gitignore's paths left out): setuptools
# adds every file an old gear_runtime.egg-info/SOURCES.txt lists, which would hide a file
# MANIFEST.in misses (tests/test_ecosystem.py copies the same way)
python - "$repo" "$work/src" <<'PY'
import shutil, sys
shutil.copytree(sys.argv[1], sys.argv[2], ignore=shutil.ignore_patterns(
    ".git", ".venv", "venv", "build", "dist", "*.egg-info", "__pycache__", "*.so", ".*cache",
    ".hypothesis", ".benchmarks", "out"))
PY
python -m build --sdist --outdir "$work/dist" "$work/src" >"$work/build.log" 2>&1 \
    || { cat "$work/build.log"; exit 1; }
sdist=("$work"/dist/gear_runtime-*.tar.gz)
echo "sdist: $(basename "${sdist[0]}") ($(du -k "${sdist[0]}" | cut -f1) KiB), ${SECONDS} s"

"${PYTHON:-python3}" -m venv "$work/venv"
"$work/venv/bin/python" -m pip install -q "${sdist[0]}"
echo "installed into a fresh venv (the C++ core built from the sdist), ${SECONDS} s in all"

cd "$work"  # not the repository: ./gear_runtime must not be what is imported
want="$(sed -n 's/^__version__ = "\(.*\)"$/\1/p' "$repo/gear_runtime/version.py")"
got="$("$work/venv/bin/python" -c \
    "import gear_runtime, gear_runtime._core; print(gear_runtime.__version__)")"
[[ "$got" == "$want" ]] || { echo "installed version $got, the repository's $want"; exit 1; }
"$work/venv/bin/python" -c "import gear_runtime, sys; \
    assert gear_runtime.__file__.startswith(sys.prefix), gear_runtime.__file__"
"$work/venv/bin/gear-runtime" --version
"$work/venv/bin/python" -m gear_runtime --version >/dev/null
echo "sdist OK: gear_runtime $got built and installed from it"
