"""The actuators' memory: which rungs are in force now, and every action ever taken (the audit).

Kept in SQLite next to the incidents so that a restarted agent knows what it did: it neither
cordons or evicts twice after a crash nor forgets to undo a lever it applied before it died.
Each rung in force carries the data its step needs to undo it (the previous cpu.idle value,
whether the node was already cordoned by a human).

Write-ahead: before a step changes anything it records an *intent* (what it is about to change
and the values from before), durably; the rung's record, its audit entry and the removal of
the intent are then written in one transaction. An intent left over is a step the agent died
in (or could not record): the ladder reconciles it before anything else (actuators/ladder.py,
`_reconcile`). Every write here passes a failpoint (sloguard/core/failpoints.py) for the
crash sweep.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sloguard.core import failpoints
from sloguard.core.audit import AuditEntry
from sloguard.store.filters import audit_page
from sloguard.store.sqlite import add_column, open_db

__all__ = ["AuditEntry", "Descent", "Intent", "Ledger", "RungState"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS rungs (
    policy TEXT NOT NULL,
    rung INTEGER NOT NULL,
    kind TEXT NOT NULL,
    status TEXT NOT NULL,
    incident TEXT NOT NULL,
    dry_run INTEGER NOT NULL,
    undo TEXT NOT NULL,
    applied_ns INTEGER NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 1,
    retry_ns INTEGER NOT NULL DEFAULT 0,
    spec TEXT NOT NULL,
    target TEXT NOT NULL,
    last_ns INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (policy, rung)
);
CREATE TABLE IF NOT EXISTS episodes (
    policy TEXT PRIMARY KEY,
    lever_order TEXT NOT NULL,
    started_ns INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS descents (
    policy TEXT PRIMARY KEY,
    firing INTEGER NOT NULL,
    came_down_ns INTEGER,
    relapses INTEGER NOT NULL,
    undo_due_ns INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS levers (
    kind TEXT PRIMARY KEY,
    tried INTEGER NOT NULL DEFAULT 0,
    worked INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS audit (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    time_ns INTEGER NOT NULL,
    node TEXT NOT NULL,
    incident TEXT NOT NULL,
    policy TEXT NOT NULL,
    rung INTEGER NOT NULL,
    kind TEXT NOT NULL,
    action TEXT NOT NULL,
    dry_run INTEGER NOT NULL,
    status TEXT NOT NULL,
    target TEXT NOT NULL,
    detail TEXT NOT NULL,
    reason TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS intents (
    policy TEXT NOT NULL,
    rung INTEGER NOT NULL,
    kind TEXT NOT NULL,
    incident TEXT NOT NULL,
    spec TEXT NOT NULL,
    undo TEXT NOT NULL,
    started_ns INTEGER NOT NULL,
    PRIMARY KEY (policy, rung)
);
CREATE TABLE IF NOT EXISTS clock (
    name TEXT PRIMARY KEY,
    value INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS audit_by_time ON audit (time_ns);
CREATE INDEX IF NOT EXISTS audit_by_kind ON audit (kind, status, time_ns);
"""
_RUNG_COLUMNS = ("policy, rung, kind, status, incident, dry_run, undo, applied_ns, attempts, "
                 "retry_ns, spec, target, last_ns")


class _Stored(str):
    """A column's JSON as the ledger holds it, not yet decoded."""


class _DecodedOnRead:
    """A RungState field given as the ledger's JSON and decoded on its first read, for that
    object alone. `Ledger.rungs()` runs 3-4 times a tick and each row's undo holds a record
    per BE cgroup (18 KB for 90: 110 us to decode, 4 times a tick), yet most callers read
    only a row's policy, kind and status (a standing lever's full check and an undo read the
    rest). Each call still makes new objects decoded from the stored text, so a caller that
    changes a row before a write that fails changes nothing another caller sees
    (tests/test_ledger_rows.py). Measured with benchmarks/agent_tick.py ("ladder")."""

    def __init__(self, *default: Any) -> None:
        self.default = default  # none: the field has no default (dataclasses asks __get__)

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        if obj is None:
            if self.default:
                return self.default[0]
            raise AttributeError(self.name)
        value = obj.__dict__[self.name]
        if type(value) is _Stored:
            value = obj.__dict__[self.name] = json.loads(value)
        return value

    def __set__(self, obj: Any, value: Any) -> None:
        obj.__dict__[self.name] = value


