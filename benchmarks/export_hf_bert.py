"""Export a randomly initialised Hugging Face BERT to ONNX (NEEDS torch + transformers).

Like ``hf_prefill.py``, this script needs torch and transformers and is not used by the tests
(nothing else imports them). Install them in a venv of their own, e.g.::

    pip install "torch==2.13.0+cpu" transformers onnx

then::

    python benchmarks/export_hf_bert.py -o bert.onnx              # BERT-base, ~418 MiB
    python benchmarks/bench_openvino.py --model bert.onnx         # the OpenVINO benchmark on it

The model is ``transformers.BertModel(BertConfig())`` (BERT-base: 12 layers, hidden 768,
12 heads, vocab 30522) with seeded random weights: nothing is downloaded. Inputs
``input_ids``, ``attention_mask``, ``token_type_ids`` (int64 ``[batch, sequence]``), outputs
``last_hidden_state`` ``[batch, sequence, 768]`` and ``pooler_output`` ``[batch, 768]``; the
batch and sequence axes are symbolic (``dynamic_axes``). It is written by the TorchScript
exporter (``dynamo=False``), the ``torch.onnx.export`` of most published BERT ONNX files: its
graph computes every reshape target and the extended attention mask from ``Shape`` /
``Gather`` / ``Unsqueeze`` / ``Concat`` at run time, which is what a static-shape compile can
fold away. ``--dynamo`` uses the dynamo exporter instead. The weights go to external data
(``bert.onnx.data``), as gear_runtime's compile expects of a model this size.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

INPUT_NAMES = ["input_ids", "attention_mask", "token_type_ids"]
OUTPUT_NAMES = ["last_hidden_state", "pooler_output"]


def wrapped(model):  # noqa: ANN001, ANN201 (torch types stay out of the hints)
    """``forward(input_ids, attention_mask, token_type_ids) -> (last_hidden_state,
    pooler_output)``: the exported signature is the three inputs by name (BertModel's own
    forward takes more, in an order that moves between transformers versions)."""
    import torch

    class Bert(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bert = model

        def forward(self, input_ids, attention_mask, token_type_ids):  # noqa: ANN001, ANN202
            out = self.bert(input_ids=input_ids, attention_mask=attention_mask,
                            token_type_ids=token_type_ids, return_dict=True)
            return out.last_hidden_state, out.pooler_output

    return Bert().eval()


def export(out: Path, seed: int, seq: int, opset: int, dynamo: bool) -> int:
    """Write the model to ``out`` (+ ``out.data``); returns its parameter count."""
    import onnx
    import torch
    from transformers import BertConfig, BertModel

    torch.manual_seed(seed)
    model = BertModel(BertConfig()).eval()
    ids = torch.randint(0, model.config.vocab_size, (1, seq), dtype=torch.int64)
    args = (ids, torch.ones_like(ids), torch.zeros_like(ids))
    kwargs: dict = {"input_names": INPUT_NAMES, "output_names": OUTPUT_NAMES,
                    "opset_version": opset}
    if dynamo:
        batch, length = torch.export.Dim("batch", max=64), torch.export.Dim("sequence", max=512)
        kwargs["dynamic_shapes"] = {n: {0: batch, 1: length} for n in
                                    ("input_ids", "attention_mask", "token_type_ids")}
        kwargs["dynamo"] = True
    else:
        axes = {0: "batch", 1: "sequence"}
        kwargs["dynamic_axes"] = {**{n: axes for n in INPUT_NAMES},
                                  "last_hidden_state": axes, "pooler_output": {0: "batch"}}
        kwargs["dynamo"] = False
    tmp = out.with_name(out.name + ".tmp.onnx")
    with torch.no_grad():
        torch.onnx.export(wrapped(model), args, str(tmp), **kwargs)
    # One data file next to the graph, whatever the exporter wrote (the TorchScript exporter
    # keeps a graph under 2 GiB inline): the layout gear_runtime's compile reads.
    proto = onnx.load(str(tmp))
    onnx.save(proto, str(out), save_as_external_data=True, all_tensors_to_one_file=True,
              location=out.name + ".data", size_threshold=1024)
    for leftover in out.parent.glob(tmp.name + "*"):
        leftover.unlink()
    return sum(p.numel() for p in model.parameters())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-o", "--output", required=True, help="the .onnx file to write")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--trace-seq", type=int, default=64,
                        help="sequence length of the example inputs traced (default 64)")
    parser.add_argument("--opset", type=int, default=17)
    parser.add_argument("--dynamo", action="store_true", help="the dynamo exporter")
    args = parser.parse_args(argv)
    out = Path(args.output)
    data = out.with_name(out.name + ".data")
    if data.exists():
        data.unlink()  # onnx.save appends to an existing data file
    t0 = time.perf_counter()
    params = export(out, args.seed, args.trace_seq, args.opset, args.dynamo)
    print(f"wrote {out} and {data.name} ({data.stat().st_size / 2**20:.0f} MiB, "
          f"{params / 1e6:.0f} M parameters) in {time.perf_counter() - t0:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
