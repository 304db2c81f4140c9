"""NEEDS torch + transformers (lazily): a random Hugging Face Qwen3 checkpoint, no download.

:func:`write_random_qwen3` writes what a Hugging Face Qwen3 folder holds: ``config.json``
(``Qwen3ForCausalLM``, float32), ``model.safetensors``, ``generation_config.json`` and the
tokenizer files of :func:`gear_runtime.examples.tokenizer.write_tokenizer`. It is the input
of ``gear-runtime llm build`` in the tests and ``benchmarks/hf_engine_check.py``: the route a
real checkpoint takes, at a size that builds in seconds.

torch and transformers are imported only when it runs: they are the ``llm-build`` extra's
(torch's CPU build comes from the PyTorch index; docs/llm.md).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gear_runtime.examples.tokenizer import write_tokenizer

#: the id of ``<|endoftext|>`` in :func:`write_tokenizer`'s vocabulary: end of sequence, pad
EOS_ID = 0
#: the weights' standard deviation: larger than transformers' 0.02 so that a random model's
#: top logits stand apart and a greedy comparison is not decided by float rounding
INIT_STD = 0.1


def write_random_qwen3(directory: str | Path, *, vocab_size: int = 512, hidden: int = 64,
                       layers: int = 2, heads: int = 4, kv_heads: int = 2,
                       intermediate: int = 128, max_position: int = 256,
                       seed: int = 0) -> Path:
    """A random ``Qwen3ForCausalLM`` checkpoint in ``directory`` (created if missing);
    returns ``directory``. The same arguments write the same weights (``seed`` seeds
    torch's generator, forked so the caller's is left as it was). ``hidden`` must divide by
    ``heads`` and ``heads`` by ``kv_heads`` (ValueError otherwise); ``vocab_size`` at least
    :data:`gear_runtime.examples.tokenizer.MIN_VOCAB`. ImportError naming the extra when
    torch or transformers is missing."""
    torch, transformers = _import_torch()
    if hidden % heads or heads % kv_heads:
        raise ValueError(f"hidden {hidden}, heads {heads}, kv_heads {kv_heads}: expected "
                         "hidden divisible by heads and heads by kv_heads")
    out = write_tokenizer(directory, vocab_size)  # first: it checks vocab_size
    config = transformers.Qwen3Config(
        vocab_size=vocab_size, hidden_size=hidden, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=hidden // heads,
        intermediate_size=intermediate, max_position_embeddings=max_position,
        initializer_range=INIT_STD, tie_word_embeddings=False, bos_token_id=None,
        eos_token_id=EOS_ID, pad_token_id=EOS_ID, architectures=["Qwen3ForCausalLM"])
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = transformers.Qwen3ForCausalLM(config).to(torch.float32).eval()
    model.save_pretrained(out, safe_serialization=True)
    return out


def _import_torch() -> tuple[Any, Any]:
    """(torch, transformers), or ImportError saying what to install."""
    try:
        import torch
        import transformers
    except ImportError as exc:
        raise ImportError(
            f"write_random_qwen3 needs torch and transformers ({exc.name} is missing): pip "
            "install torch --index-url https://download.pytorch.org/whl/cpu, then pip install "
            "'gear_runtime[llm-build]'") from None
    return torch, transformers


__all__ = ["EOS_ID", "INIT_STD", "write_random_qwen3"]
