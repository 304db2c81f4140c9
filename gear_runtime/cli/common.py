"""What every ``gear-runtime`` command shares: the exit codes, the one-line usage error, the
argparse types, the checks of the paths a user passes, and the one error line.

The CLI's error rule (one home; :func:`gear_runtime.cli.app.main` applies it): every error is
ONE line on stderr, ``gear-runtime: error: [code] message``, never a traceback for a user
error. Exit 2: usage errors and bad input (a missing file, a wrong gear, a bad flag, a spec
GE would reject); exit 1: failed checks and failures while running (backend errors).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn

import numpy as np

from gear_runtime import arguments
from gear_runtime.errors import GearFileError, GearRuntimeError, InputError

PROG = "gear-runtime"
EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


class UsageError(Exception):
    """A bad command line: raised by the parser instead of printing usage and exiting, and by
    the commands for flags that do not go together (one-line errors, exit 2)."""


class Parser(argparse.ArgumentParser):
    """argparse, but an error is one line and raises instead of calling sys.exit."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see '{self.prog} -h')")


def backends_help() -> str:
    """The help text of every ``--backend`` flag: the registered backends."""
    from gear_runtime.backends import BACKENDS, DEFAULT_BACKEND

    return f"one of {', '.join(sorted(BACKENDS))} (default {DEFAULT_BACKEND})"


# ---- argparse types ---------------------------------------------------------------------------
def int_at_least(minimum: int, maximum: int | None = None) -> Callable[[str], int]:
    """An argparse ``type``: the text as an int >= ``minimum`` (and <= ``maximum`` when
    given), else a one-line usage error."""
    bound = f">= {minimum}" if maximum is None else f"in {minimum}..{maximum}"
    return _number_in(int, minimum, maximum, "an integer", bound)


def float_at_least(minimum: float) -> Callable[[str], float]:
    """An argparse ``type``: the text as a finite float >= ``minimum``."""
    return _number_in(float, minimum, None, "a number", f"a number >= {minimum:g}")


def _number_in(convert: Callable[[str], Any], minimum: float, maximum: float | None, kind: str,
               bound: str) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        try:
            value = convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {kind}") from None
        if not value >= minimum or value == float("inf") or (  # also refuses nan
                maximum is not None and value > maximum):
            raise argparse.ArgumentTypeError(f"{text!r} must be {bound}")
        return value

    return parse


def int_list(text: str, what: str) -> list[int]:
    """``"1,2,3"`` (or ``;``-separated) as integers; InputError naming ``what`` otherwise."""
    parts = [p.strip() for p in text.replace(";", ",").split(",") if p.strip()]
    try:
        values = [int(p) for p in parts]
    except ValueError:
        raise InputError(f"{what} {text!r} must be integers separated by ','") from None
    if not values:
        raise InputError(f"{what} is empty; give integers separated by ','")
    return values


# ---- flags several commands share ----------------------------------------------------------
#: ``--providers`` short names (ONNX Runtime's full names are accepted as they are).
PROVIDER_NAMES = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider",
                  "tensorrt": "TensorrtExecutionProvider", "trt": "TensorrtExecutionProvider"}


def add_backend_flags(p: argparse.ArgumentParser) -> None:
    """``--backend``, ``--providers`` and ``--threads``: where and how the gear file runs."""
    p.add_argument("--backend", default="onnxruntime", metavar="B",
                   help=backends_help() + "; cuda: onnxruntime with --providers cuda,cpu "
                   "(backends.ALIASES)")
    p.add_argument("--providers", metavar="P,P",
                   help="onnxruntime: the execution providers in order, ONNX Runtime's names "
                   "or cpu / cuda / tensorrt (default cpu; CUDA needs onnxruntime-gpu and a GPU)")
    p.add_argument("--threads", type=int_at_least(1), default=None, metavar="N",
                   help="onnxruntime / openvino: the runtime's threads of every session "
                   "(default: the runtime's)")
    add_device_flags(p)


