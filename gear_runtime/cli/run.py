"""``gear-runtime run``: execute a gear file on .npy or synthetic inputs (once or ``--loop
N`` times; or once per file of ais_bench's ``--input`` folders), save the outputs, print (or
``--json``) what ran and how long it took, with ais_bench's Performance Summary lines."""

from __future__ import annotations

import argparse
import os
import re
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from gear_runtime.cli.common import (
    EXIT_OK,
    UsageError,
    add_backend_flags,
    add_json_flag,
    add_memory_flag,
    add_state_flags,
    backend_options,
    check_run_memory,
    check_state_names,
    existing_file,
    int_at_least,
    int_list,
    make_dir,
    model_file,
    opens_own_files,
    parse_pad_values,
    request_shapes,
    state_pairs,
    synthetic_nbytes,
)
from gear_runtime.cli.verbosity import info
from gear_runtime.errors import DynamicInputLengthError, InputError
from gear_runtime.tools.common import jsonout
from gear_runtime.tools.common.inputs import (
    FILLS,
    check_request_shapes,
    synthetic_inputs,
)

if TYPE_CHECKING:
    from gear_runtime.runtime.executor import Executor
    from gear_runtime.runtime.model import GearModel

#: The version of the ``--json`` document (docs/json.md).
JSON_VERSION = 1
#: The most files an ``--input`` folder may hold (one inference each): past it the listing
#: stops, so a folder of millions of files is refused before anything runs.
MAX_INFERENCES = 100_000
#: The files an ``--input`` folder's inferences are read from (ais_bench's, any case).
FOLDER_SUFFIXES = (".npy", ".bin")


def add_parser(sub: argparse._SubParsersAction) -> None:
    """The ``run`` command's flags (atc's and ais_bench's spellings of the gear flags too)."""
    p = sub.add_parser(
        "run", help="execute a gear file on .npy or synthetic inputs",
        description="Execute the gear file; every output is saved in --output-dir as <output "
        "name>.npy (odd characters as '_', a suffix _2, _3... where two names would share a "
        "file). Inputs: .npy files (--input), or synthetic arrays of the model's dtypes "
        "(--shapes, trtexec's form, or the shapes of the gear a --dynamic-* flag names). "
        "Without a --dynamic-* flag the gear comes from the inputs' shapes. ais_bench's "
        "--input folders run one inference per file, each output saved as <the first input's "
        "file name without .npy/.bin>_<output index>.npy. With --loop, folders or --batchsize "
        "the timings end with ais_bench's Performance Summary lines.")
    p.add_argument("file", metavar="FILE", nargs="?",
                   help="a gear file written by compile (or ais_bench's --model)")
    p.add_argument("--model", dest="model_flag", metavar="FILE",
                   help="ais_bench's spelling of FILE")
    p.add_argument("--input", action="append", default=[], metavar="NAME=FILE",
                   help="an input from a .npy or .bin file (repeat for every input); or "
                   "ais_bench's form: the files of every input in input order, separated by "
                   "',' (a .bin holds the raw values in the input's dtype, at its gear's shape); "
                   "or ais_bench's folders, one per input in input order: the i-th .npy/.bin "
                   "file of each (by name, numbers by value) make the i-th inference; every "
                   f"folder holds as many files, at most {MAX_INFERENCES}")
    p.add_argument("--dymShape", "--dym-shape", dest="dym_shape", metavar="NAME:D,D;...",
                   help="ais_bench's --dymShape: each input's shape, e.g. "
                   '"input_ids:1,100;attention_mask:1,100" (as --shapes)')
    p.add_argument("--shapes", metavar="NAME:DxD,...",
                   help="synthetic inputs of these shapes (trtexec's --shapes, e.g. "
                   "input_ids:1x100,attention_mask:1x100); inputs neither here nor in --input "
                   "take the shapes of the gear a --dynamic-* flag names")
    p.add_argument("--fill", choices=FILLS, default="random",
                   help="synthetic inputs: random (floats standard normal, integers 1, bools "
                   "True: valid indices and masks), zeros or ones (default random)")
    p.add_argument("--seed", type=int_at_least(0), default=0, metavar="N",
                   help="seed of the random synthetic inputs (default 0)")
    add_gear_flags(p)
    p.add_argument("--pad", action="store_true",
                   help="execute(pad=True): inputs of any size up to a gear run padded on the "
                   "cheapest covering gear, outputs trimmed to the request")
    p.add_argument("--pad-value", action="append", default=[], metavar="NAME=V",
                   help="with --pad: the value an input is padded with (default 0), repeatable")
    p.add_argument("--loop", type=int_at_least(1), default=1, metavar="N",
                   help="execute N times and report the latency (ais_bench --loop; default 1); "
                   "the outputs are those of the last run (with --input folders: N times per "
                   "inference)")
    p.add_argument("--batchsize", type=int_at_least(1), metavar="N",
                   help="ais_bench's --batchsize: the items per run that the throughput of "
                   "ais_bench's summary lines counts (1000 * N / mean ms); the model runs as "
                   "it is (default: the first dim of the first input)")
    p.add_argument("--warmup", "--warmup_count", "--warmup-count", type=int_at_least(0),
                   default=0, metavar="N",
                   help="untimed executes before the --loop ones (ais_bench's --warmup_count; "
                   "default 0; with --input folders, on the first inference's inputs, as "
                   "ais_bench)")
    p.add_argument("--output-dir", "--output", default=".", metavar="DIR",
                   help="where the outputs go (created if needed; default: here; ais_bench's "
                   "--output)")
    p.add_argument("--outfmt", choices=("NPY", "BIN", "TXT"), default="NPY",
                   help="ais_bench's output format: .npy (default), .bin (raw values) or .txt "
                   "(the values, one line per row of the last axis)")
    add_state_flags(p, "run executes one step with the state resident (with --loop N, N steps, "
                    "each reading the state the one before wrote), the state zeros first or "
                    "--input IN=FILE.npy")
    add_json_flag(p, "run", "the model, the gear that ran, inputs, outputs and timings")
    add_memory_flag(p)
    add_backend_flags(p)
    p.set_defaults(handler=cmd_run)


