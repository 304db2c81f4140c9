"""The model repository (``--model-repository DIR``): gear files a running server can load,
reload and unload by name (Triton's model repository extension, its "explicit" mode).

The repository is a folder of gear files; the model ``NAME`` is the file
``DIR/NAME.gear.onnx`` (what ``gear-runtime compile -o`` writes). A name is a plain file
name: letters, digits, ``_ . -``, not starting with a dot, so a request can never name a file
outside the folder.
"""

from __future__ import annotations

import re
from pathlib import Path

from gear_runtime.errors import GearFileError, InputError
from gear_runtime.serving.errors import ModelNotFoundError

#: What a repository model name may be (no path separators, no leading dot).
NAME_PATTERN = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,199}")
SUFFIX = ".gear.onnx"


class ModelRepository:
    """The gear files of one folder, by model name."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        if not self.directory.is_dir():
            raise GearFileError(f"model repository {str(directory)!r} is not a folder")

    def path_of(self, name: str) -> Path:
        """The gear file of model ``name``; InputError for a name that is not a plain file
        name, ModelNotFoundError when there is no such file."""
        if not NAME_PATTERN.fullmatch(name) or ".." in name:
            raise InputError(f"model name {name[:200]!r} is not a repository name (letters, "
                             "digits, '_', '.', '-'; not starting with '.')")
        path = self.directory / f"{name}{SUFFIX}"
        if not path.is_file():
            raise ModelNotFoundError(f"model {name!r}: the repository has no file "
                                     f"{path.name} in {str(self.directory)!r}")
        return path

    def names(self) -> list[str]:
        """The models the repository holds (sorted)."""
        found = []
        for path in self.directory.glob(f"*{SUFFIX}"):
            name = path.name[: -len(SUFFIX)]
            if path.is_file() and NAME_PATTERN.fullmatch(name) and ".." not in name:
                found.append(name)
        return sorted(found)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name in self.names()