def add_device_flags(p: argparse.ArgumentParser) -> None:
    """``--device``, ``--config`` and ``--input-shape``: what the device backends need to
    open their own model files (.om for acl, .mindir for mindspore_lite)."""
    p.add_argument("--device", metavar="D",
                   help="acl / mindspore_lite / onnxruntime on CUDA: the device id (ais_bench's "
                   "--device); openvino: the device name (CPU, GPU, NPU, AUTO)")
    p.add_argument("--config", dest="model_config", metavar="FILE",
                   help="mindspore_lite: the converter config the MindIR was built with "
                   "([acl_build_options] / [ascend_context] / [ge_graph_options]): its gears "
                   "(not needed where the MindIR records them: [acl_build_options] "
                   "ge.dynamicDims, read with Model.get_model_info)")
    p.add_argument("--input-shape", "--input_shape", dest="model_input_shape", metavar="S",
                   help="acl: the --input_shape atc compiled the .om with (the order of the "
                   "dims in dims mode, when the .om does not say)")


def device_options(backend: str, args: argparse.Namespace) -> dict[str, Any]:
    """The ``load`` options ``--device`` / ``--config`` / ``--input-shape`` ask of
    ``backend`` (its :class:`~gear_runtime.backends.BackendFacts`); UsageError naming the
    flag where the backend has no such option."""
    from gear_runtime.backends import facts

    known = facts(backend)
    options: dict[str, Any] = {}
    device = getattr(args, "device", None)
    if device is not None:
        if known.device_option is None:
            raise UsageError(f"--device is not an option of --backend {backend!r}")
        try:
            options[known.device_option] = known.device_kind(device)
        except ValueError:
            raise UsageError(f"--device {device!r}: {backend} takes a device id (an "
                             "integer such as 0)") from None
    config = getattr(args, "model_config", None)
    if config is not None:
        if known.config_option is None:
            raise UsageError(f"--config FILE is the mindspore_lite converter config; --backend "
                             f"is {backend!r}")
        options[known.config_option] = existing_file(config, "config file")
    shape = getattr(args, "model_input_shape", None)
    if shape is not None:
        if known.input_shape_option is None:
            raise UsageError(f"--input-shape is the acl backend's (atc's --input_shape); "
                             f"--backend is {backend!r}")
        options[known.input_shape_option] = shape
    return options


def opens_own_files(backend: str) -> bool:
    """Whether ``backend`` opens its own model files (.om, .mindir), not gear files."""
    from gear_runtime.backends import facts

    return facts(backend).own_suffix is not None


def backend_options(args: argparse.Namespace) -> tuple[str, dict[str, Any]]:
    """The backend and ``load`` options the backend flags ask for: ``--backend cuda`` is
    onnxruntime on CUDA; ``--providers`` / ``--threads`` only go with onnxruntime."""
    from gear_runtime.backends import ALIASES, FACTS, facts

    backend, options = ALIASES.get(args.backend, (args.backend, {}))
    options = {k: list(v) if isinstance(v, list) else v for k, v in options.items()}
    if args.providers is not None:
        option = facts(backend).providers_option
        if option is None:
            having = sorted(b for b, f in FACTS.items() if f.providers_option)
            raise UsageError(f"--providers is an {', '.join(having)} option; "
                             f"--backend is {backend!r}")
        providers = [PROVIDER_NAMES.get(p.strip().lower(), p.strip())
                     for p in args.providers.split(",") if p.strip()]
        if not providers:
            raise UsageError("--providers is empty; give e.g. cuda,cpu")
        options[option] = providers
    if args.threads is not None:
        option = FACTS[backend].threads_option if backend in FACTS else None
        if option is None:
            having = sorted(b for b, f in FACTS.items() if f.threads_option)
            raise UsageError(f"--threads is an option of {', '.join(having)}; "
                             f"--backend is {backend!r}")
        options[option] = args.threads
    options.update(device_options(backend, args))
    return backend, options


