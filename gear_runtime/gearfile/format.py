"""The gear file format: every name the writer (:mod:`gear_runtime.compiler`) and the reader
(:mod:`gear_runtime.gearfile.reader`) share, and the codecs of the values they store.


Two kinds, both written by :func:`gear_runtime.compiler.compile_model`:

``"case"`` (default; GE's multi-batch structure, docs/ge-notes.md section 4, NOT runnable by
stock ONNX Runtime): the root graph has the spec inputs shaped to the LARGEST gear plus the
int32 input ``ascend_mbatch_shape_data`` ([values_per_gear]); the weights as root
initializers (once) and the gear table (int32, flattened [gear_count * values_per_gear]);
``MapIndex(ascend_mbatch_shape_data, gear_table) -> branch index`` and
``Case(branch index, inputs...) -> outputs`` in the custom domain :data:`DOMAIN`. Case carries
GE's attributes (``batch_num``, ``pred_value_<i>``, ``user_designate_shape_order``,
``dynamic_type``, ``insert_by_mbatch``), the per-gear static graphs (``branches``, each named
``Batch_<i>``, GE's batch_label), ``dynamic_output_dims`` (GE's ATTR_NAME_DYNAMIC_OUTPUT_DIMS:
``"gearIdx,outIdx,dim0,dim1,..."``) and, in hybrid mode, ``dynamic_graph`` (the original
dynamic-shape graph). Branch graphs declare their inputs (static gear shapes) and read the
weights from the root graph by name (outer scope); they have no initializers of their own.

``"sink"`` (GE's GetNext-sink mode, runnable by plain ``onnxruntime.InferenceSession``): the
root inputs keep their dynamic dims; the graph computes the dims from the inputs' shapes
(Shape -> Gather -> Concat, GE's GetDynamicDims), compares them with the gear table (the
Constant ``ascend_mbatch_gear_table``, int64 [gear_count, dynamic positions]) into a branch
index (-1 on a miss) and routes through a balanced tree of ``If`` nodes whose leaves run
``Batch_<i>`` (no declared inputs: it reads the root inputs and weights from the outer scope).
A miss gives EMPTY outputs (or, hybrid, runs the ``Dynamic`` graph). The dims, int32, are the
LAST output, named ``ascend_mbatch_shape_data``. Per-gear output dims are stored in the
metadata key :data:`META_OUTPUT_DIMS` (JSON list of the same strings).

Weights: every weight is a ROOT initializer, once. Big ones may be ONNX external data in ONE
file beside the gear file (``<gear file name>.data``, see
:mod:`gear_runtime.gearfile.external_data`),
resolved against the gear file's folder only and checked before anything reads them.

A case file always stores the source graph as ``dynamic_graph`` (ONNX Runtime runs every gear
on one session of it); only a hybrid file (:data:`META_HYBRID`) runs it on a miss.

Both kinds carry ``metadata_props``: :data:`META_FORMAT` (= :data:`FORMAT_VERSION`),
:data:`META_SPEC` (the spec as JSON), :data:`META_KIND`, :data:`META_HYBRID`.

:func:`read_gear_file` turns either kind into a :class:`GearFile`: per gear a STANDALONE static
ONNX model without the shared weights, the source graph likewise, and the weights once as
TensorProtos (inline, or checked references to the data file): nothing reads the weights'
bytes at load but the runtime that uses them (:meth:`GearFile.runnable`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx

from gear_runtime.spec import GearSpec

_INT64_MAX = 2**63 - 1
#: Custom operator domain of MapIndex and Case.
DOMAIN = "ge.gear_runtime"
DOMAIN_VERSION = 1
#: Version of this file layout; the reader refuses any other. 2: a case file always keeps
#: the source graph (``dynamic_graph``), and big weights may live in a data file beside it.
FORMAT_VERSION = "2"
#: Largest gear file the reader takes: protobuf cannot hold a message of 2 GiB or more (the
#: weights of a bigger model are in its data file). A bigger "gear file" is refused before a
#: byte of it is read.
MAX_GEAR_FILE_BYTES = 2**31 - 1

OP_MAP_INDEX = "MapIndex"
OP_CASE = "Case"

ATTR_BATCH_NUM = "batch_num"
ATTR_PRED_VALUE = "pred_value_"          # + gear index
ATTR_SHAPE_ORDER = "user_designate_shape_order"
ATTR_DYNAMIC_TYPE = "dynamic_type"
ATTR_INSERT_BY_MBATCH = "insert_by_mbatch"
ATTR_BRANCHES = "branches"
ATTR_DYNAMIC_OUTPUT_DIMS = "dynamic_output_dims"
ATTR_DYNAMIC_GRAPH = "dynamic_graph"

META_FORMAT = "gear_runtime.format"
META_SPEC = "gear_runtime.spec"
META_KIND = "gear_runtime.kind"
META_HYBRID = "gear_runtime.hybrid"
#: sink kind only: JSON list of the dynamic_output_dims strings (no Case node to carry them).
META_OUTPUT_DIMS = "gear_runtime.dynamic_output_dims"
#: The file's integrity record (JSON, see :func:`digest_placeholder`); required.
META_DIGEST = "gear_runtime.gearfile.digest"
#: Optional: JSON list, per output, of {"axis": value index} (compiler/axes.py): which dynamic
#: value each output axis follows, so a padded run's outputs can be trimmed.
META_OUTPUT_AXES = "gear_runtime.output_dynamic_axes"

KIND_CASE = "case"
KIND_SINK = "sink"
KINDS = (KIND_CASE, KIND_SINK)

#: GE's ACL_DYNAMIC_TENSOR_NAME: the dims input (case) / last output (sink), int32.
ACL_DYNAMIC_TENSOR_NAME = "ascend_mbatch_shape_data"
#: Every name the compiler adds starts with this; models using it are refused.
RESERVED_PREFIX = "ascend_mbatch_"
GEAR_TABLE_NAME = "ascend_mbatch_gear_table"


def routing_output_name(k: int) -> str:
    """What the routing node (Case / top If) writes for output ``k`` when that output is a
    root input or weight itself (a passthrough: SSA forbids producing it again)."""
    return f"{RESERVED_PREFIX}out_{k}"



BRANCH_INDEX_NAME = "ascend_mbatch_branch_index"
#: GE's batch_label of gear i's branch, used as the branch graph's name.
BATCH_LABEL_PREFIX = "Batch_"
#: Suffix of every node and intermediate value of gear i's branch (+ str(i)), GE's naming.
BRANCH_SUFFIX = "_ascend_mbatch_batch_"
DYNAMIC_GRAPH_NAME = "Dynamic"
DYNAMIC_SUFFIX = "_ascend_mbatch_dynamic"
#: Name prefix of the Identity nodes a sink leaf adds when a model output is directly an input
#: or a weight (a subgraph output must be produced inside the subgraph); the reader drops them.
PASSTHROUGH_PREFIX = "ascend_mbatch_passthrough_"

#: spec.mode -> Case ``dynamic_type``.
DYNAMIC_TYPES = {"batch": "batch", "image_size": "image_size", "dims": "dims",
                 "static": "static"}  # static: a plain model read as one gear, never written

#: The AttributeProto type of each Case attribute (``pred_value_<i>``: INTS), as written.
CASE_ATTR_TYPES = {
    ATTR_BATCH_NUM: onnx.AttributeProto.INT,
    ATTR_SHAPE_ORDER: onnx.AttributeProto.STRINGS,
    ATTR_DYNAMIC_TYPE: onnx.AttributeProto.STRING,
    ATTR_INSERT_BY_MBATCH: onnx.AttributeProto.INT,
    ATTR_BRANCHES: onnx.AttributeProto.GRAPHS,
    ATTR_DYNAMIC_OUTPUT_DIMS: onnx.AttributeProto.STRINGS,
    ATTR_DYNAMIC_GRAPH: onnx.AttributeProto.GRAPH,
}


#: The model files a device backend opens itself (not gear files), by suffix: the one table
#: the backends' facts and the reader's hint for a wrong file both read.
OWN_FILE_SUFFIXES: dict[str, str] = {".om": "acl", ".mindir": "mindspore_lite"}


def batch_label(gear: int) -> str:
    """GE's batch_label of gear ``gear``: ``Batch_<gear>``."""
    return f"{BATCH_LABEL_PREFIX}{gear}"


