"""GearModel: a loaded gear model (GE's DavinciModel), and ``load``.

The model is shared, read-only state: the gears, the gear -> output shape / size maps, the
staging layout, and the backend's executables (ONNX Runtime sessions sharing one copy of the
weights, an ACL model id, ...). Per-request state lives in executors, one per thread:
``model.create_executor()``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from gear_runtime import core
from gear_runtime.backends import BackendModel, ModelInfo, open_model
from gear_runtime.errors import GearMismatchError, InputError
from gear_runtime.executor import Executor
from gear_runtime.spec import GearSpec

#: GE's ``ascend_mbatch_shape_data`` (ACL_DYNAMIC_TENSOR_NAME): the extra int32 input that
#: carries the current gear's dynamic dims.
ACL_DYNAMIC_TENSOR_NAME = "ascend_mbatch_shape_data"

#: GE's default ``ge.exec.input_fusion_size``: inputs up to this many bytes share the one
#: merged host-to-device copy.
DEFAULT_INPUT_FUSION_SIZE = core.DEFAULT_FUSION_SIZE


def load(path: str, backend: str = "onnxruntime", *,
         input_fusion_size: int = DEFAULT_INPUT_FUSION_SIZE, **options: Any) -> GearModel:
    """Load the gear model at ``path`` on ``backend``.

    ``options`` go to the backend (e.g. ``providers=`` for onnxruntime, ``config=`` for
    mindspore_lite, ``device_id=`` for acl). ``input_fusion_size`` mirrors GE's
    ``ge.exec.input_fusion_size`` (negative turns merging off).
    """
    try:
        path = os.fsdecode(os.fspath(path))
    except TypeError:
        raise InputError(f"path must be a file path, got {type(path).__name__}") from None
    return GearModel(open_model(path, backend, **options), input_fusion_size=input_fusion_size)


class GearModel:
    """A gear model loaded on one backend (thread-safe; executors are per thread)."""

    def __init__(self, backend_model: BackendModel,
                 input_fusion_size: int = DEFAULT_INPUT_FUSION_SIZE) -> None:
        self._backend = backend_model
        self.info: ModelInfo = backend_model.info
        self.spec: GearSpec = self.info.spec
        # One layout for every executor: computed once here, never on the hot path. The
        # backend's device memory rules (alignment, padding) shape it; the user's fusion size
        # decides what merges.
        options = {**backend_model.layout_options, "fusion_size": input_fusion_size}
        self.layout = core.plan_layout(self.info.input_nbytes(), self.spec.values_per_gear,
                                       **options)

    # ---- what the model is ---------------------------------------------------------------
    @property
    def backend(self) -> str:
        return self._backend.name

    @property
    def gear_count(self) -> int:
        return self.spec.gear_count

    @property
    def gears(self) -> list[tuple[int, ...]]:
        return list(self.spec.gears)

    @property
    def mode(self) -> str:
        return self.spec.mode

    @property
    def input_names(self) -> list[str]:
        return list(self.spec.input_names)

    @property
    def output_names(self) -> list[str]:
        return list(self.info.output_names)

    @property
    def hybrid(self) -> bool:
        return self.info.hybrid

    @property
    def sink(self) -> bool:
        return self.info.sink

    def gear_of(self, gear: int | Sequence[int]) -> int:
        """Index of ``gear``: an index, or a gear's dynamic values. Raises, never guesses."""
        if isinstance(gear, int | np.integer) and not isinstance(gear, bool):
            if 0 <= gear < self.gear_count:
                return int(gear)
            raise InputError(f"gear index {gear} is out of range: the model has "
                             f"{self.gear_count} gears (0..{self.gear_count - 1})")
        if isinstance(gear, str | bytes) or not isinstance(gear, Sequence | np.ndarray):
            raise InputError(f"gear must be an index or a tuple of dynamic values, got "
                             f"{gear!r}")
        index = self.spec.gear_index(gear)  # integers only: 40.7 is no gear 40
        if index is None:
            raise GearMismatchError(f"dynamic dims {tuple(gear)} are not a gear of the model; "
                                    f"gears: {', '.join(map(str, self.spec.gears))}")
        return index

    def output_shape(self, gear: int | Sequence[int], index: int) -> tuple[int, ...]:
        """Output ``index``'s shape in ``gear`` (GE's gear -> output shape map; never empty)."""
        return self.info.output_shapes[self.gear_of(gear)][self._output_index(index)]

    def output_size(self, gear: int | Sequence[int], index: int) -> int:
        """Output ``index``'s size in bytes in ``gear`` (GE's gear -> output size map)."""
        return self.info.output_size(self.gear_of(gear), self._output_index(index))

    def _output_index(self, index: int) -> int:
        n = len(self.info.output_names)
        if not isinstance(index, int | np.integer) or isinstance(index, bool) \
                or not 0 <= index < n:
            raise InputError(f"output index {index!r} is out of range: the model has {n} "
                             f"outputs ({', '.join(self.info.output_names)})")
        return int(index)

    # ---- ACL-style queries (acl_mdl.h, GE-NOTES section 8) -------------------------------
    def get_input_dynamic_gear_count(self) -> int:
        """aclmdlGetInputDynamicGearCount(desc, -1)."""
        return self.gear_count

    def get_input_dynamic_dims(self) -> list[tuple[int, ...]]:
        """aclmdlGetInputDynamicDims(desc, -1): per gear, all inputs' shapes flattened."""
        return [self.spec.full_dims(i) for i in range(self.gear_count)]

    def get_dynamic_batch(self) -> list[int]:
        """aclmdlGetDynamicBatch: the batch gears (empty unless dynamic batch mode)."""
        return [g[0] for g in self.spec.gears] if self.mode == "batch" else []

    def get_dynamic_hw(self) -> list[tuple[int, int]]:
        """aclmdlGetDynamicHW: the (h, w) gears (empty unless dynamic image size mode)."""
        return [(g[0], g[1]) for g in self.spec.gears] if self.mode == "image_size" else []

    def get_input_index_by_name(self, name: str) -> int:
        """aclmdlGetInputIndexByName; ``ascend_mbatch_shape_data`` is the last input."""
        if name == ACL_DYNAMIC_TENSOR_NAME:
            return len(self.spec.input_names)
        try:
            return self.spec.input_names.index(name)
        except ValueError:
            raise InputError(f"the model has no input {name!r}; inputs: "
                             f"{', '.join([*self.spec.input_names, ACL_DYNAMIC_TENSOR_NAME])}"
                             ) from None

    # ---- running -------------------------------------------------------------------------
    def create_executor(self) -> Executor:
        """A new executor: its own staging buffer, bindings and dims; one per thread."""
        return Executor(self, self._backend.create_session(self.layout))

    def close(self) -> None:
        """Unload the model (device memory, sessions). Idempotent.

        Close only when no executor of this model is running: executors read buffers the
        backend owns (on Ascend, pinned host memory), and closing under a running execute
        frees them. Close the executors first, or let them finish.
        """
        self._backend.close()

    def __enter__(self) -> GearModel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"GearModel(backend={self.backend!r}, mode={self.mode!r}, "
                f"inputs={self.input_names}, gears={self.gears}, hybrid={self.hybrid}, "
                f"sink={self.sink})")
