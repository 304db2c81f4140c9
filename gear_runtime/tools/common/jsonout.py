"""The one convention of every machine-readable output (``--json PATH|-`` on inspect, run,
bench, plan, check-padding): a JSON object whose first key ``schema`` is
``gear-runtime-<kind>/<version>`` (the version grows when a field changes meaning or goes
away; new fields may appear without it), written to a file or, for ``-``, to stdout alone
(the command then prints no text, so that the output parses). The fields of each kind are
documented in docs/json.md."""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gear_runtime import arguments
from gear_runtime.errors import InputError

#: ``--json -``: the document goes to stdout.
STDOUT = "-"


def schema_name(kind: str, version: int) -> str:
    """``gear-runtime-<kind>/<version>``, the value of every document's ``schema`` key."""
    return f"gear-runtime-{kind}/{version}"


def document(kind: str, version: int, body: Mapping[str, Any]) -> dict[str, Any]:
    """``{"schema": schema_name(kind, version), **body}``."""
    return {"schema": schema_name(kind, version), **body}


def check_target(target: str, flag: str = "--json") -> None:
    """InputError naming ``flag`` now (before any work) when ``target`` cannot be written as a
    file (:func:`gear_runtime.arguments.output_file`). ``-`` is always fine."""
    if target != STDOUT:
        arguments.output_file(flag, target, hint=", or - for stdout")


def write(target: str, doc: Mapping[str, Any], flag: str = "--json") -> str | None:
    """Write ``doc`` to ``target`` (a path, or ``-`` for stdout) as strict JSON (a NaN or an
    infinity becomes null: other tools' parsers refuse them); the path written, or None for
    stdout. InputError naming ``flag`` when the file cannot be written."""
    text = json.dumps(_finite(doc), indent=2, allow_nan=False) + "\n"
    if target == STDOUT:
        sys.stdout.write(text)
        sys.stdout.flush()
        return None
    try:
        Path(target).write_text(text, encoding="utf-8")
    except OSError as exc:
        raise InputError(f"{flag} {target!r} cannot be written: {exc.strerror or exc}") from None
    return target


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {str(k): _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


__all__ = ["STDOUT", "check_target", "document", "schema_name", "write"]