def add_gear_flags(p: argparse.ArgumentParser) -> None:
    """The gear to run, under our, atc's and ais_bench's spellings (one of them)."""
    dims = p.add_mutually_exclusive_group()
    dims.add_argument("--dynamic-dims", "--dynamic_dims", "--dymDims", metavar="D",
                      help="the gear's dynamic values (e.g. 64,64,64,16), the full dims of "
                      "all inputs flattened (aclmdlSetInputDynamicDims), or ais_bench's named "
                      'form "input_ids:1,128;attention_mask:1,128"')
    dims.add_argument("--dynamic-batch-size", "--dynamic_batch_size", "--dymBatch",
                      metavar="N", type=int_at_least(1),
                      help="the batch gear (dynamic batch models)")
    dims.add_argument("--dynamic-image-size", "--dynamic_image_size", "--dymHW", metavar="H,W",
                      help="the image-size gear (dynamic image size models)")


# ---- inputs -----------------------------------------------------------------------------------
def _parse_input_args(items: Sequence[str]) -> list[tuple[str, str]]:
    """``NAME=FILE`` items -> (name, path), checked before the model is loaded; an item
    without ``=`` is ais_bench's list (files, or folders, in input order, named ``#0``,
    ``#1``... until the model's input names are known)."""
    pairs: list[tuple[str, str]] = []
    for item in items:
        name, sep, path = item.partition("=")
        if not sep:  # ais_bench: "a.bin,b.bin" (or folders "a,b") in input order
            pairs += _ais_bench_entries(item, len(pairs))
            continue
        if not name or not path:
            raise InputError(f"--input {item!r} must be NAME=FILE.npy (e.g. input_ids=ids.npy)")
        if any(name == n for n, _ in pairs):
            raise InputError(f"--input {name!r} is given twice")
        existing_file(path, f"--input {name}:", InputError)
        if not path.lower().endswith(".bin"):
            _check_npy_magic(name, path)
        pairs.append((name, path))
    _check_one_kind(pairs)
    return pairs


def _ais_bench_entries(item: str, start: int) -> list[tuple[str, str]]:
    """ais_bench's ``a.bin,b.bin`` (or ``folder_a,folder_b``): (``#k``, path) per entry, ``k``
    counted from ``start``; InputError for an entry that is neither a file nor a folder."""
    pairs: list[tuple[str, str]] = []
    for file in (p.strip() for p in item.split(",")):
        k = start + len(pairs)
        if os.path.isdir(file):  # listed once the model's inputs are known (_folder_files)
            pairs.append((f"#{k}", file))
            continue
        if not os.path.exists(file):
            raise InputError(f"--input {item!r} must be NAME=FILE.npy (e.g. "
                             "input_ids=ids.npy) or ais_bench's form, every input's "
                             "file (or folder) in input order separated by ',': there is no "
                             f"file {file!r}")
        existing_file(file, f"--input #{k}:", InputError)
        pairs.append((f"#{k}", file))
    return pairs


def _check_one_kind(pairs: Sequence[tuple[str, str]]) -> None:
    """InputError unless the ais_bench entries are all folders or all files (ais_bench's rule:
    a folder's files are successive inferences, a file is one input of one inference)."""
    folders = [p for _, p in pairs if os.path.isdir(p)]
    files = [p for _, p in pairs if not os.path.isdir(p)]
    if folders and files:
        raise InputError(f"--input mixes folders ({folders[0]!r}) and files ({files[0]!r}); "
                         "give every input a folder (one inference per file) or every input "
                         "one file, in input order")


