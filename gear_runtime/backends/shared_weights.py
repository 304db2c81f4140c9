"""Weights held once across two models on ONNX Runtime: ``load(b, share_weights_with=a)``.

A prefill and its decode are two graphs over the same weights (two exports, often with
other initializer names). ORT's Python API shares memory between sessions one way only:
``SessionOptions.add_initializer(name, OrtValue)`` makes a session use the caller's
OrtValue instead of a copy of its own. So the first model's weights become OrtValues that
gear_runtime holds (:class:`WeightStore`: one copy, read from its file once) and its session
is rebuilt over them; the second model's initializers that are EQUAL to one of them -- same
dtype, shape and bytes, found by a SHA-256 digest, never by name -- get that OrtValue too.

Both sessions run with ORT's weight prepacking off: a session prepacks a shared weight into
a private copy (measured: close to a second copy of the weights; docs/benchmarks.md,
"Figures behind choices in the code"), which would undo the sharing; the
decode step measured no slower for it (``benchmarks/bench_generate.py`` shows both).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

#: Initializers below this size are left to each session (constants, shapes): sharing them
#: saves nothing and ORT folds many of them.
MIN_SHARED_BYTES = 1024

#: ORT's session config key that turns weight prepacking off.
DISABLE_PREPACKING_KEY = "session.disable_prepacking"

Key = tuple[str, tuple[int, ...], bytes]


def tensor_key(array: np.ndarray) -> Key:
    """What makes two weights the same: dtype, shape and a digest of the bytes."""
    data = np.ascontiguousarray(array)
    return data.dtype.str, tuple(data.shape), hashlib.sha256(data.data.cast("B")).digest()


@dataclass
class WeightStore:
    """One model's weights as OrtValues over arrays it owns; ``by_key`` finds them by
    :func:`tensor_key`, ``by_name`` by the owner's initializer names."""

    by_name: dict[str, Any] = field(default_factory=dict)
    by_key: dict[Key, Any] = field(default_factory=dict)
    nbytes: int = 0
    _arrays: list[np.ndarray] = field(default_factory=list)  # what the OrtValues point into

    @classmethod
    def from_arrays(cls, arrays: Iterable[tuple[str, np.ndarray]]) -> WeightStore:
        import onnxruntime as ort

        store = cls()
        for name, array in arrays:
            array = np.ascontiguousarray(array)
            key = tensor_key(array)
            value = store.by_key.get(key)
            if value is None:  # equal weights inside one model are held once too
                value = ort.OrtValue.ortvalue_from_numpy(array)
                store.by_key[key] = value
                store._arrays.append(array)
                store.nbytes += array.nbytes
            store.by_name[name] = value
        return store


@dataclass(frozen=True)
class SharedWeights:
    """What a model took from another: initializer name -> OrtValue, and the count."""

    values: Mapping[str, Any]
    nbytes: int

    @property
    def count(self) -> int:
        return len(self.values)


def match(store: WeightStore, arrays: Iterable[tuple[str, np.ndarray]]) -> SharedWeights:
    """The initializers of ``arrays`` equal to one held in ``store``, each with its
    OrtValue."""
    values, nbytes = {}, 0
    for name, array in arrays:
        value = store.by_key.get(tensor_key(array))
        if value is not None:
            values[name] = value
            nbytes += array.nbytes
    return SharedWeights(values, nbytes)


def weight_arrays(gear_file: Any, names: Iterable[str]) -> Iterable[tuple[str, np.ndarray]]:
    """``(name, array)`` of each weight ``names`` holds of at least :data:`MIN_SHARED_BYTES`
    (read from the data file for an external one; each array its own memory)."""
    for name in names:
        if name not in gear_file.weights:
            continue
        array = gear_file.weight_array(name)
        if array.nbytes >= MIN_SHARED_BYTES:
            yield name, np.array(array, copy=not array.flags.owndata)


def add_to_options(options: Any, values: Mapping[str, Any]) -> None:
    """Make a session built with ``options`` use ``values`` (name -> OrtValue)."""
    for name, value in values.items():
        options.add_initializer(name, value)
    if values:
        options.add_session_config_entry(DISABLE_PREPACKING_KEY, "1")
