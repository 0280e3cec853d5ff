"""Who is asking, and what they may do: viewers read, operators also act.

A request is identified, first match wins, by:
  1. `Authorization: Bearer TOKEN`: a token from the tokens file (stored as its SHA-256, never as is);
  2. the session cookie that /login sets after checking such a token (signed, HttpOnly, SameSite=Strict);
  3. `X-Forwarded-User` / `X-Forwarded-Groups` from an authenticating proxy, believed only when the
     TCP peer is one of the configured trusted proxies (anyone else could send the headers);
  4. the anonymous role, when one is configured (a console on one's own laptop).
Operators are the proxy's users in an operator group, or a token's holder with role operator.

Forms that change something carry a CSRF token: an HMAC of the user and the time it was issued, so
a page of another site, which cannot read our pages, cannot forge one; Origin and Sec-Fetch-Site are
checked too. A request authenticated by its Authorization header needs no CSRF token: a browser never
adds that header on its own.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import ipaddress
import time
from enum import Enum
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

SESSION_COOKIE = "stalwart_session"
SESSION_SECONDS = 12 * 3600
CSRF_SECONDS = 12 * 3600
CLOCK_SKEW_SECONDS = 60  # replicas behind one address sign with one key but their own clocks
USER_HEADER = "x-forwarded-user"
GROUPS_HEADER = "x-forwarded-groups"

IpNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


class Role(str, Enum):
    VIEWER = "viewer"
    OPERATOR = "operator"


class AccessError(Exception):
    """The request is not allowed: `status` is 401 (who are you?) or 403 (not you)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class Identity(BaseModel):
    user: str
    role: Role
    via: Literal["token", "session", "proxy", "anonymous"]

    @property
    def can_act(self) -> bool:
        return self.role is Role.OPERATOR


class TokenHolder(BaseModel):
    model_config = ConfigDict(extra="forbid")

    user: str = Field(min_length=1, max_length=128)
    role: Role
    sha256: str = Field(description="hex SHA-256 of the token (sha256sum of it, without a newline)")

    @field_validator("sha256")
    @classmethod
    def _hex(cls, v: str) -> str:
        v = v.strip().lower()
        if len(v) != 64 or any(c not in "0123456789abcdef" for c in v):
            raise ValueError("must be 64 hex digits (the SHA-256 of the token)")
        return v


class TokensFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tokens: list[TokenHolder] = []


class AccessSettings(BaseModel):
    trusted_proxies: list[IpNetwork] = []
    operator_groups: list[str] = ["stalwart-operators"]
    viewer_groups: list[str] = []  # empty: any user the trusted proxy names may view
    tokens: list[TokenHolder] = []
    anonymous: Role | None = None

    @property
    def configured(self) -> bool:
        return bool(self.trusted_proxies or self.tokens or self.anonymous)


def token_digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def read_tokens(path: Path) -> list[TokenHolder]:
    """The tokens file (YAML: `tokens: [{user, role, sha256}]`); a bad one is an error naming the file."""
    try:
        doc = yaml.safe_load(path.read_text()) or {}
        return TokensFile.model_validate(doc).tokens
    except (OSError, yaml.YAMLError, ValidationError) as exc:
        first = " ".join(str(exc).strip().splitlines()[:3])
        raise ValueError(f"bad tokens file {path}: {first}") from None