def _named_pairs(ex: Executor, pairs: Sequence[tuple[str, str]]
                 ) -> list[tuple[str, str]]:
    """ais_bench's positional files (``#k``) given the names of the inputs ``ex`` takes (the
    model's, less a resident state's), in order."""
    positional = [p for n, p in pairs if n.startswith("#")]
    if not positional:
        return list(pairs)
    names = ex.input_names
    if len(positional) != len(pairs) or len(positional) != len(names):
        one = "folder" if os.path.isdir(positional[0]) else "file"
        besides = " besides its --state" if ex.state_names else ""
        raise InputError(f"--input gives {len(positional)} {one}(s) in ais_bench's form; the "
                         f"model has {len(names)} inputs{besides} ({', '.join(names)}): give "
                         f"one {one} per input, in this order (or NAME=FILE for each)")
    return list(zip(names, positional, strict=True))


# ---- ais_bench's folders of inputs ------------------------------------------------------------
def _folder_files(pairs: Sequence[tuple[str, str]]) -> list[list[str]] | None:
    """ais_bench's --input folders (one per input, in ``pairs``' order): per input, its
    .npy / .bin files in name order (numbers by value: 2 before 10, as ais_bench sorts), the
    i-th of each folder making the i-th inference; None when the inputs are files.
    InputError for folders of different file counts, or whose inferences would write the
    same output files."""
    if not pairs or not os.path.isdir(pairs[0][1]):
        return None
    listed = [_list_folder(path) for _, path in pairs]
    counts = {len(files) for files in listed}
    if len(counts) > 1:
        raise InputError("--input folders hold different numbers of .npy/.bin files ("
                         + ", ".join(f"{path}: {len(files)}" for (_, path), files
                                     in zip(pairs, listed, strict=True))
                         + "); the i-th file of each folder makes the i-th inference, so every "
                         "folder needs as many")
    stems: dict[str, str] = {}
    for file in listed[0]:  # outputs are named after the first input's files
        name = os.path.basename(file)
        if _stem(name).lower() in stems:  # lower(): case-insensitive file systems too
            raise InputError(f"--input folder {pairs[0][1]!r}: {stems[_stem(name).lower()]!r} "
                             f"and {name!r} would write the same output files "
                             f"({_stem(name)}_0...); rename or remove one")
        stems[_stem(name).lower()] = name
    return listed


def _list_folder(folder: str) -> list[str]:
    """The .npy / .bin files of ``folder`` (any case), sorted as ais_bench does; InputError
    for none, for more than :data:`MAX_INFERENCES` (the listing stops there), for one that is
    not a regular file (a FIFO, a device, a folder named x.npy) and for an unreadable folder."""
    names: list[str] = []
    try:
        with os.scandir(folder) as entries:
            for entry in entries:
                if not entry.name.lower().endswith(FOLDER_SUFFIXES):
                    continue
                if not entry.is_file():  # follows links: a link to a regular file is fine
                    raise InputError(f"--input folder {folder!r}: {entry.name!r} is not a "
                                     "regular file; a folder of inputs holds .npy/.bin files")
                names.append(entry.name)
                if len(names) > MAX_INFERENCES:
                    raise InputError(f"--input folder {folder!r} holds more than "
                                     f"{MAX_INFERENCES} .npy/.bin files (one inference each); "
                                     "split it into folders of fewer files")
    except OSError as exc:
        raise InputError(f"--input folder {folder!r} cannot be read "
                         f"({exc.strerror or exc})") from None
    if not names:
        raise InputError(f"--input folder {folder!r} holds no .npy or .bin file; ais_bench's "
                         "folders hold one file per inference")
    return [os.path.join(folder, n) for n in sorted(names, key=_natural_key)]


def _natural_key(name: str) -> tuple[list[Any], str]:
    """ais_bench's order of a folder's files: by name, case-insensitive, runs of digits by
    their value (``x2`` before ``x10``); the name itself breaks ties (``x01``, ``x1``)."""
    parts = re.split(r"(\d+)", name)  # str, digits, str, ...: same types at same places
    return [int(p) if k % 2 else p.lower() for k, p in enumerate(parts)], name


def _stem(name: str) -> str:
    """A folder file's name without its .npy / .bin suffix: the stem of its outputs' names
    (ais_bench cuts at the first '.', so ``a.1.bin`` and ``a.2.bin`` would share outputs)."""
    return os.path.splitext(name)[0] if name.lower().endswith(FOLDER_SUFFIXES) else name


def _folder_outputs(stem: str, count: int, fmt: str) -> list[str]:
    """ais_bench's names of one inference's output files: ``<stem>_<output index>.<fmt>``."""
    return [f"{stem}_{k}.{fmt.lower()}" for k in range(count)]


