"""Send this node's incidents and actions to the cluster server (`sloguard server`).

A thread of its own, never the agent's loop: every `forward.interval` it POSTs to
`<url>/api/v1/ingest` the incidents changed since its cursor and the audit entries recorded
since its other cursor, in bounded batches, with this node's bearer token (or the shared
ingest token; ui/ingest.py). The incident store
numbers changes (sloguard/store/incidents_db.py), never twice the same number: an incident is
sent when it is news (not on every evaluation of a firing incident, which only adds evidence,
but at least every `forward.refresh`), and a deleted one (a pending incident that never fired)
is sent as a withdrawal. Cursors advance only when the server has answered 200, and are kept in
the data dir, so the local stores are the buffer: a server that is away (or a restarted agent)
loses nothing. The server stores incidents by id and audit entries by (node, id), so a batch
sent twice (its answer lost, or the agent killed before it wrote its cursor) is not duplicated.

A batch the server refuses as too large (413) or as invalid (400, 422: an item over one of the
server's field limits, say) is halved until the item it refuses is alone; that item is logged
with its id and the server's reason, counted and passed over, so it is neither retried for ever
nor blocks what follows. Before an item is given up, an empty request must be taken: a server
or proxy that refuses every request (a version that refuses this agent's bodies, a proxy's
size limit) is retried with back-off, and nothing is passed over. Batches are also split
before they are sent so that they stay within `forward.max_body` (the server's
`server.max_body`, if known) and below any size a 413 taught.
"""

from __future__ import annotations

import json
import logging
import os
import random
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
    Size,
    http_url,
    read_secret,
    secret_sources,
)
from sloguard.core.health import ComponentStatus

log = logging.getLogger(__name__)

INGEST_PATH = "/api/v1/ingest"
MAX_BACKOFF_S = 60.0
JITTER = 0.1  # of each wait between rounds, either way (Forwarder.next_wait says why)
MAX_BATCHES_A_ROUND = 20  # then wait an interval, so a long backlog does not hog the server
MIN_BODY = 1024  # the least server.max_body can be
CUT_OFF_SPLITS = 64 * 1024  # a body this large whose connection was reset is halved
SKIPPED_KEPT = 20  # the latest items passed over, kept in the cursor file for /readyz


