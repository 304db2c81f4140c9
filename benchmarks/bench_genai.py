"""onnxruntime-genai's own graph, served by gear_runtime: the KV cache updated in place.

    python benchmarks/bench_genai.py [--size bench|small] [--prompts 20,60,200]
                                     [--tokens 16] [--rounds 2] [--threads 1] [--workdir DIR]

The model is :mod:`gear_runtime.examples.gqa_lm` at ``--size bench``: the layout
onnxruntime-genai's model builder writes (GroupQueryAttention with rotary, past and present
sharing one buffer), hidden 1024, 8 heads of 128 (8 KV heads), 8 layers, vocab 32,000,
max_seq 512 -- 167 M parameters (635 MiB of float32 weights), a KV cache of 32 MiB. ONE
gear file holds prefill and decode: dims gears (S, T) = (G, G) for the prompt gears
32/64/128/256 and (1, 512) for a step. Side by side in ONE process, the same ORT thread
count, per prompt length, the ways in lockstep (each way's prefill in turn, then each way's
first step, ...), ``--rounds`` times after one warm-up generation each:

* ``gear in place``: ``create_executor(state=..., in_place_state=True)``: each layer's past
  and present are one buffer, which GroupQueryAttention updates where it is;
* ``gear double-buffered``: the same executor with the default state (a run reads one
  buffer and writes the other, so the kernel copies the cache into the other every step);
* ``ORT IOBinding``: the fastest plain ORT loop on the same file: past and present bound to
  one buffer per layer, the static mask [1, 512], preallocated logits;
* ``onnxruntime-genai``: ``og.Generator`` on the same ONNX file and weights (a
  ``genai_config.json`` written beside it, ``past_present_share_buffer``), greedy; its
  prefill runs the prompt at its exact length (no padding) and its steps a mask that grows
  with the sequence (the others attend over the static 512-slot mask).

Gear and ORT run the prompt right-padded to its covering gear; gear's outputs are taken
with ``copy=False`` (read at once, as a generate loop does). Reported per prompt: time to
first token, per-token decode (median), the greedy tokens' agreement with ``ORT
IOBinding``, the bytes memcpy'd / memmove'd per step (``LD_PRELOAD`` counter of
benchmarks/bench_generate.py), and the resident memory of each way's loaded model after one
generation (fresh process each). Goals (issue 30): decode <= 1.05x onnxruntime-genai on the
same weights; no bytes copied per step beyond the graph's own.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_generate import child_rss, lockstep, rerun_with_counter  # noqa: E402

Way = tuple[Callable[[np.ndarray], int], Callable[[int, int], int]]


def covering(length: int, gears: Sequence[int]) -> int:
    return min(g for g in gears if g >= length)


def gear_way(gear_file: Path, sizes: Any, threads: int, in_place: bool) -> Way:
    """(first token of a prompt, one step) on a gear executor with the cache resident."""
    import gear_runtime as gr
    from gear_runtime.examples import gqa_lm

    model = gr.load(str(gear_file), intra_op_num_threads=threads)
    ex = model.create_executor(state=gqa_lm.state_pairs(sizes), in_place_state=in_place)
    mask = np.zeros((1, sizes.max_seq), np.int64)

    def first(ids: np.ndarray) -> int:
        n, g = ids.shape[1], covering(ids.shape[1], sizes.seq_gears)
        padded = np.zeros((1, g), np.int64)
        padded[:, :n] = ids
        (logits,) = ex.execute({"input_ids": padded, "attention_mask": np.ones((1, g), np.int64)},
                               copy=False)
        mask[:] = 0
        return int(logits[0, n - 1].argmax())

    def step(token: int, position: int) -> int:
        mask[0, position] = 1
        mask[0, :position] = 1
        (logits,) = ex.execute({"input_ids": np.array([[token]], np.int64),
                                "attention_mask": mask}, copy=False)
        return int(logits[0, 0].argmax())

    return first, step


def ort_way(source: Path, sizes: Any, threads: int) -> Way:
    """Plain ORT IOBinding: past and present one buffer per layer, logits preallocated."""
    import onnxruntime as ort

    from gear_runtime.examples import gqa_lm

    opts = ort.SessionOptions()
    opts.intra_op_num_threads, opts.inter_op_num_threads = threads, 1
    sess = ort.InferenceSession(str(source), opts, providers=["CPUExecutionProvider"])
    caches = {n: np.zeros(sizes.cache_shape, np.float32) for n in gqa_lm.state_pairs(sizes)}
    mask = np.zeros((1, sizes.max_seq), np.int64)
    ids1 = np.zeros((1, 1), np.int64)
    step_logits = np.zeros((1, 1, sizes.vocab), np.float32)

    def bind(ids: np.ndarray, am: np.ndarray, logits: np.ndarray) -> Any:
        b = sess.io_binding()
        b.bind_cpu_input("input_ids", ids)
        b.bind_cpu_input("attention_mask", am)
        for past, present in gqa_lm.state_pairs(sizes).items():
            buf = caches[past]
            b.bind_input(past, "cpu", 0, np.float32, list(buf.shape), buf.ctypes.data)
            b.bind_output(present, "cpu", 0, np.float32, list(buf.shape), buf.ctypes.data)
        b.bind_output("logits", "cpu", 0, np.float32, list(logits.shape), logits.ctypes.data)
        return b

    stepping = bind(ids1, mask, step_logits)  # built once: its inputs' memory is rewritten

    def first(ids: np.ndarray) -> int:
        n, g = ids.shape[1], covering(ids.shape[1], sizes.seq_gears)
        padded = np.zeros((1, g), np.int64)
        padded[:, :n] = ids
        logits = np.empty((1, g, sizes.vocab), np.float32)
        sess.run_with_iobinding(bind(padded, np.ones((1, g), np.int64), logits))
        mask[:] = 0
        return int(logits[0, n - 1].argmax())

    def step(token: int, position: int) -> int:
        ids1[0, 0] = token
        mask[0, :position + 1] = 1
        sess.run_with_iobinding(stepping)
        return int(step_logits[0, 0].argmax())

    return first, step


def genai_way(folder: Path, tokens: int) -> Way:
    """onnxruntime-genai's Generator, greedy, on the same file (a new generator per
    prompt, as its own examples do); its thread count is the config's (write_config)."""
    import onnxruntime_genai as og

    config = og.Config(str(folder))
    config.clear_providers()
    model = og.Model(config)
    state: dict[str, Any] = {}

    def first(ids: np.ndarray) -> int:
        params = og.GeneratorParams(model)
        total = ids.shape[1] + tokens
        params.set_search_options(max_length=total, min_length=total, do_sample=False)
        gen = state["gen"] = og.Generator(model, params)
        gen.append_tokens(ids)
        gen.generate_next_token()
        return int(gen.get_next_tokens()[0])

    def step(token: int, position: int) -> int:
        gen = state["gen"]
        gen.generate_next_token()
        return int(gen.get_next_tokens()[0])

    return first, step


