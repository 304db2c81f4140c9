"""Trace files: the requests a service saw, one per line (``gear-runtime plan --trace``).

A line holds one request, in any of these forms (blank lines are skipped, and a first line
that is not a request is taken for a CSV header):

* values separated by commas, ``79`` or ``79,16``: one value per DISTINCT dynamic length
  (the dynamic axes of ``--input-shape`` that share a symbolic dim name in the source model
  move together and take one value: a Hugging Face prefill whose input_ids, attention_mask
  and position_ids are all ``[1, sequence_length]`` takes ``79``), or one value per dynamic
  axis of ``--input-shape`` in its order (``79,79,79``: GE's dims order);
* the same as JSON: ``79``, ``[79, 16]``, ``{"dims": [79, 79, 79]}``;
* named, as JSON: ``{"sequence_length": 79}``, with the source model's symbolic dim names.

Every value is an integer from 1 to 2147483647 (GE's gear values are int32); every line has
the same width. A line that is not one of these forms is an ``InputError`` naming the file,
the line and the expected form. Lines are read with a bounded length and JSON nesting, so a
hostile file costs bounded time and memory.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gear_runtime.errors import InputError
from gear_runtime.spec import GearSpec
from gear_runtime.spec.rules import MAX_GEAR_VALUE

#: The longest line read (a request is a few numbers; a named one a few names).
MAX_LINE_CHARS = 4096
#: The most requests a trace may hold (about 100 MB of Python tuples; sample a bigger one).
MAX_REQUESTS = 2_000_000


@dataclass(frozen=True)
class TraceLayout:
    """How a line's values map onto the spec's dynamic values (GE's dims order).

    ``width``: dynamic values of the spec; ``groups``: the dynamic values that move
    together (one symbolic dim name), in order of first appearance; ``names``: each group's
    symbolic name (None when the axis has none); ``labels``: each dynamic value's
    ``input[axis]``.
    """

    width: int
    groups: tuple[tuple[int, ...], ...]
    names: tuple[str | None, ...]
    labels: tuple[str, ...]

    @classmethod
    def untied(cls, width: int) -> TraceLayout:
        """Every dynamic value on its own (no model to tie them)."""
        return cls(width, tuple((v,) for v in range(width)), (None,) * width,
                   tuple(f"value {v}" for v in range(width)))

    def expand(self, values: Sequence[int]) -> tuple[int, ...]:
        """A full request (one value per dynamic value) from one value per group."""
        out = [0] * self.width
        for group, value in zip(self.groups, values, strict=True):
            for v in group:
                out[v] = value
        return tuple(out)

    def widen(self, values: Sequence[int]) -> tuple[int, ...] | None:
        """``values`` as a full request: given per group or per dynamic value; None when it
        has neither width."""
        if len(values) == self.width:
            return tuple(values)
        if len(values) == len(self.groups):
            return self.expand(values)
        return None

    def group_label(self, g: int) -> str:
        name = self.names[g]
        return name if name is not None else self.labels[self.groups[g][0]]

    def form(self) -> str:
        """The forms a line may take, for error messages."""
        grouped = ", ".join(self.group_label(g) for g in range(len(self.groups)))
        per_group = f"{len(self.groups)} value{'s' if len(self.groups) > 1 else ''} ({grouped})"
        forms = [per_group]
        if self.width != len(self.groups):
            forms.append(f"{self.width} values ({', '.join(self.labels)})")
        text = " or ".join(forms) + " separated by ','"
        named = [n for n in self.names if n is not None]
        if len(named) == len(self.names):
            example = ", ".join(f'"{n}": 79' for n in named)
            text += f", or JSON {{{example}}}"
        return text


def layout_of(spec: GearSpec, model: Any = None) -> TraceLayout:
    """The trace layout of ``spec``'s dynamic values, tied by the symbolic dim names of
    ``model`` (a path to the dynamic ONNX model or an onnx.ModelProto; its weights are not
    read). Without a model every dynamic value is its own."""
    labels = [""] * spec.values_per_gear
    for i, axis, v in spec.dynamic_positions:
        labels[v] = labels[v] or f"{spec.input_names[i]}[{axis}]"
    if model is None:
        return TraceLayout(spec.values_per_gear, tuple((v,) for v in range(len(labels))),
                           (None,) * len(labels), tuple(labels))
    names = _dim_names(spec, model)
    groups: list[list[int]] = []
    group_names: list[str | None] = []
    for v in range(spec.values_per_gear):
        name = names.get(v)
        if name is not None and name in group_names:
            groups[group_names.index(name)].append(v)
        else:
            groups.append([v])
            group_names.append(name)
    return TraceLayout(spec.values_per_gear, tuple(tuple(g) for g in groups),
                       tuple(group_names), tuple(labels))


def _dim_names(spec: GearSpec, model: Any) -> dict[int, str]:
    """Dynamic value index -> the symbolic dim name of its axis in ``model`` (when every
    axis of that value has the same one)."""
    import onnx

    proto = model if isinstance(model, onnx.ModelProto) else onnx.load(
        os.fspath(model), load_external_data=False)
    inputs = {i.name: i for i in proto.graph.input}
    found: dict[int, set[str | None]] = {}
    for i, axis, v in spec.dynamic_positions:
        name = spec.input_names[i]
        if name not in inputs:
            raise InputError(f"--input-shape names input {name!r}; the model's inputs are "
                             f"{', '.join(inputs) or 'none'}")
        dims = inputs[name].type.tensor_type.shape.dim
        param = dims[axis].dim_param if axis < len(dims) and dims[axis].dim_param else None
        found.setdefault(v, set()).add(param)
    return {v: name for v, s in found.items() if len(s) == 1 for name in s if name is not None}


def read_trace(path: str | os.PathLike[str], layout: TraceLayout | None = None
               ) -> list[tuple[int, ...]]:
    """The requests of a trace file as full value tuples (see the module doc for the
    forms). ``layout``: how lines map onto a spec's dynamic values (:func:`layout_of`);
    without one, lines are taken as they are and must all have the same width."""
    where = os.fspath(path)
    out: list[tuple[int, ...]] = []
    with open(where, encoding="utf-8", errors="replace") as f:
        n = 0
        while True:
            line = f.readline(MAX_LINE_CHARS + 1)
            if not line:
                break
            n += 1
            if len(line) > MAX_LINE_CHARS and not line.endswith("\n"):
                raise InputError(f"{where} line {n}: longer than {MAX_LINE_CHARS} characters; "
                                 f"a line holds one request: {_form(layout)}")
            text = line.strip()
            if not text:
                continue
            try:
                request = _parse(text, layout)
            except _BadLine as exc:
                if n == 1 and text[0].isalpha():
                    continue  # a CSV header
                raise InputError(f"{where} line {n}: {exc}; expected {_form(layout)}") from None
            if out and len(request) != len(out[0]):
                raise InputError(f"{where} line {n}: {len(request)} values where line 1 "
                                 f"has {len(out[0])}; every line holds one request of the "
                                 "same width")
            out.append(request)
            if len(out) > MAX_REQUESTS:
                raise InputError(f"{where}: more than {MAX_REQUESTS:,} requests; plan on a "
                                 "sample of the trace")
    if not out:
        raise InputError(f"{where} holds no requests; expected one per line: {_form(layout)}")
    return out


class _BadLine(Exception):
    """What is wrong with one line (the caller adds the file, the line and the form)."""


def _form(layout: TraceLayout | None) -> str:
    return layout.form() if layout is not None else "integers separated by ','"


def _parse(text: str, layout: TraceLayout | None) -> tuple[int, ...]:
    if text[0] in "[{" or text[0] == '"':
        item = _json(text)
        if isinstance(item, dict):
            values = _from_object(item, layout)
        elif isinstance(item, list):
            values = [_value(v) for v in item]
        else:
            values = [_value(item)]
    else:
        values = [_value(_number(t)) for t in text.split(",")]
    if not values:
        raise _BadLine("no values")
    if layout is None:
        return tuple(values)
    request = layout.widen(values)
    if request is None:
        raise _BadLine(f"{len(values)} value{'s' if len(values) != 1 else ''}")
    return request


def _json(text: str) -> Any:
    # json.loads recurses once per nesting level: a deeply nested line is refused before it
    # is parsed (a request is at most one list or object deep).
    depth = 0
    for ch in text:
        if ch in "[{":
            depth += 1
            if depth > 2:
                raise _BadLine("nested deeper than a request")
        elif ch in "]}":
            depth -= 1
    try:
        return json.loads(text, parse_constant=_constant)
    except (ValueError, RecursionError) as exc:
        raise _BadLine(f"not JSON ({exc})") from None


def _constant(name: str) -> Any:
    raise _BadLine(f"{name} is not a request value")


def _from_object(item: dict[str, Any], layout: TraceLayout | None) -> list[int]:
    if "dims" in item and len(item) == 1:
        dims = item["dims"]
        if not isinstance(dims, list):
            raise _BadLine('"dims" must be a list of integers')
        return [_value(v) for v in dims]
    names = [] if layout is None else [n for n in layout.names if n is not None]
    if layout is None or len(names) != len(layout.names):
        raise _BadLine('a JSON object needs "dims" (the model\'s dynamic axes are not all '
                       "named)" if layout is not None else 'a JSON object needs "dims"')
    if set(item) != set(names):
        extra, missing = sorted(set(item) - set(names)), [n for n in names if n not in item]
        raise _BadLine("named values " + "; ".join(
            p for p in (f"unknown {', '.join(map(repr, extra))}" if extra else "",
                        f"missing {', '.join(map(repr, missing))}" if missing else "") if p))
    return [_value(item[n]) for n in names]


def _number(token: str) -> Any:
    token = token.strip()
    try:
        return int(token)
    except ValueError:
        pass
    try:
        return float(token)
    except ValueError:
        raise _BadLine(f"{token[:40]!r} is not a number") from None


def _value(v: Any) -> int:
    """One request value: an integer (or an integral float) from 1 to MAX_GEAR_VALUE."""
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise _BadLine(f"{json.dumps(v)[:40]} is not an integer")
    if isinstance(v, float):
        if not math.isfinite(v) or v != int(v):
            raise _BadLine(f"{v!r} is not an integer")
        v = int(v)
    if not 1 <= v <= MAX_GEAR_VALUE:
        raise _BadLine(f"{v} is out of range (a request value is from 1 to {MAX_GEAR_VALUE})")
    return v
