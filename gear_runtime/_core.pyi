# The C++ core's API for editors and type checkers. Generated from the built module by
# pybind11-stubgen 3.0.0 (`pybind11-stubgen gear_runtime._core -o .`); regenerate it when
# csrc/bindings.cc changes (tests/test_package.py checks it names what the module has).
"""
C++ hot path of gear_runtime (see gear_runtime.runtime.core for the documented API).
"""
from __future__ import annotations
import collections.abc
import numpy
import numpy.typing
import typing
__all__: list[str] = ['DEFAULT_ALIGNMENT', 'DEFAULT_FUSION_SIZE', 'ExecutorCore', 'GearDispatch', 'Layout', 'MAX_FUSION_SIZE', 'plan_layout']
class Layout:
    """
    Staging layout of every gear; built by plan_layout().
    """
    def __repr__(self) -> str:
        ...
    def dims_offset(self, gear: typing.SupportsInt | typing.SupportsIndex) -> int:
        ...
    def fused(self, input: typing.SupportsInt | typing.SupportsIndex) -> bool:
        ...
    def merged_span(self, gear: typing.SupportsInt | typing.SupportsIndex) -> tuple[int, int]:
        ...
    def nbytes(self, gear: typing.SupportsInt | typing.SupportsIndex, input: typing.SupportsInt | typing.SupportsIndex) -> int:
        ...
    def offset(self, gear: typing.SupportsInt | typing.SupportsIndex, input: typing.SupportsInt | typing.SupportsIndex) -> int:
        ...
    def separate(self, gear: typing.SupportsInt | typing.SupportsIndex) -> list[tuple[int, int]]:
        ...
    @property
    def alignment(self) -> int:
        ...
    @property
    def dims_nbytes(self) -> int:
        ...
    @property
    def gear_count(self) -> int:
        ...
    @property
    def input_count(self) -> int:
        ...
    @property
    def merged(self) -> bool:
        ...
    @property
    def tail_padding(self) -> int:
        ...
    @property
    def total_bytes(self) -> int:
        ...
class GearDispatch:
    """
    Which gear: exact match and the cheapest cover.
    """
    def __init__(self, input_names: collections.abc.Sequence[str], input_shapes: collections.abc.Sequence[collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex]], dynamic_positions: collections.abc.Sequence[collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex]], gears: collections.abc.Sequence[collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex]], costs: collections.abc.Sequence[typing.SupportsFloat | typing.SupportsIndex] | None = None) -> None:
        ...
    def cover(self, values: collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex]) -> int:
        ...
    def cover_many(self, requests: typing.Annotated[numpy.typing.ArrayLike, numpy.int64]) -> numpy.typing.NDArray[numpy.int64]:
        ...
    def elements(self, values: collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex]) -> float:
        ...
    def extract(self, arrays: collections.abc.Sequence) -> tuple:
        ...
    def match(self, values: collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex]) -> int:
        ...
    def nearest(self, values: collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex], k: typing.SupportsInt | typing.SupportsIndex = 5) -> list:
        ...
    def values_from_full_dims(self, full_dims: collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex]) -> tuple:
        ...
    @property
    def costs(self) -> tuple:
        ...
    @property
    def gear_count(self) -> int:
        ...
    @property
    def values_per_gear(self) -> int:
        ...
class ExecutorCore:
    """
    Gear matching and input staging for one executor.
    """
    @staticmethod
    def execute(*args, **kwargs):
        """
        execute(inputs, preset, pad, copy): stage a plain request (a dict of the input names, or a list / tuple in input order, of numpy arrays) and make the gear's direct run. None: not a plain request, nothing staged; (gear, None): staged, the caller runs the gear; (gear, outputs): ran (copies with copy). A direct run's exception comes out as gear_runtime.errors.DirectRunFailed(gear), caused by it.
        """
    def __init__(self, dispatch: typing.Any, input_dtypes: collections.abc.Sequence[typing.Any], layout: Layout, staging: numpy.ndarray) -> None:
        ...
    def set_padding(self, pad_values: collections.abc.Sequence[bytes | None] | None = None) -> None:
        ...
    def set_runs(self, runs: typing.Any) -> None:
        ...
    def set_written(self, buffers: typing.Any) -> None:
        ...
    def stage(self, arrays: collections.abc.Sequence, preset: collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex] | None = None, pad: bool = False) -> int:
        ...
    @property
    def dispatch(self) -> GearDispatch:
        ...
    @property
    def gear_count(self) -> int:
        ...
    @property
    def in_place_bytes(self) -> int:
        ...
    @in_place_bytes.setter
    def in_place_bytes(self, arg1: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def last_in_place(self) -> tuple:
        ...
    @property
    def last_request(self) -> tuple:
        ...
    @property
    def last_values(self) -> tuple:
        ...
    @property
    def layout(self) -> Layout:
        ...
    @property
    def values_per_gear(self) -> int:
        ...
def plan_layout(input_nbytes: collections.abc.Sequence[collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex]], dims_count: typing.SupportsInt | typing.SupportsIndex, fusion_size: typing.SupportsInt | typing.SupportsIndex = 131072, alignment: typing.SupportsInt | typing.SupportsIndex = 64, tail_padding: typing.SupportsInt | typing.SupportsIndex = 0) -> Layout:
    """
    Plan the staging layout of every gear (rules: csrc/layout.h).
    """
DEFAULT_ALIGNMENT: int = 64
DEFAULT_FUSION_SIZE: int = 131072
MAX_FUSION_SIZE: int = 33554432
