"""``gear-runtime inspect FILE``: what a gear file holds, as text (:func:`describe`) or as a
``gear-runtime-inspect/1`` document (:func:`inspect_document`, ``--json``; docs/json.md).
Both come from the same facts, read and verified once."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from gear_runtime.gearfile.digest import DIGEST_ALGORITHM
from gear_runtime.gearfile.format import DYNAMIC_TYPES, FORMAT_VERSION, KIND_SINK
from gear_runtime.gearfile.reader import read_gear_file
from gear_runtime.tools.common import jsonout
from gear_runtime.tools.common.textfmt import format_bytes, format_table

#: The version of the ``--json`` document.
JSON_VERSION = 1


def inspect_document(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The facts of the gear file at ``path`` (after its integrity check: the gear file and
    every data file hashed and compared with the digests compile recorded): mode, input
    order (user_designate_shape_order), per gear the input and output shapes, hybrid / sink,
    weights, files. A plain static model (no gears: it runs as its one gear) has no format
    and kind ``"static"``. GearFileError for a bad file, naming the part that changed."""
    gf = read_gear_file(path)
    gf.verify_data()
    static = gf.spec.mode == "static"
    data = gf.data_files  # a static model's inline weights are in the model file, no data file
    return jsonout.document("inspect", JSON_VERSION, {
        "path": gf.path, "format": None if static else FORMAT_VERSION,
        "kind": "static" if static else gf.kind,
        **_model_facts(gf.info, sink=gf.kind == KIND_SINK),
        "weights": {"tensors": len(gf.weights), "bytes": int(gf.weight_bytes),
                    "in_data_file": sum(s.path in data for s in gf.external.values())},
        "integrity": {"algorithm": DIGEST_ALGORITHM, "verified": gf.spec.mode != "static",
                      "data_files": sorted(os.path.basename(p) for p in data)},
        "files": [{"path": f, "bytes": os.path.getsize(f)} for f in gf.files],
    })


def model_document(path: str | os.PathLike[str], model: Any) -> dict[str, Any]:
    """The inspect document of a model a device backend opened from its own file (an .om on
    acl, a MindIR on mindspore_lite): the facts the backend reports (mode, inputs in
    user_designate_shape_order, per gear the input and output shapes), in the same schema as
    a gear file's; no weights or integrity facts (the file is the backend's)."""
    path = os.fspath(path)
    return jsonout.document("inspect", JSON_VERSION, {
        "path": path, "format": None, "kind": model.backend, "backend": model.backend,
        **_model_facts(model.backend_model.info, sink=False),
        "weights": None,
        "integrity": {"algorithm": None, "verified": False, "data_files": []},
        "files": [{"path": path, "bytes": os.path.getsize(path)}],
    })


def _model_facts(info: Any, sink: bool) -> dict[str, Any]:
    """What both documents say of a model (a :class:`~gear_runtime.gearfile.info.ModelInfo`):
    mode, gears, inputs, outputs, and per gear the shapes and output bytes."""
    spec = info.spec
    gears = [{"gear": g, "dims": list(spec.gears[g]),
              "inputs": {n: list(s) for n, s in spec.shapes(g).items()},
              "outputs": {n: list(s) for n, s in zip(info.output_names, info.output_shapes[g],
                                                     strict=True)},
              "output_bytes": sum(info.output_size(g, k)
                                  for k in range(len(info.output_names)))}
             for g in range(spec.gear_count)]
    return {
        "mode": spec.mode, "dynamic_type": DYNAMIC_TYPES[spec.mode],
        "gear_count": spec.gear_count, "values_per_gear": spec.values_per_gear,
        "hybrid": bool(spec.hybrid), "sink": sink, "input_format": spec.input_format or None,
        "precision_mode": spec.precision_mode,
        "inputs": [{"name": n, "dtype": str(dt), "input_shape": list(s)}
                   for n, dt, s in zip(spec.input_names, info.input_dtypes, spec.input_shapes,
                                       strict=True)],
        "outputs": [{"name": n, "dtype": str(dt)}
                    for n, dt in zip(info.output_names, info.output_dtypes, strict=True)],
        "gears": gears,
    }


def describe(path: str | os.PathLike[str]) -> str:
    """What ``gear-runtime inspect FILE`` prints: the facts of :func:`inspect_document`, with
    a table of the gears' input and output shapes."""
    return text(inspect_document(path))


