"""Loading the models a server serves: gear files by name (:func:`load_models`,
:func:`load_one`), their bench profiles (``serve --profile``), and closing what a failed
load left."""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from gear_runtime.errors import InputError
from gear_runtime.gearfile.format import OWN_FILE_SUFFIXES
from gear_runtime.serving.metrics import Metrics
from gear_runtime.serving.options import ServeOptions
from gear_runtime.serving.protocol import MODEL_VERSION
from gear_runtime.serving.served import ServedModel


def model_name(path: str | os.PathLike[str]) -> str:
    """The served name of a model file: its file name without ``.gear.onnx`` / ``.onnx`` /
    ``.om`` / ``.mindir`` (``fake_conv.om`` is served as ``fake_conv``)."""
    name = Path(path).name
    for suffix in (".gear.onnx", ".onnx", *OWN_FILE_SUFFIXES):
        if name.endswith(suffix) and len(name) > len(suffix):
            return name[: -len(suffix)]
    return name


def load_models(files: Sequence[str], names: Sequence[str] | None, options: ServeOptions,
                metrics: Metrics) -> dict[str, ServedModel]:
    """Load every gear file and start its executors; names from ``names`` or the files.
    GearRuntimeError for duplicate names or a bad file."""
    names = list(names) if names else [model_name(f) for f in files]
    if len(names) != len(files):
        raise InputError(f"{len(names)} names for {len(files)} files: give one --name per file")
    if len(set(names)) != len(names):
        raise InputError(f"two models would be served as the same name: {names}; use --name")
    served: dict[str, ServedModel] = {}
    try:
        for name, path in zip(names, files, strict=True):
            served[name] = load_one(name, path, options, metrics)
        _check_pad(served, options)
    except BaseException:
        close_loaded(served.values())
        raise
    return served


def close_loaded(models: Iterable[ServedModel]) -> None:
    """Close models loaded but never served (a later load failed): their threads, sequence
    slots and files, at once (no request can be using them)."""
    for m in models:
        m.pool.close()
        if m.sequences is not None:
            m.sequences.close()
        if m.start is not None:
            m.start.close()
        m.model.close()


def _check_pad(served: dict[str, ServedModel], options: ServeOptions) -> None:
    """``--pad`` must pad something: a batched batch-mode model runs its requests in the
    covering batch gear already (a request of 3 rows joins a batch run as gear 4)."""
    if options.pad and served and all(m.batcher is not None for m in served.values()):
        raise InputError(
            f"--pad does nothing here: {', '.join(sorted(served))} "
            f"{'is a batch-mode model' if len(served) == 1 else 'are batch-mode models'} "
            "whose requests are batched and padded into the batch gears already; drop --pad "
            "(or add --no-batching to pad each request to its covering gear alone)")


def check_profile(path: str, model_path: str, backend: str) -> dict[str, Any]:
    """``serve --profile``'s file check: the bench result at ``path``, read; InputError naming
    it when it cannot be read or was measured on another model than the gear file
    ``model_path`` (its files' digest, as ``bench --compare`` checks). Hashes every file of
    the model: ``serve --workers`` makes this check once, in the parent."""
    from gear_runtime.tools.bench.context import files_digest, model_files
    from gear_runtime.tools.bench.result import load_result

    result = load_result(path, flag="--profile")
    measured = result.get("context", {}).get("model", {}).get("digest")
    if measured is not None and measured != files_digest(model_files(model_path, backend)):
        raise InputError(f"--profile: {path!r} was measured on another model (its files' "
                         f"digest differs from {model_path!r}'s): run gear-runtime bench "
                         "--json on this gear file")
    return result


def attach_profile(model: Any, path: str, model_path: str, backend: str,
                   checked: bool = False) -> None:
    """``serve --profile``: the bench result at ``path`` gives every gear of ``model`` (the
    file ``model_path``) its measured latency (model.attach_profile); InputError naming the
    file when :func:`check_profile` refuses it (skipped when ``checked``: the parent of
    ``serve --workers`` made it) or it was measured on other gears."""
    from gear_runtime.tools.bench.result import gear_latencies, load_result

    result = (load_result(path, flag="--profile") if checked
              else check_profile(path, model_path, backend))
    latencies = gear_latencies(result)
    try:  # the model's own rule: a latency for each of its gears, no other gear
        model.attach_profile(latencies)
    except InputError as exc:
        raise InputError(f"--profile: {path!r} was measured on the gears "
                         f"{sorted(latencies)}, the model has "
                         f"{[tuple(g) for g in model.gears]} ({exc}): run gear-runtime "
                         "bench --json on this gear file") from exc


def load_one(name: str, path: str, options: ServeOptions, metrics: Metrics,
             version: str = MODEL_VERSION) -> ServedModel:
    """Load the gear file ``path`` and start its executors, served as ``name`` (version
    ``version``)."""
    import gear_runtime as gr

    # a missing or unreadable file is the loader's GearFileError (its one file rule)
    model = gr.load(path, backend=options.backend, **options.load_options())
    try:
        if options.profile is not None:
            attach_profile(model, options.profile, path, options.backend,
                           checked=options.profile_checked)
        return ServedModel(name, model, options, metrics, path=path, version=version)
    except BaseException:
        model.close()
        raise
