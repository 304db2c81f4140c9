"""Built-in example models, shipped as code (``onnx.helper``, seeded weights, no download).

``prefill``: a small transformer-prefill-like model with the four inputs of the MindSpore Lite
Qwen prefill export (input_ids, attention_mask, position_ids, image_embeds) and its
``[acl_build_options]`` config with four sequence gears; what ``gear-runtime demo`` runs.
``encoder``: a BERT-like encoder. ``causal_lm``: seed 004's pair, a prefill at seq gears and a
static decode (its cache double-buffered). ``gqa_lm``: onnxruntime-genai's decoder layout,
one gear file for prefill and decode, its cache updated in place (``in_place_state=True``).
"""

from __future__ import annotations

from gear_runtime.examples.prefill import (
    PREFILL_CONFIG,
    build_prefill_model,
    example_inputs,
    inputs_for_shapes,
    write_example,
)

__all__ = [
    "PREFILL_CONFIG",
    "build_prefill_model",
    "example_inputs",
    "inputs_for_shapes",
    "write_example",
]
