"""Which dynamic value each output axis follows: what trimming a padded run's outputs needs.

An output axis *follows* value ``v`` when its size is gear value ``v`` in every gear (logits
``(1, seq, vocab)``: axis 1 follows seq). Two sources of evidence:

* the per-gear output shapes (always known at compile and at load): the size equals value
  ``v`` in every gear, and it changes between gears (a size that is the same in every gear
  follows nothing, even when it happens to equal a constant value);
* symbolic shape inference of the source model with every dynamic input dim renamed to its
  value (``gear_value_<v>``): an output dim that inference names ``gear_value_<v>``.

With two or more gears the shapes decide and inference only breaks ties between values that
are equal in every gear (tied values). With one gear the shapes cannot tell a coincidence from
a dependency, so only an axis that inference names AND whose size agrees is recorded. An axis
whose size is, say, ``2 * seq`` follows nothing: trimming it is not a prefix of the request,
and such an output is returned whole.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gear_runtime.gearfile.format import OutputAxes
from gear_runtime.gearfile.info import axes_from_shapes

_SYMBOL = "gear_value_{}"


def symbolic_axes(model: Any, positions: Sequence[tuple[int, int, int]],
                  input_names: Sequence[str]) -> list[dict[int, int]]:
    """Per graph output of ``model`` (an onnx.ModelProto, weights not needed), the axes that
    ONNX symbolic shape inference names after a dynamic value, when every dynamic input axis
    (``positions``: (input index, axis, value index)) is renamed to its value's symbol.
    Empty dicts when inference fails (the shapes alone then decide)."""
    import onnx

    m = onnx.ModelProto()
    m.CopyFrom(model)
    inputs = {vi.name: vi for vi in m.graph.input}
    for i, axis, value in positions:
        vi = inputs.get(input_names[i])
        if vi is None or len(vi.type.tensor_type.shape.dim) <= axis:
            continue
        dim = vi.type.tensor_type.shape.dim[axis]
        dim.Clear()
        dim.dim_param = _SYMBOL.format(value)
    for o in m.graph.output:  # the exporter's own output shapes must not answer for inference
        o.type.tensor_type.ClearField("shape")
    m.graph.ClearField("value_info")
    try:
        inferred = onnx.shape_inference.infer_shapes(m, strict_mode=False)
    except Exception:  # inference is evidence, not a requirement
        return [{} for _ in m.graph.output]
    symbols = {_SYMBOL.format(v): v for _, _, v in positions}
    out = []
    for o in inferred.graph.output:
        dims = o.type.tensor_type.shape.dim
        out.append({a: symbols[d.dim_param] for a, d in enumerate(dims)
                    if d.HasField("dim_param") and d.dim_param in symbols})
    return out


def output_dynamic_axes(model: Any, spec: Any,
                        output_shapes: Sequence[Sequence[Sequence[int]]]) -> OutputAxes:
    """The compiler's answer: shapes and symbolic inference of ``model`` (the source, or its
    weightless skeleton) under ``spec`` (a GearSpec)."""
    named = symbolic_axes(model, list(spec.dynamic_positions), list(spec.input_names))
    return axes_from_shapes(spec.gears, output_shapes, named)
