"""How the `alertmanager` receiver talks HTTP to an Alertmanager that wants credentials or TLS:
the Authorization header (basic auth, or a bearer token for a proxy in front of it), the TLS
context (a CA, a client certificate, the name the server's certificate must carry), and what a
failed request means (`Answer.failure`).

Why the secrets are read on every request: they come from a mounted Secret or the environment
(never the config file), and a rotated password or token must be used at the next post, without
a restart, including the retry after a 401. A read costs about 10 µs here, a post
milliseconds. The TLS files are loaded again only when one of them changes (cert-manager renews
certificates in place): a context costs 0.9 ms to build with a CA file, 18 ms with the system's
CAs.

Why redirects are not followed: urllib would send the Authorization header on to wherever the
redirect points (another host, plain http). Alertmanager's API does not redirect; a proxy that
does is named in the error, and the URL can be set to where it points.

Nothing here logs; the texts it returns never hold a secret (they are redacted, in case a proxy
echoes the request).
"""

from __future__ import annotations

import base64
import os
import socket
import ssl
import threading
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

from sloguard.actuators.alerting.config import AlertmanagerConfig, TLSConfig
from sloguard.core.config import SecretUnavailable, read_secret

# What went wrong with a request, as /readyz shows it (status()['urls'][url]['failure']):
AUTH = "auth"  # 401/403, or the credentials cannot be read: retrying alone will not fix it
TLS = "tls"  # the certificate is not trusted, the handshake failed, the TLS files are bad
UNREACHABLE = "unreachable"  # no answer: refused, reset, timed out, no such host
HTTP = "http"  # an answer other than 2xx, 400, 401 and 403 (a 5xx, a proxy's 502, a 3xx)


# TLS alerts a server sends when it wants a client certificate it trusts and did not get one
# (Go's crypto/tls, Alertmanager's: bad certificate for none at all; others send these)
_CLIENT_CERT_ALERTS = frozenset({"bad certificate", "certificate required", "unknown ca",
                                 "handshake failure"})


@dataclass(frozen=True)
class Answer:
    status: int  # 0 when no HTTP answer came
    text: str  # what went wrong, or what the 400 refused; '' when accepted
    failure: str = ""  # AUTH, TLS, UNREACHABLE, HTTP; '' when answered 2xx or 400


class _NamedContext(ssl.SSLContext):
    """A client context that checks the certificate (and sends SNI) for `server_name` rather
    than the URL's host: the Alertmanager is reached by IP or a Service name its certificate
    does not carry (Prometheus' tls_config.server_name)."""

    server_name: str | None = None

    def wrap_socket(self, sock: socket.socket, *args: Any, **kwargs: Any) -> ssl.SSLSocket:
        if self.server_name:
            kwargs["server_hostname"] = self.server_name
        return super().wrap_socket(sock, *args, **kwargs)


class TLSFileError(Exception):
    """A tls_config file cannot be loaded; the message names the setting and the path."""