def spec_to_json(spec: GearSpec) -> str:
    """The spec as the JSON stored under :data:`META_SPEC` (``precision_mode`` only when set:
    files written before it existed read the same)."""
    d = {
        "mode": spec.mode,
        "input_names": list(spec.input_names),
        "input_shapes": [list(s) for s in spec.input_shapes],
        "gears": [list(g) for g in spec.gears],
        "hybrid": bool(spec.hybrid),
        "input_format": spec.input_format,
    }
    if spec.precision_mode is not None:
        d["precision_mode"] = spec.precision_mode
    return json.dumps(d, separators=(",", ":"))


def spec_from_json(text: str) -> GearSpec:
    """Inverse of :func:`spec_to_json`; GearSpecError / ValueError / KeyError / TypeError on
    bad text. The JSON values go to GearSpec as they are: its own checks refuse what is not
    a spec (converting first would turn the string ``"ab"`` into the names ``("a", "b")``)."""
    d = json.loads(text)
    if not isinstance(d, dict):
        raise ValueError(f"a JSON object expected, got {type(d).__name__}")
    if not isinstance(d["hybrid"], bool):
        raise ValueError(f"'hybrid' must be true or false, got {d['hybrid']!r}")
    return GearSpec(mode=d["mode"], input_names=d["input_names"],
                    input_shapes=d["input_shapes"], gears=d["gears"], hybrid=d["hybrid"],
                    input_format=d.get("input_format"), precision_mode=d.get("precision_mode"))


