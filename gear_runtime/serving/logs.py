"""The server's log lines: ``serve --log-format json`` (one JSON object per line, what log
collectors parse without a pattern) and the access log (``serve --access-log``: one line
per answered request).

A JSON line holds ``time`` (ISO 8601, UTC, milliseconds), ``level``, ``logger``,
``message``, every extra field of the record (``logger.info(..., extra={...})``: an access
line's ``method``, ``path``, ``status``, ``seconds``, ``model``) and, for a record with a
traceback, ``exception`` (the traceback as one string: the line stays one line).
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import datetime, timezone
from typing import Any

#: The logger of the access log: one INFO line per answered request.
ACCESS_LOGGER = "gear_runtime.access"
#: The text format of every line (``--log-format text``, the default).
TEXT_FORMAT = "%(asctime)s %(name)s %(levelname)s: %(message)s"
#: The attributes every LogRecord has: what is not among them is an extra field.
_RECORD_FIELDS = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {
    "message", "asctime", "taskName"}

access_logger = logging.getLogger(ACCESS_LOGGER)


class JsonFormatter(logging.Formatter):
    """Each record as one line of JSON (module docstring); a value JSON cannot hold is
    written as its ``str``."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, timezone.utc)
            .isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname, "logger": record.name,
            "message": record.getMessage()}
        doc.update((k, v) for k, v in vars(record).items()
                   if k not in _RECORD_FIELDS and not k.startswith("_"))
        if record.exc_info:
            doc["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            doc["stack"] = self.formatStack(record.stack_info)
        return json.dumps(doc, default=str)


def configure(level: str, log_format: str = "text", access_log: bool = False) -> None:
    """Log to stderr at ``level`` ("warning", "info", ...) as ``log_format`` ("text" or
    "json"); with ``access_log`` the access lines are written whatever the level (they are
    asked for by name). As ``logging.basicConfig``, a root logger that has handlers already
    (a program serving in its own process, a test runner) is left as it is."""
    if log_format not in ("text", "json"):
        raise ValueError(f"log format {log_format!r}: expected 'text' or 'json'")
    # a logger's own level decides; the root's handler then writes what reaches it
    access_logger.setLevel(logging.INFO if access_log else logging.NOTSET)
    root = logging.getLogger()
    if root.handlers:
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format == "json"
                         else logging.Formatter(TEXT_FORMAT))
    root.addHandler(handler)
    root.setLevel(level.upper())


def log_access(method: str, path: str, status: int, seconds: float, model: str) -> None:
    """One access line: ``POST /v2/models/m/infer 200 0.001234 s model=m``, its parts as
    the record's extra fields."""
    access_logger.info("%s %s %d %.6f s model=%s", method, path, status, seconds, model,
                       extra={"method": method, "path": path, "status": status,
                              "seconds": round(seconds, 6), "model": model})


__all__ = ["ACCESS_LOGGER", "JsonFormatter", "configure", "log_access"]
