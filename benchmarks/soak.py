"""Soak: leaks over many executes and many load/close cycles (ONNX Runtime backend).

1. ``--executes`` (100,000) executes on ONE executor: RSS sampled after a warm-up and every
   10% of the run; the growth from the first sample to the last must stay under
   ``--max-growth-mib``.
2. ``--cycles`` (200) load -> create_executor -> execute -> close cycles: RSS and open file
   descriptors (/proc/self/fd) after a warm-up vs at the end, and no file left behind in the
   model's folder or in the temporary folder (this process gets a private TMPDIR).

Prints one JSON report; exit 1 when a limit is crossed.

    python benchmarks/soak.py [--executes 100000] [--cycles 200]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def listing(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def executes(path: Path, count: int) -> dict:
    """``count`` executes on one executor; RSS after 1% warm-up and at every 10%."""
    from fuzz_gearfile import feeds

    import gear_runtime as gr

    model = gr.load(str(path))
    ex = model.create_executor()
    x = feeds()
    warm = max(count // 100, 1)
    for _ in range(warm):
        ex.execute(x)
    samples = [rss_mib()]
    t0 = time.perf_counter()
    for i in range(1, count - warm + 1):
        ex.execute(x)
        if i % max(count // 10, 1) == 0:
            samples.append(rss_mib())
    seconds = time.perf_counter() - t0
    ex.close()
    model.close()
    return {"executes": count, "seconds": round(seconds, 2),
            "us_per_execute": round(seconds / max(count - warm, 1) * 1e6, 1),
            "rss_mib": [round(s, 1) for s in samples],
            "growth_mib": round(samples[-1] - samples[0], 2)}


def cycles(path: Path, count: int, tmp: Path) -> dict:
    """``count`` load/close cycles; RSS and fds after 10% warm-up vs the end; files left."""
    from fuzz_gearfile import feeds

    import gear_runtime as gr

    before_files, before_tmp = listing(path.parent), listing(tmp)
    warm = max(count // 10, 1)
    start: tuple[float, int] = (0.0, 0)
    t0 = time.perf_counter()
    for i in range(count):
        model = gr.load(str(path))
        ex = model.create_executor()
        ex.execute(feeds())
        ex.close()
        model.close()
        del ex, model
        if i + 1 == warm:
            start = (rss_mib(), open_fds())
    end = (rss_mib(), open_fds())
    return {"cycles": count, "seconds": round(time.perf_counter() - t0, 2),
            "rss_mib": [round(start[0], 1), round(end[0], 1)],
            "growth_mib": round(end[0] - start[0], 2), "fds": [start[1], end[1]],
            "files_left_in_model_folder": sorted(set(listing(path.parent)) - set(before_files)),
            "files_left_in_tmp": sorted(set(listing(tmp)) - set(before_tmp))}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--executes", type=int, default=100_000)
    ap.add_argument("--cycles", type=int, default=200)
    ap.add_argument("--max-growth-mib", type=float, default=8.0)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="gear-soak-") as top:
        tmp = Path(top) / "tmp"
        tmp.mkdir()
        os.environ["TMPDIR"] = str(tmp)  # anything the runtime wrote there would show
        tempfile.tempdir = None
        from fuzz_gearfile import build

        folder = Path(top) / "model"
        folder.mkdir()
        build(folder)
        report = {"executes": executes(folder / "m.gear.onnx", args.executes),
                  "cycles": cycles(folder / "m.gear.onnx", args.cycles, tmp)}
    c = report["cycles"]
    failed = [what for what, bad in (
        ("execute RSS growth", report["executes"]["growth_mib"] > args.max_growth_mib),
        ("load/close RSS growth", c["growth_mib"] > args.max_growth_mib),
        ("file descriptors", c["fds"][1] > c["fds"][0]),
        ("files left behind", c["files_left_in_model_folder"] or c["files_left_in_tmp"]))
        if bad]
    report["failed"] = failed
    print(json.dumps(report, indent=2))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
