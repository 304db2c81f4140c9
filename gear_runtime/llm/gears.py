"""The engine's gears: which it compiles, and the one gear file it compiles them into.

One gear file holds both kinds, over one copy of the weights (ONNX Runtime runs them all in
one session; GE's dims mode on the builder's graph):

* **prompt gears** ``(1, G)``: one sequence's prompt, or a chunk of it, ``G`` tokens written
  into its row of the cache at the row's current length (the mask ``[1, max_length]`` ones up
  to the length after the chunk: GroupQueryAttention's non-first-prompt path, so a chunk
  after another is the same run as the first);
* **batch gears** ``(b, 1)``: one decode step of ``b`` sequences, rows ``0 .. b`` of the cache.

Only the logits that are sampled are computed: before compiling, the decoder's LM head is
fed a ``Gather`` of one position per row (the graph input :data:`LOGITS_INDEX`, ``[1]``: the
prompt's last real token; 0 for a step), so every gear returns ``[rows, 1, vocab]``.

The gear file is written into a cache folder (``cache_dir``, the environment variable
:data:`CACHE_ENV`, else ``~/.cache/gear_runtime/llm``), under a key of the folder's files
and the gears; reused while they are unchanged; the user's folder is never written.

A folder ``gear-runtime llm build`` wrote (:mod:`gear_runtime.llm.build`) carries its own:
the gear file under the same key in :data:`BUILT_DIR`, found there before the cache is
looked at, and the gears it was built for in :data:`GEARS_CONFIG`, the defaults of
:func:`choose_gears` for that folder.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnx
from onnx import TensorProto, helper

from gear_runtime.errors import InputError
from gear_runtime.llm.folder import ModelFolder, read_json_object
from gear_runtime.version import __version__

LOGITS_INDEX = "gear_logits_index"
CACHE_ENV = "GEAR_RUNTIME_LLM_CACHE"
#: prompt gears the engine picks by default (those below max_length): fine steps, since a
#: prompt's run is compute-bound and a pad costs what a token does; ONNX Runtime runs them
#: all in one session, so a gear costs its bindings alone
DEFAULT_PROMPT_GEARS = (16, 32, 48, 64, 96, 128, 160, 192, 224, 256, 320, 384, 448, 512)
DEFAULT_MAX_SEQUENCES = 8
#: in a built folder: the gears it was built for (``max_sequences``, ``prompt_gears``,
#: ``batch_gears``, ``max_length``); not part of the key (the gear file does not depend on it)
GEARS_CONFIG = "gear_runtime.json"
#: in a built folder: the gear file, under its key (``gears/<key>/engine.gear.onnx``)
BUILT_DIR = "gears"
GEAR_FILE = "engine.gear.onnx"


@dataclass(frozen=True)
class EngineGears:
    """The gears one engine runs: ``prompt`` (tokens per prefill run) and ``batch``
    (sequences per decode step), both ascending; ``max_length`` the cache's rows."""

    prompt: tuple[int, ...]
    batch: tuple[int, ...]
    max_length: int

    @property
    def rows(self) -> int:
        """Rows of the cache: the largest batch gear."""
        return self.batch[-1]


def choose_gears(folder: ModelFolder, max_sequences: int | None = None,
                 prompt_gears: Sequence[int] | None = None,
                 batch_gears: Sequence[int] | None = None,
                 max_length: int | None = None, *, stored: bool = True) -> EngineGears:
    """The engine's gears: the ones given, else the folder's :data:`GEARS_CONFIG` where it
    has one (``stored``; each stored value only where it fits what was given: prompt gears
    below ``max_length``, batch gears covering ``max_sequences``), else the defaults
    (``max_sequences`` :data:`DEFAULT_MAX_SEQUENCES`; prompt gears
    :data:`DEFAULT_PROMPT_GEARS` below ``max_length``; batch gears the powers of two below
    ``max_sequences``, and ``max_sequences``). InputError naming the value and the limit for
    anything else."""
    if stored:
        max_sequences, prompt_gears, batch_gears, max_length = _with_stored(
            folder, max_sequences, prompt_gears, batch_gears, max_length)
    length = folder.context_length if max_length is None else _positive("max_length",
                                                                        max_length)
    if length > folder.context_length:
        raise InputError(f"max_length {length} is over the model's context_length "
                         f"{folder.context_length}")
    seqs = _positive("max_sequences", DEFAULT_MAX_SEQUENCES if max_sequences is None
                     else max_sequences)
    prompt = (tuple(g for g in DEFAULT_PROMPT_GEARS if g < length) or (length - 1,)
              if prompt_gears is None else _ascending("prompt_gears", prompt_gears))
    if prompt[-1] >= length:
        raise InputError(f"prompt_gears {list(prompt)}: each must be below max_length "
                         f"{length} (a chunk writes at the row's length, never past the end)")
    if batch_gears is None:
        batch = tuple(sorted({b for b in (1, 2, 4, 8, 16, 32, 64) if b < seqs} | {seqs}))
    else:
        batch = _ascending("batch_gears", batch_gears)
        if seqs > batch[-1]:
            raise InputError(f"max_sequences {seqs} is above the largest batch gear "
                             f"{batch[-1]} (batch_gears {list(batch)})")
    if batch[0] != 1:
        raise InputError(f"batch_gears {list(batch)} must start at 1 (one sequence left "
                         "decoding runs gear 1)")
    return EngineGears(prompt, batch, length)