def _read_bin(model: GearModel, ex: Executor, name: str, path: str,
              shapes: Mapping[str, tuple[int, ...]]) -> np.ndarray:
    """A raw ``.bin`` input: the model's dtype, the shape from --shapes / --dymShape, the
    gear the flags chose, or the one gear whose size for this input is the file's."""
    dtype = np.dtype(model.info.input_dtype_map[name])
    size = os.path.getsize(path)
    if name in shapes:
        shape = tuple(shapes[name])
    else:
        gear = 0 if model.mode == "static" else _chosen_gear(model, ex)
        if gear is None:
            fits = sorted({tuple(model.spec.shapes(g)[name]) for g in range(model.gear_count)
                           if int(np.prod(model.spec.shapes(g)[name])) * dtype.itemsize == size})
            if len(fits) != 1:
                raise InputError(f"--input {name}={path}: {size} bytes of {dtype} fit "
                                 f"{len(fits)} of the gears' shapes; give the shape (--dymShape "
                                 f"{name}:D,D or --shapes) or the gear (--dymBatch / --dymDims)")
            shape = fits[0]
        else:
            shape = tuple(model.spec.shapes(gear)[name])
    want = int(np.prod(shape)) * dtype.itemsize
    if size != want:
        raise InputError(f"--input {name}={path}: {size} bytes, but {dtype} at {list(shape)} "
                         f"is {want} bytes")
    return np.fromfile(path, dtype=dtype).reshape(shape)


def _read_npy(name: str, path: str) -> np.ndarray:
    """The one .npy array of an --input; InputError for a file that is not .npy, an
    unreadable one or an .npz."""
    _check_npy_magic(name, path)  # again: ais_bench's files and folders' files come here only
    try:
        value = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise InputError(f"--input {name}={path}: not a readable .npy file ({exc})") from None
    if not isinstance(value, np.ndarray):  # np.load gives an NpzFile for .npz archives
        raise InputError(f"--input {name}={path}: an .npz archive; give one .npy array "
                         "per input")
    return value


#: The first bytes of every .npy file (numpy.lib.format.MAGIC_PREFIX) and of an .npz (a zip).
_NPY_MAGIC, _ZIP_MAGIC = b"\x93NUMPY", b"PK\x03\x04"


def _check_npy_magic(name: str, path: str) -> None:
    """InputError naming the input unless ``path`` starts like a .npy file (or an .npz,
    refused later with its own message). Checked first because np.load takes any other file
    for a pickle and answers with a message about pickled data."""
    try:
        with open(path, "rb") as f:
            head = f.read(len(_NPY_MAGIC))
    except OSError as exc:
        raise InputError(f"--input {name}={path}: cannot be read ({exc.strerror})") from None
    if head != _NPY_MAGIC and not head.startswith(_ZIP_MAGIC):
        raise InputError(f"--input {name}={path}: not a .npy file; a .npy array is expected "
                         "(write one with numpy.save)")


def _feeds(model: GearModel, ex: Executor, pairs: Sequence[tuple[str, str]],
           shapes: Mapping[str, tuple[int, ...]], args: argparse.Namespace
           ) -> tuple[dict[str, np.ndarray], dict[str, str | None]]:
    """Every input, from its file, its --shapes entry, or the chosen gear's shapes (in that
    order); and per input its file (None: synthetic). A raw .bin file takes its shape from
    --shapes / --dymShape (ais_bench's --input x.bin --dymShape x:1,16). InputError for a
    name the model lacks or an input that none of them gives (a resident state is neither
    fed nor shaped: its value stays in ``ex``)."""
    names = ex.input_names
    resident = [n for n in shapes if n in ex.state_names]
    if resident:
        raise InputError(f"--shapes {resident[0]}: a resident state (--state) has the shape "
                         f"the model fixes and is not fed; give its first value with --input "
                         f"{resident[0]}=FILE.npy (default zeros)")
    unknown = [n for n, _ in pairs if n not in names]
    if unknown:
        raise InputError(f"--input: the model has no input {unknown[0]!r}; its inputs are "
                         f"{', '.join(names)}")
    both = [n for n, p in pairs if n in shapes and not p.lower().endswith(".bin")]
    if both:
        raise InputError(f"input {both[0]!r} is given by --input and by --shapes; give one")
    check_request_shapes(model, shapes)
    files: dict[str, str] = {n: p for n, p in pairs}
    wanted = {n: s for n, s in shapes.items() if n not in files}  # the synthetic ones
    rest = [n for n in names if n not in files and n not in wanted]
    if rest:
        gear = 0 if model.mode == "static" else _chosen_gear(model, ex)  # its one gear
        if gear is None:
            raise InputError(f"missing --input for {', '.join(rest)}; give --input NAME=FILE.npy, "
                             "--shapes NAME:DIMS (synthetic), or a --dynamic-* flag (synthetic "
                             f"inputs of that gear); the model's inputs are {', '.join(names)}")
        wanted.update({n: model.spec.shapes(gear)[n] for n in rest})
    dtypes = model.info.input_dtype_map
    made = {n: dtypes[n] for n in names if n in wanted}
    if made:  # their total, with the executor's, checked before any is allocated
        shown = ", ".join(f"{n}{list(wanted[n])}" for n in made)
        check_run_memory(model, args.memory_budget, f" and the synthetic inputs {shown}",
                         synthetic_nbytes(made, wanted, args.fill))
    synthetic = synthetic_inputs({n: dtypes[n] for n in names if n in wanted}, wanted,
                                 args.fill, args.seed)
    feeds = {n: (_read_bin(model, ex, n, files[n], shapes) if files[n].lower().endswith(".bin")
                 else _read_npy(n, files[n])) if n in files else synthetic[n] for n in names}
    return feeds, {n: files.get(n) for n in names}