@dataclass
class RungState:
    policy: str
    rung: int
    kind: str
    status: str  # done | proposed | skipped | failed
    incident: str
    dry_run: bool
    undo: dict[str, Any] = _DecodedOnRead()  # type: ignore[assignment]
    applied_ns: int  # the first attempt: the next rung's `after` runs from here
    attempts: int = 1
    retry_ns: int = 0
    # the step as configured, to undo it even if the policy file changed since
    spec: dict[str, Any] | None = _DecodedOnRead(None)  # type: ignore[assignment]
    target: str = ""
    last_ns: int = 0  # the latest attempt (a retry, a repeat); `repeat` runs from here


@dataclass(frozen=True)
class Descent:
    """Where a policy is between episodes, kept so that a restart neither forgets a relapse
    back-off nor takes a restart for a relapse."""

    firing: bool = False  # an incident under the policy fired on the last tick
    came_down_ns: int | None = None  # when its incidents last stopped firing
    relapses: int = 0  # relapses in a row
    undo_due_ns: int = 0  # nothing is lifted before this


@dataclass
class Intent:
    """A change a step is about to make (or was making when the agent died): enough to undo it
    (`undo`, in the step's own undo format, with the values from before) or to find out whether
    it happened."""

    policy: str
    rung: int
    kind: str
    incident: str
    spec: dict[str, Any]
    undo: dict[str, Any]
    started_ns: int


def _plain(value: Any) -> Any:
    """What a step's undo data holds beyond JSON (a set, a path, a time), as JSON can keep it:
    a rung applied for real is recorded in force whatever it returned, never lost (and so
    applied again on the next tick)."""
    if isinstance(value, set | frozenset):
        return list(value)
    return str(value)


def _migrate(conn: sqlite3.Connection) -> None:
    add_column(conn, "rungs", "last_ns", "INTEGER NOT NULL DEFAULT 0")  # repeats timed apart
    add_column(conn, "audit", "source_id", "INTEGER")  # a cluster server's copy: id on its node
    conn.execute("CREATE UNIQUE INDEX IF NOT EXISTS audit_by_source ON audit (node, source_id)")