class ForwardConfig(Section):
    """Send this node's incidents and actions to a cluster server (`sloguard server`). Off
    while `url` is unset. The local stores are the buffer: nothing is lost while it is away."""

    url: str | None = Field(None, description="the cluster server, e.g. http://sloguard:8080")
    token: SecretStr | None = Field(
        None, description="this node's token (its line of the server's "
                          "server.node_tokens_file), or the shared server.ingest_token; never "
                          "its ui.token. Prefer token_file, re-read on every request")
    token_file: str | None = None
    token_env: str | None = None
    interval: Duration = Field(5.0, gt=0, description="how often to send what changed")
    batch: int = Field(200, ge=1, le=1000, description="most incidents (and actions) a request")
    timeout: Duration = Field(10.0, gt=0, description="of one request")
    max_body: Size = Field(
        8 * 1024**2, ge=1024, description="largest request sent: set it to the server's "
        "server.max_body (its default is this) so batches are split before it refuses them")
    refresh: Duration = Field(
        60.0, gt=0, description="a firing incident whose only news is more evidence is sent "
                                "again this often (the server's copy trails it by at most this)")

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
                             "(this node's token on the server, or its server.ingest_token)")
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
                 data_dir: Path, metrics: Any = None, skipped_metric: Any = None) -> None:
        self.cfg = cfg
        self.node = node
        self.incidents = incidents
        self.ledger = ledger
        self.shown_url = redact_url(cfg.url)
        self.cursor_file = Path(data_dir) / "forward-cursor.json"
        self.skipped_items: list[dict[str, Any]] = []
        self.cursor = self._load_cursor()
        self.metrics = metrics
        self.skipped_metric = skipped_metric
        # the largest body to send: the configured cap, lowered by each 413 (a proxy in front
        # of the server may allow less); in memory, so a server that allows more is used again
        # after a restart
        self.max_bytes = int(cfg.max_body)
        self.last_success_ns = 0
        self.last_error = ""
        self.failures = 0
        self.sent = {"incidents": 0, "withdrawn": 0, "actions": 0}
        self.skipped = {"incidents": 0, "withdrawn": 0, "actions": 0}
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
        self.skipped_items = list(saved.get("skipped") or [])[-SKIPPED_KEPT:]
        if saved.get("url") != self.cfg.url:  # another server: it has none of it yet
            return fresh
        cursor = {k: int(saved.get(k, 0)) for k in fresh}
        last = self.incidents.last_seq()
        if cursor["incidents"] > last:
            # numbers the store never handed out: it is not the store the cursor counted in
            # (incidents.db replaced, or numbered by an older version that reused numbers)
            log.warning("forward: the cursor (%d) is past the incident store's last change "
                        "(%d): sending every incident again (the server keeps each once)",
                        cursor["incidents"], last)
            cursor["incidents"] = 0
        return cursor

    def _save_cursor(self) -> None:
        """Written whole and renamed into place: a kill leaves the old cursor or the new one,
        and the old one only sends again what the server already keeps once."""
        tmp = self.cursor_file.with_suffix(".tmp")
        tmp.write_text(json.dumps({"url": self.cfg.url, **self.cursor,
                                   "skipped": self.skipped_items[-SKIPPED_KEPT:]}))
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

    def _post(self, data: bytes) -> None:
        token = read_secret(self.cfg, "token")
        request = urllib.request.Request(
            f"{self.cfg.url}{INGEST_PATH}", data=data, method="POST",
            headers={"Content-Type": "application/json", "Authorization": f"Bearer {token}"})
        try:
            with urllib.request.urlopen(request, timeout=self.cfg.timeout) as response:
                response.read()
        except urllib.error.HTTPError as exc:
            try:
                detail = json.loads(exc.read()).get("detail")
            except (ValueError, AttributeError, OSError):
                detail = exc.reason
            error = (TooLarge if exc.code == 413 else Invalid if exc.code in (400, 422)
                     else ForwardError)
            raise error(f"HTTP {exc.code} from {self.shown_url}: "
                        f"{str(detail)[:300]}"[:1000]) from None
        except (urllib.error.URLError, OSError) as exc:
            cause = getattr(exc, "reason", exc)
            reason = self._scrub(str(cause))
            # a server (or proxy) that refuses a body by its Content-Length may close the
            # connection before the client has written it all: the 413 is never read
            error = CutOff if isinstance(cause, ConnectionResetError | BrokenPipeError) \
                else ForwardError
            raise error(f"cannot reach {self.shown_url}: {reason}"[:1000]) from None

    def send_once(self, heartbeat: bool = False) -> int:
        """Send one batch of what changed, in as many requests as the server's size limit needs;
        advance the cursors after each request it took. The items sent or passed over. With
        `heartbeat`, an empty batch is sent too (the server shows when it last heard)."""
        limit = self.cfg.batch
        changes = self.incidents.changed_since(self.cursor["incidents"], self.node, limit)
        actions = self.ledger.audit_after(self.cursor["actions"], limit)
        if not changes and not actions and not heartbeat:
            return 0
        backlog = self.backlog()
        items: list[tuple[str, Any]] = ([("incidents", c) for c in changes]
                                        + [("actions", a) for a in actions])
        # the first half is sent before the second: each kind stays in order, so a cursor
        # moved past an item has had every earlier item of its kind taken or passed over
        parts, left = [items], dict(backlog)
        while parts:
            part = parts.pop()
            for kind, _ in part:
                left[kind] -= 1
            data = self._body(part, left)
            if len(data) > self.max_bytes and len(part) > 1:
                self._split(part, parts, left)
                continue
            try:
                self._post(data)
            except CutOff:
                if len(part) == 1 or len(data) < CUT_OFF_SPLITS:
                    raise  # not a matter of size: retried with the round's backoff
                self._split(part, parts, left)  # maybe too large: halves, learning nothing
                continue
            except (TooLarge, Invalid) as exc:
                if not part:  # an empty request refused: nothing to split or pass over
                    raise
                if isinstance(exc, TooLarge):
                    self.max_bytes = max(min(self.max_bytes, len(data) - 1), MIN_BODY)
                if len(part) > 1:
                    self._split(part, parts, left)
                    continue
                # before giving an item up: a proxy refusing every request with a 413 (or a
                # server refusing every body) would otherwise have each passed over, all lost
                self._post(self._body([], left))
                self._pass_over(part[0], len(data), str(exc),
                                "too large" if isinstance(exc, TooLarge) else "invalid")
            else:
                self._count_sent(part)
            self._advance(part)
        return len(items)

    @staticmethod
    def _split(part: list[tuple[str, Any]], parts: list[list[tuple[str, Any]]],
               left: dict[str, int]) -> None:
        """Halve `part`, the first half to be sent first (the stack's top)."""
        for kind, _ in part:
            left[kind] += 1
        half = len(part) // 2
        parts += [part[half:], part[:half]]

    def _body(self, part: list[tuple[str, Any]], left: dict[str, int]) -> bytes:
        """The request for `part` of a batch, with what is `left` after it (the server shows
        each node's backlog)."""
        incidents = [c.incident.to_dict() for kind, c in part
                     if kind == "incidents" and c.incident is not None]
        withdrawn = [c.id for kind, c in part if kind == "incidents" and c.incident is None]
        actions = [asdict(a) for kind, a in part if kind == "actions"]
        after = {kind: max(n, 0) for kind, n in left.items()}
        body = {"node": self.node, "sent_ns": time.time_ns(), "backlog": after,
                "incidents": incidents, "withdrawn": withdrawn, "actions": actions}
        return json.dumps(body).encode()

    def _advance(self, part: list[tuple[str, Any]]) -> None:
        """Past `part` (taken, or passed over), written before anything else is sent."""
        for kind, item in part:
            if kind == "incidents":
                self.cursor["incidents"] = item.seq
            else:
                self.cursor["actions"] = int(item.id or 0)
        self._save_cursor()

    def _count_sent(self, part: list[tuple[str, Any]]) -> None:
        for kind, item in part:
            key = "withdrawn" if kind == "incidents" and item.incident is None else kind
            self.sent[key] += 1
            if self.metrics is not None:
                self.metrics.labels(key).inc()

    def _pass_over(self, item: tuple[str, Any], size: int, why: str,
                   refused: str = "too large") -> None:
        """One item the server refuses even alone: recorded and skipped, never retried (the
        next change of that incident is tried afresh), so it blocks nothing behind it."""
        kind, thing = item
        if kind == "incidents" and thing.incident is None:
            kind = "withdrawn"
        shown = thing.id
        log.error("forward: %s %s (%d bytes) refused alone as %s, passed over: %s",
                  kind[:-1] if kind != "withdrawn" else "withdrawal of", shown, size, refused,
                  why)
        self.skipped[kind] += 1
        self.skipped_items = [*self.skipped_items, {
            "kind": kind, "id": shown, "bytes": size, "refused": refused,
            "why": why[:300], "time_ns": time.time_ns()}][-SKIPPED_KEPT:]
        if self.skipped_metric is not None:
            self.skipped_metric.labels(kind).inc()

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
            started = time.monotonic()
            try:
                self.round()
            except Exception as exc:  # a bug here must not end forwarding for good
                log.exception("forward round failed")
                self.failures += 1
                self.last_error = f"{exc.__class__.__name__}: {exc}"
            self._stop.wait(self.next_wait(time.monotonic() - started))

    def next_wait(self, took: float = 0.0) -> float:
        """Seconds until the next round, after one that took `took` seconds: the interval
        counted from the round's start (at least half of it from its end), or after a failed
        round the interval doubled for each failure in a row up to MAX_BACKOFF_S; each drawn
        within +-JITTER of that.

        Why from the start: counted from the end, rounds a slow server held up end together
        and stay together, one interval apart; a fleet falls into step and every stall makes
        it worse (benchmarks/fleet.py: 1,000 agents' request starts correlated 0.63-0.68 with
        those one interval later in a steady state). Counted from the start, a stall shorter
        than half the interval leaves each agent's phase where it was. The jitter spreads
        what is in step anyway (agents started together, a longer stall, a backoff). A
        method of its own so that whatever schedules rounds other than `_loop` (that
        benchmark runs 1,000 forwarders on a few threads) waits as an agent does."""
        jitter = random.uniform(1 - JITTER, 1 + JITTER)
        if self.failures:
            return jitter * min(self.cfg.interval * 2 ** min(self.failures - 1, 10),
                                max(MAX_BACKOFF_S, self.cfg.interval))
        return max(self.cfg.interval * jitter - took, self.cfg.interval / 2)

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
                     "skipped": dict(self.skipped), "skipped_latest": self.skipped_items,
                     "max_bytes": self.max_bytes, "consecutive_failures": self.failures})


class ForwardError(Exception):
    """The server did not take a batch (the message names why; never the token)."""


class TooLarge(ForwardError):
    """The server (or a proxy before it) refused the request's size: 413."""


class Invalid(ForwardError):
    """The server refused the request's content (400, 422): its detail names the field."""


class CutOff(ForwardError):
    """The connection was reset while the request was sent: for a large body, likely a size
    refused before it was read (its 413 lost), else a network fault."""
