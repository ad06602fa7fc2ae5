"""Delivery to Alertmanager's API v2 (POST /api/v2/alerts): one thread per URL, so an HA
pair's peers each get every alert and one down does not hold up the other.

Each URL's thread posts, from the spool (am_spool.py), what changed since that URL last
accepted it, as soon as the pipeline says something changed; and every `resend_interval`
everything that fires (and what resolved in the last 15 minutes), as Prometheus does, so an
Alertmanager that restarted, or lost an alert, has it again within one interval. A firing
alert's `endsAt` is stamped at each post: valid for four resend intervals (Prometheus' rule),
so the alerts of an agent that stopped end by themselves, whatever Alertmanager's
resolve_timeout is.

What each answer means:

- 200: accepted; the URL's marks move to the versions posted.
- 400: Alertmanager refused some alerts as invalid (it keeps the valid ones of the request):
  a retry would be refused again, so the request counts as told, the problem is logged and
  shown on /readyz, and the next resend tries again.
- 401 or 403 (wrong or rotated credentials, a client certificate refused), credentials that
  cannot be read, a certificate not trusted: an authentication or TLS failure, shown as such
  on /readyz (`failure`: auth, tls), since waiting alone will not fix it. The alerts stay in
  the spool and are posted again after the backoff, with the credentials read again (a fixed
  Secret is used at the next try, without a restart).
- any other status, a timeout, a refused connection: posted again after a backoff (1 s
  doubling, at most `resend_interval`, ±20%); the post is idempotent, so a request that did
  arrive before its answer was lost does no harm when repeated.

The HTTP side (credentials, TLS, redirects) is am_http.py.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from sloguard import __version__
from sloguard.actuators.alerting.am_alert import MAX_REQUEST_BYTES, batches, with_ends_at
from sloguard.actuators.alerting.am_http import AlertmanagerClient
from sloguard.actuators.alerting.am_spool import Spool
from sloguard.actuators.alerting.config import AlertmanagerConfig
from sloguard.actuators.alerting.retry import backoff_s
from sloguard.core.config import is_loopback

log = logging.getLogger(__name__)

KIND = "alertmanager"  # the kind of the messages metric
VALID_INTERVALS = 4  # a firing alert's post holds this many resend intervals
REFUSED = 400


class _Peer:
    """One Alertmanager URL: its thread, its marks in the spool, its health."""

    def __init__(self, sender: AlertmanagerSender, url: str) -> None:
        self.sender = sender
        self.url = url
        self.endpoint = url + "/api/v2/alerts"
        self.problem = ""
        self.failure = ""  # am_http's AUTH, TLS, UNREACHABLE, HTTP; '' when delivering
        self.delivered = 0  # alerts accepted
        self.last_success_ns = 0
        self.failures = 0
        self.retry_at = 0.0  # monotonic
        self.next_full = 0.0  # monotonic: a started agent posts everything at once
        self.wake = threading.Event()
        self.thread: threading.Thread | None = None

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                wait = self.step()
            except Exception:  # a bug here must not end delivery for good
                log.exception("receiver %s: posting to %s failed", self.sender.name, self.url)
                wait = 5.0
            if wait > 0:
                self.wake.wait(wait)
                self.wake.clear()

    def step(self) -> float:
        """Post what is due to this URL; return how long to wait."""
        sender, now = self.sender, time.monotonic()
        if now < self.retry_at:
            return self.retry_at - now
        everything = now >= self.next_full
        now_ns = time.time_ns()
        items = sender.spool.due(sender.name, self.url, everything, now_ns)
        if not items:
            if everything:
                self.next_full = now + sender.config.resend_interval
            return max(self.next_full - now, 0.01)
        valid_s = sender.config.resend_interval * VALID_INTERVALS
        docs = [with_ends_at(item.doc, now_ns, valid_s) for item in items]
        start, refused = 0, ""
        for body, count in batches(docs, sender.config.max_batch, MAX_REQUEST_BYTES):
            chunk = items[start:start + count]
            answer = sender.client.post(self.endpoint, body, sender.config.timeout)
            status, text = answer.status, answer.text
            if answer.failure:
                self._failed(answer.failure, text)
                return self.retry_at - time.monotonic()
            self.failure = ""
            sender.spool.told(sender.name, self.url, chunk, time.time_ns())
            start += count
            self.failures = 0
            if status == REFUSED:
                sender.on_result(KIND, "refused")
                refused = f"refused {count} alert(s): {text}"
            else:
                self.delivered += count
                self.last_success_ns = time.time_ns()
                sender.on_result(KIND, "sent")
        if refused:
            self._set_problem(refused)
        elif self.problem:
            log.info("receiver %s: %s accepts alerts again", sender.name, self.url)
            self.problem = ""
        if everything:
            self.next_full = time.monotonic() + sender.config.resend_interval
        return 0.0

    def _failed(self, failure: str, error: str) -> None:
        self.failures += 1
        low, high = self.sender.backoff_s
        delay = backoff_s(self.failures, low, min(high, self.sender.config.resend_interval))
        self.retry_at = time.monotonic() + delay
        self.sender.on_result(KIND, "retry")
        self._set_problem(f"{error} (retrying in {delay:.1f}s)")
        self.failure = failure  # after the problem: whoever sees the kind reads its text

    def _set_problem(self, problem: str) -> None:
        if problem.split(" (retrying")[0] != self.problem.split(" (retrying")[0]:
            log.warning("receiver %s: %s: %s", self.sender.name, self.url, problem)
        self.problem = problem


class AlertmanagerSender:
    """One `alertmanager` receiver: a peer thread per URL."""

    def __init__(self, name: str, config: AlertmanagerConfig, spool: Spool,
                 on_result: Callable[[str, str], None] = lambda kind, result: None,
                 backoff_s: tuple[float, float] = (1.0, 300.0)) -> None:
        self.name = name
        self.config = config
        self.spool = spool
        self.on_result = on_result
        self.backoff_s = backoff_s
        self.client = AlertmanagerClient(config, f"sloguard/{__version__}")
        self.peers = [_Peer(self, url) for url in config.urls]
        self._stop = threading.Event()
        self._warn_insecure()

    def _warn_insecure(self) -> None:
        """Say once, at start, what sends alerts or credentials where anyone can read them."""
        if self.config.tls_config and self.config.tls_config.insecure_skip_verify:
            log.warning("receiver %s: tls_config.insecure_skip_verify: the Alertmanager's "
                            "certificate is not verified", self.name)
        if self.config.basic_auth is None and self.config.authorization is None:
            return
        for url in self.config.urls:
            parts = urlsplit(url)
            if parts.scheme == "http" and not is_loopback(parts.hostname or ""):
                log.warning("receiver %s: credentials sent over plain http to %s: use https "
                            "(or a proxy on the node)", self.name, url)

    @property
    def problem(self) -> str:
        return "; ".join(f"{p.url}: {p.problem}" for p in self.peers if p.problem)

    def watched(self) -> list[tuple[str, Callable[[], threading.Thread | None],
                                    Callable[[], None]]]:
        """A thread per URL for the agent's supervisor: (name, the thread now, restart)."""
        return [(f"alertmanager-{self.name}-{index}", lambda p=peer: p.thread,
                 lambda p=peer: self.start_peer(p)) for index, peer in enumerate(self.peers)]

    def start(self) -> None:
        for peer in self.peers:
            self.start_peer(peer)

    def start_peer(self, peer: _Peer) -> None:
        """Start (or, for the agent's supervisor, restart) one URL's thread."""
        index = self.peers.index(peer)
        peer.thread = threading.Thread(target=peer.run, args=(self._stop,),
                                       name=f"alertmanager-{self.name}-{index}", daemon=True)
        peer.thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        for peer in self.peers:
            peer.wake.set()
        deadline = time.monotonic() + timeout
        for peer in self.peers:
            if peer.thread is not None:
                peer.thread.join(max(0.0, deadline - time.monotonic()))

    def wake(self) -> None:
        for peer in self.peers:
            peer.wake.set()

    def status(self) -> dict[str, Any]:
        return {"mode": "alertmanager", "urls": {
            p.url: {"delivered": p.delivered, "problem": p.problem, "failure": p.failure,
                    "last_success_ns": p.last_success_ns} for p in self.peers}}
