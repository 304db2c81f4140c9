"""NEEDS torch + transformers: a Hugging Face checkpoint through ``gear-runtime llm build``
to the engine, its greedy tokens checked against transformers at a size above the test's.

    python benchmarks/hf_engine_check.py [--layers 4] [--hidden 256] [--vocab 8000]
                                         [--prompts 5,40,120,300] [--new 16] [--workdir DIR]

Steps, each printed with its seconds:

1. a random ``Qwen3ForCausalLM`` (:func:`gear_runtime.examples.hf_qwen3.write_random_qwen3`,
   heads of 64, KV heads half the heads, MLP 3x hidden) saved as a local HF folder;
2. ``gear-runtime llm build HF -o MODEL`` in a subprocess (the builder, then the gears: the
   engine's defaults, ``--max-sequences``);
3. ``Engine.from_folder(MODEL)`` (it must find the build's gear file: the cache it would
   compile into is a fresh folder, checked empty after);
4. per prompt length (seeded token ids): the engine's greedy tokens (``--new`` of them, the
   end of sequence off) and transformers' ``generate(do_sample=False, min_new_tokens)``;
   then all prompts submitted to the engine at once (the batch gears), checked again.

Prints a table: prompt length, tokens equal (yes / no), the engine's seconds alone and
batched, transformers' seconds. Exit 1 when any tokens differ.

Needs ``pip install torch --index-url https://download.pytorch.org/whl/cpu`` and
``pip install -e '.[llm-build]'`` (docs/llm.md).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HEAD_SIZE = 64


def timed(step: str, started: float) -> None:
    print(f"{step} {time.perf_counter() - started:.1f} s", flush=True)


def write_checkpoint(hf: Path, args: argparse.Namespace) -> None:
    from gear_runtime.examples.hf_qwen3 import write_random_qwen3

    heads = max(1, args.hidden // HEAD_SIZE)
    write_random_qwen3(hf, vocab_size=args.vocab, hidden=args.hidden, layers=args.layers,
                       heads=heads, kv_heads=max(1, heads // 2),
                       intermediate=3 * args.hidden, max_position=args.max_position,
                       seed=args.seed)


def build(hf: Path, out: Path, max_sequences: int) -> None:
    command = [sys.executable, "-m", "gear_runtime.cli", "llm", "build", str(hf), "-o",
               str(out), "--max-sequences", str(max_sequences)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    for line in done.stdout.splitlines():
        print(f"  {line}")
    if done.returncode != 0:
        sys.exit(f"llm build failed: {done.stderr.strip()}")


def prompts_of(lengths: list[int], vocab: int, seed: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(3, vocab, n).tolist() for n in lengths]


def transformers_greedy(hf: Path, prompts: list[list[int]], new: int
                        ) -> list[tuple[list[int], float]]:
    import torch
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(hf).eval()
    out = []
    for p in prompts:
        start = time.perf_counter()
        ids = model.generate(torch.tensor([p]), max_new_tokens=new, min_new_tokens=new,
                             do_sample=False)
        out.append((ids[0, len(p):].tolist(), time.perf_counter() - start))
    return out


def engine_greedy(engine, prompts: list[list[int]], new: int
                  ) -> tuple[list[tuple[list[int], float]], list[list[int]], float]:
    """Each prompt alone (tokens, seconds), then all at once (tokens, seconds)."""
    alone = []
    for p in prompts:
        start = time.perf_counter()
        tokens = engine.generate([p], max_new_tokens=new, stop_token_ids=[])[0]
        alone.append((tokens, time.perf_counter() - start))
    start = time.perf_counter()
    together = engine.generate(prompts, max_new_tokens=new, stop_token_ids=[])
    return alone, together, time.perf_counter() - start


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--vocab", type=int, default=8000)
    ap.add_argument("--prompts", default="5,40,120,300", help="prompt lengths in tokens")
    ap.add_argument("--new", type=int, default=16, help="tokens generated per prompt")
    ap.add_argument("--max-position", type=int, default=512)
    ap.add_argument("--max-sequences", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workdir", help="where the checkpoint and the model folder go "
                    "(default: a temporary folder)")
    args = ap.parse_args()
    lengths = [int(n) for n in args.prompts.split(",")]
    work = Path(args.workdir or tempfile.mkdtemp(prefix="hf_engine_check-"))
    hf, out, cache = work / "hf", work / "model", work / "engine-cache"
    cache.mkdir(parents=True, exist_ok=True)
    os.environ["GEAR_RUNTIME_LLM_CACHE"] = str(cache)

    print(f"Qwen3 layers {args.layers}, hidden {args.hidden}, vocab {args.vocab}; "
          f"in {work}", flush=True)
    started = time.perf_counter()
    write_checkpoint(hf, args)
    timed("checkpoint", started)
    started = time.perf_counter()
    build(hf, out, args.max_sequences)
    timed("llm build (subprocess)", started)

    from gear_runtime.llm import Engine

    started = time.perf_counter()
    engine = Engine.from_folder(out)
    timed(f"from_folder (gears {engine.gears})", started)
    prompts = prompts_of(lengths, args.vocab, args.seed)
    try:
        alone, together, together_s = engine_greedy(engine, prompts, args.new)
    finally:
        engine.close()
    reference = transformers_greedy(hf, prompts, args.new)
    compiled = sorted(p.name for p in cache.iterdir())
    return report(lengths, alone, together, together_s, reference, compiled)


def report(lengths: list[int], alone, together, together_s: float, reference,
           compiled: list[str]) -> int:
    print(f"\n{'prompt':>7} {'equal':>6} {'engine s':>9} {'transformers s':>15}")
    ok = True
    rows = zip(lengths, alone, together, reference, strict=True)
    for n, (tokens, seconds), batched, (ref, ref_s) in rows:
        equal = tokens == ref and batched == ref
        ok &= equal
        print(f"{n:>7} {'yes' if equal else 'no':>6} {seconds:>9.3f} {ref_s:>15.3f}")
    print(f"all {len(lengths)} at once on the engine: {together_s:.3f} s")
    print("engine cache: " + ("empty (the build's gear file ran)" if not compiled
                              else f"compiled {compiled} (the build's gear file was missed)"))
    return 0 if ok and not compiled else 1


if __name__ == "__main__":
    sys.exit(main())
