"""Export a Hugging Face causal LM's prefill to ONNX for gear_runtime (NEEDS torch + transformers).

This script is the one part of the project that needs torch and transformers; nothing else
imports them (the tests never do). Install them in a venv of their own, e.g.::

    pip install "torch==2.13.0+cpu" transformers onnx onnxscript

then::

    python benchmarks/hf_prefill.py --checkpoint PATH_OR_HUB_ID -o prefill.onnx
    python benchmarks/hf_prefill.py --random qwen3-0.6b -o prefill.onnx   # random weights
    python benchmarks/hf_prefill.py --random tiny -o tiny.onnx            # seconds, 30 MB

The graph takes ``input_ids``, ``attention_mask`` and ``position_ids`` (int64, all
``[1, sequence_length]``: ONE symbolic dim name, so ``gear-runtime plan`` reads a trace line
as the prompt length) and returns ``logits`` ``[1, sequence_length, vocab]`` (no KV cache:
the prefill's output is what a service samples the first token from). It is written by
``torch.onnx.export`` (the dynamo exporter) with the weights in external data
(``prefill.onnx.data``): models past 2 GiB do not fit in one protobuf. ``--random`` builds
the architecture from a config with seeded random weights (nothing is downloaded);
``--checkpoint`` loads yours with ``AutoModelForCausalLM.from_pretrained`` (local folder, or
a hub id where the hub is reachable).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

# Qwen3-0.6B's shape (its config.json), and a tiny one of the same architecture for a quick try.
SHAPES = {
    "qwen3-0.6b": dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                       num_attention_heads=16, num_key_value_heads=8, head_dim=128,
                       vocab_size=151936, max_position_embeddings=40960,
                       tie_word_embeddings=True),
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                 vocab_size=32000, max_position_embeddings=2048, tie_word_embeddings=True),
}


def load_model(args: argparse.Namespace):  # noqa: ANN201 (torch types stay out of the hints)
    import torch
    from transformers import AutoModelForCausalLM, Qwen3Config

    if args.checkpoint:
        model = AutoModelForCausalLM.from_pretrained(args.checkpoint, dtype=torch.float32)
    else:
        torch.manual_seed(args.seed)
        model = AutoModelForCausalLM.from_config(Qwen3Config(**SHAPES[args.random]),
                                                 dtype=torch.float32)
    model.config.use_cache = False
    return model.eval()


def prefill_module(lm):  # noqa: ANN001, ANN201 (torch types stay out of the hints)
    """``forward(input_ids, attention_mask, position_ids) -> logits``, no cache: the exported
    signature is the three inputs and the one output."""
    import torch

    class Prefill(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lm = lm

        def forward(self, input_ids, attention_mask, position_ids):  # noqa: ANN001, ANN202
            return self.lm(input_ids=input_ids, attention_mask=attention_mask,
                           position_ids=position_ids, use_cache=False).logits

    return Prefill().eval()


def export(model, out: Path, seq: int) -> None:  # noqa: ANN001
    import torch

    ids = torch.randint(0, model.config.vocab_size, (1, seq), dtype=torch.int64)
    mask = torch.ones((1, seq), dtype=torch.int64)
    pos = torch.arange(seq, dtype=torch.int64)[None]
    length = torch.export.Dim("sequence_length", min=2, max=8192)
    dyn = {"input_ids": {1: length}, "attention_mask": {1: length},
           "position_ids": {1: length}}
    with torch.no_grad():
        torch.onnx.export(prefill_module(model), (ids, mask, pos), str(out), dynamo=True,
                          input_names=["input_ids", "attention_mask", "position_ids"],
                          output_names=["logits"], dynamic_shapes=dyn, external_data=True,
                          opset_version=18)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    src = parser.add_mutually_exclusive_group(required=True)
    src.add_argument("--checkpoint", help="a local checkpoint folder or a hub id")
    src.add_argument("--random", choices=sorted(SHAPES), help="random weights of this shape")
    parser.add_argument("-o", "--output", required=True, help="the .onnx file to write")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--trace-seq", type=int, default=17,
                        help="sequence length of the example inputs traced (default 17)")
    args = parser.parse_args(argv)
    out = Path(args.output)
    t0 = time.perf_counter()
    model = load_model(args)
    params = sum(p.numel() for p in model.parameters())
    print(f"model: {params / 1e6:.0f} M parameters ({params * 4 / 2**30:.2f} GiB float32)",
          flush=True)
    export(model, out, args.trace_seq)
    data = out.with_name(out.name + ".data")
    size = data.stat().st_size if data.exists() else 0
    print(f"wrote {out} and {data.name} ({size / 2**30:.2f} GiB) in "
          f"{time.perf_counter() - t0:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