def _chosen_gear(model: GearModel, ex: Executor) -> int | None:
    """The gear the --dynamic-* flag set on ``ex``, or None (no flag, or dims of no gear)."""
    dims = ex.dynamic_dims
    return model.gears.index(tuple(dims)) if dims is not None and tuple(dims) in model.gears \
        else None


# ---- the gear ---------------------------------------------------------------------------------
def gear_flag(args: argparse.Namespace) -> Callable[[Executor], None]:
    """What the --dynamic-* flag asks of the executor, parsed before the model is loaded."""
    if args.dynamic_dims is not None:
        text = args.dynamic_dims
        if ":" in text:  # ais_bench's named form: "input_ids:1,128;attention_mask:1,128"
            named = _named_dims(text)
            return lambda ex: _set_dims(ex, _full_dims(ex, named, text), text)
        dims = int_list(text, "--dynamic-dims")
        return lambda ex: _set_dims(ex, dims, text)
    if args.dynamic_batch_size is not None:
        batch = args.dynamic_batch_size
        return lambda ex: ex.set_dynamic_batch_size(batch)
    if args.dynamic_image_size is not None:
        hw = int_list(args.dynamic_image_size, "--dynamic-image-size")
        if len(hw) != 2:
            raise InputError(f"--dynamic-image-size {args.dynamic_image_size!r} must be H,W")
        return lambda ex: ex.set_dynamic_image_size(*hw)
    return lambda ex: None  # the gear comes from the inputs' shapes


def _named_dims(text: str) -> dict[str, list[int]]:
    """ais_bench's ``--dymDims "name:d,d;name:d,d"`` -> {name: dims}; InputError naming the
    piece that is not ``NAME:D,D...`` or a name given twice."""
    named: dict[str, list[int]] = {}
    for piece in (p.strip() for p in text.split(";")):
        if not piece:
            continue
        name, sep, dims = piece.rpartition(":")
        if not sep or not name.strip():
            raise InputError(f"--dymDims {text!r}: {piece!r} is not NAME:D,D,... (ais_bench's "
                             "named form) and the form without names has no ':'")
        if name.strip() in named:
            raise InputError(f"--dymDims {text!r} gives input {name.strip()!r} twice")
        named[name.strip()] = int_list(dims, f"--dymDims {name.strip()!r}")
    return named


def _full_dims(ex: Executor, named: dict[str, list[int]], text: str) -> list[int]:
    """The named dims as set_dynamic_dims's full form: every input's dims in the model's
    input order (user_designate_shape_order). InputError for a name that is not an input
    or an input left out."""
    spec = ex.model.spec
    unknown = [n for n in named if n not in spec.input_names]
    if unknown:
        raise InputError(f"--dymDims {text!r} names {unknown[0]!r}, which is not an input; "
                         f"inputs: {', '.join(spec.input_names)}")
    missing = [n for n in spec.input_names if n not in named]
    if missing:
        raise InputError(f"--dymDims {text!r} leaves out input(s) {', '.join(missing)}; the "
                         "named form gives every input's dims")
    return [d for n in spec.input_names for d in named[n]]


def _set_dims(ex: Executor, dims: list[int], text: str) -> None:
    """set_dynamic_dims, with both of its forms explained when ``dims`` fits neither."""
    spec = ex.model.spec
    ranks = sum(len(s) for s in spec.input_shapes)
    if len(dims) not in (ranks, spec.values_per_gear):
        example = ",".join(map(str, spec.gears[0]))
        full = ",".join(str(d) for n in spec.input_names for d in spec.shapes(0)[n])
        per_input = ", ".join(f"{n}:{len(s)}" for n, s in zip(spec.input_names,
                                                                 spec.input_shapes, strict=True))
        raise DynamicInputLengthError(
            f"--dynamic-dims {text!r} has {len(dims)} value(s); give the gear's "
            f"{spec.values_per_gear} dynamic value(s) (gear 0: {example}) or the full dims of "
            f"all inputs flattened, {ranks} values ({per_input}; gear 0: {full})")
    ex.set_dynamic_dims(dims)


