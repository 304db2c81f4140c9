"""Executor: one per thread (or stream); set the dims, execute, get the gear's outputs.

The hot path is one C++ call (``ExecutorCore.stage``: dims from the input shapes, exact O(1)
match, every input copied into the merged staging buffer with the GIL released, the int32 dims
buffer written) followed by the backend's run of that gear. Everything an executor mutates is
its own (staging, bindings, current dims), so executors of one model run concurrently with no
lock; one executor must not be used by two threads at once.

Differences from GE, on purpose: a miss is an error (GE silently keeps gear 0), an output
shape is never empty (GE returns an empty shape on a miss), and dims are per executor (ACL's
set-dims-then-execute pair is per dataset and races when a dataset is shared).
"""

from __future__ import annotations

import logging
import operator
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from gear_runtime import core
from gear_runtime.backends.base import BackendSession
from gear_runtime.errors import (
    BackendError,
    DynamicInputLengthError,
    GearMismatchError,
    InputError,
)

if TYPE_CHECKING:
    from gear_runtime.model import GearModel

logger = logging.getLogger("gear_runtime")

Inputs = Mapping[str, Any] | Sequence[Any]


class Executor:
    """Runs one gear model; created by :meth:`GearModel.create_executor`."""

    def __init__(self, model: GearModel, session: BackendSession) -> None:
        spec, info = model.spec, model.info
        self.model = model
        self._session = session
        self._names = spec.input_names
        self._dtypes = info.input_dtypes
        self._hybrid = info.hybrid
        self._sink = info.sink
        self._ranks = sum(len(s) for s in spec.input_shapes)
        self._core = core.ExecutorCore(
            list(spec.input_names), [list(s) for s in spec.input_shapes],
            list(spec.dynamic_positions), [list(g) for g in spec.gears],
            [np.dtype(d) for d in info.input_dtypes], model.layout, session.staging)
        self._preset: tuple[int, ...] | None = None
        #: The dynamic dims of the last run: matched on the host, or (GetNext-sink mode) read
        #: back from the device after the run. None before the first run.
        self.last_dynamic_dims: tuple[int, ...] | None = None
        #: Index of the gear the last run used; None before the first run, or when the last
        #: run went to the dynamic-shape graph (hybrid miss).
        self.last_gear: int | None = None

    # ---- choosing the gear ---------------------------------------------------------------
    def set_dynamic_dims(self, dims: Sequence[int]) -> None:
        """aclmdlSetInputDynamicDims: the FULL shapes of all inputs flattened, in input order.

        The dynamic values alone (one per -1 of input_shape) are accepted too. Raises
        DynamicInputLengthError (145012) on a wrong length or static dim and GearMismatchError
        (145013) when the dims are no gear (hybrid models accept any dims: a miss runs the
        dynamic-shape graph). The dims stay set for the following executes, whose input
        shapes must agree with them, until changed or :meth:`clear_dynamic_dims`.
        """
        values = self._to_ints("dims", dims)
        if len(values) == 0:
            raise InputError("dims is empty: aclmdlSetInputDynamicDims rejects dimCount 0; "
                             f"pass the {self._ranks} dims of all inputs")
        if len(values) != self._ranks and len(values) == self._core.values_per_gear:
            gear_values = values  # the dynamic values alone
        else:
            gear_values = self._core.values_from_full_dims(values)
        self._set(gear_values)

    def set_dynamic_batch_size(self, batch: int) -> None:
        """aclmdlSetDynamicBatchSize: dynamic batch mode only; 0 is rejected as ACL does."""
        self._require_mode("batch", "set_dynamic_batch_size")
        (b,) = self._to_ints("batch", [batch])
        if b <= 0:
            raise InputError(f"batch must be positive (aclmdlSetDynamicBatchSize rejects {b}); "
                             f"batch gears: {', '.join(str(g[0]) for g in self.model.gears)}")
        self._set((b,))

    def set_dynamic_image_size(self, height: int, width: int) -> None:
        """aclmdlSetDynamicHWSize: dynamic image size mode only; 0 is rejected as ACL does."""
        self._require_mode("image_size", "set_dynamic_image_size")
        h, w = self._to_ints("image size", [height, width])
        if h <= 0 or w <= 0:
            raise InputError(f"image size must be positive, got height={h}, width={w}")
        self._set((h, w))

    def clear_dynamic_dims(self) -> None:
        """Forget set dims: the next execute derives them from the input shapes again."""
        self._preset = None

    @property
    def dynamic_dims(self) -> tuple[int, ...] | None:
        """The dims set by ``set_*`` (gear values), or None when derived from the inputs."""
        return self._preset

    def _set(self, values: tuple[int, ...]) -> None:
        if not self._hybrid:
            self._core.match(values)  # raises 145013 now, at set time, as ACL does
        self._preset = tuple(values)

    def _require_mode(self, mode: str, call: str) -> None:
        if self.model.mode != mode:
            raise InputError(f"{call} needs a model compiled with dynamic {mode.replace('_', ' ')}"
                             f"; this model's mode is {self.model.mode!r}: use "
                             "set_dynamic_dims")

    @staticmethod
    def _to_ints(what: str, values: Any) -> tuple[int, ...]:
        """Integers only (Python or numpy): no silent truncation of 2.5, no "3" strings."""
        try:
            return tuple(operator.index(v) for v in values)
        except TypeError:
            raise InputError(f"{what} must be a sequence of integers, got {values!r}") from None

    # ---- running -------------------------------------------------------------------------
    def execute(self, inputs: Inputs, *, copy: bool = True) -> list[np.ndarray]:
        """Run the gear that the inputs (or the set dims) select; outputs in model order.

        ``inputs``: a dict name -> array, or a list in input order (numpy arrays, or anything
        ``numpy.asarray`` takes; dtypes must be the model's: no silent casts). Outputs have the
        gear's real shapes. With ``copy=False`` they are views of this executor's buffers,
        valid until its next execute (zero-copy for services that consume them at once).
        """
        arrays = self._arrays(inputs)
        if self._sink:
            outputs = self._run_sink(arrays)
        else:
            try:
                gear = self._core.stage(arrays, self._preset)
            except GearMismatchError:
                if not self._hybrid:
                    raise
                return self._run_dynamic(arrays)
            outputs = self._session.run_gear(gear)
            self.last_gear = gear
            self.last_dynamic_dims = self._core.last_values
        return [o.copy() for o in outputs] if copy else list(outputs)

    def _arrays(self, inputs: Inputs) -> list[np.ndarray]:
        """Inputs as a list of arrays in input order; clear errors for missing/unknown names."""
        if isinstance(inputs, Mapping):
            # Hot path: one lookup per input; the names are diffed only on the error path.
            try:
                values = [inputs[n] for n in self._names]
            except KeyError:
                values = []
            if len(values) != len(self._names) or len(inputs) != len(self._names):
                self._raise_name_mismatch(inputs)
        elif isinstance(inputs, Sequence) and not isinstance(inputs, str | bytes):
            if len(inputs) != len(self._names):
                raise InputError(f"got {len(inputs)} inputs, the model takes {len(self._names)}"
                                 f" ({', '.join(self._names)})")
            values = list(inputs)
        else:
            raise InputError("inputs must be a dict name -> array or a list in input order "
                             f"({', '.join(self._names)}), got {type(inputs).__name__}")
        for i, v in enumerate(values):
            if not isinstance(v, np.ndarray):
                values[i] = self._as_array(self._names[i], v, self._dtypes[i])
        return values

    def _raise_name_mismatch(self, inputs: Mapping[str, Any]) -> None:
        missing = [n for n in self._names if n not in inputs]
        unknown = [n for n in inputs if n not in self._names]
        raise InputError(
            "inputs do not match the model"
            + (f"; missing: {', '.join(missing)}" if missing else "")
            + (f"; unknown: {', '.join(map(str, unknown))}" if unknown else "")
            + f"; the model's inputs are: {', '.join(self._names)}")

    @staticmethod
    def _as_array(name: str, value: Any, dtype: np.dtype) -> np.ndarray:
        try:
            return np.asarray(value, dtype=dtype)
        except (TypeError, ValueError) as exc:
            raise InputError(f"input {name!r} cannot be read as a {np.dtype(dtype)} array: "
                             f"{exc}") from None

    def _run_dynamic(self, arrays: list[np.ndarray]) -> list[np.ndarray]:
        """Hybrid mode after a miss (GE's SelectExecuteGraph): the dynamic-shape graph."""
        values = self._core.extract(arrays)
        self._check_preset(values, "the inputs' dynamic dims")
        logger.info("dynamic dims %s match no gear: running the dynamic-shape graph", values)
        self._check_dtypes(arrays)
        outputs = self._session.run_dynamic(arrays)
        self.last_gear = None
        self.last_dynamic_dims = values
        return outputs

    def _run_sink(self, arrays: list[np.ndarray]) -> list[np.ndarray]:
        """GetNext-sink mode: the device computes the dims; read them back, then look up."""
        self._check_dtypes(arrays)
        outputs, dims = self._session.run_sink(arrays)
        self.last_dynamic_dims = tuple(int(d) for d in dims)
        self.last_gear = None
        self._check_preset(self.last_dynamic_dims, "the dims computed on the device")
        try:
            gear = self._core.match(self.last_dynamic_dims)
        except GearMismatchError as exc:
            raise GearMismatchError(f"{exc.message} (dims computed on the device from the "
                                    "input shapes)", exc.code) from None
        expected = self.model.info.output_shapes[gear]
        for k, (out, shape) in enumerate(zip(outputs, expected, strict=True)):
            if tuple(out.shape) != tuple(shape):
                raise BackendError(
                    f"output {self.model.output_names[k]!r} of gear {gear} has shape "
                    f"{tuple(out.shape)}, the gear map says {tuple(shape)}")
        self.last_gear = gear
        return outputs

    def _check_preset(self, values: tuple[int, ...], what: str) -> None:
        """Paths that bypass ``core.stage`` apply its rule: inputs must agree with set dims."""
        if self._preset is not None and values != self._preset:
            raise DynamicInputLengthError(
                f"{what} {values} disagree with the dims set with set_dynamic_* "
                f"{self._preset}")

    def _check_dtypes(self, arrays: list[np.ndarray]) -> None:
        """Paths that bypass ``core.stage`` check dtypes as it does (same message)."""
        for name, a, dt in zip(self._names, arrays, self._dtypes, strict=True):
            if a.dtype != dt:
                raise InputError(f"input '{name}' has dtype {a.dtype}, the model's input has "
                                 f"{np.dtype(dt)}")

    def close(self) -> None:
        self._session.close()

    def __enter__(self) -> Executor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
