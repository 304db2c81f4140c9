"""Which dynamic value each output axis follows: what trimming a padded run's outputs needs.

An output axis *follows* value ``v`` when its size is gear value ``v`` in every gear (logits
``(1, seq, vocab)``: axis 1 follows seq). Two sources of evidence:

* the per-gear output shapes (always known at compile and at load): the size equals value
  ``v`` in every gear, and it changes between gears (a size that is the same in every gear
  follows nothing, even when it happens to equal a constant value);
* symbolic shape inference of the source model with every dynamic input dim renamed to its
  value (``gear_value_<v>``): an output dim that inference names ``gear_value_<v>``.

With two or more gears the shapes decide and inference only breaks ties between values that
are equal in every gear (tied values: square image gears, H == W). Where inference names no
axis (it carries no symbol through a Conv), a *probe* does: the source is run once more at
values where the tied ones differ (the smallest gear's, each tied value after the first
raised by one more), and an axis follows the value whose size it has there (none: it follows
no single value, and is returned whole). A model that cannot run there needs the values
equal itself (input_ids' and attention_mask's lengths): any of them trims alike, the first
is recorded. Without the probe (compile's verify off) the first is recorded too, and compile
says so. With one gear the shapes cannot tell a coincidence from a dependency, so only an
axis that inference names AND whose size agrees is recorded. An axis whose size is, say,
``2 * seq`` follows nothing: trimming it is not a prefix of the request, and such an output
is returned whole.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gear_runtime.gearfile.format import OutputAxes
from gear_runtime.gearfile.info import Probe, ambiguous_axes, axes_from_shapes

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


def probe_values(gears: Sequence[Sequence[int]]) -> list[int] | None:
    """Values where every group of values that are equal in every gear (and vary between
    gears) differ: the smallest gear's, the k-th value of a group raised by k. None when no
    values are tied that way (nothing to tell apart)."""
    if len(gears) < 2:
        return None
    groups: dict[tuple[int, ...], list[int]] = {}
    for v in range(len(gears[0])):
        groups.setdefault(tuple(g[v] for g in gears), []).append(v)
    tied = [vs for column, vs in groups.items() if len(vs) > 1 and len(set(column)) > 1]
    if not tied:
        return None
    values = list(min(gears, key=sum))
    for vs in tied:
        for k, v in enumerate(vs):
            values[v] = values[vs[0]] + k
    return values


def output_dynamic_axes(model: Any, spec: Any,
                        output_shapes: Sequence[Sequence[Sequence[int]]],
                        probe: Probe | None = None, probed: bool = True
                        ) -> tuple[OutputAxes, list[tuple[int, int, list[int]]]]:
    """The compiler's answer: shapes and symbolic inference of ``model`` (the source, or its
    weightless skeleton) under ``spec`` (a GearSpec), and ``probe``: the output shapes of a
    run at :func:`probe_values` (None: no values tied, or the model could not run there).
    Also, when the probe was not even tried (``probed`` False), the ties left to the first
    value unchecked (gearfile.info.ambiguous_axes)."""
    named = symbolic_axes(model, list(spec.dynamic_positions), list(spec.input_names))
    axes = axes_from_shapes(spec.gears, output_shapes, named, probe)
    return axes, [] if probed else ambiguous_axes(spec.gears, output_shapes, axes, named)