class Ledger:
    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._conn = open_db(self.path, _SCHEMA, "the actuator ledger", migrate=_migrate)

    # -- rungs in force --------------------------------------------------------------------

    def rungs(self, policy: str | None = None) -> list[RungState]:
        query = f"SELECT {_RUNG_COLUMNS} FROM rungs" + (" WHERE policy = ?" if policy else "")
        with self._lock:
            rows = self._conn.execute(query + " ORDER BY policy, rung",
                                      (policy,) if policy else ()).fetchall()
        return [RungState(r[0], r[1], r[2], r[3], r[4], bool(r[5]), _Stored(r[6]), r[7], r[8],
                          r[9], _Stored(r[10]), r[11], r[12]) for r in rows]

    def put(self, state: RungState) -> None:
        self.settle(put=state)

    def remove(self, policy: str, rung: int) -> None:
        self.settle(remove=(policy, rung))

    def settle(self, put: RungState | None = None, remove: tuple[str, int] | None = None,
               audit: AuditEntry | None = None, intent_done: tuple[str, int] | None = None
               ) -> None:
        """The outcome of one step, all or nothing: the rung's record (or its removal), its
        audit entry, and the end of its intent. A crash between a rung's record and its audit
        entry would lose an eviction from the budget; between the record and the intent's end,
        reconcile a lever twice."""
        statements: list[tuple[str, tuple[Any, ...]]] = []
        if put is not None:
            statements.append((
                f"INSERT OR REPLACE INTO rungs ({_RUNG_COLUMNS}) VALUES "
                "(?,?,?,?,?,?,?,?,?,?,?,?,?)",
                (put.policy, put.rung, put.kind, put.status, put.incident,
                 int(put.dry_run), json.dumps(put.undo, default=_plain), put.applied_ns,
                 put.attempts, put.retry_ns, json.dumps(put.spec or {}, default=_plain),
                 put.target, put.last_ns or put.applied_ns)))
        if remove is not None:
            statements.append(("DELETE FROM rungs WHERE policy = ? AND rung = ?", remove))
        if audit is not None:
            statements.append(_audit_insert(audit))
        if intent_done is not None:
            statements.append(("DELETE FROM intents WHERE policy = ? AND rung = ?", intent_done))
        self._write("settle", statements)

    def _write(self, what: str, statements: list[tuple[str, tuple[Any, ...]]]) -> int:
        """One transaction, between failpoints; on any error nothing of it is kept. The rows
        it changed."""
        if not statements:
            return 0
        failpoints.hit(f"ledger.{what}:before")
        changed = 0
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                for sql, args in statements:
                    changed += self._conn.execute(sql, args).rowcount
                self._conn.execute("COMMIT")
            except BaseException:
                if self._conn.in_transaction:
                    self._conn.execute("ROLLBACK")
                raise
        failpoints.hit(f"ledger.{what}:after")
        return changed

    # -- intents (write-ahead) ---------------------------------------------------------------

    def intend(self, intent: Intent) -> None:
        """Durable before the change it announces; raises when it cannot be written, and then
        the step must not make the change."""
        self._write("intend", [(
            "INSERT OR REPLACE INTO intents (policy, rung, kind, incident, spec, undo, "
            "started_ns) VALUES (?,?,?,?,?,?,?)",
            (intent.policy, intent.rung, intent.kind, intent.incident,
             json.dumps(intent.spec, default=_plain), json.dumps(intent.undo, default=_plain),
             intent.started_ns))])

    def intents(self) -> list[Intent]:
        with self._lock:
            rows = self._conn.execute(
                "SELECT policy, rung, kind, incident, spec, undo, started_ns FROM intents "
                "ORDER BY started_ns, policy, rung").fetchall()
        return [Intent(r[0], r[1], r[2], r[3], json.loads(r[4]), json.loads(r[5]), r[6])
                for r in rows]

    def drop_intent(self, policy: str, rung: int) -> None:
        self._write("drop_intent", [("DELETE FROM intents WHERE policy = ? AND rung = ?",
                                     (policy, rung))])


    # -- episodes and learning ---------------------------------------------------------------

    def episode(self, policy: str) -> list[str] | None:
        with self._lock:
            row = self._conn.execute("SELECT lever_order FROM episodes WHERE policy = ?",
                                     (policy,)).fetchone()
        return None if row is None else json.loads(row[0])

    def timer_skew(self) -> int:
        """How far wall time ran ahead of the ladder's timers when last saved (ns)."""
        with self._lock:
            row = self._conn.execute("SELECT value FROM clock WHERE name = 'skew'").fetchone()
        return int(row[0]) if row else 0

    def put_timer_skew(self, skew_ns: int) -> None:
        self._write("put_timer_skew", [("INSERT OR REPLACE INTO clock VALUES ('skew', ?)",
                                        (int(skew_ns),))])

    def open_episodes(self) -> list[str]:
        with self._lock:
            return [r[0] for r in self._conn.execute("SELECT policy FROM episodes")]

    def start_episode(self, policy: str, lever_order: list[str], now_ns: int) -> None:
        self._write("start_episode", [("INSERT OR REPLACE INTO episodes VALUES (?,?,?)",
                                       (policy, json.dumps(lever_order), now_ns))])

    def end_episode(self, policy: str) -> None:
        self._write("end_episode", [("DELETE FROM episodes WHERE policy = ?", (policy,))])

    def descents(self) -> dict[str, Descent]:
        with self._lock:
            rows = self._conn.execute("SELECT policy, firing, came_down_ns, relapses, "
                                      "undo_due_ns FROM descents").fetchall()
        return {r[0]: Descent(firing=bool(r[1]), came_down_ns=r[2], relapses=r[3],
                              undo_due_ns=r[4]) for r in rows}

    def put_descent(self, policy: str, descent: Descent) -> None:
        """A policy with nothing to remember has no row, so the table holds only policies
        between episodes and does not grow with every policy ever loaded."""
        if descent == Descent():
            self._write("put_descent", [("DELETE FROM descents WHERE policy = ?", (policy,))])
            return
        self._write("put_descent", [("INSERT OR REPLACE INTO descents VALUES (?,?,?,?,?)",
                                     (policy, int(descent.firing), descent.came_down_ns,
                                      descent.relapses, descent.undo_due_ns))])

    def lever_record(self, kind: str, worked: bool) -> None:
        self._write("lever_record", [(
            "INSERT INTO levers (kind, tried, worked) VALUES (?, 1, ?) ON CONFLICT(kind) DO "
            "UPDATE SET tried = tried + 1, worked = worked + excluded.worked",
            (kind, int(worked)))])

    def lever_stats(self) -> dict[str, tuple[int, int]]:
        """kind -> (tried, worked) on this node."""
        with self._lock:
            rows = self._conn.execute("SELECT kind, tried, worked FROM levers").fetchall()
        return {kind: (tried, worked) for kind, tried, worked in rows}

    # -- audit -------------------------------------------------------------------------------

    def audit(self, entry: AuditEntry) -> None:
        self._write("audit", [_audit_insert(entry)])

    def prune_audit(self, before_ns: int, batch: int = 5000) -> int:
        """Drop the audit entries older than `before_ns` (the table would grow forever), a
        batch per transaction so that a large backlog never holds the ledger for long."""
        pruned = 0
        while True:
            deleted = self._write("prune_audit", [(
                "DELETE FROM audit WHERE id IN (SELECT id FROM audit WHERE time_ns < ? "
                "ORDER BY id LIMIT ?)", (before_ns, batch))])
            pruned += deleted
            if deleted < batch:
                return pruned

    def audit_after(self, after_id: int, limit: int = 100) -> list[AuditEntry]:
        """Entries recorded after id `after_id`, oldest first (what a forwarder sends)."""
        with self._lock:
            rows = self._conn.execute(
                "SELECT time_ns, node, incident, policy, rung, kind, action, dry_run, status, "
                "target, detail, reason, id FROM audit WHERE id > ? ORDER BY id LIMIT ?",
                (after_id, limit)).fetchall()
        return [AuditEntry(r[0], r[1], r[2], r[3], r[4], r[5], r[6], bool(r[7]), r[8], r[9],
                           r[10], r[11], r[12]) for r in rows]

    def last_audit_id(self) -> int:
        """The newest audit entry's id (0 when there is none)."""
        with self._lock:
            return int(self._conn.execute("SELECT COALESCE(MAX(id), 0) FROM audit")
                       .fetchone()[0])

    def count_after(self, after_id: int) -> int:
        with self._lock:
            return int(self._conn.execute(
                "SELECT count(*) FROM audit WHERE id > ?", (after_id,)).fetchone()[0])

    def import_audit(self, entry: AuditEntry, source_id: int) -> bool:
        """Keep an entry another node recorded as its `source_id`, once: False when it is
        already here (a resend)."""
        with self._lock:
            cursor = self._conn.execute(
                "INSERT OR IGNORE INTO audit (time_ns, node, incident, policy, rung, kind, "
                "action, dry_run, status, target, detail, reason, source_id) "
                "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
                (entry.time_ns, entry.node, entry.incident, entry.policy, entry.rung, entry.kind,
                 entry.action, int(entry.dry_run), entry.status, entry.target, entry.detail,
                 entry.reason, source_id))
            return cursor.rowcount == 1

    def audit_log(self, since_ns: int = 0, kind: str | None = None, incident: str | None = None,
                  limit: int = 500) -> list[AuditEntry]:
        tail, params = audit_page("?", limit, since_ns=since_ns, kind=kind, incident=incident)
        with self._lock:
            rows = self._conn.execute(
                "SELECT time_ns, node, incident, policy, rung, kind, action, dry_run, status, "
                f"target, detail, reason, id FROM audit {tail}", params).fetchall()
        return [AuditEntry(r[0], r[1], r[2], r[3], r[4], r[5], r[6], bool(r[7]), r[8], r[9],
                           r[10], r[11], r[12]) for r in rows]

    def count(self, kind: str, status: str, since_ns: int, incident: str | None = None) -> int:
        """How many `kind` actions ended in `status` since then (budgets, rate limits)."""
        query = ("SELECT COUNT(*) FROM audit WHERE kind = ? AND status = ? AND action = 'apply' "
                 "AND time_ns >= ?")
        args: list[Any] = [kind, status, since_ns]
        if incident:
            query += " AND incident = ?"
            args.append(incident)
        with self._lock:
            return int(self._conn.execute(query, args).fetchone()[0])

    def close(self) -> None:
        with self._lock:
            self._conn.close()


def _audit_insert(entry: AuditEntry) -> tuple[str, tuple[Any, ...]]:
    return ("INSERT INTO audit (time_ns, node, incident, policy, rung, kind, action, dry_run, "
            "status, target, detail, reason) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
            (entry.time_ns, entry.node, entry.incident, entry.policy, entry.rung, entry.kind,
             entry.action, int(entry.dry_run), entry.status, entry.target, entry.detail,
             entry.reason))