def model_file(positional: str | None, flag: str | None, missing: str) -> str:
    """The model from the positional FILE or its ``--model`` spelling (atc's, ais_bench's):
    exactly one of them; UsageError ``missing`` when neither is given."""
    if positional is not None and flag is not None:
        raise UsageError(f"give the model once: {positional!r} and --model {flag!r}")
    path = positional if positional is not None else flag
    if path is None:
        raise UsageError(missing)
    return path


def request_shapes(args: argparse.Namespace) -> dict[str, tuple[int, ...]] | None:
    """The request's shapes from trtexec's ``--shapes`` or ais_bench's ``--dymShape`` (one
    of them); None when neither is given."""
    from gear_runtime.tools.common.inputs import parse_dym_shape, parse_shapes

    if args.shapes is not None and args.dym_shape is not None:
        raise UsageError("--shapes and --dymShape both give the shapes: give one")
    if args.shapes is not None:
        return parse_shapes(args.shapes)
    return parse_dym_shape(args.dym_shape) if args.dym_shape is not None else None


def add_memory_flag(p: argparse.ArgumentParser) -> None:
    """``--max-memory BYTES``: the host memory budget of a run (the executor's buffers and the
    synthetic inputs together), checked before anything is allocated."""
    p.add_argument("--max-memory", type=int_at_least(1), metavar="BYTES",
                   help="the most host memory (bytes) the executor's buffers (staging, "
                   "outputs) and the synthetic inputs may take together, checked before "
                   "allocating (default: $GEAR_RUNTIME_MAX_BYTES, else half the host's memory)")


def synthetic_nbytes(dtypes: Mapping[str, Any], shapes: Mapping[str, Sequence[int]],
                     fill: str) -> int:
    """The peak bytes of synthetic inputs of ``shapes``: their arrays, and the float64 draw
    of the largest random float one (``synthetic_inputs`` draws in float64, then casts)."""
    total, draw = 0, 0
    for name, dtype in dtypes.items():
        dt, count = np.dtype(dtype), int(np.prod(shapes[name], dtype=object))
        total += count * dt.itemsize
        if fill == "random" and dt.kind == "f":
            draw = max(draw, count * 8)
    return total + draw


def check_run_memory(model: Any, budget: int, what: str = "", extra: int = 0) -> None:
    """MemoryBudgetError (before allocating) when ``model``'s executor buffers and ``extra``
    bytes (``what``: the synthetic inputs) exceed ``budget`` (``--max-memory``)."""
    from gear_runtime.runtime.model import check_budget

    needed = model.executor_bytes() + extra
    check_budget(needed, budget, "the executor's buffers (staging, outputs)" + what,
                 "--max-memory N")


def add_json_flag(p: argparse.ArgumentParser, kind: str, what: str) -> None:
    """``--json PATH|-``: ``what`` as a document of schema ``gear-runtime-<kind>/N`` (see
    :mod:`gear_runtime.tools.common.jsonout` and docs/json.md); ``-``: stdout, and no text."""
    p.add_argument("--json", metavar="PATH|-",
                   help=f"write {what} as JSON (schema gear-runtime-{kind}/N, docs/json.md); "
                   "-: to stdout, instead of the text")


def parse_pad_values(items: list[str], flag: str = "--pad-value") -> dict[str, int | float]:
    """``NAME=V`` items (an int, else a float) -> {name: value}; UsageError naming ``flag``."""
    pads: dict[str, int | float] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise UsageError(f"{flag} {item!r}: expected NAME=VALUE")
        try:
            pads[name] = int(value)
        except ValueError:
            try:
                pads[name] = float(value)
            except ValueError:
                raise UsageError(f"{flag} {item!r}: {value!r} is not a number") from None
    return pads


