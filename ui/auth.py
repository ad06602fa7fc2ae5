"""Who may read and who may change: one shared token, as a bearer for the API and a login for
the browser.

- Changes (acknowledge, resolve, silence...) always need the token. Without one configured,
  changes are refused with the reason, never open to anyone who can reach the port.
- Reading needs it too when the agent listens beyond loopback (the config refuses to start
  such an agent without a token); on loopback, reading is open, as for a local tool.
- A browser logs in once with the token and gets a signed session cookie (HttpOnly,
  SameSite=Strict, Secure when the UI serves TLS); forms it posts carry a CSRF token bound to
  that session. The token itself never reaches the page, the logs or an error.
- Wrong tokens (a bearer, a login, a forged session cookie) are counted per client address:
  past `ui.auth_failures_per_minute` the client's credentials are refused with 429 until the
  minute has passed, so the token cannot be guessed at network speed, and each refusal is
  logged (once per client and minute, so a flood does not flood the log too).
- On loopback, the Host header must name this machine (or `ui.allowed_hosts`): a web page
  whose DNS name is rebound to 127.0.0.1 would otherwise read the open loopback API from the
  victim's browser.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import logging
import threading
import time
from collections import OrderedDict, deque
from typing import Any
from urllib.parse import quote, urlsplit

from fastapi import HTTPException, Request
from fastapi.responses import JSONResponse, RedirectResponse, Response

SESSION_COOKIE = "sloguard_session"
CSRF_FIELD = "csrf"
MAX_CLIENTS = 10_000  # addresses whose failures are remembered; the stalest are forgotten
WINDOW_S = 60.0
LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost"})

log = logging.getLogger(__name__)


def _same(offered: str, expected: str) -> bool:
    """Constant-time equality that never raises: hmac.compare_digest refuses non-ASCII str,
    and a cookie or form field is whatever the client sent."""
    return hmac.compare_digest(offered.encode("utf-8", "surrogateescape"),
                               expected.encode("utf-8", "surrogateescape"))


def _netloc(url: str) -> str | None:
    try:
        return urlsplit(url).netloc
    except ValueError:  # e.g. "http://[" : not an origin this agent serves
        return None


def client_of(request: Request) -> str:
    return request.client.host if request.client else "unknown"


class FailureLimiter:
    """Failed authentications per client address over the last minute, bounded in memory
    (MAX_CLIENTS addresses, `limit` timestamps each) and O(1) per request."""

    def __init__(self, limit: int, max_clients: int = MAX_CLIENTS) -> None:
        self.limit = limit
        self.max_clients = max_clients
        self._failures: OrderedDict[str, deque[float]] = OrderedDict()
        self._logged: dict[str, str] = {}  # client -> what was logged: failed | blocked
        self._lock = threading.Lock()
        self.refused = 0  # requests refused with 429
        self.failed_total = 0

    def _recent(self, client: str, now: float) -> deque[float] | None:
        times = self._failures.get(client)
        if times is None:
            return None
        while times and times[0] <= now - WINDOW_S:
            times.popleft()
        if not times:
            del self._failures[client]
            self._logged.pop(client, None)
            return None
        return times

    def retry_after(self, client: str, now: float | None = None) -> float:
        """Seconds until `client` may try again (0: it may now)."""
        now = time.monotonic() if now is None else now
        with self._lock:
            times = self._recent(client, now)
            if times is None or len(times) < self.limit:
                return 0.0
            return max(1.0, times[0] + WINDOW_S - now)

    def failed(self, client: str, what: str, path: str) -> None:
        now = time.monotonic()
        with self._lock:
            self.failed_total += 1
            times = self._recent(client, now)
            if times is None:
                times = self._failures[client] = deque(maxlen=self.limit)
                while len(self._failures) > self.max_clients:
                    stale, _ = self._failures.popitem(last=False)
                    self._logged.pop(stale, None)
            self._failures.move_to_end(client)
            times.append(now)
            blocked = len(times) >= self.limit
            said = self._logged.get(client, "")
            log_first, log_block = not said, blocked and said != "blocked"
            self._logged[client] = "blocked" if blocked else "failed"
        if log_first:
            log.warning("authentication failed: %s from %s on %s", what, client, path)
        if log_block:
            log.warning("authentication: %s failed %d times within %gs: its credentials are "
                        "refused (429) until the window has passed", client, self.limit,
                        WINDOW_S)

    def refuse(self, client: str, path: str) -> float:
        """The Retry-After for a client over its limit (counted), else 0."""
        wait = self.retry_after(client)
        if wait:
            with self._lock:
                self.refused += 1
        return wait


def host_allowed(header: str, allowed: frozenset[str]) -> bool:
    """Whether a Host header names a loopback address, a loopback name or an allowed host."""
    host = header.strip().lower()
    if host.startswith("["):
        host = host[1:].partition("]")[0]
    elif host.count(":") == 1:
        host = host.partition(":")[0]
    host = host.rstrip(".")
    if not host:
        return False
    if host in LOOPBACK_NAMES or host in allowed:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class Auth:
    def __init__(self, settings: Any) -> None:
        self.ui = settings.ui
        host = settings.listen_host_port[0]
        from sloguard.core.config import is_loopback

        self.read_open = is_loopback(host)
        self.secure_cookies = bool(getattr(self.ui, "tls_cert_file", None))
        self.allowed_hosts = frozenset(h.lower().rstrip(".")
                                       for h in getattr(self.ui, "allowed_hosts", []) or [])
        # On loopback the Host check is always on (DNS rebinding); beyond it, when listed.
        self.check_host = self.read_open or bool(self.allowed_hosts)
        self.limiter = FailureLimiter(getattr(self.ui, "auth_failures_per_minute", 10))

    def _token(self) -> str | None:
        return self.ui.resolved_token()

    @staticmethod
    def _sign(token: str, message: str) -> str:
        return hmac.new(token.encode(), message.encode(), hashlib.sha256).hexdigest()

    def host_ok(self, request: Request) -> bool:
        if not self.check_host:
            return True
        header = request.headers.get("host")
        return header is None or host_allowed(header, self.allowed_hosts)

    # -- sessions --------------------------------------------------------------------------

    def login(self, offered: str, request: Request | None = None) -> str | None:
        """A session cookie value for the right token, else None (a counted failure)."""
        token = self._token()
        if not token or not _same(offered, token):
            if token and request is not None:
                self.limiter.failed(client_of(request), "wrong token at /login", "/login")
            return None
        expires = int(time.time() + self.ui.session_hours * 3600)
        return f"{expires}.{self._sign(token, f'session:{expires}')}"

    def _session_state(self, request: Request) -> tuple[str | None, bool]:
        """(the valid session value or None, whether the cookie was forged)."""
        token = self._token()
        value = request.cookies.get(SESSION_COOKIE, "")
        if not token or not value:
            return None, False
        expires, _, signature = value.partition(".")
        if not (expires.isascii() and expires.isdigit()) or len(expires) > 12:
            return None, True
        expected = self._sign(token, f"session:{expires}")
        if not _same(signature, expected):
            return None, True
        if int(expires) < time.time():
            return None, False  # a real session that ran out: not an attack
        return value, False

    def session(self, request: Request) -> str | None:
        """The valid session of this request (its cookie value), or None."""
        return self._session_state(request)[0]

    def csrf(self, session: str | None) -> str:
        token = self._token()
        return self._sign(token, f"csrf:{session}") if token and session else ""

    # -- checks ----------------------------------------------------------------------------

    def _bearer(self, request: Request) -> bool | None:
        """True: the right bearer; False: a wrong one; None: none offered."""
        header = request.headers.get("authorization")
        if header is None:
            return None
        token = self._token()
        scheme, _, offered = header.partition(" ")
        if scheme.lower() != "bearer":
            return False
        return bool(token) and _same(offered.strip(), token)

    def authenticated(self, request: Request) -> tuple[str, float]:
        """("bearer" | "session" | "", retry-after): how this request authenticated, once per
        request (the verdict is kept on it, so a failure is counted once). A client over its
        failure limit that offers credentials gets retry-after > 0 and is not checked."""
        kept = request.scope.setdefault("state", {}).get("sloguard_auth")
        if kept is not None:
            return kept
        client = client_of(request)
        offers = "authorization" in request.headers or SESSION_COOKIE in request.cookies
        wait = self.limiter.refuse(client, request.url.path) if offers else 0.0
        if wait:
            verdict = ("", wait)
        else:
            bearer = self._bearer(request)
            session, forged = self._session_state(request)
            if bearer:
                verdict = ("bearer", 0.0)
            elif session is not None:
                verdict = ("session", 0.0)
            else:
                verdict = ("", 0.0)
            if bearer is False and self._token():
                self.limiter.failed(client, "wrong bearer token", request.url.path)
            elif forged and not bearer:
                self.limiter.failed(client, "forged session cookie", request.url.path)
        request.scope["state"]["sloguard_auth"] = verdict
        return verdict

    def too_many(self, request: Request) -> float:
        """Retry-After seconds when this request's client is refused for its failures."""
        return self.authenticated(request)[1]

    def _raise_if_limited(self, request: Request) -> None:
        wait = self.too_many(request)
        if wait:
            raise HTTPException(429, "too many failed authentications from this address: "
                                     f"retry in {wait:.0f}s",
                                headers={"Retry-After": str(int(wait + 0.999))})

    def require_read(self, request: Request) -> None:
        if self.read_open:
            return
        self._raise_if_limited(request)
        if self.authenticated(request)[0]:
            return
        raise HTTPException(401, "this agent listens beyond loopback: send "
                                 "Authorization: Bearer <ui.token>, or log in at /login",
                            headers={"WWW-Authenticate": "Bearer"})

    def api_change(self, request: Request) -> None:
        """A FastAPI dependency for JSON endpoints that change state (bearer token only)."""
        self.require_change(request)

    def require_change(self, request: Request, form_csrf: str | None = None) -> str:
        """Who is making the change ("api" or "browser"); raises 401/403/429 otherwise.

        A browser change must carry the CSRF token of its session (`form_csrf`): a cookie
        alone is what a forged cross-site form would send.
        """
        if not self._token():
            raise HTTPException(403, "changes are disabled: set ui.token or ui.token_file "
                                     "(or SLOGUARD_UI__TOKEN) on this agent")
        self._raise_if_limited(request)
        how = self.authenticated(request)[0]
        if how == "bearer":
            return "api"
        if how == "session":
            session = self.session(request)
            origin = request.headers.get("origin")
            if origin and origin != "null" and _netloc(origin) != request.url.netloc:
                raise HTTPException(403, "cross-site form submission refused")
            if form_csrf and session and _same(form_csrf, self.csrf(session)):
                return "browser"
            raise HTTPException(403, "missing or wrong CSRF token: reload the page and retry")
        raise HTTPException(401, "changes need Authorization: Bearer <ui.token>, or a login",
                            headers={"WWW-Authenticate": "Bearer"})


