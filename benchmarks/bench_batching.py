"""When dynamic batching pays: one model served three ways, side by side in one run.

    python benchmarks/bench_batching.py [--model bert|conv] [--clients 8] [--seconds 8]
                                        [--rounds 2] [--threads 1]

The model (bench_serve.py's: BERT 4x768 seq 128, 208 MB, or the 3x64x64 convnet; batch
gears 1, 2, 4, 8) is measured with ``gear-runtime bench --json`` first, then served by
``gear-runtime serve`` (1 executor, ``--threads`` intra-op threads) with batching as it is
(every waiting request that fits the largest gear), with ``--profile`` (the batch takes the
waiting requests that run the most rows per second by the measured gear latencies) and with
``--no-batching``; ``--clients`` tritonclient HTTP binary clients in closed loops, the three
servers alternating round by round. Reported: rows/s, p50 ms, server CPU ms per request.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_serve as bs  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=("bert", "conv"), default="bert")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        bench = bs.build(Path(tmp), args.model, "4x768")
        profile = Path(tmp) / "profile.json"
        subprocess.run([sys.executable, "-m", "gear_runtime.cli", "bench", str(bench.gear_path),
                        "--threads", str(args.threads), "--iterations", "5", "--warmup", "1",
                        "--no-progress", "--json", str(profile)], check=True,
                       stdout=subprocess.DEVNULL)
        ways = {"batching (no profile)": (), "batching --profile": ("--profile", str(profile)),
                "--no-batching": ("--no-batching",)}
        served = argparse.Namespace(executors=1, threads=args.threads)
        cells: dict[str, list[tuple[float, float, float]]] = {w: [] for w in ways}
        for r in range(args.rounds):
            for way in (list(ways) if r % 2 == 0 else list(ways)[::-1]):
                server = bs.gear_server(bench, served, *ways[way])
                try:
                    server.wait_ready(bench.name)
                    rate, lat, cpu, errors = bs.drive(
                        bs.http_caller(bench, server.http_port, True), args.clients,
                        args.seconds, server)
                    if errors:
                        raise SystemExit(f"{way}: {errors} errors")
                    cells[way].append((rate, np.percentile(lat, 50) * 1e3, cpu * 1e3))
                finally:
                    server.close()
        weights = sum(t.nbytes for t in bs.bench_weights(bench)) / 1e6
        print(f"{args.model} ({weights:.1f} MB of weights), "
              f"{args.clients} HTTP binary clients, 1 executor, {args.threads} thread(s), "
              f"{args.seconds:g} s x {args.rounds} rounds (ranges over rounds)")
        print(bs.round_table(["server"], {(way,): got for way, got in cells.items()},
                             [("rows/s", "%.2f"), ("p50 ms", "%.0f"),
                              ("server CPU ms/request", "%.1f")]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
