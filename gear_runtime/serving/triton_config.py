"""Triton's model repository layout, read as Triton reads it (``--model-repository DIR``):

    DIR/<model>/config.pbtxt                 the model configuration (protobuf text format)
    DIR/<model>/<version>/model.gear.onnx    one folder per version, named by its number

``config.pbtxt`` is parsed with the ModelConfig message tritonclient ships
(``tritonclient.grpc.model_config_pb2``, the grpc extra) and ``google.protobuf.text_format``.
Its fields that mean something for a gear file are taken (docs/serving.md has the table):
``name`` (must be the folder's, as Triton requires), ``platform`` / ``backend`` (what
describes a gear file; anything else is refused naming it), ``max_batch_size``, ``input`` /
``output`` (checked against the gear file), ``dynamic_batching`` (on, and its delay),
``sequence_batching`` (state pairs, idle limit, in-place state), ``instance_group`` (the
executors, or a stateful model's sequence slots), ``version_policy``,
``default_model_filename``. A field that contradicts the gear file is refused
(:class:`~gear_runtime.serving.errors.ModelConfigError`) naming the field, both values and
what to write instead; fields with no meaning here (optimization, warmup, parameters, ...)
are ignored.

Versions: every folder named by a whole number (no leading zeros; others are skipped, as
Triton skips them); by default the newest is served, ``version_policy`` says otherwise
(``latest { num_versions: N }``, ``all {}``, ``specific { versions: [...] }``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gear_runtime.errors import BackendUnavailableError, GearFileError
from gear_runtime.gearfile.format import OWN_FILE_SUFFIXES
from gear_runtime.serving.errors import ModelConfigError
from gear_runtime.serving.options import ServeOptions

CONFIG_FILE = "config.pbtxt"
#: The file a version folder holds, in the order looked for (``default_model_filename``
#: names another): a gear file, or ``model.onnx`` as Triton's onnxruntime backend names it
#: (a gear file, or a static ONNX model: one gear), or a backend's own file.
MODEL_FILES = ("model.gear.onnx", "model.onnx", *(f"model{s}" for s in OWN_FILE_SUFFIXES))
#: ``platform`` values that describe a gear file: Triton's ONNX Runtime platform, and what
#: this server's own configuration says (``gear_runtime_<backend>``)
GEAR_PLATFORMS = ("onnxruntime_onnx", "gear_runtime")
#: ``backend`` values that describe a gear file
GEAR_BACKENDS = ("onnxruntime", "gear_runtime")


def read_config(path: Path) -> Any:
    """The ModelConfig message of the config.pbtxt at ``path``. ModelConfigError naming the
    file when it is not one; BackendUnavailableError when tritonclient's proto is not
    installed."""
    try:
        from google.protobuf import text_format
        from tritonclient.grpc import model_config_pb2
    except ImportError as exc:
        raise BackendUnavailableError(
            f"{str(path)!r}: reading Triton's config.pbtxt needs tritonclient's model_config "
            f'proto: pip install "gear_runtime[grpc]" ({exc.name} is not installed)') from exc
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise GearFileError(f"{str(path)!r} cannot be read: {exc}") from None
    try:
        return text_format.Parse(text, model_config_pb2.ModelConfig())
    except text_format.ParseError as exc:
        raise ModelConfigError(f"{str(path)!r} is not a Triton model configuration "
                               f"(inference.ModelConfig in protobuf text format): {exc}"
                               ) from None


def version_numbers(folder: Path) -> list[int]:
    """The versions ``folder`` holds, ascending: its subfolders named by a whole number
    without leading zeros (Triton's rule)."""
    return sorted(int(p.name) for p in folder.iterdir()
                  if p.is_dir() and p.name.isascii() and p.name.isdigit()
                  and (p.name == "0" or not p.name.startswith("0")))


def is_model_folder(folder: Path) -> bool:
    """Whether ``folder`` is a model of Triton's layout: a config.pbtxt, or a version
    folder."""
    return folder.is_dir() and ((folder / CONFIG_FILE).is_file() or
                                bool(version_numbers(folder)))


@dataclass(frozen=True)
class TritonModel:
    """One model folder of a Triton repository: its configuration (None: no config.pbtxt,
    every setting the serve flags') and the versions to serve, version -> model file,
    oldest first (requests naming no version get the last)."""

    name: str
    folder: Path
    config: Any | None
    versions: dict[str, Path]

    @classmethod
    def read(cls, folder: Path) -> TritonModel:
        """Read ``folder`` (config.pbtxt, version folders, their files); ModelConfigError
        naming what is wrong."""
        config_path = folder / CONFIG_FILE
        config = read_config(config_path) if config_path.is_file() else None
        if config is not None:
            _check_identity(config, folder.name, str(config_path))
        chosen = _versions_to_serve(config, version_numbers(folder), folder)
        filename = config.default_model_filename if config is not None else ""
        return cls(folder.name, folder, config,
                   {str(v): _model_file(folder / str(v), filename) for v in chosen})

    @property
    def where(self) -> str:
        return str(self.folder / CONFIG_FILE)

    def options(self, base: ServeOptions) -> ServeOptions:
        """``base`` (the serve flags) with what config.pbtxt sets for this model."""
        if self.config is None:
            return base
        changes = {**_batching(self.config, self.where), **_sequences(self.config, self.where)}
        count = sum(max(1, g.count) for g in self.config.instance_group)
        if count:  # Triton's direct strategy: one sequence slot per instance
            stateful = bool(changes.get("state", base.state))
            changes["max_sequences" if stateful else "executors"] = count
        return dataclasses.replace(base, **changes)

    def version_policy(self) -> dict[str, Any]:
        """The version policy, as Triton's configuration (JSON) writes it."""
        choice, policy = _version_policy(self.config)
        if choice == "all":
            return {"all": {}}
        if choice == "specific":
            return {"specific": {"versions": sorted(policy.specific.versions)}}
        n = policy.latest.num_versions if choice == "latest" else 1
        return {"latest": {"num_versions": n}}

    @property
    def batch_axis(self) -> bool:
        """False where config.pbtxt says max_batch_size 0: the model's axis 0 is then part
        of every tensor's dims, as Triton reads them."""
        return self.config is None or self.config.max_batch_size > 0

    def check(self, served: dict[str, Any], version: str) -> None:
        """ModelConfigError unless config.pbtxt describes the model the server serves, as
        ``served`` (its Triton configuration, ServedModel.config()) says it: max_batch_size,
        every input (name, data type, dims), the outputs it lists, the state pairs, the
        preferred batch sizes."""
        if self.config is None:
            return
        where = f"{self.where} (version {version}: {self.versions[version]})"
        if self.config.max_batch_size != served["max_batch_size"]:
            raise ModelConfigError(
                f"{where}: max_batch_size is {self.config.max_batch_size}, the gear file's "
                f"is {served['max_batch_size']} " + _batch_hint(served))
        _check_tensors("input", self.config.input, served["input"], where, every=True)
        _check_tensors("output", self.config.output, served["output"], where, every=False)
        _check_states(self.config, served, where)
        preferred = set(self.config.dynamic_batching.preferred_batch_size)
        gears = served.get("dynamic_batching", {}).get("preferred_batch_size", [])
        if preferred - set(gears):
            raise ModelConfigError(
                f"{where}: dynamic_batching preferred_batch_size {sorted(preferred)} has "
                f"{sorted(preferred - set(gears))}, not a batch gear of the gear file (its "
                f"batch gears: {gears}); batches run at the gears: drop it or list gears")


def _check_identity(config: Any, folder: str, where: str) -> None:
    """The config's name is its folder's (empty: taken from it, as Triton does), and its
    platform / backend describe a gear file."""
    if config.name and config.name != folder:
        raise ModelConfigError(f"{where}: unexpected directory name {folder!r} for model "
                               f"{config.name!r}: the directory name must equal the model "
                               "name (Triton's rule)")
    config.name = folder
    platform, backend = config.platform, config.backend
    if platform and not (platform in GEAR_PLATFORMS or platform.startswith("gear_runtime_")):
        raise ModelConfigError(
            f"{where}: platform {platform!r} does not describe a gear file; expected "
            f"{' or '.join(map(repr, GEAR_PLATFORMS))} (or gear_runtime_<backend>), or no "
            "platform: gear_runtime serves gear files (gear-runtime compile)")
    if backend and backend not in GEAR_BACKENDS:
        raise ModelConfigError(
            f"{where}: backend {backend!r} does not describe a gear file; expected "
            f"{' or '.join(map(repr, GEAR_BACKENDS))}, or no backend")
    if config.model_transaction_policy.decoupled:
        raise ModelConfigError(f"{where}: model_transaction_policy decoupled: true: a gear "
                               "model answers each request once (not decoupled)")


def _version_policy(config: Any | None) -> tuple[str | None, Any]:
    """``config``'s version_policy: which policy it chose (None without a config) and the
    policy message."""
    if config is None:
        return None, None
    return config.version_policy.WhichOneof("policy_choice"), config.version_policy


def _versions_to_serve(config: Any | None, found: list[int], folder: Path) -> list[int]:
    """The versions ``version_policy`` serves of ``found`` (ascending); ModelConfigError
    when none, or for a specific version without its folder."""
    choice, policy = _version_policy(config)
    if choice == "all":
        chosen = found
    elif choice == "specific":
        wanted = sorted(set(policy.specific.versions))
        missing = [v for v in wanted if v not in found]
        if missing:
            raise ModelConfigError(
                f"{str(folder / CONFIG_FILE)!r}: version_policy specific versions {wanted}: "
                f"no version folder {missing[0]} in {str(folder)!r} (its versions: {found})")
        chosen = wanted
    else:
        n = policy.latest.num_versions if choice == "latest" else 1
        if n < 1:
            raise ModelConfigError(f"{str(folder / CONFIG_FILE)!r}: version_policy latest "
                                   f"num_versions {n}: expected 1 or more")
        chosen = found[-n:]
    if not chosen:
        raise ModelConfigError(f"model folder {str(folder)!r} has no version folder (a "
                               "folder named by a whole number: 1/model.gear.onnx)")
    return chosen


def _model_file(folder: Path, filename: str) -> Path:
    """The model file of version folder ``folder``: ``filename`` (default_model_filename)
    or the first of :data:`MODEL_FILES` there; ModelConfigError naming what was looked
    for."""
    if filename and (Path(filename).name != filename or filename.startswith(".")):
        raise ModelConfigError(f"default_model_filename {filename!r} must be a plain file "
                               "name in the version folder")
    names = (filename,) if filename else MODEL_FILES
    for name in names:
        if (folder / name).is_file():
            return folder / name
    raise ModelConfigError(f"version folder {str(folder)!r} has no model file: expected "
                           f"{' or '.join(names)}")


def _batching(config: Any, where: str) -> dict[str, Any]:
    """The batching options: dynamic_batching on (its delay, its queue's bound) or off, as
    Triton batches only with dynamic_batching."""
    if config.max_batch_size < 0:
        raise ModelConfigError(f"{where}: max_batch_size {config.max_batch_size}: expected "
                               "0 (no batch axis) or more")
    if not config.HasField("dynamic_batching"):
        return {"batching": False}
    if config.max_batch_size == 0:
        raise ModelConfigError(f"{where}: dynamic_batching with max_batch_size 0: batching "
                               "needs a batch axis; set max_batch_size to the largest batch "
                               "gear")
    batching = config.dynamic_batching
    changes: dict[str, Any] = {"batching": True, "max_batch_delay_ms":
                               batching.max_queue_delay_microseconds / 1000}
    if batching.default_queue_policy.max_queue_size:
        changes["max_queue"] = batching.default_queue_policy.max_queue_size
    return changes


def _sequences(config: Any, where: str) -> dict[str, Any]:
    """The options of sequence_batching with implicit state: the state pairs, the idle
    limit, one buffer per pair (use_same_buffer_for_input_output)."""
    if not config.HasField("sequence_batching"):
        return {}
    seq = config.sequence_batching
    if seq.control_input:
        raise ModelConfigError(
            f"{where}: sequence_batching control_input {seq.control_input[0].name!r}: the "
            "sequence flags reach the server as request parameters (sequence_id, "
            "sequence_start, sequence_end), not as input tensors of the model")
    if seq.iterative_sequence:
        raise ModelConfigError(f"{where}: sequence_batching iterative_sequence is not "
                               "supported")
    for state in seq.state:
        for initial in state.initial_state:
            if initial.WhichOneof("state_data") == "data_file":
                raise ModelConfigError(
                    f"{where}: state {state.input_name!r} initial_state {initial.name!r} "
                    "from data_file: a sequence starts from zeros (zero_data: true) or from "
                    "serve --sequence-start")
    same = {s.use_same_buffer_for_input_output for s in seq.state}
    if len(same) > 1:
        raise ModelConfigError(f"{where}: use_same_buffer_for_input_output is set for some "
                               "states only: the state is kept in place for every pair or "
                               "for none")
    changes: dict[str, Any] = {}
    if seq.state:
        changes["state"] = tuple((s.input_name, s.output_name) for s in seq.state)
        changes["in_place_state"] = same == {True}
    if seq.max_sequence_idle_microseconds:
        changes["sequence_idle_s"] = seq.max_sequence_idle_microseconds / 1e6
    return changes


def _type_name(data_type: int) -> str:
    from tritonclient.grpc import model_config_pb2

    return model_config_pb2.DataType.Name(data_type)


def _check_tensors(kind: str, wanted: Iterable[Any], served: Sequence[dict[str, Any]],
                   where: str, every: bool) -> None:
    """Each tensor config.pbtxt lists is one the gear file has, of its data type and dims
    (as the server's configuration writes them: -1 where gears differ, without the batch
    axis where max_batch_size > 0); ``every``: the list, when given, names all of them."""
    ours = {t["name"]: t for t in served}
    listed = []
    for tensor in wanted:
        listed.append(tensor.name)
        got = ours.get(tensor.name)
        if got is None:
            raise ModelConfigError(f"{where}: {kind} {tensor.name!r} is not an {kind} of the "
                                   f"gear file (its {kind}s: {', '.join(ours)})")
        if tensor.HasField("reshape"):
            raise ModelConfigError(f"{where}: {kind} {tensor.name!r} has a reshape: the gear "
                                   "file's shapes are served as they are")
        if list(tensor.dims) != list(got["dims"]):
            raise ModelConfigError(
                f"{where}: {kind} {tensor.name!r} has dims {list(tensor.dims)} in "
                f"config.pbtxt, the gear file {list(got['dims'])} (-1 where its gears "
                "differ; without the batch axis where max_batch_size > 0)")
        if tensor.data_type and _type_name(tensor.data_type) != got["data_type"]:
            raise ModelConfigError(
                f"{where}: {kind} {tensor.name!r} has data_type "
                f"{_type_name(tensor.data_type)} in config.pbtxt, the gear file "
                f"{got['data_type']}")
    missing = [n for n in ours if n not in listed]
    if every and listed and missing:
        raise ModelConfigError(f"{where}: config.pbtxt lists the {kind}s {listed}; the gear "
                               f"file also takes {missing}")


def _check_states(config: Any, served: dict[str, Any], where: str) -> None:
    """Each state of sequence_batching has the data type and dims of its model input."""
    ours = {s["input_name"]: s for s in served.get("sequence_batching", {}).get("state", [])}
    for state in config.sequence_batching.state:
        got = ours.get(state.input_name)
        if got is None:  # the pair itself is the executor's to refuse; this is a guard
            raise ModelConfigError(f"{where}: state {state.input_name!r} is not served as "
                                   "a state of the gear file")
        if state.dims and list(state.dims) != list(got["dims"]):
            raise ModelConfigError(
                f"{where}: state {state.input_name!r} has dims {list(state.dims)} in "
                f"config.pbtxt, the gear file's input {list(got['dims'])}")
        if state.data_type and _type_name(state.data_type) != got["data_type"]:
            raise ModelConfigError(
                f"{where}: state {state.input_name!r} has data_type "
                f"{_type_name(state.data_type)} in config.pbtxt, the gear file's input "
                f"{got['data_type']}")


def _batch_hint(served: dict[str, Any]) -> str:
    """What max_batch_size the gear file takes, and why."""
    if served["max_batch_size"]:
        return (f"(its largest batch gear): set max_batch_size: {served['max_batch_size']}, "
                "or 0 to serve axis 0 as part of the dims")
    return ("(it does not batch on axis 0 of every input and output): set max_batch_size: 0 "
            "and give the dims in full")


__all__ = ["CONFIG_FILE", "MODEL_FILES", "TritonModel", "is_model_folder", "read_config",
           "version_numbers"]
