"""Incidents persisted in SQLite next to the samples, so they survive a restart.

Each incident is stored whole as JSON (its shape grows with every issue) with the columns the UI
filters on kept beside it.

Beside them, `changes` numbers what a forwarder (sloguard/forwarder.py) must send, one row per
incident: its latest change, or its deletion (a tombstone, so that the cluster server withdraws
a pending incident that never fired). The numbers come from AUTOINCREMENT, which never hands out
a number twice, even after the row holding the highest is deleted (`max(seq) + 1` did, and a
forwarder whose cursor had passed that number skipped the next change). The incident's row and
its change are written in one transaction under SQLite's single-writer lock, so numbers are
committed in the order they are handed out: a reader never sees 12 while 11 is still to come,
and a cursor that passed a number has seen everything below it.

A firing incident is saved on every evaluation, with one more piece of evidence and a new
`updated_ns`. That alone is not a change worth sending every interval: a save is numbered anew
only when something other than the evidence and `updated_ns` differs (state, actions,
annotations, quiet, suspects...), or when the incident was last numbered `refresh` ago, so that
a copy elsewhere trails the latest evidence by at most that.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NamedTuple

from sloguard.core.incidents import RESOLVED, STATES, Incident
from sloguard.store.filters import incident_page
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
CREATE TABLE IF NOT EXISTS changes (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    node TEXT NOT NULL,
    deleted INTEGER NOT NULL DEFAULT 0,
    time_ns INTEGER NOT NULL,
    digest TEXT NOT NULL DEFAULT ''
);
CREATE INDEX IF NOT EXISTS changes_by_node ON changes (node, seq);
"""
# changes.time_ns: the incident's updated_ns when it was last numbered (for a tombstone, when
# it was deleted); changes.digest: what, beyond evidence and updated_ns, it held then.

REFRESH_S = 60.0
# What a save adds on every evaluation of a firing incident: not a change by itself.
_NOT_NEWS = ("updated_ns", "evidence")


def _migrate(conn: sqlite3.Connection) -> None:
    """Older files: the `seq` column once numbered changes in place. Each incident without a
    row in `changes` gets one, keeping its old number (a forwarder's cursor counts in those)
    and numbered anew after them if it had none (saved before numbering existed)."""
    add_column(conn, "incidents", "seq", "INTEGER NOT NULL DEFAULT 0")
    conn.execute("DROP INDEX IF EXISTS incidents_by_seq")  # no longer read: one less to write
    conn.execute("BEGIN IMMEDIATE")
    try:
        conn.execute(
            "INSERT OR IGNORE INTO changes (seq, id, node, time_ns) SELECT seq, id, node, "
            "updated_ns FROM incidents WHERE seq > 0 AND id NOT IN (SELECT id FROM changes) "
            "ORDER BY seq")
        conn.execute(
            "INSERT OR IGNORE INTO changes (id, node, time_ns) SELECT id, node, updated_ns "
            "FROM incidents WHERE id NOT IN (SELECT id FROM changes) ORDER BY started_ns")
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise


def _digest(doc: dict[str, Any]) -> str:
    """What a copy elsewhere must be told about: the document but for the evidence and time
    every evaluation of a firing incident adds."""
    news = {k: v for k, v in doc.items() if k not in _NOT_NEWS}
    return hashlib.blake2b(json.dumps(news, sort_keys=True, separators=(",", ":")).encode(),
                           digest_size=16).hexdigest()


class Change(NamedTuple):
    """One numbered change: the incident as it is now, or None when it was deleted."""

    seq: int
    id: str
    incident: Incident | None