def write_config(folder: Path, sizes: Any, threads: int) -> None:
    """genai_config.json beside the model, with the thread count."""
    from gear_runtime.examples import gqa_lm

    gqa_lm.write_genai_config(folder, sizes)
    path = folder / "genai_config.json"
    config = json.loads(path.read_text())
    config["model"]["decoder"]["session_options"].update(
        {"intra_op_num_threads": threads, "inter_op_num_threads": 1})
    path.write_text(json.dumps(config, indent=2))


def time_ways(ways: dict[str, Way], sizes: Any, prompts: Sequence[int], tokens: int,
              rounds: int) -> list[dict[str, Any]]:
    from gear_runtime.examples import gqa_lm

    rows = []
    for length in prompts:
        got = lockstep(ways, gqa_lm.prompt(length, sizes, seed=length), tokens, rounds)
        for way, g in got.items():
            rows.append({"prompt": length, "way": way, "ttft": g["ttft"], "step": g["step"],
                         "bytes": g["bytes"],
                         "same": g["tokens"] == got["ORT IOBinding"]["tokens"]})
        print(f"  prompt {length}: done", flush=True)
    return rows


def print_table(rows: list[dict[str, Any]]) -> None:
    ref = {(r["prompt"], r["way"]): r for r in rows}
    print(f"\n{'prompt':>6} {'way':<22} {'TTFT ms':>8} {'/ORT':>6} {'step ms':>8} "
          f"{'/ORT':>6} {'/genai':>6} {'MiB copied/step':>15} {'tokens':>7}")
    for r in rows:
        bound = ref[(r["prompt"], "ORT IOBinding")]
        genai = ref.get((r["prompt"], "onnxruntime-genai"))
        copied = "-" if r["bytes"] is None else f"{r['bytes'] / 2**20:.3f}"
        vs_genai = "-" if genai is None else f"{r['step'] / genai['step']:.3f}"
        print(f"{r['prompt']:>6} {r['way']:<22} {r['ttft'] * 1e3:>8.1f} "
              f"{r['ttft'] / bound['ttft']:>6.3f} {r['step'] * 1e3:>8.2f} "
              f"{r['step'] / bound['step']:>6.3f} {vs_genai:>6} {copied:>15} "
              f"{'same' if r['same'] else 'DIFFER':>7}")