def case_gear_table(spec: GearSpec) -> np.ndarray:
    """Kind ``"case"``'s gear table (GE's MapIndex Const): the gears flattened, int32
    [gear_count * values_per_gear]."""
    return np.asarray(spec.gears, dtype=np.int32).reshape(-1)


def sink_gear_table(spec: GearSpec) -> np.ndarray:
    """Kind ``"sink"``'s gear table, compared with GetDynamicDims' output: per gear, the
    value at every dynamic position (``spec.dynamic_positions`` order), int64
    [gear_count, len(dynamic_positions)]."""
    return np.asarray([[g[v] for _, _, v in spec.dynamic_positions] for g in spec.gears],
                      dtype=np.int64)


def format_output_dims(shapes: Sequence[Sequence[Sequence[int]]]) -> list[str]:
    """``shapes[gear][output]`` -> GE's ``"gearIdx,outIdx,dim0,dim1,..."`` strings."""
    return [",".join(str(v) for v in (g, k, *shape))
            for g, outs in enumerate(shapes) for k, shape in enumerate(outs)]


def parse_output_dims(items: Sequence[str], gear_count: int,
                      output_count: int) -> tuple[tuple[tuple[int, ...], ...], ...]:
    """Inverse of :func:`format_output_dims`; ValueError unless every (gear, output) appears
    exactly once with non-negative dims."""
    table: dict[tuple[int, int], tuple[int, ...]] = {}
    for item in items:
        vals = [int(v) for v in item.split(",")] if item else []
        if len(vals) < 2:
            raise ValueError(f"output dims entry {item!r} has no gear and output index")
        g, k, dims = vals[0], vals[1], tuple(vals[2:])
        if not (0 <= g < gear_count and 0 <= k < output_count):
            raise ValueError(f"output dims entry {item!r}: gear or output index out of range "
                             f"({gear_count} gears, {output_count} outputs)")
        if (g, k) in table:
            raise ValueError(f"output dims entry {item!r}: gear {g} output {k} given twice")
        if any(d < 0 for d in dims):
            raise ValueError(f"output dims entry {item!r} has a negative dim")
        if math.prod(dims) > _INT64_MAX:  # sizes are int64 everywhere after this
            raise ValueError(f"output dims entry {item!r}: {math.prod(dims)} elements do not "
                             "fit in int64")
        table[(g, k)] = dims
    missing = [(g, k) for g in range(gear_count) for k in range(output_count)
               if (g, k) not in table]
    if missing:
        raise ValueError(f"output dims missing for (gear, output) {missing[:5]}")
    return tuple(tuple(table[(g, k)] for k in range(output_count)) for g in range(gear_count))


#: Per output, ``{axis: value index}``: which dynamic value each output axis follows
#: (:mod:`gear_runtime.compiler.axes`), stored under :data:`META_OUTPUT_AXES`.
OutputAxes = tuple[dict[int, int], ...]


def axes_to_json(axes: OutputAxes) -> list[dict[str, int]]:
    """JSON form (object keys are strings): one ``{"axis": value}`` object per output."""
    return [{str(a): int(v) for a, v in sorted(d.items())} for d in axes]


def axes_from_json(items: Any, output_count: int, width: int) -> OutputAxes:
    """Inverse of :func:`axes_to_json`; ValueError naming what is wrong."""
    if not isinstance(items, list) or len(items) != output_count:
        raise ValueError(f"expected a list of {output_count} objects")
    out = []
    for k, item in enumerate(items):
        if not isinstance(item, dict):
            raise ValueError(f"output {k}: expected an object axis -> value index")
        axes = {}
        for a, v in item.items():
            if not (isinstance(a, str) and a.isdigit() and isinstance(v, int)
                    and not isinstance(v, bool) and 0 <= v < width):
                raise ValueError(f"output {k}: bad entry {a!r}: {v!r}")
            axes[int(a)] = v
        out.append(axes)
    return tuple(out)
