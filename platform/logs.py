"""Structured logging: one JSON object per line, with the job/node/rank/generation context bound in.

Services log through this; only the CLI prints for humans.
"""

from __future__ import annotations

import datetime as dt
import logging
import sys
from collections.abc import Mapping
from typing import Any

from pythonjsonlogger.json import JsonFormatter as _LibraryJsonFormatter


def iso_time(created: float) -> str:
    """ISO 8601 in UTC with milliseconds and the zone, e.g. 2026-11-29T01:20:00.123Z (what log
    pipelines and people parse without guessing the zone)."""
    utc = dt.timezone.utc  # noqa: UP017 (the worker side runs on 3.10: no datetime.UTC)
    return dt.datetime.fromtimestamp(created, utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class JsonFormatter(_LibraryJsonFormatter):
    """python-json-logger's formatter, with Stalwart's fields: `ts` (epoch seconds), `time` (ISO
    8601, UTC, milliseconds), `level`, `logger`, `msg`, the bound context, and `exc`."""

    def __init__(self) -> None:
        super().__init__(json_default=str)

    def add_fields(self, log_data: dict[str, Any], record: logging.LogRecord, message_dict: dict[str, Any]) -> None:
        log_data.update(
            ts=round(record.created, 3),
            time=iso_time(record.created),
            level=record.levelname.lower(),
            logger=record.name,
            msg=record.getMessage(),
        )
        log_data.update(getattr(record, "context", {}))
        if record.exc_info:
            log_data["exc"] = logging.Formatter.formatException(self, record.exc_info)  # the traceback as one string


class ContextLogger(logging.LoggerAdapter):
    """A logger with bound context; `bind` returns a new one with more."""

    def process(self, msg: Any, kwargs: Any) -> tuple[Any, Any]:
        extra_fields = kwargs.pop("fields", {})
        context = {**(self.extra or {}), **extra_fields}
        kwargs.setdefault("extra", {})["context"] = context
        return msg, kwargs

    def bind(self, **fields: Any) -> ContextLogger:
        return ContextLogger(self.logger, {**(self.extra or {}), **fields})


def get_logger(name: str, **context: Any) -> ContextLogger:
    return ContextLogger(logging.getLogger(name), context)


def configure(level: str = "INFO", stream: Any = None, context: Mapping[str, Any] | None = None) -> None:
    """Route the root logger to JSON lines on `stream` (stderr by default)."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