def tls_context(tls: TLSConfig) -> ssl.SSLContext:
    """The client context `tls` describes (TLSFileError when a file is missing or bad)."""
    context = _NamedContext(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    setting = "ca_file (none: the system's CAs)"
    try:
        if tls.ca_file:
            setting = f"ca_file {tls.ca_file}"
            context.load_verify_locations(cafile=tls.ca_file)
        else:
            context.load_default_certs()
        if tls.cert_file and tls.key_file:
            setting = f"cert_file {tls.cert_file}, key_file {tls.key_file}"
            context.load_cert_chain(tls.cert_file, tls.key_file)
    except (OSError, ssl.SSLError) as exc:  # SSLError: not PEM, a key that does not match
        detail = exc.strerror if isinstance(exc, OSError) and exc.strerror else (
            f"{exc.__class__.__name__}: {exc}")
        raise TLSFileError(f"tls_config.{setting}: {detail}"[:300]) from None
    context.server_name = tls.server_name
    if tls.insecure_skip_verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return context


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None  # urllib then raises the 3xx as an HTTPError


class AlertmanagerClient:
    """Posts to one receiver's Alertmanagers with its credentials and TLS settings. Safe to
    share between the receiver's URL threads."""

    def __init__(self, config: AlertmanagerConfig, user_agent: str) -> None:
        self.config = config
        self.user_agent = user_agent
        self.tls = config.tls_config or TLSConfig()
        self._context: ssl.SSLContext | None = None
        self._context_key: tuple[Any, ...] | None = None
        self._secrets: set[str] = set()  # every value read, to redact texts
        self._lock = threading.Lock()  # the URL threads share the set

    # -- credentials -------------------------------------------------------------------------

    def authorization(self) -> str | None:
        """The Authorization header's value now (SecretUnavailable when it cannot be read)."""
        if self.config.basic_auth is not None:
            auth = self.config.basic_auth
            password = read_secret(auth, "password") or ""
            pair = base64.b64encode(f"{auth.username}:{password}".encode()).decode()
            self._remember(password, pair)
            return f"Basic {pair}"
        if self.config.authorization is not None:
            credentials = read_secret(self.config.authorization, "credentials") or ""
            self._remember(credentials)
            if not (credentials.isascii() and credentials.isprintable()):
                # http.client would refuse the header with its value in the message: a file
                # of two lines, say
                raise SecretUnavailable("the credentials hold a line break, a control or a "
                                        "non-ASCII character")
            return f"{self.config.authorization.type} {credentials}"
        return None

    def _remember(self, *secrets: str) -> None:
        with self._lock:
            self._secrets.update(s for s in secrets if len(s) >= 3)

    def redact(self, text: str) -> str:
        """`text` without any credential this client has sent."""
        with self._lock:
            secrets = sorted(self._secrets, key=len, reverse=True)
        for secret in secrets:
            text = text.replace(secret, "***")
        return text

    # -- TLS ---------------------------------------------------------------------------------

    def context(self) -> ssl.SSLContext:
        """The TLS context, built again when a file it was built from changed."""
        key = tuple(_stamp(path) for path in (self.tls.ca_file, self.tls.cert_file,
                                              self.tls.key_file))
        if self._context is None or key != self._context_key:
            self._context = tls_context(self.tls)
            self._context_key = key
        return self._context

    # -- a request ---------------------------------------------------------------------------

    def post(self, endpoint: str, body: bytes, timeout: float) -> Answer:
        """POST `body` to `endpoint` and say what the answer means."""
        headers = {"Content-Type": "application/json", "User-Agent": self.user_agent}
        try:
            authorization = self.authorization()
        except SecretUnavailable as exc:
            return Answer(0, f"authentication: cannot read the credentials: {exc}", AUTH)
        if authorization:
            headers["Authorization"] = authorization
        handlers: list[Any] = [_NoRedirects()]
        if endpoint.startswith("https:"):
            try:
                handlers.append(urllib.request.HTTPSHandler(context=self.context()))
            except TLSFileError as exc:
                return Answer(0, str(exc), TLS)
        request = urllib.request.Request(endpoint, data=body, method="POST", headers=headers)
        try:
            with urllib.request.build_opener(*handlers).open(request, timeout=timeout) as reply:
                return Answer(reply.status, "")
        except urllib.error.HTTPError as exc:
            try:
                text = exc.read(500).decode(errors="replace").strip()
            except OSError:
                text = ""
            text = self.redact(text)
            if exc.code in (401, 403):
                return Answer(exc.code, f"authentication refused: HTTP {exc.code} {text}"
                              .strip(), AUTH)
            if 300 <= exc.code < 400:
                where = self.redact(str(exc.headers.get("Location")))[:200]
                return Answer(exc.code, f"HTTP {exc.code} to {where}: "
                              "redirects are not followed (the credentials would go along): "
                              "set the URL to where it points", HTTP)
            if exc.code == 400:
                return Answer(exc.code, text)
            return Answer(exc.code, f"HTTP {exc.code} {text}".strip(), HTTP)
        except (OSError, ValueError) as exc:  # URLError, timeout, reset, TLS
            reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
            if isinstance(reason, ssl.SSLError):
                return Answer(0, self.redact(
                    f"TLS: {_describe(reason, bool(self.tls.cert_file))}"), TLS)
            return Answer(0, self.redact(f"{reason.__class__.__name__}: {reason}"[:300]),
                          UNREACHABLE)


def _stamp(path: str | None) -> tuple[Any, ...] | None:
    """What tells that a file changed (a mounted Secret's update swaps a symlink: stat
    follows it)."""
    if not path:
        return None
    try:
        st = os.stat(path)
    except OSError:
        return (path,)  # loading it says why
    return (path, st.st_ino, st.st_mtime_ns, st.st_size)


def _describe(exc: ssl.SSLError, has_cert: bool) -> str:
    """A TLS failure as the person fixing it reads it. A server that wants a client
    certificate it did not get (TLS 1.3: after the client's side of the handshake) sends an
    alert and closes, and which of the two the client reads first is a race: both get the
    hint, unless a certificate was sent."""
    hint = "" if has_cert else " (does it want a client certificate? tls_config.cert_file, " \
                               "key_file)"
    if isinstance(exc, ssl.SSLCertVerificationError):
        return f"certificate not trusted: {exc.verify_message}"[:300]
    if "ALERT" in (exc.reason or ""):
        alert = exc.reason.split("ALERT_", 1)[-1].lower().replace("_", " ")
        return (f"the server refused the handshake: {alert}"
                f"{hint if alert in _CLIENT_CERT_ALERTS else ''}")
    if isinstance(exc, ssl.SSLEOFError):
        return f"the server closed the connection during TLS{hint}"
    return f"{exc.__class__.__name__}: {exc}"[:300]
