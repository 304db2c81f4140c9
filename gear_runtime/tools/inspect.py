"""``gear-runtime inspect FILE``: a human description of a gear file."""

from __future__ import annotations

import os
from collections.abc import Sequence

from gear_runtime.gearfile.digest import DIGEST_ALGORITHM
from gear_runtime.gearfile.format import DYNAMIC_TYPES, FORMAT_VERSION, KIND_SINK
from gear_runtime.gearfile.reader import read_gear_file
from gear_runtime.tools.textfmt import format_bytes, format_table


def _shape(dims: Sequence[int]) -> str:
    return "[" + ",".join(str(d) for d in dims) + "]"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], indent: str = "  ") -> list[str]:
    return format_table([header, *rows], indent=indent)


def _bytes(n: int) -> str:
    return format_bytes(n, digits=2, exact=True)


def describe(path: str | os.PathLike[str]) -> str:
    """What ``gear-runtime inspect FILE`` prints: mode, input order
    (user_designate_shape_order), gears with per-gear input and output shapes (a table),
    hybrid / sink flags, file size and weights size, and the integrity check (the gear file
    and every data file hashed and compared with the digests compile recorded).
    GearFileError for a bad file, naming the part that changed."""
    gf = read_gear_file(path)
    gf.verify_data()
    spec = gf.spec
    sink = gf.kind == KIND_SINK
    lines = [
        f"gear file   {gf.path}",
        f"format      {FORMAT_VERSION}, kind {gf.kind}",
        f"mode        {spec.mode} (dynamic_type {DYNAMIC_TYPES[spec.mode]}), "
        f"{spec.gear_count} gears, {spec.values_per_gear} value(s) per gear",
        f"hybrid      {'yes' if spec.hybrid else 'no'}"
        f"{' (a miss runs the dynamic-shape graph)' if spec.hybrid else ''}",
        f"sink        {'yes' if sink else 'no'}"
        f"{' (runnable by stock ONNX Runtime; dims returned last)' if sink else ''}",
    ]
    if spec.input_format:
        lines.append(f"input fmt   {spec.input_format}")
    lines.append("inputs (user_designate_shape_order):")
    lines += _table(["#", "name", "dtype", "input_shape"],
                    [[str(i), n, str(dt), _shape(s)] for i, (n, dt, s) in
                     enumerate(zip(spec.input_names, gf.input_dtypes, spec.input_shapes,
                                   strict=True))])
    lines.append("outputs:")
    lines += _table(["#", "name", "dtype"],
                    [[str(k), n, str(dt)] for k, (n, dt) in
                     enumerate(zip(gf.output_names, gf.output_dtypes, strict=True))])
    lines.append("gears:")
    rows = []
    for g in range(spec.gear_count):
        ins = " ".join(f"{n}{_shape(s)}" for n, s in spec.shapes(g).items())
        outs = " ".join(f"{n}{_shape(s)}" for n, s in
                        zip(gf.output_names, gf.output_shapes[g], strict=True))
        size = sum(gf.info.output_size(g, k) for k in range(len(gf.output_names)))
        rows.append([str(g), ",".join(map(str, spec.gears[g])), ins, outs, str(size)])
    lines += _table(["gear", "dims", "input shapes", "output shapes", "output bytes"], rows)
    lines.append(f"weights     {len(gf.weights)} tensors, {_bytes(gf.weight_bytes)}"
                 f"{f', {len(gf.external)} in the data file' if gf.external else ' inside'}")
    data = "".join(f"; data file {os.path.basename(p)} verified" for p in sorted(gf.data_digests))
    lines.append(f"integrity   {DIGEST_ALGORITHM}: graph and metadata verified{data}")
    lines.append("files:")
    lines += _table(["path", "size"], [[f, _bytes(os.path.getsize(f))] for f in gf.files])
    return "\n".join(lines)