class IncidentStore:
    def __init__(self, path: Path, refresh_s: float = REFRESH_S) -> None:
        self.path = Path(path)
        self.refresh_ns = int(refresh_s * 1e9)
        self._lock = threading.Lock()
        self._conn = open_db(self.path, _SCHEMA, "the incident store", migrate=_migrate)

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        """One write transaction (the caller holds the lock): the incident and its change are
        committed together or not at all, whenever the process dies."""
        self._conn.execute("BEGIN IMMEDIATE")
        try:
            yield self._conn
            self._conn.execute("COMMIT")
        except BaseException:
            if self._conn.in_transaction:  # a failed COMMIT leaves it open
                self._conn.execute("ROLLBACK")
            raise

    def save(self, incident: Incident) -> None:
        """Persist the incident; number it as a change if it is news (see the module's doc)."""
        incident.compact()  # the ladder appends actions itself: bounded here, on every save
        doc = incident.to_dict()
        digest = _digest(doc)
        row = (
            incident.id, incident.fingerprint, incident.state, incident.severity, incident.rule,
            incident.node, incident.started_ns, incident.updated_ns,
            json.dumps(doc, separators=(",", ":")),
        )
        with self._lock, self._transaction() as conn:
            conn.execute(
                "INSERT OR REPLACE INTO incidents (id, fingerprint, state, severity, rule, node, "
                "started_ns, updated_ns, doc) VALUES (?,?,?,?,?,?,?,?,?)", row)
            held = conn.execute("SELECT deleted, time_ns, digest FROM changes WHERE id = ?",
                                (incident.id,)).fetchone()
            if (held is not None and not held[0] and held[2] == digest
                    and abs(incident.updated_ns - held[1]) < self.refresh_ns):
                return  # only more evidence, numbered recently: the doc is newer, not news
            # REPLACE drops the old row: the new one takes a number never used before
            conn.execute("INSERT OR REPLACE INTO changes (id, node, deleted, time_ns, digest) "
                         "VALUES (?,?,0,?,?)",
                         (incident.id, incident.node, incident.updated_ns, digest))

    def changed_since(self, seq: int, node: str | None = None,
                      limit: int = 100) -> list[Change]:
        """The changes numbered after `seq` (of `node`'s incidents), oldest first: each incident
        once, as it is now, or None if it was deleted since."""
        where, params = "c.seq > ?", [seq]
        if node is not None:
            where += " AND c.node = ?"
            params.append(node)
        with self._lock:
            rows = self._conn.execute(
                f"SELECT c.seq, c.id, c.deleted, i.doc FROM changes c LEFT JOIN incidents i "
                f"ON i.id = c.id WHERE {where} ORDER BY c.seq LIMIT ?",
                (*params, limit)).fetchall()
        out = []
        for n, incident_id, deleted, doc in rows:
            if doc is None and not deleted:
                continue  # cannot be (deleted with its incident); nothing to send if it were
            out.append(Change(n, incident_id,
                              None if deleted else Incident.from_dict(json.loads(doc))))
        return out

    def count_changed_since(self, seq: int, node: str | None = None) -> int:
        where, params = "seq > ?", [seq]
        if node is not None:
            where += " AND node = ?"
            params.append(node)
        with self._lock:
            return int(self._conn.execute(
                f"SELECT count(*) FROM changes WHERE {where}", params).fetchone()[0])

    def last_seq(self) -> int:
        """The highest change number ever handed out (kept by SQLite even after its row is
        gone): a forwarder's cursor above it means the store is not the one it counted in."""
        with self._lock:
            row = self._conn.execute(
                "SELECT seq FROM sqlite_sequence WHERE name = 'changes'").fetchone()
        return int(row[0]) if row else 0

    def updated_ns_of(self, incident_id: str) -> int | None:
        with self._lock:
            row = self._conn.execute(
                "SELECT updated_ns FROM incidents WHERE id = ?", (incident_id,)).fetchone()
        return row[0] if row else None

    def updated_ns_and_node_of(self, incident_id: str) -> tuple[int, str] | None:
        """The held copy's updated_ns and node: the cluster server keeps an incident from
        being overwritten by an older copy, or by another node sending its id."""
        with self._lock:
            row = self._conn.execute(
                "SELECT updated_ns, node FROM incidents WHERE id = ?", (incident_id,)).fetchone()
        return (row[0], row[1]) if row else None

    def prune(self, resolved_before_ns: int, limit: int = 10_000) -> int:
        """Delete incidents resolved before `resolved_before_ns` (at most `limit` per call, so
        one call never holds the lock for long); returns how many went. Retention is not a
        withdrawal: they leave no tombstone (a copy elsewhere keeps its own retention). Older
        tombstones go too: a forwarder that has not sent one in that long never will."""
        with self._lock, self._transaction() as conn:
            ids = [(i,) for (i,) in conn.execute(
                "SELECT id FROM incidents WHERE state = ? AND updated_ns < ? LIMIT ?",
                (RESOLVED, resolved_before_ns, limit))]
            conn.executemany("DELETE FROM incidents WHERE id = ?", ids)
            conn.executemany("DELETE FROM changes WHERE id = ?", ids)
            conn.execute("DELETE FROM changes WHERE deleted = 1 AND time_ns < ?",
                         (resolved_before_ns,))
        return len(ids)

    def delete(self, incident_id: str, node: str | None = None) -> bool:
        """Delete an incident (of `node`, when given) and record the deletion as a change, so a
        forwarder withdraws it where it was sent. False if there was no such incident."""
        with self._lock, self._transaction() as conn:
            row = conn.execute("SELECT node FROM incidents WHERE id = ?",
                               (incident_id,)).fetchone()
            if row is None or (node is not None and row[0] != node):
                return False
            conn.execute("DELETE FROM incidents WHERE id = ?", (incident_id,))
            conn.execute("INSERT OR REPLACE INTO changes (id, node, deleted, time_ns) "
                         "VALUES (?,?,1,?)", (incident_id, row[0], time.time_ns()))
        return True

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
        before: tuple[int, str] | None = None,
    ) -> list[Incident]:
        """Newest first, at most `limit`; `before`: the (started_ns, id) the previous page
        ended on (keyset pagination, cluster_db.IncidentReader)."""
        tail, params = incident_page("?", limit, state=state, severity=severity, rule=rule,
                                     node=node, since_ns=since_ns, until_ns=until_ns,
                                     before=before)
        with self._lock:
            rows = self._conn.execute(f"SELECT doc FROM incidents {tail}", params).fetchall()
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