# ---- output -----------------------------------------------------------------------------------
def _save(path: Path, value: np.ndarray, fmt: str) -> None:
    """One output as ais_bench's --outfmt says: .npy, raw .bin, or .txt."""
    if fmt == "BIN":
        np.ascontiguousarray(value).tofile(path)
    elif fmt == "TXT":
        rows = value.reshape(-1, value.shape[-1]) if value.ndim > 1 else value.reshape(1, -1)
        np.savetxt(path, rows, fmt="%s")
    else:
        np.save(path, value)


def _output_files(names: Sequence[str], fmt: str = "NPY") -> list[str]:
    """One distinct ``.npy`` file name per output: path separators and odd characters become
    '_'; a name that would collide with an earlier one (``y:0`` and ``y_0``) gets ``_2``,
    ``_3``... so that no output overwrites another."""
    used: set[str] = set()
    files = []
    for name in names:
        stem = re.sub(r"[^A-Za-z0-9._-]", "_", name).lstrip(".") or "output"
        candidate, n = stem, 1
        while candidate.lower() in used:  # lower(): case-insensitive file systems too
            n += 1
            candidate = f"{stem}_{n}"
        used.add(candidate.lower())
        files.append(f"{candidate}.{fmt.lower()}")
    return files


def _timed(run: Callable[[], list[np.ndarray]], loop: int,
           warmup: int) -> tuple[list[np.ndarray], list[int]]:
    """The outputs of the last of ``warmup + loop`` runs and the ``loop`` timed ones' ns."""
    for _ in range(warmup):
        run()
    samples: list[int] = []
    outputs: list[np.ndarray] = []
    for _ in range(loop):
        t0 = time.perf_counter_ns()
        outputs = run()
        samples.append(time.perf_counter_ns() - t0)
    return outputs, samples


def cmd_run(args: argparse.Namespace) -> int:
    import gear_runtime as gr

    args.file = model_file(args.file, args.model_flag,
                           "give the model to run: FILE (or ais_bench's --model FILE)")
    existing_file(args.file, "model file" if opens_own_files(args.backend) else "gear file")
    # everything the command line alone can refuse is refused before the model loads
    state = state_pairs(args.state, args.in_place_state)
    pairs = _parse_input_args(args.input)
    shapes = request_shapes(args) or {}
    choose_gear = gear_flag(args)
    pads = parse_pad_values(args.pad_value)
    if pads and not args.pad:
        raise UsageError("--pad-value needs --pad")
    if args.json is not None:
        jsonout.check_target(args.json)
    backend, options = backend_options(args)
    from gear_runtime.runtime.model import memory_budget

    args.memory_budget = memory_budget(args.max_memory)  # the env's, when no flag
    with gr.load(args.file, backend=backend, **options) as model:
        check_run_memory(model, args.memory_budget)  # the CLI's words, before allocating
        ex = _executor(model, state, args.in_place_state, pads, args.memory_budget)
        choose_gear(ex)
        args.state_files = _initial_state(ex, pairs)
        named = _named_pairs(ex, [(n, p) for n, p in pairs if n not in ex.state_names])
        folders = _folder_files(named)
        doc = _run_inferences(model, ex, _inferences(ex, named, folders, args.outfmt),
                              shapes, args,
                              [path for _, path in named] if folders is not None else None)
    if args.json != jsonout.STDOUT:
        _print(doc, timed=args.loop > 1 or len(doc["inferences"]) > 1
               or args.batchsize is not None)
    if args.json is not None:
        written = jsonout.write(args.json, doc)
        if written is not None:
            info(f"wrote {written}")
    return EXIT_OK


def _executor(model: GearModel, state: dict[str, str] | None, in_place: bool,
              pads: Mapping[str, int | float], budget: int) -> Executor:
    """The run's executor: with ``state`` (``--state``), the pairs resident in it, checked
    against the model's inputs and outputs first (InputError naming the pair)."""
    if state is None:
        return model.create_executor(pad_values=pads or None, max_bytes=budget)
    check_state_names(state, model.input_names, model.output_names)
    return model.create_executor(pad_values=pads or None, max_bytes=budget, state=state,
                                 in_place_state=in_place)


def _initial_state(ex: Executor, pairs: Sequence[tuple[str, str]]) -> dict[str, str]:
    """Set each resident state an ``--input IN=FILE.npy`` gives (its exact shape and dtype:
    ``set_state``'s InputError otherwise); {state input: file}."""
    files = {n: p for n, p in pairs if n in ex.state_names}
    for name, path in files.items():
        if path.lower().endswith(".bin"):
            raise InputError(f"--input {name}={path}: a resident state's first value is a .npy "
                             "file (its shape and dtype are checked)")
        ex.set_state(name, _read_npy(name, path))
    return files


Inference = tuple[list[tuple[str, str]], list[str]]


