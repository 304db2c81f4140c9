"""The model repository (``--model-repository DIR``): models a running server can load,
reload and unload by name (Triton's model repository extension, its "explicit" mode).

A model of the repository is either

* a gear file ``DIR/NAME.gear.onnx`` (what ``gear-runtime compile -o`` writes), served as
  version "1" with the serve flags' settings; or
* a folder in Triton's layout, ``DIR/NAME/config.pbtxt`` + ``DIR/NAME/<version>/model.gear.onnx``
  (serving/triton_config.py): its versions, and what its config.pbtxt sets.

A name is a plain file name: letters, digits, ``_ . -``, not starting with a dot, so a
request can never name a file outside the folder.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from gear_runtime.errors import GearFileError, InputError
from gear_runtime.serving.errors import ModelConfigError, ModelNotFoundError
from gear_runtime.serving.loading import close_loaded, load_one
from gear_runtime.serving.metrics import Metrics
from gear_runtime.serving.options import ServeOptions
from gear_runtime.serving.protocol import MODEL_VERSION
from gear_runtime.serving.served import ServedModel
from gear_runtime.serving.triton_config import TritonModel, is_model_folder

#: What a repository model name may be (no path separators, no leading dot).
NAME_PATTERN = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,199}")
SUFFIX = ".gear.onnx"


@dataclass(frozen=True)
class RepositoryModel:
    """One model of the repository: the versions to serve (version -> file, oldest first:
    requests naming no version get the last) and, in Triton's layout, its configuration."""

    name: str
    versions: dict[str, Path]
    triton: TritonModel | None = None

    def load(self, options: ServeOptions, metrics: Metrics) -> dict[str, ServedModel]:
        """Every version loaded and started (version -> model, oldest first), with the
        settings its config.pbtxt gives over ``options``; GearRuntimeError for a file that
        cannot be served or a config.pbtxt that contradicts it (none is left open)."""
        options = self.triton.options(options) if self.triton else options
        loaded: dict[str, ServedModel] = {}
        try:
            for version, path in self.versions.items():
                loaded[version] = served = self._load_one(version, path, options, metrics)
                if self.triton is not None:
                    served.version_policy = self.triton.version_policy()
                    served.batch_axis = self.triton.batch_axis
                    self.triton.check(served.config(), version)
        except BaseException:
            close_loaded(loaded.values())
            raise
        for served in loaded.values():
            served.versions = tuple(loaded)
        return loaded

    def _load_one(self, version: str, path: Path, options: ServeOptions,
                  metrics: Metrics) -> ServedModel:
        """One version; a file of Triton's layout the loader refuses (a model.onnx that is
        a plain ONNX model with dynamic axes) is refused saying how to compile it."""
        try:
            return load_one(self.name, str(path), options, metrics, version)
        except ModelConfigError:
            raise
        except GearFileError as exc:
            if self.triton is None or path.name.endswith(SUFFIX):
                raise
            raise GearFileError(
                f"{exc.message}; a version folder of Triton's layout holds a gear file: "
                f"gear-runtime compile {path} --input_shape=... --dynamic_... "
                f"-o {path.parent / 'model.gear.onnx'}", exc.code) from exc


class ModelRepository:
    """The models of one folder, by name."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        if not self.directory.is_dir():
            raise GearFileError(f"model repository {str(directory)!r} is not a folder")

    def entry(self, name: str) -> RepositoryModel:
        """Model ``name`` as the folder holds it now (a config.pbtxt is read afresh);
        InputError for a name that is not a plain file name, ModelNotFoundError when there
        is no such model, ModelConfigError for one that cannot be served as laid out."""
        if not NAME_PATTERN.fullmatch(name) or ".." in name:
            raise InputError(f"model name {name[:200]!r} is not a repository name (letters, "
                             "digits, '_', '.', '-'; not starting with '.')")
        file, folder = self.directory / f"{name}{SUFFIX}", self.directory / name
        if file.is_file() and is_model_folder(folder):
            raise ModelConfigError(f"model {name!r} is both the gear file {str(file)!r} and "
                                   f"the model folder {str(folder)!r}: keep one")
        if file.is_file():
            return RepositoryModel(name, {MODEL_VERSION: file})
        if is_model_folder(folder):
            triton = TritonModel.read(folder)
            return RepositoryModel(name, triton.versions, triton)
        raise ModelNotFoundError(f"model {name!r}: the repository {str(self.directory)!r} has "
                                 f"no file {file.name} and no model folder {name}/")

    def path_of(self, name: str) -> Path:
        """The file of model ``name``'s newest served version (see :meth:`entry`)."""
        return list(self.entry(name).versions.values())[-1]

    def names(self) -> list[str]:
        """The models the repository holds (sorted): gear files and model folders."""
        found = set()
        for path in self.directory.iterdir():
            name = path.name[: -len(SUFFIX)] if path.name.endswith(SUFFIX) else path.name
            if not NAME_PATTERN.fullmatch(name) or ".." in name:
                continue
            if (path.is_file() and path.name.endswith(SUFFIX)) or is_model_folder(path):
                found.add(name)
        return sorted(found)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name in self.names()


def load_entries(entries: list[RepositoryModel], options: ServeOptions,
                 metrics: Metrics) -> dict[str, dict[str, ServedModel]]:
    """Each model's versions loaded (name -> version -> model); none left open when one
    fails."""
    loaded: dict[str, dict[str, ServedModel]] = {}
    try:
        for entry in entries:
            loaded[entry.name] = entry.load(options, metrics)
    except BaseException:
        close_loaded(m for versions in loaded.values() for m in versions.values())
        raise
    return loaded
