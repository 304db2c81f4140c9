"""The gear compiler: a dynamic ONNX model + a GearSpec -> one gear file.

Flow: check the spec against the model (check.py) -> per gear, fix the inputs, re-infer shapes
and clone the graph as ``Batch_<i>`` (branch.py) -> per gear output shapes (outputs.py) ->
wrap the branches in GE's Case structure or the sink routing (route.py) -> one .onnx file.
The file format and its reader are in :mod:`gear_runtime.gearfile`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass, field

import onnx
from tqdm import tqdm

from gear_runtime.compiler.branch import (
    build_branch,
    build_dynamic,
    dynamic_inputs,
    infer_gear,
    make_skeleton,
    static_inputs,
)
from gear_runtime.compiler.check import check_reserved, check_spec, inspect_model, load_model
from gear_runtime.compiler.outputs import ShapeRunner, gear_output_shapes, set_output_shapes
from gear_runtime.compiler.route import build_case_model, build_sink_model, check_sink_opset
from gear_runtime.errors import CompileError
from gear_runtime.gearfile import (
    FORMAT_VERSION,
    KIND_CASE,
    KIND_SINK,
    META_FORMAT,
    META_HYBRID,
    META_KIND,
    META_OUTPUT_DIMS,
    META_SPEC,
    format_output_dims,
    spec_to_json,
)
from gear_runtime.spec import GearSpec

#: protobuf cannot serialize a message of 2 GiB or more, and a gear file keeps its weights
#: inside (one file, no external data).
MAX_FILE_BYTES = 2**31 - 1


@dataclass
class CompileReport:
    """What one compile did (for tests, benchmarks and the CLI)."""

    path: str
    kind: str
    gear_count: int
    file_bytes: int = 0
    seconds: float = 0.0
    #: gears whose output shapes needed a real ONNX Runtime run (inference left dims unknown)
    ran_on_ort: list[int] = field(default_factory=list)


def compile_model(model: str | os.PathLike[str] | onnx.ModelProto, spec: GearSpec,
                  output: str | os.PathLike[str], hybrid: bool = False, sink: bool = False,
                  progress: bool = True) -> str:
    """Compile ``model`` (a path or ModelProto with dynamic dims) for the gears of ``spec``
    into the gear file ``output``; return ``output`` as a string.

    ``hybrid`` (or ``spec.hybrid``): also store the original dynamic-shape graph, run on a miss
    (GE's hybrid mode); the stored spec then has ``hybrid=True``. ``sink``: write the
    stock-ONNX-Runtime-runnable routing form (GE's GetNext-sink mode: dims computed in the
    graph and returned as the last output) instead of GE's Case structure. ``progress``: a
    tqdm bar on stderr while compiling gears (only when stderr is a terminal).

    Raises CompileError when the spec does not fit the model (naming the input, the axis, the
    spec's value and the model's), when the output directory does not exist, when ``sink``
    is asked of a model below opset 11 (these before any gear is compiled), when a gear's
    output shape cannot be determined, when the file would exceed 2 GiB, or when it cannot
    be written.
    """
    return compile_gears(model, spec, output, hybrid=hybrid, sink=sink,
                         progress=progress).path


def compile_gears(model: str | os.PathLike[str] | onnx.ModelProto, spec: GearSpec,
                  output: str | os.PathLike[str], hybrid: bool = False, sink: bool = False,
                  progress: bool = True) -> CompileReport:
    """:func:`compile_model`, returning a :class:`CompileReport`."""
    start = time.perf_counter()
    if not isinstance(spec, GearSpec):
        raise CompileError(f"spec must be a GearSpec, got {type(spec).__name__}")
    path = os.fspath(output)
    # everything that can be refused is refused before the first gear is compiled
    _check_output_dir(path)
    source = load_model(model)
    info = inspect_model(source)
    check_reserved(source)
    check_spec(info, spec)
    if sink:
        check_sink_opset(info)
    if hybrid and not spec.hybrid:
        spec = dataclasses.replace(spec, hybrid=True)
    report = CompileReport(path, KIND_SINK if sink else KIND_CASE, spec.gear_count)

    skeleton = make_skeleton(source)
    branches: list[onnx.GraphProto] = []
    shapes: list[list[tuple[int, ...]]] = []
    runner = ShapeRunner(source, info)
    bar = tqdm(total=spec.gear_count, desc="compiling gears", unit="gear", file=sys.stderr,
               disable=not progress or not _is_tty(sys.stderr))
    try:
        for i in range(spec.gear_count):
            gear_shapes = spec.shapes(i)
            bar.set_postfix_str(",".join(map(str, spec.gears[i])), refresh=False)
            inferred = infer_gear(skeleton, gear_shapes, i)
            inputs = static_inputs(info, spec.input_names, gear_shapes)
            branch = build_branch(inferred, i, inputs, list(inferred.output), info.weights)
            out_shapes, ran = gear_output_shapes(inferred, runner, info, gear_shapes, i)
            if ran:
                report.ran_on_ort.append(i)
            set_output_shapes(branch, info, out_shapes)
            branches.append(branch)
            shapes.append(out_shapes)
            bar.update(1)
    finally:
        bar.close()
        runner.close()

    dynamic = None
    if spec.hybrid:
        dynamic = build_dynamic(source, dynamic_inputs(info, spec.input_names, spec.input_shapes),
                                info.weights)
    build = build_sink_model if sink else build_case_model
    root = build(source, info, spec, branches, shapes, dynamic)
    _set_metadata(root, spec, report.kind, shapes)
    report.file_bytes = _save(root, path)
    report.seconds = time.perf_counter() - start
    return report


def _is_tty(stream: object) -> bool:
    try:
        return bool(stream.isatty())  # type: ignore[attr-defined]
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


def _set_metadata(model: onnx.ModelProto, spec: GearSpec, kind: str,
                  shapes: list[list[tuple[int, ...]]]) -> None:
    ours = {META_FORMAT: FORMAT_VERSION, META_SPEC: spec_to_json(spec), META_KIND: kind,
            META_HYBRID: "1" if spec.hybrid else "0"}
    if kind == KIND_SINK:
        ours[META_OUTPUT_DIMS] = json.dumps(format_output_dims(shapes))
    kept = [p for p in model.metadata_props if p.key not in ours]
    del model.metadata_props[:]
    model.metadata_props.extend(kept)
    for key, value in ours.items():
        model.metadata_props.add(key=key, value=value)


def _check_output_dir(path: str) -> None:
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise CompileError(f"cannot write {path!r}: directory {directory!r} does not exist")


def _save(model: onnx.ModelProto, path: str) -> int:
    """Check and write ``model`` to ``path`` (atomically: a temp file then rename; the temp
    file never outlives a failure)."""
    try:
        size = model.ByteSize()
    except Exception:  # some protobuf builds refuse to size a message past 2 GiB
        size = MAX_FILE_BYTES + 1
    if size > MAX_FILE_BYTES:
        raise CompileError(
            f"the gear file would be {size / 2**30:.2f} GiB: ONNX files (protobuf) are limited "
            f"to 2 GiB and a gear file keeps its weights inside; reduce the weights (fp16, "
            f"quantization) before compiling")
    try:
        onnx.checker.check_model(model)
    except onnx.checker.ValidationError as exc:
        raise CompileError(f"internal error: the compiled model fails onnx.checker: {exc}") from exc
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=".gear-", suffix=".onnx.tmp",
                                   dir=os.path.dirname(os.path.abspath(path)))
        with os.fdopen(fd, "wb") as f:
            f.write(model.SerializeToString())
        os.replace(tmp, path)
        return os.path.getsize(path)
    except OSError as exc:  # mkstemp included: a read-only or vanished directory
        raise CompileError(f"cannot write {path!r}: {exc.strerror or exc}") from exc
    finally:
        if tmp is not None:  # gone after a successful replace
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
