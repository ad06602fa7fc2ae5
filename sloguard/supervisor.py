"""Every long-lived thread the agent starts, watched: a dead one is reported and restarted.

The agent is a handful of daemon threads (the loop, the app-latency scraper, the pod-metadata
refresher, the Slack senders, the forwarder, the InfluxDB writer). Each catches what its own
work raises, yet a thread can still end: a bug outside its `try`, a BaseException, a double
start that leaves one thread on a foreign asyncio loop. A dead daemon thread is silent: the
process lives, /healthz answers, and that part of the agent has simply stopped. So a watchdog
thread looks at each of them every second, records why one ended (`threading.excepthook`
hands it the exception), restarts it with an exponential back-off, and reports the restarts
and the last reason in /readyz. The agent's loop in turn restarts the watchdog if it ever ends.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sloguard.core.health import ComponentStatus

log = logging.getLogger(__name__)

CHECK_S = 1.0
BACKOFF_S = (1.0, 60.0)  # the first restart after one second, doubling up to a minute
STABLE_S = 60.0  # a restarted thread alive this long has its back-off reset
_MAX_ERRORS = 64  # exceptions of ended threads not yet read: a bound, not a log


@dataclass
class Watched:
    """One thread the agent relies on, and what it takes to start it again."""

    name: str
    thread: Callable[[], threading.Thread | None]  # the current thread (None: not started)
    restart: Callable[[], None] | None  # None: reported only (its owner must restart it)
    component: str = ""  # the /readyz component this thread serves, if any
    restarts: int = 0
    last_reason: str = ""
    down_since: float | None = None  # monotonic; None while the thread runs
    next_try: float = 0.0
    backoff: float = BACKOFF_S[0]
    started_at: float = field(default_factory=time.monotonic)

    def as_dict(self) -> dict[str, Any]:
        return {"alive": self.down_since is None, "restarts": self.restarts,
                "last_reason": self.last_reason}


class Supervisor:
    def __init__(self, backoff_s: tuple[float, float] = BACKOFF_S,
                 check_s: float = CHECK_S) -> None:
        self.backoff_s = backoff_s
        self.check_s = check_s
        self.watched: dict[str, Watched] = {}
        self._lock = threading.Lock()
        self._errors: dict[threading.Thread, str] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._previous_hook: Any = None

    def watch(self, name: str, thread: Callable[[], threading.Thread | None],
              restart: Callable[[], None] | None, component: str = "") -> None:
        with self._lock:
            self.watched[name] = Watched(name, thread, restart, component,
                                         backoff=self.backoff_s[0])

    # -- lifecycle -----------------------------------------------------------------------

    def start(self) -> None:
        if self._previous_hook is None:
            self._previous_hook = threading.excepthook
            threading.excepthook = self._excepthook
        self.ensure_running()

    def ensure_running(self) -> None:
        """Start the watchdog thread if it is not running (the agent's loop calls this)."""
        if self._stop.is_set() or (self._thread is not None and self._thread.is_alive()):
            return
        if self._thread is not None:
            log.error("the thread supervisor had stopped; starting it again")
        self._thread = threading.Thread(target=self._run, name="supervisor", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self._previous_hook is not None and threading.excepthook == self._excepthook:
            threading.excepthook = self._previous_hook

    def _excepthook(self, args: Any) -> None:
        """Why a thread ended, kept for its restart's report; then the usual traceback."""
        reason = f"{args.exc_type.__name__}: {args.exc_value}"[:500]
        with self._lock:
            if len(self._errors) >= _MAX_ERRORS:
                self._errors.pop(next(iter(self._errors)))
            if args.thread is not None:
                self._errors[args.thread] = reason
        log.error("thread %s ended: %s", getattr(args.thread, "name", "?"), reason,
                  exc_info=(args.exc_type, args.exc_value, args.exc_traceback))

    def _run(self) -> None:
        while not self._stop.wait(self.check_s):
            try:
                self.check()
            except Exception:  # the watchdog must outlive anything one check does
                log.exception("thread supervisor check failed")

    # -- one check -----------------------------------------------------------------------

    def check(self, now: float | None = None) -> None:
        """Note threads that ended and restart those whose back-off has passed."""
        now = time.monotonic() if now is None else now
        with self._lock:
            watched = list(self.watched.values())
        for item in watched:
            thread = item.thread()
            if thread is None:
                continue  # not started (or not configured to run)
            if thread.is_alive():
                if item.down_since is not None:
                    item.down_since = None
                if item.backoff > self.backoff_s[0] and now - item.started_at >= STABLE_S:
                    item.backoff = self.backoff_s[0]
                continue
            if self._stop.is_set():
                return
            if item.down_since is None:
                with self._lock:
                    reason = self._errors.pop(thread, "") or "the thread ended"
                item.down_since, item.last_reason = now, reason
                item.next_try = now + item.backoff
                log.error("thread %s is down (%s); restarting it in %.3gs", item.name, reason,
                          item.backoff)
            if item.restart is None or now < item.next_try:
                continue
            try:
                item.restart()
            except Exception as exc:
                item.last_reason = f"restart failed: {exc.__class__.__name__}: {exc}"[:500]
                log.error("thread %s: %s", item.name, item.last_reason)
            else:
                item.restarts += 1
                item.started_at = now
                log.warning("thread %s restarted (%d restarts)", item.name, item.restarts)
                new = item.thread()
                if new is not None and new.is_alive():
                    item.down_since = None
            item.next_try = now + item.backoff
            item.backoff = min(item.backoff * 2, self.backoff_s[1])

    # -- health --------------------------------------------------------------------------

    def status(self) -> ComponentStatus:
        with self._lock:
            watched = list(self.watched.values())
        down = [w for w in watched if w.down_since is not None]
        watchdog = self._thread is not None and self._thread.is_alive()
        reasons = [f"thread {w.name} is down ({w.restarts} restarts so far): {w.last_reason}"
                   for w in down]
        if not watchdog and not self._stop.is_set():
            reasons.insert(0, "the supervisor is not running")
        return ComponentStatus(
            "threads", ok=not reasons, reason="; ".join(reasons)[:2000],
            details={"watched": {w.name: w.as_dict() for w in watched},
                     "restarts_total": sum(w.restarts for w in watched)})
