"""Per gear on CUDA: the gear executor with and without CUDA graphs vs plain ORT CUDA.

    python benchmarks/bench_cuda.py [--seconds S] [--small]

Needs onnxruntime-gpu and an NVIDIA GPU; elsewhere it says so and exits 2 (not part of
run_all, which runs on CPU machines). On a GPU machine, one command:

    pip install -q onnxruntime-gpu && pip install -e ".[test]" && \
      python -m pytest -m cuda tests/test_backend_cuda.py && python benchmarks/bench_cuda.py

The model is weight-heavy: the prefill example at hidden 512, vocab 8000, 4 layers (~83 MB of
weights, in a data file beside the gear file), gears seq 32 / 128 / 512 / 1024 (``--small``:
the tiny built-in example). Three columns per gear, interleaved per iteration in a shuffled
order in ONE process: ``execute`` without graphs, ``execute`` with one CUDA graph per gear,
and a plain ORT CUDA session of the source model (``session.run`` on host arrays: it copies
inputs in and outputs out, as ``execute`` does). Before the table: per executor, its device
arenas (one per executor, sized to its largest gear), whether the input arena is views of one
allocation, whether the host staging is pinned. Not yet run: no GPU was lent to the sessions
that wrote it.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from bench_scale import interleaved  # noqa: E402  (the sibling script, one timing loop)

CUDA = ["CUDAExecutionProvider", "CPUExecutionProvider"]
SEQS = (32, 128, 512, 1024)


def device_facts(ex) -> str:
    """What an executor holds on the device: arena bytes (one per executor, sized to its
    largest gear), whether the arena is shared views, whether the host staging is pinned."""
    session = ex.session
    staging = session._device
    return (f"device arenas {staging.nbytes / 2**20:.2f} MiB (inputs shared: "
            f"{staging.inputs.shared}), host staging pinned: {session.staging_pinned}, "
            f"graphs: {session.model.cuda_graph}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="per gear")
    parser.add_argument("--small", action="store_true", help="the tiny built-in example")
    args = parser.parse_args(argv)

    import onnx
    import onnxruntime as ort

    import gear_runtime as gr
    from gear_runtime.backends.onnxruntime import cuda_available, gpu_present
    from gear_runtime.examples import prefill

    if not (cuda_available() and gpu_present()):
        print("bench_cuda: needs onnxruntime-gpu and an NVIDIA GPU; none here", file=sys.stderr)
        return 2
    hidden, vocab = (prefill.HIDDEN, prefill.VOCAB) if args.small else (512, 8000)
    seqs = prefill.SEQ_GEARS if args.small else SEQS
    with tempfile.TemporaryDirectory(prefix="bench-cuda-") as tmp:
        d = Path(tmp)
        source = d / "prefill.onnx"
        model = (prefill.build_prefill_model() if args.small else prefill.build_prefill_model(
            hidden=hidden, vocab=vocab, layers=4, heads=8, max_positions=max(seqs)))
        onnx.save(model, str(source), save_as_external_data=True, location="prefill.weights")
        ini = d / "config.ini"
        ini.write_text(prefill.prefill_config(hidden=hidden, seq_gears=seqs), encoding="utf-8")
        spec = gr.GearSpec.from_config(str(ini))
        path = gr.compile(str(source), spec, str(d / "p.gear.onnx"), progress=False)
        weights = (d / "p.gear.onnx.data").stat().st_size
        plain_ex = gr.load(path, providers=CUDA).create_executor()
        graph_ex = gr.load(path, providers=CUDA, cuda_graph=True).create_executor()
        ref = ort.InferenceSession(str(source), providers=CUDA)
        devices = [(name, device_facts(ex)) for name, ex in (("no graph", plain_ex),
                                                             ("graph", graph_ex))]
        rows = []
        for g, dims in enumerate(spec.gears):
            feeds = prefill.example_inputs(spec, g, seed=g, vocab=vocab)
            want = ref.run(None, feeds)
            for ex in (plain_ex, graph_ex):
                for a, b in zip(ex.execute(feeds), want, strict=True):
                    np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-3)
            times = interleaved([lambda f=feeds: plain_ex.execute(f),
                                 lambda f=feeds: graph_ex.execute(f),
                                 lambda f=feeds: ref.run(None, f)], args.seconds,
                                min_iter=10, max_iter=10**9, warmup=3)
            p50 = [float(np.median(t)) for t in times]
            rows.append((g, dims, *p50))
    print(f"prefill model, {weights / 2**20:.0f} MB of weights, ORT {ort.__version__}, "
          f"{ort.get_device()}")
    for name, facts in devices:
        print(f"{name}: {facts}")
    print(f"{'gear':<5}{'dims':<19}{'no graph ms':>12}{'graph ms':>10}{'ORT CUDA ms':>12}"
          f"{'graph/no':>10}{'graph/ORT':>10}")
    for g, dims, plain, graph, ref_t in rows:
        print(f"{g:<5}{','.join(map(str, dims)):<19}{plain * 1e3:>12.3f}{graph * 1e3:>10.3f}"
              f"{ref_t * 1e3:>12.3f}{graph / plain:>10.2f}{graph / ref_t:>10.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
