"""A causal LM's folder as onnxruntime-genai's model builder writes it, read once.

``genai_config.json`` names the decoder's file and its inputs and outputs (the KV cache as
``past_key_values.%d.key`` / ``present.%d.key`` patterns), its sizes (layers, KV heads, head
size, context length, vocabulary) and its end-of-sequence token(s); ``model.onnx`` (+ its
``.data``) is the decoder: GroupQueryAttention with the cache updated in place, a dynamic
batch and sequence (``python -m onnxruntime_genai.models.builder ... -e cpu``, and
:func:`gear_runtime.examples.gqa_lm.write_genai_folder`). Nothing here runs the model.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gear_runtime.errors import InputError

CONFIG = "genai_config.json"


@dataclass(frozen=True)
class ModelFolder:
    """What the engine needs of a builder folder (see the module doc)."""

    path: Path
    #: the decoder file, inside ``path``
    decoder: Path
    input_ids: str
    attention_mask: str
    #: the position ids input, where the graph takes one (else None: GQA derives them)
    position_ids: str | None
    logits: str
    #: per layer (past key, past value, present key, present value)
    cache: tuple[tuple[str, str, str, str], ...]
    layers: int
    kv_heads: int
    head_size: int
    context_length: int
    vocab_size: int
    eos_token_ids: tuple[int, ...]

    @property
    def state_pairs(self) -> dict[str, str]:
        """The resident state: each past input <- its present output."""
        pairs = {}
        for past_k, past_v, present_k, present_v in self.cache:
            pairs[past_k], pairs[past_v] = present_k, present_v
        return pairs


def read_folder(path: str | Path) -> ModelFolder:
    """The folder at ``path``; InputError naming the file and the key that is missing or
    wrong (never a KeyError)."""
    folder = Path(path)
    config_path = folder / CONFIG
    if not config_path.is_file():
        raise InputError(f"{folder}: no {CONFIG} (an onnxruntime-genai model builder folder "
                         "holds one beside model.onnx)")
    config = read_json_object(config_path)
    model = _get(config, "model", dict, config_path)
    decoder = _get(model, "decoder", dict, config_path, "model")
    inputs = _get(decoder, "inputs", dict, config_path, "model.decoder")
    outputs = _get(decoder, "outputs", dict, config_path, "model.decoder")
    layers = _get(decoder, "num_hidden_layers", int, config_path, "model.decoder")
    names = [(inputs.get("past_key_names"), inputs.get("past_value_names"),
              outputs.get("present_key_names"), outputs.get("present_value_names"))]
    if not all(isinstance(n, str) and "%d" in n for n in names[0]):
        raise InputError(f"{config_path}: model.decoder needs past_key_names / "
                         "past_value_names inputs and present_key_names / present_value_names "
                         "outputs with a %d for the layer")
    cache = tuple(tuple(n.replace("%d", str(i)) for n in names[0]) for i in range(layers))
    file = folder / _get(decoder, "filename", str, config_path, "model.decoder")
    if not file.is_file() or file.resolve().parent != folder.resolve():
        raise InputError(f"{config_path}: model.decoder.filename {file.name!r} is not a file "
                         f"of {folder}")
    eos = model.get("eos_token_id", [])
    eos_ids = tuple(eos) if isinstance(eos, list) else (eos,)
    return ModelFolder(
        path=folder, decoder=file,
        input_ids=_get(inputs, "input_ids", str, config_path, "model.decoder.inputs"),
        attention_mask=_get(inputs, "attention_mask", str, config_path,
                            "model.decoder.inputs"),
        position_ids=inputs.get("position_ids"),
        logits=_get(outputs, "logits", str, config_path, "model.decoder.outputs"),
        cache=cache,
        layers=layers,
        kv_heads=_get(decoder, "num_key_value_heads", int, config_path, "model.decoder"),
        head_size=_get(decoder, "head_size", int, config_path, "model.decoder"),
        context_length=_get(model, "context_length", int, config_path, "model"),
        vocab_size=_get(model, "vocab_size", int, config_path, "model"),
        eos_token_ids=tuple(int(t) for t in eos_ids if isinstance(t, int)))


def read_json_object(path: Path) -> dict[str, Any]:
    """The JSON object in ``path`` ({} when there is no such file): the one reader of the
    folder's JSON files (genai_config.json, the tokenizer's, generation_config.json, a
    build's gears). InputError naming the file when it is unreadable or not an object."""
    if not path.is_file():
        return {}
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(f"{path}: not readable JSON ({exc})") from None
    if not isinstance(value, dict):
        raise InputError(f"{path}: expected a JSON object, got {type(value).__name__}")
    return value


def _get(table: dict[str, Any], key: str, kind: type, path: Path, where: str = "") -> Any:
    value = table.get(key)
    if not isinstance(value, kind) or isinstance(value, bool) or (
            kind is int and isinstance(value, int) and value <= 0):
        place = f"{where}.{key}" if where else key
        want = "a positive integer" if kind is int else f"a {kind.__name__}"
        raise InputError(f"{path}: {place} must be {want}, got {value!r}")
    return value


__all__ = ["CONFIG", "ModelFolder", "read_folder", "read_json_object"]
