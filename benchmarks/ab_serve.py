"""Two checkouts of gear_runtime serving one model, side by side in one run: A/B of a change.

    git worktree add /tmp/before HEAD~1 && cp gear_runtime/_core*.so /tmp/before/gear_runtime/
    python benchmarks/ab_serve.py /tmp/before . [--model conv|bert] [--clients 1]
        [--seconds 3] [--rounds 3] [-- SERVE FLAGS...]

Each round starts ``gear-runtime serve`` from each checkout in turn (``PYTHONPATH`` at it; the
order reversed every other round), drives it with ``--clients`` tritonclient gRPC clients,
then HTTP binary ones, in closed loops (bench_serve.py's servers, models and clients: 1
executor, 1 intra-op thread), and prints rows/s, p50 and server CPU per request, each as
its range over the rounds.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_serve as bs  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trees", nargs=2, help="the two checkouts (A, then B)")
    parser.add_argument("--model", choices=("bert", "conv"), default="conv")
    parser.add_argument("--clients", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=3)
    argv = sys.argv[1:]
    cut = argv.index("--") if "--" in argv else len(argv)
    args = parser.parse_args(argv[:cut])
    flags = argv[cut + 1:]  # serve's own flags, after --
    trees = [str(Path(t).resolve()) for t in args.trees]
    served = argparse.Namespace(executors=1, threads=1)
    got: dict[tuple[str, str], list[tuple[float, float, float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        # `python -m` puts the working directory first on sys.path: a server started from a
        # checkout would import THAT checkout whatever PYTHONPATH says
        os.chdir(tmp)
        bench = bs.build(Path(tmp), args.model, "4x768")
        for r in range(args.rounds):
            for tree in (trees if r % 2 == 0 else trees[::-1]):
                os.environ["PYTHONPATH"] = tree
                server = bs.gear_server(bench, served, *flags)
                try:
                    server.wait_ready(bench.name)
                    for way in ("gRPC", "HTTP binary"):
                        call = (bs.grpc_caller(bench, server.grpc_port) if way == "gRPC"
                                else bs.http_caller(bench, server.http_port, True))
                        rate, lat, cpu, errors = bs.drive(call, args.clients, args.seconds,
                                                          server)
                        if errors:
                            raise SystemExit(f"{tree} {way}: {errors} errors")
                        got.setdefault((tree, way), []).append(
                            (rate, float(np.percentile(lat, 50)) * 1e3, cpu * 1e3))
                finally:
                    server.close()
    print(f"{args.model}, {args.clients} client(s), serve {' '.join(flags) or '(defaults)'}, "
          f"{args.seconds:g} s x {args.rounds} rounds (ranges over rounds)")
    print(bs.round_table(["checkout", "transport"], got,
                         [("rows/s", "%.0f"), ("p50 ms", "%.2f"),
                          ("server CPU ms/request", "%.2f")]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