@dataclass(frozen=True)
class StoredGears:
    """A built folder's :data:`GEARS_CONFIG`: the gears it was built for (None: not said)."""

    max_sequences: int | None = None
    prompt_gears: tuple[int, ...] | None = None
    batch_gears: tuple[int, ...] | None = None
    max_length: int | None = None


def stored_gears(folder: ModelFolder) -> StoredGears:
    """The folder's :data:`GEARS_CONFIG` (all None when it has none). InputError naming the
    file and the key for a malformed one."""
    path = folder.path / GEARS_CONFIG
    table = read_json_object(path)

    def read(key: str, check: Callable[[str, Any], Any]) -> Any:
        return None if table.get(key) is None else check(key, table[key])

    try:
        return StoredGears(read("max_sequences", _positive), read("prompt_gears", _ascending),
                           read("batch_gears", _ascending), read("max_length", _positive))
    except InputError as exc:
        raise InputError(f"{path}: {exc.message}") from None


def _with_stored(folder: ModelFolder, max_sequences: int | None,
                 prompt_gears: Sequence[int] | None, batch_gears: Sequence[int] | None,
                 max_length: int | None) -> tuple[Any, Any, Any, Any]:
    """The arguments with the folder's stored gears in the places left None, each only
    where it fits the values given (see :func:`choose_gears`)."""
    saved = stored_gears(folder)
    seqs = saved.max_sequences if max_sequences is None else max_sequences
    length = saved.max_length if max_length is None else max_length
    prompt, batch = saved.prompt_gears, saved.batch_gears
    if prompt_gears is None and prompt and (not isinstance(length, int)
                                            or prompt[-1] < length):
        prompt_gears = prompt
    if batch_gears is None and batch and (not isinstance(seqs, int) or seqs <= batch[-1]):
        batch_gears = batch
    return seqs, prompt_gears, batch_gears, length


