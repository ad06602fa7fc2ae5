"""Who may change things through the UI and API (silences now; acknowledge, resolve with #9).

The model of issue #9, as far as this issue needs it:
- with `ui.token` set (inline, `token_file` or `token_env`), every change needs it: the API as
  `Authorization: Bearer <token>`, a browser form as its `token` field (until #9's login);
- without a token, changes are accepted only from loopback clients (the agent binds loopback
  by default, so that is whoever can run commands on the node);
- forms carry a CSRF token that only a page served by this agent knows, and a cross-site
  `Origin` is refused: a page elsewhere cannot make a browser on the node create a silence.
JSON endpoints need `Content-Type: application/json` (FastAPI refuses others), which a
cross-site form cannot send without a CORS preflight this app never grants.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import secrets
from collections.abc import Callable
from urllib.parse import urlsplit

from fastapi import HTTPException, Request


class ChangeGuard:
    def __init__(self, token: Callable[[], str | None]) -> None:
        self._token = token  # re-read on each change: a rotated secret file is picked up
        self._key = secrets.token_bytes(32)

    def csrf(self) -> str:
        return hmac.new(self._key, b"sloguard-forms", hashlib.sha256).hexdigest()

    def api(self, request: Request) -> None:
        """A FastAPI dependency for JSON endpoints that change state."""
        token = self._configured()
        if token is None:
            self._loopback_only(request)
            return
        given = request.headers.get("authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
            raise HTTPException(401, "this change needs the UI token: Authorization: Bearer "
                                     "<ui.token>", headers={"WWW-Authenticate": "Bearer"})

    def form(self, request: Request, fields: dict[str, str]) -> None:
        origin = request.headers.get("origin")
        if origin and origin != "null" and urlsplit(origin).netloc != request.url.netloc:
            raise HTTPException(403, "cross-site form submission refused")
        if not hmac.compare_digest(fields.get("csrf", "").encode(), self.csrf().encode()):
            raise HTTPException(403, "the form is stale or was not served by this agent: "
                                     "reload the page")
        token = self._configured()
        if token is None:
            self._loopback_only(request)
        elif not hmac.compare_digest(fields.get("token", "").encode(), token.encode()):
            raise HTTPException(401, "this change needs the UI token (ui.token)")

    def _configured(self) -> str | None:
        from sloguard.config import SecretUnavailable

        try:
            return self._token()
        except SecretUnavailable as exc:
            raise HTTPException(503, f"the UI token cannot be read: {exc}") from None

    @staticmethod
    def _loopback_only(request: Request) -> None:
        host = request.client.host if request.client else ""
        try:
            loopback = ipaddress.ip_address(host).is_loopback
        except ValueError:
            loopback = host == "localhost"
        if not loopback:
            raise HTTPException(403, "changes from other hosts need a token: set ui.token "
                                     "(or ui.token_file) on the agent")
