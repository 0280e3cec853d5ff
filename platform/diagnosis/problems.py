"""The diagnosis service's answer to a request it cannot use: a status and a JSON body whose message
names the offending fields (never more than a few of the values sent)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

MAX_NAMED = 10
MAX_LISTED = 50


def _field(loc: Sequence[Any]) -> str:
    parts = [str(p)[:64] for p in loc if p != "body"]
    return ".".join(parts) or "body"


def validation_problem(errors: Sequence[Any], what: str = "evidence bundle") -> tuple[int, dict[str, Any]]:
    """(400, ...) for a body that is not JSON; (422, ...) naming the fields of one that does not validate.

    `errors` are pydantic's (or FastAPI's) error dicts."""
    invalid_json = [e for e in errors if e.get("type") == "json_invalid"]
    if invalid_json:
        where = str((invalid_json[0].get("ctx") or {}).get("error", ""))[:200]
        return 400, {"detail": f"request body is not valid JSON: {where}".rstrip(": ")}
    parts = [f"{_field(e.get('loc', ()))}: {str(e.get('msg', 'invalid'))[:300]}" for e in errors[:MAX_NAMED]]
    more = f" (and {len(errors) - MAX_NAMED} more)" if len(errors) > MAX_NAMED else ""
    return 422, {
        "detail": f"invalid {what}: " + "; ".join(parts) + more,
        "errors": [
            {
                "loc": [str(x)[:64] for x in e.get("loc", ())],
                "msg": str(e.get("msg", ""))[:300],
                "type": str(e.get("type", "")),
            }
            for e in errors[:MAX_LISTED]
        ],
    }
