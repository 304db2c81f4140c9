"""The gear compiler: a dynamic ONNX model + a GearSpec -> one gear file.

Flow: check the spec against the model (check.py) -> per gear, fix the inputs, re-infer shapes
and clone the graph as ``Batch_<i>`` (branch.py) -> per gear output shapes (outputs.py) ->
wrap the branches in GE's Case structure or the sink routing (route.py) -> one .onnx file.
The file format and its reader are in :mod:`gear_runtime.gearfile.reader`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import secrets
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

import onnx

from gear_runtime import arguments
from gear_runtime.compiler.axes import output_dynamic_axes, probe_values
from gear_runtime.compiler.branch import (
    build_branch,
    build_dynamic,
    dynamic_inputs,
    infer_gear,
    make_skeleton,
    static_inputs,
)
from gear_runtime.compiler.check import (
    Source,
    check_reserved,
    check_spec,
    inspect_model,
    load_model,
)
from gear_runtime.compiler.outputs import (
    ShapeRunner,
    gear_output_shapes,
    select_outputs,
    set_output_shapes,
)
from gear_runtime.compiler.route import build_case_model, build_sink_model, check_sink_opset
from gear_runtime.errors import CompileError
from gear_runtime.gearfile.digest import DataDigest, digest_placeholder, graph_digest, seal_digest
from gear_runtime.gearfile.external_data import (
    AUTO_EXTERNAL_BYTES,
    DataWriter,
    data_file_name,
    escape_file_name,
    is_external,
    movable,
    relocate,
    tensor_nbytes,
)
from gear_runtime.gearfile.format import (
    FORMAT_VERSION,
    KIND_CASE,
    KIND_SINK,
    MAX_GEAR_FILE_BYTES,
    META_DIGEST,
    META_FORMAT,
    META_HYBRID,
    META_KIND,
    META_OUTPUT_AXES,
    META_OUTPUT_DIMS,
    META_SPEC,
    RESERVED_PREFIX,
    OutputAxes,
    axes_to_json,
    format_output_dims,
    spec_to_json,
)
from gear_runtime.gearfile.info import Probe
from gear_runtime.progress import progress_bar
from gear_runtime.spec import GearSpec

#: protobuf cannot serialize a message of 2 GiB or more: the graph (and any weights kept
#: inside it) must stay under the format's limit; big weights go to the data file beside it.
MAX_FILE_BYTES = MAX_GEAR_FILE_BYTES


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
    #: the weights' data file beside the gear file (None: the weights are inside it)
    data_path: str | None = None
    data_bytes: int = 0
    #: gears run once on ONNX Runtime at compile time (their outputs' shapes checked), and
    #: those the budget left unrun (``verify=None``) or ``verify=False`` skipped
    verified: list[int] = field(default_factory=list)
    unverified: list[int] = field(default_factory=list)
    #: output axes that follow one of several values equal in every gear, recorded to
    #: follow the first without the probe run that tells them apart (verify off): "y axis 3
    #: follows value 0 or 1 (...): padded requests trim it by value 0"
    unchecked_ties: list[str] = field(default_factory=list)


#: ``verify=None``: gears are run while the runs so far took less than this many seconds...
VERIFY_SECONDS = 60.0
#: ... and only for sources of at most this many bytes of weights (the run loads them all
#: into an ORT session once more); ``verify=True`` runs every gear whatever they cost.
VERIFY_MAX_WEIGHT_BYTES = 2 * 2**30


def compile_model(model: str | os.PathLike[str] | onnx.ModelProto, spec: GearSpec,
                  output: str | os.PathLike[str], hybrid: bool = False, sink: bool = False,
                  progress: bool = True, external_data: bool | None = None,
                  verify: bool | None = None, out_nodes: str | None = None) -> str:
    """Compile ``model`` (a path or ModelProto with dynamic dims) for the gears of ``spec``
    into the gear file ``output``; return ``output`` as a string.

    ``hybrid`` (or ``spec.hybrid``): also store the original dynamic-shape graph, run on a miss
    (GE's hybrid mode); the stored spec then has ``hybrid=True``. ``sink``: write the
    stock-ONNX-Runtime-runnable routing form (GE's GetNext-sink mode: dims computed in the
    graph and returned as the last output) instead of GE's Case structure. ``progress``: a
    bar on stderr over the whole compile (reading the source, each gear, building, checking
    and writing), drawn only when stderr is a terminal (:mod:`gear_runtime.progress`).
    ``external_data``: put the weights (tensors of 1 KiB or more) in ONE data file beside the
    gear file, ``<output>.data`` (ONNX external data, location relative to the gear file's
    folder); None: when they add up to 16 MiB or more, or the source keeps any weight in
    external data. A source with external data is streamed: its weights are copied file to
    file, never parsed. The gear file and its data file are written atomically (temporary
    files renamed in place), with the mode the umask gives new files. ``verify``: run each
    gear once on ONNX Runtime before writing (see :func:`compile_gears`). ``out_nodes``: atc's
    ``--out_nodes``, the outputs the gear file has instead of the source's
    (``"node_name:0;node_name:1"``, or graph output names ``"out1;out2"``; see
    :func:`gear_runtime.compiler.outputs.select_outputs`).

    Raises CompileError when the spec does not fit the model (naming the input, the axis, the
    spec's value and the model's), when the output directory does not exist, when ``sink``
    is asked of a model below opset 11 (these before any gear is compiled), when a gear's
    output shape cannot be determined or a gear cannot run, when the output is the source
    itself, when dims the model names alike get different values in a gear, when the graph
    (with any weights kept inside it) would exceed 2 GiB, or when a file cannot be written.
    """
    return compile_gears(model, spec, output, hybrid=hybrid, sink=sink, progress=progress,
                         external_data=external_data, verify=verify, out_nodes=out_nodes).path


def compile_gears(model: str | os.PathLike[str] | onnx.ModelProto, spec: GearSpec,
                  output: str | os.PathLike[str], hybrid: bool = False, sink: bool = False,
                  progress: bool = True, external_data: bool | None = None,
                  verify: bool | None = None, out_nodes: str | None = None) -> CompileReport:
    """:func:`compile_model`, returning a :class:`CompileReport`.

    ``verify``: run every gear once on ONNX Runtime (zero inputs, the source graph at the
    gear's shapes) and refuse a gear that fails (CompileError naming the gear, the node and
    ORT's reason) before anything is written, as atc refuses a model it cannot build. None
    (default): within a budget (:data:`VERIFY_SECONDS`, :data:`VERIFY_MAX_WEIGHT_BYTES`; the
    report lists the gears left unrun); True: every gear; False: none.
    """
    start = time.perf_counter()
    if not isinstance(spec, GearSpec):
        raise CompileError(f"spec must be a GearSpec, got {type(spec).__name__}")
    if spec.mode == "static":
        raise CompileError("a static spec has no gears to compile: a model whose inputs are "
                           "all static loads as it is (gear_runtime.load / gear-runtime run)")
    if not isinstance(model, onnx.ModelProto):
        model = arguments.path("model", model, CompileError)
    hybrid, sink, progress = (arguments.flag(name, value, CompileError) for name, value in (
        ("hybrid", hybrid), ("sink", sink), ("progress", progress)))
    if external_data is not None:
        external_data = arguments.flag("external_data", external_data, CompileError)
    if verify is not None:
        verify = arguments.flag("verify", verify, CompileError)
    if out_nodes is not None and not isinstance(out_nodes, str):
        raise CompileError(f"out_nodes must be a string like 'node:0;node:1', got "
                           f"{type(out_nodes).__name__}")
    if (hybrid or spec.hybrid) and spec.mode != "dims":
        # GE builds the hybrid (gear + dynamic-shape) graph only from ge.dynamicDims
        raise CompileError(f"hybrid mode needs a dims spec (GE has it only with ge.inputShape "
                           f"+ ge.dynamicDims); this spec is in {spec.mode} mode",
                           code="E10001")
    # everything that can be refused is refused before the first gear is compiled
    path = _check_output(output)
    if isinstance(model, str) and os.path.exists(path) and os.path.samefile(model, path):
        raise CompileError(f"the output {path!r} is the source model itself: compiling would "
                           "overwrite it; give the gear file another name (e.g. "
                           f"{os.path.splitext(path)[0]}.gear.onnx)")
    # the bar counts every long step, not only the gears: on a multi-GB model reading the
    # source and writing (checking, hashing) the file take as long as the gears
    with progress_bar(spec.gear_count + 3, "compile", progress, unit="step") as bar:
        bar.set_postfix_str("reading the source", refresh=True)
        loaded = load_model(model)
        source = loaded.model
        if out_nodes is not None:
            select_outputs(source, out_nodes)
        info = inspect_model(source)
        check_reserved(source)
        check_spec(info, spec)
        if sink:
            check_sink_opset(info)
        if hybrid and not spec.hybrid:
            spec = dataclasses.replace(spec, hybrid=True)
        report = CompileReport(path, KIND_SINK if sink else KIND_CASE, spec.gear_count)
        bar.update(1)

        skeleton = make_skeleton(source)
        branches: list[onnx.GraphProto] = []
        shapes: list[list[tuple[int, ...]]] = []
        runner = ShapeRunner(loaded, info)
        budget = _VerifyBudget(verify, loaded)
        try:
            for i in range(spec.gear_count):
                gear_shapes = spec.shapes(i)
                bar.set_postfix_str("gear " + ",".join(map(str, spec.gears[i])), refresh=False)
                inferred = infer_gear(skeleton, gear_shapes, i)
                inputs = static_inputs(info, spec.input_names, gear_shapes)
                branch = build_branch(inferred, i, inputs, list(inferred.output), info.weights)
                out_shapes, ran = gear_output_shapes(inferred, runner, info, gear_shapes, i)
                del inferred  # the branch has what it needs; a graph's inference is big
                if ran:
                    report.ran_on_ort.append(i)
                if ran or budget.run(partial(runner.check, gear_shapes, i, spec.gears[i],
                                             out_shapes)):
                    report.verified.append(i)
                else:
                    report.unverified.append(i)
                set_output_shapes(branch, info, out_shapes)
                branches.append(branch)
                shapes.append(out_shapes)
                bar.update(1)
            probed = budget.verify is not False
            probe = _probe(spec, runner) if probed else None
        finally:
            runner.close()

        # A case file always keeps the source graph: ONNX Runtime runs every gear on ONE
        # session of it (one copy of the weights, prepacked once); a hybrid miss runs it too.
        # A sink file keeps it only for hybrid misses: ORT runs the sink file itself.
        bar.set_postfix_str("building the gear file", refresh=True)
        axes, ties = output_dynamic_axes(skeleton, spec, shapes, probe, probed)
        del skeleton  # before the root is built: graphs held at once are the peak of a compile
        dynamic = None
        if spec.hybrid or not sink:
            dynamic = build_dynamic(source, dynamic_inputs(info, spec.input_names,
                                                           spec.input_shapes), info.weights)
        build = build_sink_model if sink else build_case_model
        root = build(source, info, spec, branches, shapes, dynamic)  # empties branches (case)
        del source, branches, dynamic  # the root holds what is left; free the rest early
        report.unchecked_ties = [
            f"{info.outputs[k].name} axis {axis} follows value {' or '.join(map(str, fits))}"
            f" (equal in every gear; no run at compile time told which): padded requests "
            f"trim it by value {fits[0]}" for k, axis, fits in ties]
        for line in report.unchecked_ties:
            warnings.warn(line, stacklevel=3)
        _set_metadata(root, spec, report.kind, shapes, axes)
        bar.update(1)
        bar.set_postfix_str("checking and writing", refresh=True)
        report.file_bytes, report.data_path, report.data_bytes = save_gear_file(
            root, path, loaded, external_data, progress)
        bar.update(1)
    report.seconds = time.perf_counter() - start
    return report


class _VerifyBudget:
    """Whether compile runs the next gear (``verify``: True always, False never, None while
    the runs so far stay under :data:`VERIFY_SECONDS` on a source of at most
    :data:`VERIFY_MAX_WEIGHT_BYTES` of weights)."""

    def __init__(self, verify: bool | None, source: Source) -> None:
        self.verify, self.spent = verify, 0.0
        if verify is None and _weight_bytes(source.model) > VERIFY_MAX_WEIGHT_BYTES:
            self.verify = False

    def run(self, check: Callable[[], None]) -> bool:
        """Run ``check`` if the budget allows; whether it ran (its errors propagate)."""
        if self.verify is False or (self.verify is None and self.spent >= VERIFY_SECONDS):
            return False
        start = time.perf_counter()
        check()
        self.spent += time.perf_counter() - start
        return True


def _probe(spec: GearSpec, runner: ShapeRunner) -> Probe | None:
    """The probe run of compiler/axes.py (values tied in every gear made to differ): the
    values and per output its shape; None when no values are tied or when the model cannot
    run there (it needs them equal itself)."""
    values = probe_values(spec.gears)
    if values is None:
        return None
    try:
        return values, runner.run(spec.shapes_for(values), -1)
    except CompileError:  # a shape baked into the graph: the probe is evidence, not a rule
        return None


def _weight_bytes(model: onnx.ModelProto) -> int:
    return sum(tensor_nbytes(t) or 0 for t in model.graph.initializer)


def _set_metadata(model: onnx.ModelProto, spec: GearSpec, kind: str,
                  shapes: list[list[tuple[int, ...]]], axes: OutputAxes = ()) -> None:
    ours = {META_FORMAT: FORMAT_VERSION, META_SPEC: spec_to_json(spec), META_KIND: kind,
            META_HYBRID: "1" if spec.hybrid else "0"}
    if axes:
        ours[META_OUTPUT_AXES] = json.dumps(axes_to_json(axes))
    if kind == KIND_SINK:
        ours[META_OUTPUT_DIMS] = json.dumps(format_output_dims(shapes))
    kept = [p for p in model.metadata_props if p.key not in ours]
    del model.metadata_props[:]
    model.metadata_props.extend(kept)
    for key, value in ours.items():
        model.metadata_props.add(key=key, value=value)


def _check_output(output: object) -> str:
    """``output`` as a path to write the gear file to: a file name (not ``.``, ``..`` or a
    folder) in an existing folder. CompileError naming the path and what is wrong."""
    path = arguments.path("output", output, CompileError)
    if os.path.basename(path) in ("", ".", "..") or os.path.isdir(path):
        raise CompileError(f"cannot write {path!r}: it names a directory, not a file; give the "
                           "gear file's own name (e.g. model.gear.onnx)")
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise CompileError(f"cannot write {path!r}: directory {directory!r} does not exist")
    return path


def save_gear_file(model: onnx.ModelProto, path: str, source: Source,
                   external: bool | None, progress: bool = False) -> tuple[int, str | None, int]:
    """Check and write ``model`` to ``path``, its big weights to the data file beside it
    when ``external`` (None: see :func:`compile_model`). Returns (gear file bytes, data file
    path or None, data file bytes).

    Atomic: both files are written to temporary names in the same folder and renamed in
    place once the graph passed onnx.checker; nothing temporary outlives a failure. A stale
    data file of an earlier compile to the same path is removed when the new file keeps its
    weights inside. The gear file records the digests of itself and of the data file
    (:data:`META_DIGEST`), checked at load. ``progress``: a bar of the data file's bytes on
    a terminal (the longest step of a multi-GB compile)."""
    folder = os.path.dirname(os.path.abspath(path))
    data_name = data_file_name(path)
    tensors = [t for t in model.graph.initializer
               if movable(t) and not t.name.startswith(RESERVED_PREFIX)]
    if external is None:
        external = (any(is_external(t) for t in tensors)
                    or sum(tensor_nbytes(t) or 0 for t in tensors) >= AUTO_EXTERNAL_BYTES)
    temps: list[str] = []
    try:
        data_bytes = 0
        digests: dict[str, DataDigest] = {}
        if external and tensors:
            data_tmp = _new_file(folder, data_name, temps)  # its name is what the checker sees
            sizes = [tensor_nbytes(t) or 0 for t in tensors]
            with open(data_tmp, "wb") as f, progress_bar(
                    sum(sizes), "writing weights", progress, unit="B", scale=True) as bar:
                writer = DataWriter(f, os.path.basename(data_tmp))
                for t, size in zip(tensors, sizes, strict=True):
                    writer.move(t, source.span)
                    bar.update(size)
                data_bytes = writer.bytes
            digests[data_name] = DataDigest(writer.digest(), data_bytes)
        else:
            for t in tensors:
                if is_external(t):
                    source.inline(t)
        _check_size(model)
        gear_tmp = _new_file(folder, escape_file_name(os.path.basename(path)), temps)
        _write_checked(model, gear_tmp, digests)
        if data_bytes:
            _replace_pair(model, tensors, path, folder, data_name, digests, gear_tmp, temps)
        else:
            os.replace(gear_tmp, path)
        _remove_stale_temps(folder, [escape_file_name(os.path.basename(path)), data_name])
        if not data_bytes:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(folder, data_name))
        return (os.path.getsize(path), os.path.join(folder, data_name) if data_bytes else None,
                data_bytes)
    except OSError as exc:
        raise CompileError(f"cannot write {path!r}: {exc.strerror or exc}") from exc
    finally:
        for tmp in temps:  # gone after a successful replace
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)


def _replace_pair(model: onnx.ModelProto, tensors: list[onnx.TensorProto], path: str,
                  folder: str, data_name: str, digests: dict[str, DataDigest], gear_tmp: str,
                  temps: list[str]) -> None:
    """Put the new gear file and data file in place so that a kill at any moment leaves a
    pair that belongs together (the old one or the new one), never the old gear file with
    the new data file.

    1. The gear file as checked -- pointing at the data file's TEMPORARY name, its digest
       recorded under that name -- replaces ``path``: already a whole new pair.
    2. A hard link gives the new data file its real name (replacing the old data file);
       the temporary name still holds it, so step 1's gear file stays whole.
    3. The gear file pointing at the real name replaces ``path``; the temporary name goes.
    Where the file system has no hard links, the data file is renamed in place and then the
    gear file (a kill between the two leaves a mismatched pair, which load refuses)."""
    data_tmp, data_path = temps[0], os.path.join(folder, data_name)
    tmp_name = os.path.basename(data_tmp)
    with open(gear_tmp, "wb") as f:  # 1.
        f.write(_sealed(model, {tmp_name: digests[data_name]}))
    try:
        link = _new_name(folder, data_name)
        os.link(data_tmp, link)
    except OSError:
        linked = False
    else:
        temps.append(link)
        linked = True
        os.replace(gear_tmp, path)
        os.replace(link, data_path)  # 2.
    for t in tensors:
        relocate(t, data_name)
    final = _new_file(folder, escape_file_name(os.path.basename(path)), temps)
    with open(final, "wb") as f:
        f.write(_sealed(model, digests))
    if not linked:
        os.replace(data_tmp, data_path)
    os.replace(final, path)  # 3.


def _remove_stale_temps(folder: str, names: list[str]) -> None:
    """Remove what killed compiles of these names left (``.tmp-<name>.<pid>.<hex>`` of a
    process that no longer runs); a live compile's files are left alone."""
    for entry in os.listdir(folder):
        for name in names:
            prefix = f".tmp-{name}."
            if not entry.startswith(prefix):
                continue
            pid = entry[len(prefix):].split(".")[0]
            if pid.isdigit() and int(pid) != os.getpid() and not _alive(int(pid)):
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(folder, entry))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process: it exists
        return True
    return True


def _temp_name(folder: str, name: str) -> str:
    """One candidate temporary name for ``name``: ``.tmp-<name>.<pid>.<hex>`` (the form
    :func:`_remove_stale_temps` recognises)."""
    return os.path.join(folder, f".tmp-{name}.{os.getpid()}.{secrets.token_hex(4)}")


def _new_name(folder: str, name: str) -> str:
    """A free temporary name for ``name`` in ``folder`` (nothing created)."""
    for _ in range(100):
        tmp = _temp_name(folder, name)
        if not os.path.lexists(tmp):
            return tmp
    raise OSError(f"no free temporary file name in {folder!r}")


def _new_file(folder: str, name: str, temps: list[str]) -> str:
    """Create an empty temporary file for ``name`` (escaped, :func:`escape_file_name`: a
    data file's temporary name is the location onnx.checker checks, and the checker takes a
    backslash in the gear file's name for a folder; ``.tmp-`` before it, not a bare dot, so
    that ``.hidden`` gives no ``..``) with the mode the umask gives new files (0644 under umask
    022; mkstemp would force 0600) and record it in ``temps``."""
    for _ in range(100):
        tmp = _temp_name(folder, name)
        try:
            os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
        except FileExistsError:
            continue
        temps.append(tmp)
        return tmp
    raise OSError(f"no free temporary file name in {folder!r}")


def _check_size(model: onnx.ModelProto) -> None:
    try:
        size = model.ByteSize()
    except Exception:  # some protobuf builds refuse to size a message past 2 GiB
        size = MAX_FILE_BYTES + 1
    if size > MAX_FILE_BYTES:
        raise CompileError(
            f"the gear file would be {size / 2**30:.2f} GiB: ONNX graphs (protobuf) are "
            f"limited to 2 GiB; compile with external_data=True (--external-data) so that "
            f"the weights go to a data file beside it")


def _sealed(model: onnx.ModelProto, digests: dict[str, DataDigest]) -> bytes:
    """``model`` serialized with its integrity record: the digest of its graph, of
    ``digests``' data files, and of the serialized file itself (sealed in place, same length)."""
    placeholder = digest_placeholder(graph_digest(model), digests)
    kept = [p for p in model.metadata_props if p.key != META_DIGEST]
    del model.metadata_props[:]
    model.metadata_props.extend(kept)
    model.metadata_props.add(key=META_DIGEST, value=placeholder)
    try:
        return seal_digest(model.SerializeToString(), placeholder)
    except ValueError as exc:
        raise CompileError(f"internal error: {exc}") from exc


def _write_checked(model: onnx.ModelProto, tmp: str, digests: dict[str, DataDigest]) -> None:
    """Write ``model`` (sealed, see :func:`_sealed`) to ``tmp`` and run onnx.checker on the
    file (so external data is checked against the files beside it, not the working
    directory).

    ONNX Runtime registers some of its own kernels in the default domain, which onnx has no
    schema for (SimplifiedLayerNormalization, SkipSimplifiedLayerNormalization: what
    onnxruntime-genai's model builder writes). The checker stops at the first such node
    ("No Op registered for ..."): where the model itself uses that op (the compiler writes
    none), the checker cannot judge the file, and ORT, which runs it, is the judge (the
    compile's verify run and every load)."""
    with open(tmp, "wb") as f:
        f.write(_sealed(model, digests))
    try:
        onnx.checker.check_model(tmp)
    except onnx.checker.ValidationError as exc:
        unknown = re.search(r"No Op registered for (\S+) with domain_version", str(exc))
        if unknown is None or unknown.group(1) not in _unschematized_ops(model.graph):
            raise CompileError(f"internal error: the compiled model fails onnx.checker: "
                               f"{exc}") from exc


def _unschematized_ops(graph: onnx.GraphProto) -> set[str]:
    """Default-domain op types of ``graph`` (and its subgraphs) that onnx has no schema for."""
    found: set[str] = set()
    for node in graph.node:
        if node.domain in ("", "ai.onnx") and not onnx.defs.has(node.op_type):
            found.add(node.op_type)
        for attr in node.attribute:
            for sub in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
                found |= _unschematized_ops(sub)
    return found