RSS_CHILD = r"""
import json, sys
sys.path.insert(0, {bench!r})
import numpy as np
import bench_genai as b
from bench_generate import rss_mib
from gear_runtime.examples import gqa_lm
sizes = getattr(gqa_lm, {size!r})
base = rss_mib()
way = {way!r}
if way == "onnxruntime-genai":
    first, step = b.genai_way(b.Path({folder!r}), 4)
elif way == "ORT IOBinding":
    first, step = b.ort_way(b.Path({source!r}), sizes, 1)
else:
    first, step = b.gear_way(b.Path({gear!r}), sizes, 1, way == "gear in place")
ids = gqa_lm.prompt(60, sizes)
t = first(ids)
for p in range(3):
    t = step(t, 60 + p)
print(json.dumps({{"rss": rss_mib() - base}}))
"""


def print_memory(folder: Path, size: str, sizes: Any, weights: int,
                 ways: Sequence[str]) -> None:
    floor = (weights + sizes.cache_bytes) / 2**20
    print(f"\nresident memory after one generation (fresh process each; one copy of the "
          f"weights + one cache = {floor:.0f} MiB):")
    for way in ways:
        rss = child_rss(RSS_CHILD.format(
            bench=str(Path(__file__).resolve().parent), size=size.upper(), way=way,
            folder=str(folder), source=str(folder / "gqa_lm.onnx"),
            gear=str(folder / "gqa_lm.gear.onnx")))
        print(f"  {way:<22} +{rss:7.0f} MiB  ({rss / floor:.2f}x)")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", choices=("bench", "small"), default="bench")
    parser.add_argument("--prompts", default="20,60,200")
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--workdir", default=None)
    parser.add_argument("--no-memory", action="store_true")
    args = parser.parse_args(argv)
    code = rerun_with_counter(__file__, argv)
    if code is not None:
        return code

    from gear_runtime.examples import gqa_lm

    sizes = getattr(gqa_lm, args.size.upper())
    folder = Path(args.workdir or tempfile.mkdtemp(prefix="gear-bench-genai-"))
    if not (folder / "gqa_lm.gear.onnx").exists():
        start = time.perf_counter()
        gqa_lm.write_model(folder, sizes)
        print(f"built the model in {folder} ({time.perf_counter() - start:.0f} s)")
    write_config(folder, sizes, args.threads)
    weights = sum(a.nbytes for a in gqa_lm.make_weights(sizes).values())
    print(f"model: {weights / 4 / 1e6:.0f} M parameters ({weights / 2**20:.0f} MiB float32), "
          f"KV cache {2 * sizes.layers} x {list(sizes.cache_shape)} = "
          f"{sizes.cache_bytes / 2**20:.0f} MiB, prompt gears {list(sizes.seq_gears)}; "
          f"{args.threads} ORT thread(s), {args.tokens} tokens, {args.rounds} rounds")
    ways: dict[str, Way] = {
        "gear in place": gear_way(folder / "gqa_lm.gear.onnx", sizes, args.threads, True),
        "gear double-buffered": gear_way(folder / "gqa_lm.gear.onnx", sizes, args.threads,
                                         False),
        "ORT IOBinding": ort_way(folder / "gqa_lm.onnx", sizes, args.threads)}
    try:
        ways["onnxruntime-genai"] = genai_way(folder, args.tokens)
    except ImportError:
        print("onnxruntime-genai is not installed (pip install onnxruntime-genai): not run")
    prompts = [int(p) for p in args.prompts.split(",")]
    print_table(time_ways(ways, sizes, prompts, args.tokens, args.rounds))
    if not args.no_memory:
        print_memory(folder, args.size, sizes, weights, list(ways))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
