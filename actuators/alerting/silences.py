"""Silences: a set of matchers, who set it and why, and when it ends.

As in Alertmanager, a silence mutes every alert all its matchers match while it is active
(between its start and its end); expiring it ends it now, and the alerts it muted that still
fire are notified at their group's next flush. Silences are kept (expired ones for a week) so
the UI and the CLI can show what was muted, by whom and why.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from dataclasses import asdict, dataclass, field
from typing import Any

from sloguard.actuators.alerting.db import AlertDB
from sloguard.core.selectors import Matcher, parse_matchers

SCHEMA = """
CREATE TABLE IF NOT EXISTS silences (
    id TEXT PRIMARY KEY,
    matchers TEXT NOT NULL,
    starts_ns INTEGER NOT NULL,
    ends_ns INTEGER NOT NULL,
    created_by TEXT NOT NULL,
    comment TEXT NOT NULL,
    created_ns INTEGER NOT NULL,
    updated_ns INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS silences_by_end ON silences (ends_ns);
"""

PENDING, ACTIVE, EXPIRED = "pending", "active", "expired"
SILENCE_STATES = (PENDING, ACTIVE, EXPIRED)
KEEP_EXPIRED_NS = 7 * 86400 * 10**9
MAX_TEXT = 1000


class SilenceError(ValueError):
    """A silence that cannot be created as asked; the message says why."""


@dataclass
class Silence:
    id: str
    matchers: list[str]
    starts_ns: int
    ends_ns: int
    created_by: str
    comment: str
    created_ns: int
    updated_ns: int
    _parsed: tuple[Matcher, ...] = field(default=(), repr=False, compare=False)

    def state(self, now_ns: int) -> str:
        if now_ns >= self.ends_ns:
            return EXPIRED
        return PENDING if now_ns < self.starts_ns else ACTIVE

    def matches(self, labels: dict[str, str]) -> bool:
        if not self._parsed:
            self._parsed = parse_matchers(self.matchers)
        return all(m.matches(labels) for m in self._parsed)

    def as_dict(self, now_ns: int | None = None) -> dict[str, Any]:
        out = {k: v for k, v in asdict(self).items() if not k.startswith("_")}
        out["state"] = self.state(now_ns or time.time_ns())
        return out


class SilenceStore:
    def __init__(self, db: AlertDB) -> None:
        self.db = db
        self._lock = threading.Lock()
        self._cache: list[Silence] | None = None
        self._version = -1

    def add(self, matchers: list[str], ends_ns: int, created_by: str, comment: str,
            starts_ns: int | None = None, now_ns: int | None = None) -> Silence:
        """Validate and store a silence; SilenceError says what is wrong."""
        now_ns = now_ns or time.time_ns()
        starts_ns = starts_ns or now_ns
        matchers = [m.strip() for m in matchers if m and m.strip()]
        try:
            parsed = parse_matchers(matchers)
        except ValueError as exc:
            raise SilenceError(str(exc)) from None
        if not parsed:
            raise SilenceError("a silence needs at least one matcher, e.g. alertname=\"X\"")
        if all(m.matches({}) for m in parsed):
            # Alertmanager's rule: a silence whose matchers all match an empty label set would
            # silence every alert.
            raise SilenceError("at least one matcher must not match an empty label (this "
                               "silence would mute every alert)")
        created_by, comment = created_by.strip(), comment.strip()
        if not created_by:
            raise SilenceError("a silence needs an author (created_by)")
        if not comment:
            raise SilenceError("a silence needs a comment: why is this muted?")
        if len(created_by) > MAX_TEXT or len(comment) > MAX_TEXT:
            raise SilenceError(f"author and comment are limited to {MAX_TEXT} characters")
        if ends_ns <= starts_ns:
            raise SilenceError("a silence must end after it starts")
        if ends_ns <= now_ns:
            raise SilenceError("a silence must end in the future")
        silence = Silence(uuid.uuid4().hex, [str(m) for m in parsed], starts_ns, ends_ns,
                          created_by, comment, now_ns, now_ns)
        with self.db.transaction() as conn:
            conn.execute("INSERT INTO silences VALUES (?,?,?,?,?,?,?,?)",
                         (silence.id, json.dumps(silence.matchers), starts_ns, ends_ns,
                          created_by, comment, now_ns, now_ns))
        self._invalidate()
        return silence

    def expire(self, silence_id: str, now_ns: int | None = None) -> Silence | None:
        """End a silence now; None when there is no such silence. Expiring an expired silence
        changes nothing."""
        now_ns = now_ns or time.time_ns()
        silence = self.get(silence_id)
        if silence is None:
            return None
        if silence.state(now_ns) != EXPIRED:
            starts = min(silence.starts_ns, now_ns)
            self.db.execute("UPDATE silences SET ends_ns = ?, starts_ns = ?, updated_ns = ? "
                            "WHERE id = ?", (now_ns, starts, now_ns, silence_id))
            silence.ends_ns, silence.starts_ns, silence.updated_ns = now_ns, starts, now_ns
            self._invalidate()
        return silence

    def get(self, silence_id: str) -> Silence | None:
        rows = self.db.rows("SELECT * FROM silences WHERE id = ?", (silence_id,))
        return _silence(rows[0]) if rows else None

    def list(self, state: str | None = None, now_ns: int | None = None) -> list[Silence]:
        """Newest first; `state` filters (pending, active, expired)."""
        now_ns = now_ns or time.time_ns()
        found = [_silence(r) for r in self.db.rows(
            "SELECT * FROM silences ORDER BY created_ns DESC")]
        return [s for s in found if state is None or s.state(now_ns) == state]

    def silencing(self, labels: dict[str, str], now_ns: int) -> list[str]:
        """Ids of the active silences that mute an alert with these labels."""
        return [s.id for s in self._current() if s.state(now_ns) == ACTIVE and s.matches(labels)]

    def gc(self, now_ns: int) -> int:
        return self.db.execute("DELETE FROM silences WHERE ends_ns < ?",
                               (now_ns - KEEP_EXPIRED_NS,))

    def _current(self) -> list[Silence]:
        """Every stored silence, re-read when anyone (another process too) changed them."""
        version = self.db.version()
        with self._lock:
            if self._cache is None or version != self._version:
                self._version = version
                self._cache = [_silence(r) for r in self.db.rows("SELECT * FROM silences")]
            return self._cache

    def _invalidate(self) -> None:
        with self._lock:
            self._cache = None


def _silence(row: tuple[Any, ...]) -> Silence:
    return Silence(row[0], json.loads(row[1]), row[2], row[3], row[4], row[5], row[6], row[7])
