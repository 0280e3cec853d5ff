"""Structured logging: one JSON object per line, with the job/node/rank/generation context bound in.

Services log through this; only the CLI prints for humans.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Mapping
from typing import Any


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": round(record.created, 3),
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        entry.update(getattr(record, "context", {}))
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


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
