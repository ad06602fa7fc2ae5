"""Incidents persisted in SQLite next to the samples, so they survive a restart.

Each incident is stored whole as JSON (its shape grows with every issue) with the columns the UI
filters on kept beside it.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections import Counter
from pathlib import Path

from sloguard.core.incidents import RESOLVED, STATES, Incident
from sloguard.store.sqlite import add_column, open_db

_SCHEMA = """
CREATE TABLE IF NOT EXISTS incidents (
    id TEXT PRIMARY KEY,
    fingerprint TEXT NOT NULL,
    state TEXT NOT NULL,
    severity TEXT NOT NULL,
    rule TEXT NOT NULL,
    node TEXT NOT NULL,
    started_ns INTEGER NOT NULL,
    updated_ns INTEGER NOT NULL,
    doc TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS incidents_by_state ON incidents (state, started_ns);
CREATE INDEX IF NOT EXISTS incidents_by_time ON incidents (started_ns);
"""


def _migrate(conn: sqlite3.Connection) -> None:
    add_column(conn, "incidents", "seq", "INTEGER NOT NULL DEFAULT 0")  # changes numbered
    conn.execute("CREATE INDEX IF NOT EXISTS incidents_by_seq ON incidents (seq)")


class IncidentStore:
    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._conn = open_db(self.path, _SCHEMA, "the incident store", migrate=_migrate)

    def save(self, incident: Incident) -> None:
        incident.compact()  # the ladder appends actions itself: bounded here, on every save
        row = (
            incident.id, incident.fingerprint, incident.state, incident.severity, incident.rule,
            incident.node, incident.started_ns, incident.updated_ns,
            json.dumps(incident.to_dict(), separators=(",", ":")),
        )
        with self._lock:  # seq numbers every change: what a forwarder's cursor follows
            self._conn.execute(
                "INSERT OR REPLACE INTO incidents (id, fingerprint, state, severity, rule, node, "
                "started_ns, updated_ns, doc, seq) VALUES (?,?,?,?,?,?,?,?,?,"
                "(SELECT coalesce(max(seq), 0) + 1 FROM incidents))", row)

    def changed_since(self, seq: int, node: str | None = None,
                      limit: int = 100) -> list[tuple[int, Incident]]:
        """Incidents saved after change number `seq` (of `node`), oldest change first, each with
        its change number."""
        where, params = "seq > ?", [seq]
        if node is not None:
            where += " AND node = ?"
            params.append(node)
        with self._lock:
            rows = self._conn.execute(
                f"SELECT seq, doc FROM incidents WHERE {where} ORDER BY seq LIMIT ?",
                (*params, limit)).fetchall()
        return [(n, Incident.from_dict(json.loads(doc))) for n, doc in rows]

    def count_changed_since(self, seq: int, node: str | None = None) -> int:
        where, params = "seq > ?", [seq]
        if node is not None:
            where += " AND node = ?"
            params.append(node)
        with self._lock:
            return int(self._conn.execute(
                f"SELECT count(*) FROM incidents WHERE {where}", params).fetchone()[0])

    def updated_ns_of(self, incident_id: str) -> int | None:
        with self._lock:
            row = self._conn.execute(
                "SELECT updated_ns FROM incidents WHERE id = ?", (incident_id,)).fetchone()
        return row[0] if row else None

    def prune(self, resolved_before_ns: int, limit: int = 10_000) -> int:
        """Delete incidents resolved before `resolved_before_ns` (at most `limit` per call, so
        one call never holds the lock for long); returns how many went."""
        with self._lock:
            cursor = self._conn.execute(
                "DELETE FROM incidents WHERE id IN (SELECT id FROM incidents WHERE state = ? "
                "AND updated_ns < ? LIMIT ?)", (RESOLVED, resolved_before_ns, limit))
        return cursor.rowcount

    def delete(self, incident_id: str) -> None:
        with self._lock:
            self._conn.execute("DELETE FROM incidents WHERE id = ?", (incident_id,))

    def get(self, incident_id: str) -> Incident | None:
        with self._lock:
            row = self._conn.execute(
                "SELECT doc FROM incidents WHERE id = ?", (incident_id,)
            ).fetchone()
        return Incident.from_dict(json.loads(row[0])) if row else None

    def query(
        self,
        state: str | None = None,
        severity: str | None = None,
        rule: str | None = None,
        node: str | None = None,
        since_ns: int | None = None,
        until_ns: int | None = None,
        limit: int = 100,
    ) -> list[Incident]:
        clauses, params = [], []
        for column, value in (("state", state), ("severity", severity), ("rule", rule),
                              ("node", node)):
            if value is not None:
                clauses.append(f"{column} = ?")
                params.append(value)
        if since_ns is not None:
            clauses.append("started_ns >= ?")
            params.append(since_ns)
        if until_ns is not None:
            clauses.append("started_ns < ?")
            params.append(until_ns)
        where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
        with self._lock:
            rows = self._conn.execute(
                f"SELECT doc FROM incidents {where} ORDER BY started_ns DESC LIMIT ?",
                (*params, limit),
            ).fetchall()
        return [Incident.from_dict(json.loads(doc)) for (doc,) in rows]

    def open_incidents(self) -> list[Incident]:
        with self._lock:
            rows = self._conn.execute(
                "SELECT doc FROM incidents WHERE state != ?", (RESOLVED,)
            ).fetchall()
        return [Incident.from_dict(json.loads(doc)) for (doc,) in rows]

    def counts_by_state(self) -> dict[str, int]:
        with self._lock:
            rows = self._conn.execute(
                "SELECT state, count(*) FROM incidents GROUP BY state"
            ).fetchall()
        counts = Counter({state: 0 for state in STATES})
        counts.update(dict(rows))
        return dict(counts)

    def close(self) -> None:
        with self._lock:
            self._conn.close()