class Gate:
    """Identifies requests and signs what the console hands to browsers (sessions, CSRF tokens)."""

    def __init__(self, settings: AccessSettings, secret: bytes) -> None:
        self.settings = settings
        self._secret = secret
        self._by_digest = {t.sha256: t for t in settings.tokens}

    # -- signing ---------------------------------------------------------------------------------
    def _sign(self, text: str) -> str:
        mac = hmac.new(self._secret, text.encode(), hashlib.sha256).digest()
        return base64.urlsafe_b64encode(mac).decode().rstrip("=")

    def _signed(self, purpose: str, fields: list[str], max_age: float, value: str) -> list[str] | None:
        """The fields of a value made by _make(purpose, ...), if its signature holds and it is fresh."""
        parts = value.split("|")
        if len(parts) != len(fields) + 2:
            return None
        *body, issued, sig = parts
        if not hmac.compare_digest(sig, self._sign("|".join([purpose, *body, issued]))):
            return None
        try:
            age = time.time() - float(issued)
        except ValueError:
            return None
        return body if -CLOCK_SKEW_SECONDS <= age <= max_age else None

    def _make(self, purpose: str, body: list[str]) -> str:
        issued = str(int(time.time()))
        return "|".join([*body, issued, self._sign("|".join([purpose, *body, issued]))])

    # -- sessions (a token checked once at /login) --------------------------------------------------
    def token_holder(self, token: str) -> TokenHolder | None:
        holder = self._by_digest.get(token_digest(token.strip()))
        return holder

    def session_for(self, holder: TokenHolder) -> str:
        return self._make("session", [_clean(holder.user), holder.role.value])

    def _from_session(self, value: str) -> Identity | None:
        body = self._signed("session", ["user", "role"], SESSION_SECONDS, value)
        if body is None:
            return None
        try:
            return Identity(user=body[0], role=Role(body[1]), via="session")
        except ValueError:
            return None

    # -- CSRF ---------------------------------------------------------------------------------------
    def csrf_token(self, identity: Identity) -> str:
        return self._make("csrf", [_clean(identity.user)])

    def check_csrf(self, identity: Identity, token: str | None) -> None:
        body = self._signed("csrf", ["user"], CSRF_SECONDS, token or "")
        if body is None or body[0] != _clean(identity.user):
            raise AccessError(403, "the form's CSRF token is missing, expired or not yours: reload the page and retry")

    # -- who is asking ----------------------------------------------------------------------------
    def identify(self, headers: dict[str, str], cookies: dict[str, str], peer: str | None) -> Identity:
        """`headers` with lower-case names. Raises AccessError(401) when nobody is identified."""
        auth = headers.get("authorization", "")
        if auth:
            scheme, _, token = auth.partition(" ")
            holder = self.token_holder(token) if scheme.lower() == "bearer" and token.strip() else None
            if holder is None:
                raise AccessError(401, "the bearer token is not one the console knows")
            return Identity(user=holder.user, role=holder.role, via="token")
        session = cookies.get(SESSION_COOKIE)
        if session:
            found = self._from_session(session)
            if found is not None:
                return found
        user = headers.get(USER_HEADER, "").strip()
        if user and self._trusted(peer):
            groups = [g.strip() for g in headers.get(GROUPS_HEADER, "").split(",") if g.strip()]
            if any(g in self.settings.operator_groups for g in groups):
                return Identity(user=_clean(user), role=Role.OPERATOR, via="proxy")
            if not self.settings.viewer_groups or any(g in self.settings.viewer_groups for g in groups):
                return Identity(user=_clean(user), role=Role.VIEWER, via="proxy")
            raise AccessError(403, f"{user} is in none of the console's viewer groups")
        if self.settings.anonymous is not None:
            return Identity(user="anonymous", role=self.settings.anonymous, via="anonymous")
        raise AccessError(401, "sign in through the authenticating proxy, or with a token at /login")

    def _trusted(self, peer: str | None) -> bool:
        if not peer or not self.settings.trusted_proxies:
            return False
        try:
            address = ipaddress.ip_address(peer)
        except ValueError:
            return False
        return any(address in net for net in self.settings.trusted_proxies)


def same_origin(headers: dict[str, str], host: str) -> bool:
    """A browser's POST came from our own pages (Sec-Fetch-Site, else Origin against Host)."""
    site = headers.get("sec-fetch-site")
    if site is not None:
        return site in ("same-origin", "none")
    origin = headers.get("origin")
    if origin is None or origin == "null":
        return origin is None  # no Origin: not a browser's cross-site form (those send one)
    return origin.split("://", 1)[-1].rstrip("/") == host


def _clean(user: str) -> str:
    """A user name as shown and signed: printable, no separator, bounded."""
    return "".join(c for c in user if c.isprintable() and c != "|")[:128] or "unknown"