def text(doc: dict[str, Any]) -> str:
    """The human form of an inspect document (a static model's: :func:`_static_text`)."""
    if doc["mode"] == "static":
        return _static_text(doc)
    own = doc.get("backend") is not None  # a device backend's own file, not a gear file
    lines = [
        f"{'model file' if own else 'gear file '}  {doc['path']}",
        f"backend     {doc['backend']} (the gears as the backend reports them)" if own else
        f"format      {doc['format']}, kind {doc['kind']}",
        f"mode        {doc['mode']} (dynamic_type {doc['dynamic_type']}), "
        f"{doc['gear_count']} gears, {doc['values_per_gear']} value(s) per gear",
        f"hybrid      {'yes' if doc['hybrid'] else 'no'}"
        f"{' (a miss runs the dynamic-shape graph)' if doc['hybrid'] else ''}",
        f"sink        {'yes' if doc['sink'] else 'no'}"
        f"{' (runnable by stock ONNX Runtime; dims returned last)' if doc['sink'] else ''}",
    ]
    if doc["input_format"]:
        lines.append(f"input fmt   {doc['input_format']}")
    precision = doc.get("precision_mode")
    lines.append(f"precision   {precision} (GE's precision_mode)" if precision else
                 "precision   not given (an .om built so runs force_fp16; ONNX Runtime and "
                 "OpenVINO run float32)")
    lines.append("inputs (user_designate_shape_order):")
    lines += _table(["#", "name", "dtype", "input_shape"],
                    [[str(i), x["name"], x["dtype"], _shape(x["input_shape"])]
                     for i, x in enumerate(doc["inputs"])])
    lines.append("outputs:")
    lines += _table(["#", "name", "dtype"],
                    [[str(k), x["name"], x["dtype"]] for k, x in enumerate(doc["outputs"])])
    lines.append("gears:")
    rows = [[str(g["gear"]), ",".join(map(str, g["dims"])),
             " ".join(f"{n}{_shape(s)}" for n, s in g["inputs"].items()),
             " ".join(f"{n}{_shape(s)}" for n, s in g["outputs"].items()),
             str(g["output_bytes"])] for g in doc["gears"]]
    lines += _table(["gear", "dims", "input shapes", "output shapes", "output bytes"], rows)
    w = doc["weights"]
    if w is not None:
        where = f", {w['in_data_file']} in the data file" if w["in_data_file"] else " inside"
        lines.append(f"weights     {w['tensors']} tensors, {_bytes(w['bytes'])}{where}")
    data = "".join(f"; data file {f} verified" for f in doc["integrity"]["data_files"])
    if own:
        lines.append(f"integrity   the {doc['backend']} backend's file: not a gear file, no "
                     "digest")
    elif doc["integrity"]["verified"]:
        lines.append(f"integrity   {doc['integrity']['algorithm']}: graph and metadata verified"
                     f"{data}")
    else:  # a plain static model records no digest
        lines.append("integrity   none recorded (a plain static model, not a gear file)")
    lines.append("files:")
    lines += _table(["path", "size"], [[f["path"], _bytes(f["bytes"])] for f in doc["files"]])
    return "\n".join(lines)


def _static_text(doc: dict[str, Any]) -> str:
    """A static model (no gears, every shape fixed) said plainly: its inputs and outputs with
    their shapes, and that it runs as one gear; none of a gear file's facts (format, mode,
    gears, digest), which it does not have."""
    own = doc.get("backend")
    (gear,) = doc["gears"]  # a static model is its one gear
    lines = [f"static model  {doc['path']}" + (f" ({own} backend's file)" if own else ""),
             "              no gears: every shape is fixed; it runs as one gear (gear 0) at "
             "exactly these shapes"]
    precision = doc.get("precision_mode")
    if precision:
        lines.append(f"precision     {precision} (GE's precision_mode)")
    lines.append("inputs:")
    lines += _table(["#", "name", "dtype", "shape"],
                    [[str(i), x["name"], x["dtype"], _shape(gear["inputs"][x["name"]])]
                     for i, x in enumerate(doc["inputs"])])
    lines.append("outputs:")
    lines += _table(["#", "name", "dtype", "shape"],
                    [[str(k), x["name"], x["dtype"], _shape(gear["outputs"][x["name"]])]
                     for k, x in enumerate(doc["outputs"])])
    lines.append(f"output bytes  {_bytes(gear['output_bytes'])}")
    w = doc["weights"]
    if w is not None:
        where = f", {w['in_data_file']} in data files" if w["in_data_file"] else " inside"
        lines.append(f"weights       {w['tensors']} tensors, {_bytes(w['bytes'])}{where}")
    lines.append("files:")
    lines += _table(["path", "size"], [[f["path"], _bytes(f["bytes"])] for f in doc["files"]])
    return "\n".join(lines)


def _shape(dims: Sequence[int]) -> str:
    return "[" + ",".join(str(d) for d in dims) + "]"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], indent: str = "  ") -> list[str]:
    return format_table([header, *rows], indent=indent)


def _bytes(n: int) -> str:
    return format_bytes(n, digits=2, exact=True)


__all__ = ["describe", "inspect_document", "model_document", "text"]
