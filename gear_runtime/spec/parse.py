"""Parse ATC flag values and GE options into a GearSpec.

MINIMAL FIRST VERSION: parses well-formed input only. The full GE validation (codes E10001..
E10058, hypothesis-proof parsing) is being added; see issue #2.
"""

from __future__ import annotations

from collections.abc import Mapping

from gear_runtime.spec.gearspec import DEFAULT_MAX_GEARS, GearSpec


def _parse_input_shape(text: str) -> tuple[list[str], list[tuple[int, ...]]]:
    names, shapes = [], []
    for entry in (e for e in text.split(";") if e):
        name, _, dims = entry.rpartition(":")
        names.append(name)
        shapes.append(tuple(int(d) for d in dims.split(",") if d))
    return names, shapes


def spec_from_atc(input_shape: str, dynamic_batch_size: str | None = None,
                  dynamic_image_size: str | None = None, dynamic_dims: str | None = None,
                  input_format: str | None = None, max_gears: int = DEFAULT_MAX_GEARS,
                  hybrid: bool = False) -> GearSpec:
    names, shapes = _parse_input_shape(input_shape)
    if dynamic_batch_size is not None:
        mode, gears = "batch", [(int(v),) for v in dynamic_batch_size.split(",") if v]
    elif dynamic_image_size is not None:
        mode = "image_size"
        gears = [tuple(int(v) for v in g.split(",") if v) for g in dynamic_image_size.split(";") if g]
    else:
        mode = "dims"
        gears = [tuple(int(v) for v in g.split(",") if v) for g in (dynamic_dims or "").split(";") if g]
    return GearSpec(mode, tuple(names), tuple(shapes), tuple(gears), hybrid=hybrid,
                    input_format=input_format)


def spec_from_ge_options(options: Mapping[str, str], max_gears: int = DEFAULT_MAX_GEARS) -> GearSpec:
    hybrid = options.get("ge.dynamicNodeType") == "1" and options.get("ge.compileHybridMode") == "1"
    return spec_from_atc(options["ge.inputShape"], dynamic_dims=options["ge.dynamicDims"],
                         max_gears=max_gears, hybrid=hybrid)


def spec_to_atc(spec: GearSpec) -> dict[str, str]:
    shape = ";".join(f"{n}:{','.join(map(str, s))}" for n, s in zip(spec.input_names, spec.input_shapes))
    key = {"batch": "dynamic_batch_size", "image_size": "dynamic_image_size", "dims": "dynamic_dims"}[spec.mode]
    sep = "," if spec.mode == "batch" else ";"
    return {"input_shape": shape, key: sep.join(",".join(map(str, g)) for g in spec.gears)}
