"""``gear-runtime run``: execute a gear file once on .npy inputs, save the outputs."""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from gear_runtime.cli.common import EXIT_OK, backends_help, existing_file, int_list, make_dir
from gear_runtime.errors import InputError

if TYPE_CHECKING:
    from gear_runtime.runtime.executor import Executor


def add_parser(sub: argparse._SubParsersAction) -> None:
    """The ``run`` command's flags."""
    p = sub.add_parser("run", help="execute a gear file once on .npy inputs",
                       description="Execute once; every output is saved in --output-dir as "
                       "<output name>.npy (odd characters as '_', a suffix _2, _3... where "
                       "two names would share a file). Without a --dynamic-* flag the gear "
                       "comes from the inputs' shapes.")
    p.add_argument("file", metavar="FILE", help="a gear file written by compile")
    p.add_argument("--input", action="append", default=[], metavar="NAME=FILE.npy",
                   help="an input (repeat for every input)")
    dims = p.add_mutually_exclusive_group()
    dims.add_argument("--dynamic-dims", metavar="D",
                      help="full dims of all inputs flattened, or the gear's dynamic values")
    dims.add_argument("--dynamic-batch-size", metavar="N", type=int,
                      help="the batch gear (dynamic batch models)")
    dims.add_argument("--dynamic-image-size", metavar="H,W",
                      help="the image-size gear (dynamic image size models)")
    p.add_argument("--output-dir", default=".", metavar="DIR",
                   help="where the outputs go (created if needed; default: here)")
    p.add_argument("--backend", default="onnxruntime", metavar="B", help=backends_help())
    p.set_defaults(handler=cmd_run)


def _parse_input_args(items: Sequence[str]) -> list[tuple[str, str]]:
    """``NAME=FILE.npy`` items -> (name, path), checked before the model is loaded."""
    pairs: list[tuple[str, str]] = []
    for item in items:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise InputError(f"--input {item!r} must be NAME=FILE.npy (e.g. input_ids=ids.npy)")
        if any(name == n for n, _ in pairs):
            raise InputError(f"--input {name!r} is given twice")
        existing_file(path, f"--input {name}:", InputError)
        _check_npy_magic(name, path)
        pairs.append((name, path))
    return pairs


def _read_inputs(pairs: Sequence[tuple[str, str]], names: Sequence[str]) -> dict[str, np.ndarray]:
    """Load the checked (name, path) pairs for a model with inputs ``names``; InputError on an
    unknown or missing name or a file that is not one .npy array."""
    unknown = [n for n, _ in pairs if n not in names]
    if unknown:
        raise InputError(f"--input: the model has no input {unknown[0]!r}; its inputs are "
                         f"{', '.join(names)}")
    missing = [n for n in names if all(n != m for m, _ in pairs)]
    if missing:
        raise InputError(f"missing --input for {', '.join(missing)}; the model's inputs are "
                         f"{', '.join(names)}")
    feeds: dict[str, np.ndarray] = {}
    for name, path in pairs:
        try:
            value = np.load(path, allow_pickle=False)
        except (OSError, ValueError) as exc:
            raise InputError(f"--input {name}={path}: not a readable .npy file ({exc})") from None
        if not isinstance(value, np.ndarray):  # np.load gives an NpzFile for .npz archives
            raise InputError(f"--input {name}={path}: an .npz archive; give one .npy array "
                             "per input")
        feeds[name] = value
    return feeds


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


def _output_files(names: Sequence[str]) -> list[str]:
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
        files.append(f"{candidate}.npy")
    return files


def _gear_flag(args: argparse.Namespace) -> Callable[[Executor], None]:
    """What the --dynamic-* flag asks of the executor, parsed before the model is loaded."""
    if args.dynamic_dims is not None:
        dims = int_list(args.dynamic_dims, "--dynamic-dims")
        return lambda ex: ex.set_dynamic_dims(dims)
    if args.dynamic_batch_size is not None:
        batch = args.dynamic_batch_size
        return lambda ex: ex.set_dynamic_batch_size(batch)
    if args.dynamic_image_size is not None:
        hw = int_list(args.dynamic_image_size, "--dynamic-image-size")
        if len(hw) != 2:
            raise InputError(f"--dynamic-image-size {args.dynamic_image_size!r} must be H,W")
        return lambda ex: ex.set_dynamic_image_size(*hw)
    return lambda ex: None  # the gear comes from the inputs' shapes


def cmd_run(args: argparse.Namespace) -> int:
    import gear_runtime as gr

    existing_file(args.file, "gear file")
    pairs = _parse_input_args(args.input)  # syntax and files first: no load for a typo
    choose_gear = _gear_flag(args)
    model = gr.load(args.file, backend=args.backend)
    feeds = _read_inputs(pairs, model.input_names)
    ex = model.create_executor()
    choose_gear(ex)
    outputs = ex.execute(feeds)
    out_dir = make_dir("--output-dir", args.output_dir)
    if ex.last_gear is not None:
        print(f"gear {ex.last_gear}: dims {','.join(map(str, model.gears[ex.last_gear]))}")
    else:
        print(f"no gear matched: dims {ex.last_dynamic_dims} ran on the dynamic-shape graph "
              "(hybrid)")
    files = _output_files(model.output_names)
    for name, value, file in zip(model.output_names, outputs, files, strict=True):
        path = out_dir / file
        np.save(path, value)
        print(f"  {name}: {value.dtype} {list(value.shape)} -> {path}")
    return EXIT_OK