def _inferences(ex: Executor, pairs: Sequence[tuple[str, str]],
                folders: Sequence[Sequence[str]] | None, fmt: str) -> Iterator[Inference]:
    """Per inference, its input files ((name, path); inputs not in them are synthetic) and
    the names of its output files (of the outputs ``ex`` returns: a resident state's are
    kept): the one inference of ``pairs``, or one per file of ais_bench's folders
    (``folders``: :func:`_folder_files`), named after the first input's file as ais_bench
    names them."""
    if folders is None:
        yield list(pairs), _output_files(ex.output_names, fmt)
        return
    names = [n for n, _ in pairs]
    for files in zip(*folders, strict=True):
        yield (list(zip(names, files, strict=True)),
               _folder_outputs(_stem(os.path.basename(files[0])), len(ex.output_names), fmt))


def _run_inferences(model: GearModel, ex: Executor, inferences: Iterable[Inference],
                    shapes: Mapping[str, tuple[int, ...]], args: argparse.Namespace,
                    input_folders: list[str] | None) -> dict[str, Any]:
    """Run every inference, each ``--loop`` times (``--warmup`` untimed runs before the
    first one's, as ais_bench warms up); each is read when its turn comes and its outputs
    saved before the next is read, so one inference's arrays are in memory at a time. The
    run document: the last inference's inputs and outputs, every inference's files, every
    timed run (``input_folders``: ais_bench's folders the inferences came from, or None)."""
    from gear_runtime.tools.bench.report import first_dim

    samples: list[int] = []
    runs: list[dict[str, Any]] = []
    out_dir: Path | None = None
    batches: list[int] = []  # each inference's first dim of its first input
    for pairs, out_files in inferences:
        feeds, files = _feeds(model, ex, pairs, shapes, args)
        outputs, timed = _timed(partial(ex.execute, feeds, pad=args.pad), args.loop,
                                args.warmup if not runs else 0)
        samples += timed
        out_dir = out_dir or make_dir("--output-dir", args.output_dir)
        saved = [str(out_dir / file) for file in out_files]
        for value, path in zip(outputs, saved, strict=True):
            _save(Path(path), value, args.outfmt)
        runs.append({"inputs": [files[n] for n in ex.input_names], "outputs": saved,
                     "gear": ex.last_gear})
        batches.append(first_dim({n: v.shape for n, v in feeds.items()}, ex.input_names))
    # ais_bench's default batchsize: the first input's first dim, its mean over inferences
    # of several sizes (every inference runs --loop times, so 1000 * mean batch / mean ms
    # is the items per second)
    mean = sum(batches) / len(batches)
    batchsize = args.batchsize or (int(mean) if mean.is_integer() else mean)
    return _document(model, ex, feeds, files, outputs, saved, samples, args,
                     {"input_folders": input_folders, "inferences": runs}, batchsize)


def _document(model: GearModel, ex: Executor, feeds: Mapping[str, np.ndarray],
              files: Mapping[str, str | None], outputs: Sequence[np.ndarray],
              saved: Sequence[str], samples: Sequence[int],
              args: argparse.Namespace, every: Mapping[str, Any],
              batchsize: float) -> dict[str, Any]:
    """The ``gear-runtime-run/1`` document (docs/json.md): ``run``, ``inputs`` and
    ``outputs`` of the last inference; ``every``: ``input_folders`` and ``inferences``, the
    files of each inference."""
    from gear_runtime.tools.bench.report import AisBenchSummary, Stats

    providers = getattr(model.backend_model, "execution_providers", None)
    gear = ex.last_gear
    return jsonout.document("run", JSON_VERSION, {
        "model": {"path": str(Path(args.file).resolve()), "backend": model.backend,
                  "providers": providers, "mode": model.mode,
                  "gears": [list(g) for g in model.gears]},
        "run": {"gear": gear, "dynamic_dims": _ints(ex.last_dynamic_dims),
                "request_dims": _ints(ex.last_request_dims), "pad": bool(args.pad),
                "hybrid_miss": gear is None},
        "inputs": [{"name": n, "dtype": str(feeds[n].dtype), "shape": list(feeds[n].shape),
                    "file": files[n], "synthetic": files[n] is None,
                    **({"fill": args.fill} if files[n] is None else {})}
                   for n in ex.input_names],
        "outputs": [{"name": n, "dtype": str(v.dtype), "shape": list(v.shape), "file": f}
                    for n, v, f in zip(ex.output_names, outputs, saved, strict=True)],
        "state": _state_document(ex, getattr(args, "state_files", {})),
        "input_folders": every["input_folders"],
        "inferences": [dict(r) for r in every["inferences"]],
        "timing": {"loop": args.loop, "warmup": args.warmup,
                   "inferences": len(every["inferences"]),
                   "ms": Stats.of_ns(samples).to_dict(),
                   "samples_ns": [int(s) for s in samples],
                   "ais_bench": AisBenchSummary.of_ns(samples, batchsize).to_dict()},
    })


