"""NEEDS torch + transformers: a Hugging Face LM through onnxruntime-genai's real builder.

Served by gear_runtime: prompt gears and the static decode step in one gear file, the KV
cache resident and updated in place, greedy tokens checked against ``transformers``'
``generate()`` and against onnxruntime-genai itself on the very same ONNX file.

The only script of the project that needs torch and transformers (nothing else imports
them); run it in a venv of its own::

    pip install torch transformers onnx-ir onnxruntime-genai   # + gear_runtime (pip install .)
    python benchmarks/hf_genai_pair.py --out /tmp/hf_genai --tokens 16

Steps (each printed with its time):
1. a randomly initialised ``Qwen3ForCausalLM`` (seeded; ``--size small|bench``) saved as a
   local HF folder, with a word-level tokenizer the builder needs beside it (no download);
2. ``python -m onnxruntime_genai.models.builder -i HF -o OUT -p fp32 -e cpu``: the builder's
   own graph (GroupQueryAttention, the cache shared between past and present);
3. ``gear-runtime compile`` of that ``model.onnx`` at prompt gears (G, G) and the decode
   step (1, MAX) (``gqa_lm.gear_text``: the layout is the builder's);
4. per prompt length: greedy tokens of transformers ``generate(do_sample=False)``, of
   gear_runtime (``state=``, ``in_place_state=True``, the prompt right-padded to its gear),
   and of onnxruntime-genai on the builder's folder; the three must be equal, and the
   per-token time of each is printed.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

SIZES = {  # Qwen3Config fields; hidden = heads * head_dim (the GQA layout's head size)
    "small": {"vocab_size": 2048, "hidden_size": 256, "intermediate_size": 512,
              "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
              "head_dim": 64, "max_position_embeddings": 256},
    "bench": {"vocab_size": 32000, "hidden_size": 1024, "intermediate_size": 3072,
              "num_hidden_layers": 8, "num_attention_heads": 8, "num_key_value_heads": 8,
              "head_dim": 128, "max_position_embeddings": 512},
}
GEARS = {"small": (16, 32, 64, 128), "bench": (32, 64, 128, 256)}


def log(step: str, started: float) -> None:
    print(f"  {step}: {time.perf_counter() - started:.1f} s", flush=True)


def write_hf_folder(folder: Path, size: str, seed: int = 0) -> None:
    """A seeded random Qwen3 and a word-level tokenizer over its vocabulary, saved as a
    local HF folder (the builder reads ``config.json``, the safetensors and the tokenizer)."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    config = Qwen3Config(**SIZES[size], tie_word_embeddings=False, bos_token_id=1,
                         eos_token_id=0, pad_token_id=0, torch_dtype="float32")
    model = Qwen3ForCausalLM(config).eval()
    model.generation_config.pad_token_id = 0
    model.save_pretrained(folder)
    vocab = {f"t{i}": i for i in range(config.vocab_size)}
    words = Tokenizer(models.WordLevel(vocab=vocab, unk_token="t0"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=words, unk_token="t0", pad_token="t0",
                            eos_token="t0", bos_token="t1").save_pretrained(folder)


def build_genai(hf: Path, out: Path) -> None:
    """onnxruntime-genai's model builder on the local folder (fp32, CPU)."""
    cache = out.parent / "builder_cache"
    subprocess.run([sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(hf),
                    "-o", str(out), "-p", "fp32", "-e", "cpu", "-c", str(cache)], check=True)


def one_thread(out: Path) -> None:
    """Every way on one compute thread: genai's session options in its config."""
    path = out / "genai_config.json"
    config = json.loads(path.read_text())
    config["model"]["decoder"].setdefault("session_options", {})["intra_op_num_threads"] = 1
    path.write_text(json.dumps(config, indent=2))


def sizes_of(out: Path, size: str):
    """gqa_lm.Sizes read back from the builder's genai_config.json (what the graph is)."""
    from gear_runtime.examples import gqa_lm

    dec = json.loads((out / "genai_config.json").read_text())["model"]
    d = dec["decoder"]
    return gqa_lm.Sizes(vocab=dec["vocab_size"], hidden=d["head_size"] * d["num_attention_heads"],
                        heads=d["num_attention_heads"], kv_heads=d["num_key_value_heads"],
                        layers=d["num_hidden_layers"], max_seq=dec["context_length"],
                        seq_gears=GEARS[size])


def compile_gears(out: Path, sizes) -> Path:
    import gear_runtime as gr
    from gear_runtime.examples import gqa_lm

    shape, dims = gqa_lm.gear_text(sizes)
    gear = out / "model.gear.onnx"
    gr.compile(str(out / "model.onnx"), gr.GearSpec.from_atc(input_shape=shape, dynamic_dims=dims),
               str(gear), progress=False)
    return gear


def hf_tokens(hf: Path, ids: np.ndarray, n: int) -> tuple[list[int], float]:
    import torch
    from transformers import Qwen3ForCausalLM

    torch.set_num_threads(1)
    model = Qwen3ForCausalLM.from_pretrained(hf, dtype=torch.float32).eval()
    with torch.no_grad():
        started = time.perf_counter()
        out = model.generate(torch.from_numpy(ids), attention_mask=torch.ones_like(
            torch.from_numpy(ids)), max_new_tokens=n, min_new_tokens=n, do_sample=False)
        took = time.perf_counter() - started
    return out[0, ids.shape[1]:].tolist(), took / n


def gear_tokens(gear: Path, sizes, ids: np.ndarray, n: int) -> tuple[list[int], float]:
    import gear_runtime as gr
    from gear_runtime.examples import gqa_lm

    model = gr.load(str(gear), intra_op_num_threads=1)
    ex = model.create_executor(state=gqa_lm.state_pairs(sizes), in_place_state=True)
    logits = ex.execute(gqa_lm.prompt_feeds(ids, sizes), copy=False)[0]
    tokens = [int(logits[0, ids.shape[1] - 1].argmax())]
    started = time.perf_counter()
    for t in range(n - 1):
        logits = ex.execute(gqa_lm.step_feeds(tokens[-1], ids.shape[1] + t, sizes),
                            copy=False)[0]
        tokens.append(int(logits[0, -1].argmax()))
    return tokens, (time.perf_counter() - started) / max(n - 1, 1)


def genai_tokens(out: Path, ids: np.ndarray, n: int) -> tuple[list[int], float]:
    import onnxruntime_genai as og

    config = og.Config(str(out))
    model = og.Model(config)
    params = og.GeneratorParams(model)
    params.set_search_options(do_sample=False, max_length=ids.shape[1] + n,
                              min_length=ids.shape[1] + n)
    gen = og.Generator(model, params)
    gen.append_tokens(ids)  # the prompt's run
    tokens, started = [], 0.0
    while not gen.is_done():
        gen.generate_next_token()
        tokens.append(int(gen.get_next_tokens()[0]))
        if len(tokens) == 1:  # timed from the first token on, as gear_tokens' steps are
            started = time.perf_counter()
    return tokens[:n], (time.perf_counter() - started) / max(len(tokens) - 1, 1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="/tmp/hf_genai", help="working folder")
    parser.add_argument("--size", choices=sorted(SIZES), default="small")
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--prompts", default="5,40,100", help="prompt lengths")
    args = parser.parse_args()
    work = Path(args.out)
    hf, out = work / "hf", work / "genai"
    started = time.perf_counter()
    print(f"Qwen3 {args.size} {SIZES[args.size]}", flush=True)
    write_hf_folder(hf, args.size)
    log("random Qwen3 saved", started)
    build_genai(hf, out)
    one_thread(out)
    log("onnxruntime-genai builder", started)
    sizes = sizes_of(out, args.size)
    gear = compile_gears(out, sizes)
    log(f"compiled at prompt gears {sizes.seq_gears} + step (1, {sizes.max_seq})", started)
    print("| prompt | transformers generate(), ms/token with its prefill | gear_runtime step ms "
          "| onnxruntime-genai step ms | gear / genai | tokens equal |")
    print("|---|---|---|---|---|---|")
    same = True
    for length in (int(x) for x in args.prompts.split(",")):
        ids = np.random.default_rng(length).integers(2, sizes.vocab, (1, length), np.int64)
        want, t_hf = hf_tokens(hf, ids, args.tokens)
        got, t_gear = gear_tokens(gear, sizes, ids, args.tokens)
        genai, t_genai = genai_tokens(out, ids, args.tokens)
        equal = want == got == genai
        same &= equal
        print(f"| {length} | {t_hf * 1e3:.2f} | {t_gear * 1e3:.2f} | {t_genai * 1e3:.2f} | "
              f"{t_gear / t_genai:.2f} | {'yes' if equal else f'NO: {want} / {got} / {genai}'} |",
              flush=True)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
