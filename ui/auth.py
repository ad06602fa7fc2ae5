"""Who may read and who may change: one shared token, as a bearer for the API and a login for
the browser.

- Changes (acknowledge, resolve, silence...) always need the token. Without one configured,
  changes are refused with the reason, never open to anyone who can reach the port.
- Reading needs it too when the agent listens beyond loopback (the config refuses to start
  such an agent without a token); on loopback, reading is open, as for a local tool.
- A browser logs in once with the token and gets a signed session cookie (HttpOnly,
  SameSite=Strict); forms it posts carry a CSRF token bound to that session. The token itself
  never reaches the page, the logs or an error.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from typing import Any

from fastapi import HTTPException, Request

SESSION_COOKIE = "sloguard_session"
CSRF_FIELD = "csrf"


class Auth:
    def __init__(self, settings: Any) -> None:
        self.ui = settings.ui
        host = settings.listen_host_port[0]
        from sloguard.config import _loopback

        self.read_open = _loopback(host)

    def _token(self) -> str | None:
        return self.ui.resolved_token()

    @staticmethod
    def _sign(token: str, message: str) -> str:
        return hmac.new(token.encode(), message.encode(), hashlib.sha256).hexdigest()

    # -- sessions --------------------------------------------------------------------------

    def login(self, offered: str) -> str | None:
        """A session cookie value for the right token, else None."""
        token = self._token()
        if not token or not hmac.compare_digest(offered.encode(), token.encode()):
            return None
        expires = int(time.time() + self.ui.session_hours * 3600)
        return f"{expires}.{self._sign(token, f'session:{expires}')}"

    def session(self, request: Request) -> str | None:
        """The valid session of this request (its cookie value), or None."""
        token = self._token()
        value = request.cookies.get(SESSION_COOKIE, "")
        expires, _, signature = value.partition(".")
        if not token or not expires.isdigit() or int(expires) < time.time():
            return None
        expected = self._sign(token, f"session:{expires}")
        return value if hmac.compare_digest(signature, expected) else None

    def csrf(self, session: str | None) -> str:
        token = self._token()
        return self._sign(token, f"csrf:{session}") if token and session else ""

    # -- checks ----------------------------------------------------------------------------

    def _bearer_ok(self, request: Request) -> bool:
        token = self._token()
        header = request.headers.get("authorization", "")
        scheme, _, offered = header.partition(" ")
        return bool(token) and scheme.lower() == "bearer" and hmac.compare_digest(
            offered.strip().encode(), token.encode())

    def authenticated(self, request: Request) -> bool:
        return self._bearer_ok(request) or self.session(request) is not None

    def require_read(self, request: Request) -> None:
        if self.read_open or self.authenticated(request):
            return
        raise HTTPException(401, "this agent listens beyond loopback: send "
                                 "Authorization: Bearer <ui.token>, or log in at /login",
                            headers={"WWW-Authenticate": "Bearer"})

    def require_change(self, request: Request, form_csrf: str | None = None) -> str:
        """Who is making the change ("api" or "browser"); raises 401/403 otherwise.

        A browser change must carry the CSRF token of its session (`form_csrf`): a cookie
        alone is what a forged cross-site form would send.
        """
        if not self._token():
            raise HTTPException(403, "changes are disabled: set ui.token or ui.token_file "
                                     "(or SLOGUARD_UI__TOKEN) on this agent")
        if self._bearer_ok(request):
            return "api"
        session = self.session(request)
        if session is not None:
            if form_csrf and hmac.compare_digest(form_csrf, self.csrf(session)):
                return "browser"
            raise HTTPException(403, "missing or wrong CSRF token: reload the page and retry")
        raise HTTPException(401, "changes need Authorization: Bearer <ui.token>, or a login",
                            headers={"WWW-Authenticate": "Bearer"})