def _state_document(ex: Executor, files: Mapping[str, str]) -> list[dict[str, Any]]:
    """Per resident state pair (``--state``): its names, how it is kept, its shape and dtype,
    and the file its first value came from (None: zeros); empty without state."""
    modes = ex.state_modes
    return [{"input": n, "output": out, "mode": modes[n], "dtype": str(ex.state[n].dtype),
             "shape": list(ex.state[n].shape), "file": files.get(n)}
            for n, out in ex.state_names.items()]


def _ints(values: Sequence[int] | None) -> list[int] | None:
    return None if values is None else [int(v) for v in values]


def _gear_text(gear: int | None, gears: Sequence[Sequence[int]]) -> str:
    """``gear 1 (dims 64,64)``, ``gear 0 (a static model)`` or the hybrid graph's name."""
    if gear is None:
        return "the dynamic-shape graph (hybrid)"
    dims = ",".join(map(str, gears[gear]))
    return f"gear {gear} (dims {dims})" if dims else f"gear {gear} (a static model)"


def _print(doc: Mapping[str, Any], timed: bool) -> None:
    """The human summary of a run document; ``timed``: with the latency of the timed runs
    and ais_bench's Performance Summary lines."""
    from gear_runtime.tools.bench.report import AisBenchSummary, Stats
    from gear_runtime.tools.bench.table import ais_bench_lines, ais_bench_note

    if doc["input_folders"] is None:
        _print_one(doc)
        what = _gear_text(doc["run"]["gear"], doc["model"]["gears"])
    else:
        _print_folders(doc)
        what = _inferences_text(len(doc["inferences"]))
    if not timed:
        return
    timing = doc["timing"]
    stats = Stats.of_ns(timing["samples_ns"])
    runs = len(timing["samples_ns"])
    per = (f" ({timing['inferences']} inferences x --loop {timing['loop']})"
           if timing["inferences"] > 1 else "")
    print(f"  {runs} runs{per} after {timing['warmup']} warm-up: p50 {stats.p50:.3f} ms, "
          f"p99 {stats.p99:.3f} ms, mean {stats.mean:.3f} ms, min {stats.min:.3f} ms")
    ais = timing["ais_bench"]
    summary = AisBenchSummary.of_ns(timing["samples_ns"], ais["batchsize"])
    print("\n".join([*ais_bench_lines(summary, what), ais_bench_note()]))


def _inferences_text(count: int) -> str:
    return f"{count} inference{'' if count == 1 else 's'}"


def _print_one(doc: Mapping[str, Any]) -> None:
    """The gear that ran, the synthetic inputs and the output files of one inference."""
    run = doc["run"]
    dims = ",".join(map(str, run["dynamic_dims"] or []))
    if run["gear"] is not None:
        request = (f" (request {','.join(map(str, run['request_dims']))}, padded)"
                   if run["pad"] and run["request_dims"] != run["dynamic_dims"] else "")
        print(f"gear {run['gear']}: dims {dims}{request}" if dims else
              f"gear {run['gear']}: a static model (its one gear)")
    else:
        print(f"no gear matched: dims {dims} ran on the dynamic-shape graph (hybrid)")
    synthetic = [i for i in doc["inputs"] if i["synthetic"]]
    if synthetic:
        print(f"  synthetic inputs ({synthetic[0]['fill']}): "
              + ", ".join(f"{i['name']}{i['shape']}" for i in synthetic))
    for out in doc["outputs"]:
        print(f"  {out['name']}: {out['dtype']} {out['shape']} -> {out['file']}")
    for st in doc["state"]:
        first = st["file"] or "zeros"
        print(f"  state {st['input']} <- {st['output']}: {st['dtype']} {st['shape']}, resident "
              f"({st['mode']}; first value: {first}), not saved")


def _print_folders(doc: Mapping[str, Any]) -> None:
    """ais_bench's folders: how many inferences ran, on which gears, where the outputs are."""
    runs = doc["inferences"]
    print(f"{_inferences_text(len(runs))}, the i-th file of each --input folder together: "
          + ", ".join(f"{name} <- {folder}" for name, folder
                      in zip([i["name"] for i in doc["inputs"]], doc["input_folders"],
                             strict=True)))
    gears = Counter(r["gear"] for r in runs)
    print("  " + "; ".join(f"{_gear_text(g, doc['model']['gears'])}: {n} inference(s)"
                           for g, n in sorted(gears.items(), key=lambda x: (x[0] is None,
                                                                            x[0] or 0))))
    first, last = runs[0]["outputs"], runs[-1]["outputs"]
    where = os.path.dirname(first[0]) or "."
    print(f"  outputs: {len(runs) * len(first)} files in {where}, <the first input's file "
          f"name without .npy/.bin>_<output index> ({os.path.basename(first[0])} ... "
          f"{os.path.basename(last[-1])})")
