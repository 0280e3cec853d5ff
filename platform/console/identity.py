"""Who is asking, as route dependencies: `Who` for every page, `Operator` for every change (the
operator role, a same-origin request and its CSRF token). The rules themselves are access.py's."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Form, Request

from stalwart.console.access import AccessError, Gate, Identity, same_origin


def headers_of(request: Request) -> dict[str, str]:
    return {k.lower(): v for k, v in request.headers.items()}


def identity(request: Request) -> Identity:
    """Who is asking (AccessError when nobody is identified); kept on the request for the page."""
    gate: Gate = request.app.state.gate
    who = gate.identify(headers_of(request), dict(request.cookies), request.client.host if request.client else None)
    request.state.identity = who
    return who


Who = Annotated[Identity, Depends(identity)]


def operator(request: Request, who: Who, csrf: Annotated[str | None, Form()] = None) -> Identity:
    """An operator, in a request that a page of another site could not have made."""
    gate: Gate = request.app.state.gate
    if not who.can_act:
        raise AccessError(403, f"{who.user} may view but not act: ask for the operator role")
    if who.via != "token":  # a browser never adds the Authorization header by itself: no CSRF possible
        if not same_origin(headers_of(request), request.headers.get("host", "")):
            raise AccessError(403, "cross-site request refused")
        gate.check_csrf(who, csrf)
    return who


Operator = Annotated[Identity, Depends(operator)]
