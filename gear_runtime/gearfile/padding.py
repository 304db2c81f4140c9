"""The padding verdict a gear file records (:data:`META_PADDING`): is ``execute(pad=True)``
exact for this model?

``check-padding --record`` (``check_padding(record=True)``, ``compile(check_padding=...)``)
measures it (:mod:`gear_runtime.tools.check.padding`) and writes it here; the runtime reads
it at load (``GearModel.pad_safe``) and never pads a model recorded UNSAFE (a prefill whose
recurrent state a pad position still decays): it refuses the request instead
(:class:`~gear_runtime.errors.PaddingUnsafeError`). A declaration ``load(pad_safe=...)`` /
``create_executor(pad_safe=...)`` overrides the record.

The value is JSON, schema ``"gear-runtime-padding-verdict/1"``::

    {"schema": "gear-runtime-padding-verdict/1", "safe": false,
     "valid": {"present_kv": 4}, "ignored": [], "pad_values": {"attention_mask": 0},
     "rtol": 0.0001, "atol": 1e-05, "samples": 6, "unsafe_outputs": ["state"]}

Writing it edits the gear file's metadata: the file is resealed (its integrity digest
recomputed, the data files' digests kept: :func:`gear_runtime.gearfile.digest.reseal`) and
replaced atomically.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import onnx

from gear_runtime.errors import GearFileError
from gear_runtime.gearfile.digest import reseal
from gear_runtime.gearfile.format import META_DIGEST, META_FORMAT

#: The metadata key of the verdict.
META_PADDING = "gear_runtime.padding_verdict"
SCHEMA = "gear-runtime-padding-verdict/1"


@dataclass(frozen=True)
class PaddingVerdict:
    """What check-padding found, as recorded: SAFE or UNSAFE, and how it compared."""

    safe: bool
    #: output -> axis compared over the request's length only (``--valid``)
    valid: Mapping[str, int] = field(default_factory=dict)
    ignored: tuple[str, ...] = ()
    pad_values: Mapping[str, Any] = field(default_factory=dict)
    rtol: float = 1e-4
    atol: float = 1e-5
    samples: int = 0
    unsafe_outputs: tuple[str, ...] = ()

    @property
    def word(self) -> str:
        return "SAFE" if self.safe else "UNSAFE"

    def describe(self) -> str:
        """One phrase: ``UNSAFE (check-padding: outputs state differ)``."""
        how = [f"--valid {n}:{a}" for n, a in sorted(self.valid.items())]
        how += [f"--ignore-output {n}" for n in self.ignored]
        what = (f"output(s) {', '.join(self.unsafe_outputs)} change with padding"
                if self.unsafe_outputs else f"{self.samples} request size(s) agree")
        return (f"{self.word} (recorded by check-padding: {what}"
                f"{'; compared with ' + ' '.join(how) if how else ''})")

    def to_json(self) -> str:
        return json.dumps({"schema": SCHEMA, "safe": self.safe,
                           "valid": {n: int(a) for n, a in sorted(self.valid.items())},
                           "ignored": list(self.ignored),
                           "pad_values": {n: _plain(v) for n, v in self.pad_values.items()},
                           "rtol": self.rtol, "atol": self.atol, "samples": self.samples,
                           "unsafe_outputs": list(self.unsafe_outputs)},
                          separators=(",", ":"))


def _plain(value: Any) -> Any:
    return value.item() if hasattr(value, "item") else value


def verdict_from_json(text: str) -> PaddingVerdict:
    """Inverse of :meth:`PaddingVerdict.to_json`; ValueError naming what is wrong."""
    try:
        d = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise ValueError(f"not JSON ({exc})") from None
    if not isinstance(d, dict) or d.get("schema") != SCHEMA:
        raise ValueError(f"not a {SCHEMA!r} record")
    safe, valid, ignored = d.get("safe"), d.get("valid", {}), d.get("ignored", [])
    unsafe = d.get("unsafe_outputs", [])
    if not isinstance(safe, bool):
        raise ValueError(f"'safe' must be true or false, got {safe!r}")
    if not (isinstance(valid, dict) and all(type(a) is int for a in valid.values())):
        raise ValueError("'valid' must map output names to axes")
    for key, items in (("ignored", ignored), ("unsafe_outputs", unsafe)):
        if not (isinstance(items, list) and all(isinstance(n, str) for n in items)):
            raise ValueError(f"{key!r} must be a list of output names")
    pads = d.get("pad_values", {})
    if not isinstance(pads, dict):
        raise ValueError("'pad_values' must be an object")
    return PaddingVerdict(safe=safe, valid=valid, ignored=tuple(ignored), pad_values=pads,
                          rtol=float(d.get("rtol", 1e-4)), atol=float(d.get("atol", 1e-5)),
                          samples=int(d.get("samples", 0)), unsafe_outputs=tuple(unsafe))


def recorded_verdict(path: str | os.PathLike[str]) -> PaddingVerdict | None:
    """The verdict ``path`` records, read from its metadata alone (weights not loaded, the
    digest not checked: the load does that); None when there is none or the file cannot be
    read here (the load then says why)."""
    try:
        model = onnx.load(os.fspath(path), load_external_data=False)
        meta = {p.key: p.value for p in model.metadata_props}
        return verdict_from_json(meta[META_PADDING]) if META_PADDING in meta else None
    except Exception:  # noqa: BLE001 - not a readable gear file: the load reports it
        return None


def record_verdict(path: str | os.PathLike[str], verdict: PaddingVerdict) -> None:
    """Write ``verdict`` into the gear file ``path`` (replacing any earlier one), resealed
    and replaced atomically. GearFileError for a file with no gear metadata (a static
    model, never padded) or no integrity record."""
    path = os.fspath(path)
    model = onnx.load(path, load_external_data=False)
    meta = {p.key: p.value for p in model.metadata_props}
    if META_FORMAT not in meta or META_DIGEST not in meta:
        raise GearFileError(f"{path!r} is no gear file with an integrity record: a padding "
                            "verdict can only be recorded in a compiled gear file")
    kept = [p for p in model.metadata_props if p.key != META_PADDING]
    del model.metadata_props[:]
    model.metadata_props.extend(kept)
    model.metadata_props.add(key=META_PADDING, value=verdict.to_json())
    try:
        blob = reseal(model)
    except ValueError as exc:
        raise GearFileError(f"{path!r}: cannot reseal it with the verdict ({exc})") from None
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".padding-", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(blob)
        os.chmod(tmp, os.stat(path).st_mode & 0o7777)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def verdict_of(safe: bool, *, valid: Mapping[str, int], ignored: Sequence[str],
               pad_values: Mapping[str, Any], rtol: float, atol: float, samples: int,
               unsafe_outputs: Sequence[str]) -> PaddingVerdict:
    """A verdict from a check's parts."""
    return PaddingVerdict(safe=safe, valid=dict(valid), ignored=tuple(ignored),
                          pad_values=dict(pad_values), rtol=rtol, atol=atol, samples=samples,
                          unsafe_outputs=tuple(unsafe_outputs))