def add_state_flags(p: argparse.ArgumentParser, what: str) -> None:
    """``--state IN=OUT`` (repeatable) and ``--in-place-state``: the resident state pairs of a
    stateful model, as ``serve`` takes them; ``what``: what the command does with them."""
    p.add_argument("--state", action="append", default=[], metavar="IN=OUT",
                   help="a resident state pair of a stateful model (a decode step's KV cache: "
                   f"past_kv=present_kv), repeatable: {what}; the executor keeps the state "
                   "in the backend's memory, never copied in or out per run, and the state "
                   "inputs and outputs are neither given nor returned")
    p.add_argument("--in-place-state", action="store_true",
                   help="with --state: keep each pair in ONE buffer that the run reads and "
                   "writes, where the graph updates it in place (onnxruntime-genai's "
                   "GroupQueryAttention); refused naming the pair where the graph does not")


def state_pairs(items: Sequence[str], in_place: bool) -> dict[str, str] | None:
    """``--state IN=OUT`` items as {input: output} (None without any); UsageError naming a
    malformed item, a pair given twice, or ``--in-place-state`` without ``--state``."""
    if in_place and not items:
        raise UsageError("--in-place-state needs --state IN=OUT: it says how the state is kept")
    pairs: dict[str, str] = {}
    for item in items:
        name, sep, out = (s.strip() for s in item.partition("="))
        if not sep or not name or not out:
            raise UsageError(f"--state {item!r}: expected INPUT=OUTPUT (e.g. "
                             "past_kv=present_kv)")
        if name in pairs:
            raise UsageError(f"--state {item!r}: input {name!r} is already paired with "
                             f"{pairs[name]!r}; give each state input once")
        pairs[name] = out
    return pairs or None


def check_state_names(pairs: Mapping[str, str], inputs: Sequence[str],
                      outputs: Sequence[str]) -> None:
    """InputError naming the ``--state`` pair whose input is not one of ``inputs`` or whose
    output is not one of ``outputs`` (the model's), listing both; the executor checks the
    rest (shapes, dtypes, in place) when it is created."""
    for name, out in pairs.items():
        missing = (f"no input {name!r}" if name not in inputs else
                   f"no output {out!r}" if out not in outputs else None)
        if missing is not None:
            raise InputError(f"--state {name}={out}: the model has {missing}; its inputs: "
                             f"{', '.join(inputs)}; its outputs: {', '.join(outputs)}")


# ---- paths ------------------------------------------------------------------------------------
def existing_file(path: str, what: str,
                  error: type[GearRuntimeError] = GearFileError) -> str:
    """``path`` when it is an existing file, else ``error`` naming ``what`` and the path."""
    if not os.path.exists(path):
        raise error(f"{what} {path!r} does not exist")
    if not os.path.isfile(path):
        raise error(f"{what} {path!r} is not a file")
    return path


def make_dir(flag: str, path: str) -> Path:
    """Create directory ``path`` (and its parents) if needed; InputError naming ``flag``."""
    try:
        Path(path).mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"{flag} {path!r} cannot be created: {exc}") from None
    return Path(path)


def check_output_file(flag: str, path: str) -> None:
    """InputError naming ``flag`` when ``path`` cannot be written as a file (the one rule:
    :func:`gear_runtime.arguments.output_file`)."""
    arguments.output_file(flag, path)


# ---- the error line ---------------------------------------------------------------------------
def error(message: str, code: str = "") -> None:
    """Print the one error line: ``gear-runtime: error: [code] message`` on stderr."""
    line = " ".join(message.split())  # one line, whatever the message holds
    prefix = f"[{code}] " if code and not line.startswith(f"[{code}]") else ""
    print(f"{PROG}: error: {prefix}{line}", file=sys.stderr)


__all__ = ["EXIT_FAILED", "EXIT_OK", "EXIT_USAGE", "PROG", "Parser", "UsageError",
           "add_backend_flags", "add_json_flag", "add_state_flags", "backend_options",
           "backends_help", "check_output_file", "check_state_names", "error", "existing_file",
           "float_at_least", "int_at_least", "int_list", "make_dir", "parse_pad_values",
           "state_pairs"]
