"""Send this node's incidents and actions to the cluster server (`sloguard server`).

A thread of its own, never the agent's loop: every `forward.interval` it POSTs to
`<url>/api/v1/ingest` the incidents changed since its cursor (the incident store numbers every
save) and the audit entries recorded since its other cursor, in bounded batches, with the
ingest bearer token. Cursors advance only when the server has answered 200, and are kept in the
data dir, so the local stores are the buffer: a server that is away (or a restarted agent)
loses nothing. The server stores incidents by id and audit entries by (node, id), so a batch
sent twice (its answer lost) is not duplicated.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
import urllib.error
import urllib.request
from dataclasses import asdict
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from pydantic import Field, SecretStr, field_validator, model_validator

from sloguard.core.config import (
    Duration,
    SecretUnavailable,
    Section,
    http_url,
    read_secret,
    secret_sources,
)
from sloguard.core.health import ComponentStatus

log = logging.getLogger(__name__)

INGEST_PATH = "/api/v1/ingest"
MAX_BACKOFF_S = 60.0
MAX_BATCHES_A_ROUND = 20  # then wait an interval, so a long backlog does not hog the server


class ForwardConfig(Section):
    """Send this node's incidents and actions to a cluster server (`sloguard server`). Off
    while `url` is unset. The local stores are the buffer: nothing is lost while it is away."""

    url: str | None = Field(None, description="the cluster server, e.g. http://sloguard:8080")
    token: SecretStr | None = Field(
        None, description="the server's server.ingest_token (not its ui.token); prefer "
                          "token_file (a mounted Secret) or token_env")
    token_file: str | None = None
    token_env: str | None = None
    interval: Duration = Field(5.0, gt=0, description="how often to send what changed")
    batch: int = Field(200, ge=1, le=1000, description="most incidents (and actions) a request")
    timeout: Duration = Field(10.0, gt=0, description="of one request")

    @field_validator("url")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        return http_url(value).rstrip("/") if value else None

    @model_validator(mode="after")
    def _one_token(self) -> ForwardConfig:
        sources = secret_sources(self, "token")
        if len(sources) > 1:
            raise ValueError("give only one of token, token_file, token_env")
        if self.url and not sources:
            raise ValueError("url is set without a token: set token, token_file or token_env "
                             "(the server's server.ingest_token)")
        return self



def redact_url(url: str | None) -> str:
    """The server's address as logs and /readyz show it: credentials in the userinfo and the
    query (where some proxies take an API key) replaced, scheme, host, port and path kept."""
    if not url:
        return ""
    try:
        parts = urlsplit(url)
        netloc = parts.netloc
        if "@" in netloc:
            netloc = "***@" + netloc.rpartition("@")[2]
        return urlunsplit((parts.scheme, netloc, parts.path, "***" if parts.query else "",
                           ""))
    except ValueError:
        return "(unparsable URL)"


class Forwarder:
    def __init__(self, cfg: ForwardConfig, node: str, incidents: Any, ledger: Any,
                 data_dir: Path, metrics: Any = None) -> None:
        self.cfg = cfg
        self.node = node
        self.incidents = incidents
        self.ledger = ledger
        self.shown_url = redact_url(cfg.url)
        self.cursor_file = Path(data_dir) / "forward-cursor.json"
        self.cursor = self._load_cursor()
        self.metrics = metrics
        self.last_success_ns = 0
        self.last_error = ""
        self.failures = 0
        self.sent = {"incidents": 0, "actions": 0}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- cursors -----------------------------------------------------------------------------

    def _load_cursor(self) -> dict[str, int]:
        fresh = {"incidents": 0, "actions": 0}
        try:
            saved = json.loads(self.cursor_file.read_text())
        except FileNotFoundError:
            return fresh
        except (OSError, ValueError) as exc:
            log.error("forward: %s unreadable (%s): sending everything again (the server "
                      "keeps each item once)", self.cursor_file, exc)
            return fresh
        if saved.get("url") != self.cfg.url:  # another server: it has none of it yet
            return fresh
        return {k: int(saved.get(k, 0)) for k in fresh}

    def _save_cursor(self) -> None:
        tmp = self.cursor_file.with_suffix(".tmp")
        tmp.write_text(json.dumps({"url": self.cfg.url, **self.cursor}))
        os.replace(tmp, self.cursor_file)

    def _scrub(self, text: str) -> str:
        """`text` without the URL's credentials (an error may quote part of the URL)."""
        text = text.replace(str(self.cfg.url), self.shown_url)
        try:
            parts = urlsplit(str(self.cfg.url))
        except ValueError:
            return text
        userinfo = parts.netloc.rpartition("@")[0] if "@" in parts.netloc else ""
        for secret in sorted({t for t in (userinfo, *userinfo.split(":"), parts.query)
                              if len(t) >= 3},
                             key=len, reverse=True):
            text = text.replace(secret, "***")
        return text

    def backlog(self) -> dict[str, int]:
        return {"incidents": self.incidents.count_changed_since(self.cursor["incidents"],
                                                                 self.node),
                "actions": self.ledger.count_after(self.cursor["actions"])}

    # -- sending -----------------------------------------------------------------------------

    def _post(self, body: dict[str, Any]) -> None:
        token = read_secret(self.cfg, "token")
        request = urllib.request.Request(
            f"{self.cfg.url}{INGEST_PATH}", data=json.dumps(body).encode(), method="POST",
            headers={"Content-Type": "application/json", "Authorization": f"Bearer {token}"})
        try:
            with urllib.request.urlopen(request, timeout=self.cfg.timeout) as response:
                response.read()
        except urllib.error.HTTPError as exc:
            try:
                detail = json.loads(exc.read()).get("detail")
            except (ValueError, AttributeError, OSError):
                detail = exc.reason
            raise ForwardError(f"HTTP {exc.code} from {self.shown_url}: "
                               f"{str(detail)[:300]}"[:1000]) from None
        except (urllib.error.URLError, OSError) as exc:
            reason = self._scrub(str(getattr(exc, "reason", exc)))
            raise ForwardError(f"cannot reach {self.shown_url}: {reason}"[:1000]) from None

    def send_once(self, heartbeat: bool = False) -> int:
        """Send one batch of what changed; advance the cursors on success. The items sent.
        With `heartbeat`, an empty batch is sent too (the server shows when it last heard)."""
        limit = self.cfg.batch
        changed = self.incidents.changed_since(self.cursor["incidents"], self.node, limit)
        actions = self.ledger.audit_after(self.cursor["actions"], limit)
        if not changed and not actions and not heartbeat:
            return 0
        backlog = self.backlog()
        body = {
            "node": self.node, "sent_ns": time.time_ns(),
            "backlog": {"incidents": backlog["incidents"] - len(changed),
                        "actions": backlog["actions"] - len(actions)},
            "incidents": [incident.to_dict() for _, incident in changed],
            "actions": [asdict(entry) for entry in actions],
        }
        self._post(body)
        if changed:
            self.cursor["incidents"] = changed[-1][0]
        if actions:
            self.cursor["actions"] = int(actions[-1].id or 0)
        self._save_cursor()
        self.sent["incidents"] += len(changed)
        self.sent["actions"] += len(actions)
        if self.metrics is not None:
            self.metrics.labels("incidents").inc(len(changed))
            self.metrics.labels("actions").inc(len(actions))
        return len(changed) + len(actions)

    def round(self) -> None:
        """Send batches until nothing is left (or a bound); record the outcome."""
        try:
            for n in range(MAX_BATCHES_A_ROUND):
                if self.send_once(heartbeat=n == 0) == 0:
                    break
        except (ForwardError, SecretUnavailable, OSError) as exc:
            self.failures += 1
            if self.last_error != str(exc):
                log.warning("forward: %s (kept locally, retrying)", exc)
            self.last_error = str(exc)
            return
        self.failures = 0
        self.last_error = ""
        self.last_success_ns = time.time_ns()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.round()
            except Exception as exc:  # a bug here must not end forwarding for good
                log.exception("forward round failed")
                self.failures += 1
                self.last_error = f"{exc.__class__.__name__}: {exc}"
            wait = self.cfg.interval
            if self.failures:
                wait = min(self.cfg.interval * 2 ** min(self.failures - 1, 10),
                           max(MAX_BACKOFF_S, self.cfg.interval))
            self._stop.wait(wait)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="forwarder", daemon=True)
        self._thread.start()
        log.info("forwarding incidents and actions to %s every %gs", self.shown_url,
                 self.cfg.interval)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.cfg.timeout + 5)

    def status(self) -> ComponentStatus:
        try:
            backlog = self.backlog()
        except Exception as exc:  # a closed store at shutdown
            backlog = {"error": str(exc)}
        return ComponentStatus(
            "forward", ok=not self.last_error, reason=self.last_error,
            details={"url": self.shown_url, "last_success_ns": self.last_success_ns or None,
                     "backlog": backlog, "sent": dict(self.sent),
                     "consecutive_failures": self.failures})


class ForwardError(Exception):
    """The server did not take a batch (the message names why; never the token)."""
