"""Signing in with a token (a session cookie) and signing out."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Form, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from stalwart.console.access import SESSION_COOKIE, SESSION_SECONDS, AccessError, same_origin
from stalwart.console.context import Ctx
from stalwart.console.identity import Who, headers_of

router = APIRouter()


@router.get("/login")
def login_form(request: Request, ctx: Ctx) -> HTMLResponse:
    return ctx.pages.page(request, "login.html", {"failed": False})


@router.post("/login")
def login(request: Request, ctx: Ctx, token: Annotated[str, Form(max_length=4096)]) -> Response:
    if not same_origin(headers_of(request), request.headers.get("host", "")):
        raise AccessError(403, "cross-site request refused")
    holder = ctx.gate.token_holder(token)
    if holder is None:
        return ctx.pages.page(request, "login.html", {"failed": True}, status=401)
    response = RedirectResponse(f"{request.scope.get('root_path', '')}/jobs", status_code=303)
    response.set_cookie(
        SESSION_COOKIE,
        ctx.gate.session_for(holder),
        max_age=SESSION_SECONDS,
        httponly=True,
        samesite="strict",
        secure=ctx.config.secure_cookies,
        path="/",
    )
    return response


@router.post("/logout")
def logout(request: Request, who: Who, ctx: Ctx, csrf: Annotated[str | None, Form()] = None) -> Response:
    ctx.gate.check_csrf(who, csrf)
    response = RedirectResponse(f"{request.scope.get('root_path', '')}/login", status_code=303)
    response.delete_cookie(SESSION_COOKIE, path="/")
    return response