def _positive(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise InputError(f"{name} must be a positive integer, got {value!r}")
    return value


def _ascending(name: str, values: Sequence[int]) -> tuple[int, ...]:
    try:
        out = tuple(_positive(name, v) for v in values)
    except TypeError:
        raise InputError(f"{name} must be a list of positive integers, got {values!r}"
                         ) from None
    if not out or list(out) != sorted(set(out)):
        raise InputError(f"{name} must be distinct positive integers in ascending order, "
                         f"got {list(out)}")
    return out


def gear_file(folder: ModelFolder, gears: EngineGears, cache_dir: str | Path | None = None,
              progress: bool = False) -> Path:
    """The compiled gear file of ``folder`` at ``gears``: the folder's own (in
    :data:`BUILT_DIR`, a build's) or the cache's when its key matches, else compiled into
    the cache now (see the module doc). Only the cache is ever written."""
    root = Path(cache_dir if cache_dir is not None else os.environ.get(CACHE_ENV) or
                Path.home() / ".cache" / "gear_runtime" / "llm")
    key = _key(folder, gears)
    for place in (folder.path / BUILT_DIR / key, root / key):
        if _complete(place):
            return place / GEAR_FILE
    root.mkdir(parents=True, exist_ok=True)
    with _locked(root / f"{key}.lock"):  # processes that load the folder at once
        target = root / key  # (serve --workers) compile it once; the others wait
        if not _complete(target):
            _compile_into(folder, gears, target, progress)
    return target / GEAR_FILE


def _compile_into(folder: ModelFolder, gears: EngineGears, target: Path,
                  progress: bool) -> None:
    """Compile into a fresh folder beside ``target``, renamed to it once whole: a process
    that dies mid-compile leaves no half-written ``target``."""
    import gear_runtime.compiler as compiler  # noqa: PLC0415 - the compiler is heavy
    from gear_runtime.spec import GearSpec

    work = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        source = _gathered_source(folder, work)
        shape, dims = spec_text(folder, gears)
        try:
            compiler.compile_model(str(source), GearSpec.from_atc(input_shape=shape,
                                                                  dynamic_dims=dims),
                                   str(work / GEAR_FILE), progress=progress)
        finally:
            for leftover in (source, source.with_name(source.name + ".data")):
                leftover.unlink(missing_ok=True)
        (work / "done").write_text(json.dumps({"prompt": gears.prompt, "batch": gears.batch,
                                               "max_length": gears.max_length}))
        shutil.rmtree(target, ignore_errors=True)  # an older, unfinished one
        os.replace(work, target)
    finally:
        shutil.rmtree(work, ignore_errors=True)


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive lock on ``path`` (created) for the time of the ``with``."""
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _complete(place: Path) -> bool:
    """Whether ``place`` holds a finished gear file (its ``done`` is written last)."""
    return (place / GEAR_FILE).is_file() and (place / "done").is_file()


def spec_text(folder: ModelFolder, gears: EngineGears) -> tuple[str, str]:
    """(input_shape, dynamic_dims) in atc's syntax: every input's batch axis and the ids'
    sequence axis dynamic; per gear its values."""
    cache = f"{folder.kv_heads},{gears.max_length},{folder.head_size}"
    inputs = [f"{folder.input_ids}:-1,-1", f"{folder.attention_mask}:-1,{gears.max_length}"]
    if folder.position_ids:
        inputs.append(f"{folder.position_ids}:-1,-1")
    inputs.append(f"{LOGITS_INDEX}:1")
    pasts = [name for layer in folder.cache for name in layer[:2]]
    inputs += [f"{name}:-1,{cache}" for name in pasts]
    per_gear = []
    for rows, tokens in [(1, g) for g in gears.prompt] + [(b, 1) for b in gears.batch]:
        values = [rows, tokens, rows] + ([rows, tokens] if folder.position_ids else [])
        per_gear.append(",".join(map(str, values + [rows] * len(pasts))))
    return ";".join(inputs), ";".join(per_gear)


def _key(folder: ModelFolder, gears: EngineGears) -> str:
    """What the compiled file depends on: the config, the graph file's bytes, the data
    files' size and time, the gears, this package's version."""
    h = hashlib.sha256()
    h.update(__version__.encode())
    h.update(repr((gears.prompt, gears.batch, gears.max_length)).encode())
    for path in sorted(folder.path.iterdir()):
        if path.name == GEARS_CONFIG:
            continue
        if path.suffix in (".json", ".onnx"):
            h.update(path.name.encode() + path.read_bytes())
        elif path.is_file():
            st = path.stat()
            h.update(f"{path.name}:{st.st_size}:{st.st_mtime_ns}".encode())
    return h.hexdigest()[:24]


def _gathered_source(folder: ModelFolder, target: Path) -> Path:
    """The decoder with the gather before its LM head, written into ``target`` beside a
    link to (or, across file systems, a copy of) its data file; its path."""
    model = onnx.load(str(folder.decoder), load_external_data=False)
    gather_logits(model, folder.logits)
    locations = {e.value for t in model.graph.initializer for e in t.external_data
                 if e.key == "location"}
    for location in locations:
        src, dst = folder.path / location, target / location
        if dst.resolve().parent != target.resolve() or not src.is_file():
            raise InputError(f"{folder.decoder}: external data {location!r} is not a file "
                             f"of {folder.path}")
        dst.unlink(missing_ok=True)
        try:
            os.link(src, dst)
        except OSError:
            shutil.copyfile(src, dst)
    out = target / folder.decoder.name
    onnx.save(model, str(out))
    return out


def gather_logits(model: onnx.ModelProto, logits: str) -> None:
    """In place: the LM head (the MatMul computing output ``logits``, or the MatMul under
    an Add of a bias) reads one position per row, ``Gather(x, gear_logits_index, axis=1)``,
    so ``logits`` is ``[rows, 1, vocab]``. InputError when the head is no such MatMul."""
    graph = model.graph
    producer = {o: n for n in graph.node for o in n.output}
    head = producer.get(logits)
    if head is not None and head.op_type == "Add":
        head = next((producer.get(x) for x in head.input
                     if producer.get(x) is not None and producer[x].op_type == "MatMul"), None)
    if head is None or head.op_type != "MatMul":
        raise InputError(f"output {logits!r} is not computed by a MatMul (the LM head): the "
                         "engine computes the sampled position's logits alone by gathering "
                         "before it")
    gathered = f"{head.input[0]}_gear_last"
    node = helper.make_node("Gather", [head.input[0], LOGITS_INDEX], [gathered],
                            name="gear_logits_gather", axis=1)
    head.input[0] = gathered
    index = list(graph.node).index(head)
    graph.node.insert(index, node)
    graph.input.append(helper.make_tensor_value_info(LOGITS_INDEX, TensorProto.INT64, [1]))
    for out in graph.output:
        if out.name == logits:
            dims = out.type.tensor_type.shape.dim
            if len(dims) == 3:
                dims[1].ClearField("dim_param")
                dims[1].dim_value = 1
    del graph.value_info[:]  # stale shapes of the old head must not get in the way


__all__ = ["BUILT_DIR", "CACHE_ENV", "DEFAULT_MAX_SEQUENCES", "DEFAULT_PROMPT_GEARS",
           "EngineGears", "GEARS_CONFIG", "GEAR_FILE", "LOGITS_INDEX", "StoredGears",
           "choose_gears", "gather_logits", "gear_file", "spec_text", "stored_gears"]
