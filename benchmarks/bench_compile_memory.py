"""Peak memory and time of ``gear-runtime compile`` on a graph of many nodes.

    python benchmarks/bench_compile_memory.py [--nodes 200000] [--gears 2] [--baseline CHECKOUT]

The source: a chain of ``nodes`` Neg / Relu nodes on an ``x [B, 4]`` input (no weights: 6 MiB
of ONNX for 200k nodes), compiled for batch gears 1..``gears``. Each compile runs in a FRESH
process; its peak resident set (``ru_maxrss`` of the child) and wall time are reported.
``--baseline CHECKOUT``: the same compile with the gear_runtime of that source tree (its
``_core`` built in place; e.g. ``git worktree add /tmp/before <commit>`` and the built .so
copied in), run alternately with this one: the peak-memory ratio of a change. The peak is
the graphs held at once (the source, each gear's branch, the root being built, the
checker's parse of the written file), not the weights (there are none).
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def chain_model(nodes: int, path: Path) -> Path:
    """The chain of ``nodes`` nodes, saved to ``path``."""
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Relu" if i % 2 else "Neg", ["x" if i == 0 else f"t{i - 1}"],
                          [f"t{i}" if i < nodes - 1 else "y"], name=f"n{i}")
         for i in range(nodes)], "chain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["B", 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def compile_once(tree: Path, source: Path, gears: int, out: Path) -> tuple[float, float]:
    """(peak RSS in MiB, seconds) of one compile in a fresh process with ``tree``'s package."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    start = time.perf_counter()
    env = {**os.environ, "PYTHONPATH": str(tree)}
    subprocess.run([sys.executable, "-m", "gear_runtime.cli", "compile", str(source),
                    "--input-shape", "x:-1,4", "--dynamic-batch-size",
                    ",".join(str(b) for b in range(1, gears + 1)), "-o", str(out),
                    "--no-progress"], check=True, env=env, cwd=str(tree),
                   stdout=subprocess.DEVNULL)
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    if peak <= before:  # ru_maxrss of children is the largest so far: a smaller one hides
        peak = float("nan")
    return peak / 1024, seconds


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, default=200_000)
    p.add_argument("--gears", type=int, default=2)
    p.add_argument("--baseline", type=Path, default=None, metavar="CHECKOUT")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench_compile_memory_") as tmp:
        source = chain_model(args.nodes, Path(tmp) / "chain.onnx")
        size = source.stat().st_size / 2**20
        print(f"compile of a {args.nodes}-node chain ({size:.1f} MiB of ONNX), "
              f"{args.gears} batch gears, each in a fresh process")
        # ru_maxrss of children only grows: the baseline (larger, before a fix) runs last
        runs = [("this tree", ROOT)] + ([("baseline", args.baseline)] if args.baseline else [])
        rows = [(name, *compile_once(tree, source, args.gears, Path(tmp) / f"{k}.gear.onnx"))
                for k, (name, tree) in enumerate(runs)]
    print(f"{'tree':<10}  {'peak MiB':>9}  {'seconds':>8}")
    for name, peak, seconds in rows:
        print(f"{name:<10}  {peak:>9.0f}  {seconds:>8.1f}")
    if len(rows) == 2:
        print(f"peak this / baseline: {rows[0][1] / rows[1][1]:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
