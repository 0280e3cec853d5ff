"""ASGI pieces in front of the diagnosis service's routes: a timer of every request, bearer-token
authentication, checked before a byte of the body is read, and the JSON error answer they send."""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable, Collection, MutableMapping, Sequence
from typing import Any

from starlette.routing import BaseRoute, Match

from stalwart.store.credentials import bearer_token, tokens_match

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


async def send_json_error(send: Send, status: int, detail: str, headers: Collection[tuple[bytes, bytes]] = ()) -> None:
    body = json.dumps({"detail": detail}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                *headers,
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


class BearerAuth:
    """Every path but `open_paths` needs `Authorization: Bearer <token>`: 401 without one, 403 with
    a wrong one, compared in constant time. `token` None lets everyone in (`--no-auth`)."""

    def __init__(
        self, app: ASGIApp, token: str | None, open_paths: Collection[str], on_reject: Callable[[int], None]
    ) -> None:
        self.app = app
        self.token = token.encode() if token is not None else None
        self.open_paths = frozenset(open_paths)
        self.on_reject = on_reject

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self.token is None or scope["path"] in self.open_paths:
            await self.app(scope, receive, send)
            return
        header = next((v for k, v in scope["headers"] if k.lower() == b"authorization"), None)
        given = bearer_token(header)
        if given is None:
            self.on_reject(401)
            await send_json_error(
                send,
                401,
                "this service needs a bearer token (Authorization: Bearer <token>)",
                [(b"www-authenticate", b'Bearer realm="stalwart-diagnosis"')],
            )
            return
        if not tokens_match(given, self.token):
            self.on_reject(403)
            await send_json_error(send, 403, "the bearer token is not this service's")
            return
        await self.app(scope, receive, send)


def route_label(routes: Sequence[BaseRoute]) -> Callable[[Scope], str]:
    """RequestTimer's `routes`: the template of the route among `routes` that the request's path and
    method match (the routers' own routes: an app lists an included router as one opaque entry), also
    for a request refused before routing; unknown paths share one label."""

    def label(scope: Scope) -> str:
        for route in routes:
            if route.matches(scope)[0] is Match.FULL:
                return str(getattr(route, "path", "other"))
        return "other"

    return label


class RequestTimer:
    """ASGI middleware, outermost: every request's duration by method, route template and status
    (refusals by authentication included). Unknown paths share one route label: no cardinality blow-up."""

    def __init__(self, app: ASGIApp, routes: Callable[[Scope], str], observe: Callable[[str, str, str, float], None]):
        self.app = app
        self.routes = routes
        self.observe = observe

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        t0 = time.perf_counter()
        status = "500"

        async def send_and_note(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = str(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, send_and_note)
        finally:
            self.observe(scope["method"], self.routes(scope), status, time.perf_counter() - t0)
