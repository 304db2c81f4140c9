"""Run every benchmark of the project and print ONE table of ratios with PASS/FAIL.

    python benchmarks/run_all.py [--quick]

Scripts: ``bench_core.py`` (the C++ hot path, another helper's; run as a subprocess, its
printed table's rows taken over with their PASS/FAIL, its exit code as the verdict when its
table cannot be read), ``bench_gears.py`` (per gear: gear executor vs ONNX
Runtime on the original dynamic model vs the naive per-input ``session.run``, on the built-in
example) and ``bench_memory.py`` (resident memory of an 8-gear weight-heavy model vs its
1-gear version, each load in a fresh process). Each script also runs alone.

The rows (``bench_rows.py``: ``row``, ``format_rows``, re-exported here) are dicts: ``bench``,
``metric``, ``value``, ``unit``, ``target`` (text or None) and ``status``: ``"PASS"`` /
``"FAIL"`` against the target, ``"info"`` without one, ``"SKIP"``. Exit code 0 when no row
FAILed.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:  # so that `import bench_gears` works from anywhere
    sys.path.insert(0, str(HERE))

from bench_rows import Row, format_rows, row  # noqa: E402  (its folder is on sys.path now)


def _core_rows(stdout: str) -> list[Row]:
    """Rows of bench_core.py's printed table (case, A, B, "name = 1.23x" or "name = 2.50us",
    target, result)."""
    rows: list[Row] = []
    for line in stdout.splitlines():
        cells = re.split(r"\s{2,}", line.strip())
        if len(cells) < 4 or cells[0] == "case" or set(cells[0]) <= {"-"}:
            continue
        ratio = re.search(r"^(.*?)\s*=\s*(-?[0-9.,]+)(x|us)$", cells[3])
        if ratio is None:
            continue
        target = cells[4] if len(cells) > 4 and cells[4] != "(info)" else None
        result = cells[5] if len(cells) > 5 else ""
        rows.append(row("core", f"{cells[0]} ({ratio.group(1)})",
                        float(ratio.group(2).replace(",", "")), ratio.group(3), target,
                        status=result if result in ("PASS", "FAIL") else "info"))
    return rows


def run_core(quick: bool) -> list[Row]:
    """bench_core.py (another helper's) as a subprocess; its table's rows, or its exit code."""
    script = HERE / "bench_core.py"
    if not script.is_file():
        return [row("core", "bench_core.py not found", None, "", "exit 0", status="SKIP")]
    proc = subprocess.run([sys.executable, str(script), *(["--quick"] if quick else [])],
                          capture_output=True, text=True, cwd=HERE.parent, timeout=900)
    print(proc.stdout.rstrip())
    if proc.returncode != 0:
        print(proc.stderr.rstrip()[-3000:], file=sys.stderr)
    rows = _core_rows(proc.stdout)
    if not rows or (proc.returncode != 0 and all(r["status"] != "FAIL" for r in rows)):
        # nothing parsed, or a failure the table does not show: the exit code is the verdict
        rows.append(row("core", "bench_core.py exit code", proc.returncode, "", "0",
                        proc.returncode == 0))
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer iterations")
    args = parser.parse_args(argv)

    import bench_gears
    import bench_memory

    rows: list[Row] = []
    print("---- bench_core.py ----")
    rows += run_core(args.quick)
    print("\n---- bench_gears.py ----")
    rows += bench_gears.run(iterations=50 if args.quick else 200, verbose=True,
                            repeats=1 if args.quick else 3)
    print("\n---- bench_memory.py ----")
    rows += bench_memory.run(verbose=True)
    print("\n==== all benchmarks ====")
    print(format_rows(rows))
    failed = [r for r in rows if r["status"] == "FAIL"]
    print(f"\n{len(failed)} FAILED" if failed else "\nall targets met")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
