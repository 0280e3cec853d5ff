"""The job's checkpoint token: what a memory store asks of every caller but its health check.

The agent starts each node's store and the workers with the same per-job token in
STALWART_CHECKPOINT_TOKEN; clients (the memory tier, the standby's mirror, the peers' copies) send
it as `Authorization: Bearer TOKEN`. Never in a URI: URIs end up in logs.
"""

from __future__ import annotations

import os
import secrets

TOKEN_ENV = "STALWART_CHECKPOINT_TOKEN"
TOKEN_HEADER_PREFIX = "Bearer "


def token_from_env() -> str | None:
    return os.environ.get(TOKEN_ENV, "").strip() or None


def new_token() -> str:
    return secrets.token_urlsafe(32)


def auth_headers(token: str | None) -> dict[str, str]:
    return {"Authorization": TOKEN_HEADER_PREFIX + token} if token else {}