class ReadGate:
    """The checks every request passes before its route: the Host header names this agent,
    and off loopback, reading needs the token or a login (paths in `own_auth` check a token
    of their own, `open_paths` and /static/ need none).

    A plain ASGI middleware, not Starlette's BaseHTTPMiddleware (`@app.middleware("http")`):
    that one runs each request in a task group and streams the response through a memory
    stream, a cost every push to the receive endpoints paid (measured by
    benchmarks/agent_overhead.py --push-every, "receive cost per push"). It answers a refusal
    itself: an exception raised here would bypass FastAPI's handlers (a 500).
    """

    def __init__(self, app: Any, auth: Auth, open_paths: frozenset[str],
                 own_auth: frozenset[str]) -> None:
        self.app = app
        self.auth = auth
        self.open_paths = open_paths
        self.own_auth = own_auth

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        refusal = self.refusal(Request(scope))
        if refusal is None:
            await self.app(scope, receive, send)
        else:
            await refusal(scope, receive, send)

    def refusal(self, request: Request) -> Response | None:
        """The answer to a request that may not go on, else None."""
        auth = self.auth
        if not auth.host_ok(request):
            return JSONResponse({"detail": "the Host header does not name this agent (a DNS "
                                           "rebinding page?): use localhost or 127.0.0.1, or "
                                           "list the name in ui.allowed_hosts"},
                                status_code=400)
        path = request.url.path
        if path in self.own_auth:
            return None
        wait = auth.too_many(request)
        if wait and path not in self.open_paths:
            return JSONResponse({"detail": "too many failed authentications from this "
                                           f"address: retry in {wait:.0f}s"},
                                status_code=429, headers={"Retry-After": str(int(wait + 0.999))})
        if auth.read_open or path in self.open_paths or path.startswith("/static/") or (
                auth.authenticated(request)[0]):
            return None
        if path.startswith("/api/") or path == "/metrics" or path == "/openapi.json":
            return JSONResponse({"detail": "this agent listens beyond loopback: send "
                                           "Authorization: Bearer <ui.token>, or log in"},
                                status_code=401, headers={"WWW-Authenticate": "Bearer"})
        return RedirectResponse(f"/login?next={quote(path)}", status_code=303)
