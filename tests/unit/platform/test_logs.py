"""Log lines: one JSON object each, through python-json-logger, with an ISO 8601 time that carries
the zone and milliseconds, the bound context, and the exception."""

from __future__ import annotations

import datetime as dt
import io
import json
import logging
from collections.abc import Iterator

import pytest
from pythonjsonlogger.json import JsonFormatter as LibraryJsonFormatter

from stalwart import logs


@pytest.fixture
def stream() -> Iterator[io.StringIO]:
    root = logging.getLogger()
    saved = (root.handlers[:], root.level)
    out = io.StringIO()
    logs.configure("INFO", stream=out)
    yield out
    root.handlers[:], root.level = saved


def lines(stream: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_a_line_has_an_iso_8601_time_with_zone_and_milliseconds(stream: io.StringIO) -> None:
    logs.get_logger("stalwart.test", job="j1").bind(node="node-2").info("started", fields={"rank": 3})
    [line] = lines(stream)
    parsed = dt.datetime.fromisoformat(str(line["time"]).replace("Z", "+00:00"))
    assert parsed.utcoffset() == dt.timedelta(0)  # a zone, and it is UTC
    assert str(line["time"]).endswith("Z") and len(str(line["time"]).split(".")[1]) == len("123Z")
    # Both at millisecond resolution, one rounded and one cut: they may differ by one millisecond.
    assert abs(parsed.timestamp() - float(line["ts"])) < 0.0015  # type: ignore[arg-type]
    assert {k: line[k] for k in ("level", "logger", "msg", "job", "node", "rank")} == {
        "level": "info",
        "logger": "stalwart.test",
        "msg": "started",
        "job": "j1",
        "node": "node-2",
        "rank": 3,
    }


def test_the_milliseconds_and_the_zone_are_exact() -> None:
    assert logs.iso_time(0.0) == "1970-01-01T00:00:00.000Z"
    midnight = dt.datetime(2026, 11, 29, tzinfo=dt.timezone.utc).timestamp()  # noqa: UP017
    assert logs.iso_time(midnight + 0.5) == "2026-11-29T00:00:00.500Z"
    assert logs.iso_time(midnight + 0.0004) == "2026-11-29T00:00:00.000Z"


def test_exceptions_and_values_json_cannot_hold_are_logged(stream: io.StringIO) -> None:
    log = logs.get_logger("stalwart.test")
    try:
        raise ValueError("bad shard")
    except ValueError:
        log.exception("load failed", fields={"path": object()})
    [line] = lines(stream)
    assert "ValueError: bad shard" in str(line["exc"]) and str(line["path"]).startswith("<object")


def test_the_formatter_is_python_json_loggers() -> None:
    assert isinstance(logs.JsonFormatter(), LibraryJsonFormatter)
