"""The cluster server's store in PostgreSQL, shared by several replicas behind one address.

Nothing another replica needs is held in this process: the incidents, the forwarded audit
entries and the nodes' last-seen records are rows, and every read goes to the database, so
whichever replica a request reaches answers the same. Ingest is idempotent under concurrent
replicas without any lock of ours: an incident is an upsert that keeps the larger updated_ns
(PostgreSQL re-checks the condition against the row a concurrent writer committed), an audit
entry is inserted once per (node, source id) (ON CONFLICT DO NOTHING), and the node's record
adds its counts and keeps the latest times. One batch is one transaction; its rows are
written in id order so that two replicas writing overlapping batches lock rows in the same
order, and a deadlock or serialization failure (still possible against other writers) is
retried.

psycopg (3) is an optional dependency (`pip install 'sloguard[postgres]'`): imported only
when server.database is set.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from typing import Any

from sloguard.core.audit import AuditEntry
from sloguard.core.incidents import RESOLVED, STATES, Incident
from sloguard.store import StoreError
from sloguard.store.cluster_db import (
    Culprit,
    SufferingNode,
    Timeline,
    newest_per_id,
    severity_case,
    severity_named,
    timeline_of,
)
from sloguard.store.filters import audit_page, incident_page
from sloguard.store.pg_migrations import migrate

log = logging.getLogger(__name__)
RETRIES = 3
_AUDIT_COLUMNS = ("time_ns, node, incident, policy, rung, kind, action, dry_run, status, "
                  "target, detail, reason, id")

_UPSERT_INCIDENTS = """
INSERT INTO incidents (id, fingerprint, state, severity, rule, node, started_ns, updated_ns, doc)
SELECT * FROM unnest(%s::text[], %s::text[], %s::text[], %s::text[], %s::text[], %s::text[],
                     %s::bigint[], %s::bigint[], %s::text[])
ON CONFLICT (id) DO UPDATE SET
    fingerprint = excluded.fingerprint, state = excluded.state, severity = excluded.severity,
    rule = excluded.rule, node = excluded.node, started_ns = excluded.started_ns,
    updated_ns = excluded.updated_ns, doc = excluded.doc
WHERE incidents.updated_ns <= excluded.updated_ns AND incidents.node = excluded.node
RETURNING id
"""
_OTHER_NODES = "SELECT id, node FROM incidents WHERE id = ANY(%s) AND node <> %s"
_INSERT_AUDIT = """
INSERT INTO audit (node, source_id, time_ns, incident, policy, rung, kind, action, dry_run,
                   status, target, detail, reason)
SELECT * FROM unnest(%s::text[], %s::bigint[], %s::bigint[], %s::text[], %s::text[],
                     %s::integer[], %s::text[], %s::text[], %s::boolean[], %s::text[],
                     %s::text[], %s::text[], %s::text[])
ON CONFLICT ON CONSTRAINT audit_once DO NOTHING
RETURNING id
"""
# Only the sending node's own incidents: an id another node holds is left alone (ClusterDB).
_WITHDRAW = "DELETE FROM incidents WHERE id = ANY(%s::text[]) AND node = %s RETURNING id"
# A node may reach two replicas at once (a retry after a timeout): last seen is the later of
# the two, the backlog is the one of the later batch, the counts add up.
_UPSERT_NODE = """
INSERT INTO nodes (node, last_seen_ns, sent_ns, backlog, incidents, actions)
VALUES (%s, %s, %s, %s, %s, %s)
ON CONFLICT (node) DO UPDATE SET
    last_seen_ns = greatest(nodes.last_seen_ns, excluded.last_seen_ns),
    backlog = CASE WHEN excluded.sent_ns >= nodes.sent_ns THEN excluded.backlog
                   ELSE nodes.backlog END,
    sent_ns = greatest(nodes.sent_ns, excluded.sent_ns),
    incidents = nodes.incidents + excluded.incidents,
    actions = nodes.actions + excluded.actions
"""

# The fleet summary (cluster_db.ClusterDB): each an aggregate over an index (pg_migrations
# step 3), answering at most `limit` rows; `count(*) OVER ()` counts the groups before LIMIT.
# Names are ordered by code point (COLLATE "C", as SQLite and Python order them), whatever
# the database's collation, so that ties fall the same way on either store.
_SUFFERING = f"""
SELECT node, count(*), max({severity_case()}), min(coalesce(fired_ns, started_ns)),
       count(*) OVER ()
FROM incidents WHERE state = 'firing'
GROUP BY node ORDER BY 3 DESC, 2 DESC, 4, node COLLATE "C" LIMIT %s
"""
# One pass over the range's index entries: counts per (node, bucket), of which the top nodes'
# rows, everyone's per bucket and the number of nodes are sent: at most limit x buckets +
# buckets + 1 rows, however many nodes there are.
_TIMELINE = """
WITH g AS MATERIALIZED (
    SELECT node, (started_ns - %(since)s) / %(width)s AS b, count(*) AS n FROM incidents
    WHERE started_ns >= %(since)s AND started_ns < %(until)s GROUP BY node, b),
totals AS (SELECT node, sum(n) AS total FROM g GROUP BY node),
top AS (SELECT node, total FROM totals ORDER BY total DESC, node COLLATE "C"
        LIMIT %(limit)s)
SELECT 'top', node, total, NULL FROM top
UNION ALL SELECT 'node', g.node, g.b, g.n FROM g JOIN top USING (node)
UNION ALL SELECT 'bucket', NULL, b, sum(n) FROM g GROUP BY b
UNION ALL SELECT 'nodes', NULL, count(*), NULL FROM totals
"""
# A name is in an incident's `suspects` once (pg_migrations step 3), so counting rows counts
# incidents: per (name, node) first, then per name, both hashed, no DISTINCT to sort for.
_CULPRITS = """
SELECT name, sum(first), sum(named), count(*), count(*) OVER ()
FROM (SELECT name, node, count(*) FILTER (WHERE ord = 1) AS first, count(*) AS named
      FROM incidents, unnest(suspects) WITH ORDINALITY AS s(name, ord)
      WHERE started_ns >= %s AND started_ns < %s AND cardinality(suspects) > 0
      GROUP BY name, node) AS per_node
GROUP BY name ORDER BY 2 DESC, 3 DESC, name COLLATE "C" LIMIT %s
"""

def _psycopg() -> tuple[Any, Any]:
    try:
        import psycopg
        import psycopg_pool
    except ImportError as exc:
        raise StoreError("server.database: PostgreSQL needs psycopg, which is not installed: "
                         "pip install 'sloguard[postgres]'") from exc
    return psycopg, psycopg_pool


class PostgresClusterDB:
    def __init__(self, url: str, password: str | None, pool_size: int = 4,
                 where: str = "PostgreSQL") -> None:
        """Connect, migrate the schema (sloguard/store/pg_migrations.py), and open a pool of
        at most `pool_size` connections. StoreError, naming server.database and `where`
        (the URL without its password), when the database cannot be reached or is newer."""
        psycopg, psycopg_pool = _psycopg()
        self._errors = psycopg.errors
        self.where = where
        kwargs: dict[str, Any] = {"password": password} if password else {}
        kwargs["application_name"] = "sloguard-server"
        try:
            with psycopg.connect(url, autocommit=True, connect_timeout=10, **kwargs) as conn:
                found, applied = migrate(conn, where)
        except psycopg.Error as exc:
            raise StoreError(f"server.database ({where}): {_reason(exc)}") from None
        if applied:
            log.info("%s: schema at version %d (was %d)", where, applied[-1], found)
        self.pool = psycopg_pool.ConnectionPool(
            url, min_size=1, max_size=pool_size, kwargs={**kwargs, "connect_timeout": 10},
            timeout=30, name="sloguard-server", open=False,
            check=psycopg_pool.ConnectionPool.check_connection)  # a restarted server's
        try:
            self.pool.open(wait=True, timeout=30)
        except psycopg_pool.PoolTimeout as exc:
            self.pool.close()
            raise StoreError(f"server.database ({where}): no connection within 30 s") from exc
        self.incidents = PgIncidents(self.pool)
        self.ledger = PgAudit(self.pool)

    def ingest(self, node: str, incidents: list[Incident],
               actions: list[tuple[int, AuditEntry]], sent_ns: int,
               backlog: dict[str, int], withdrawn: Sequence[str] = ()) -> dict[str, int]:
        newest, dropped = newest_per_id(incidents)
        gone = sorted({i for i in withdrawn if "\x00" not in i})  # in id order, as the upsert
        for incident in newest:
            incident.compact()  # bounded as the SQLite store bounds it on every save
        docs = {i.id: json.dumps(i.to_dict(), separators=(",", ":")) for i in newest}
        ordered = sorted(actions, key=lambda pair: pair[0])
        audit_rows = [
            [e.node for _, e in ordered], [source for source, _ in ordered],
            [e.time_ns for _, e in ordered], [e.incident for _, e in ordered],
            [e.policy for _, e in ordered], [e.rung for _, e in ordered],
            [e.kind for _, e in ordered], [e.action for _, e in ordered],
            [bool(e.dry_run) for _, e in ordered], [e.status for _, e in ordered],
            [e.target for _, e in ordered], [e.detail for _, e in ordered],
            [e.reason for _, e in ordered]]
        retryable = (self._errors.DeadlockDetected, self._errors.SerializationFailure)
        for attempt in range(1, RETRIES + 1):
            try:
                with self.pool.connection() as conn, conn.transaction():
                    removed = len(conn.execute(_WITHDRAW, (gone, node)).fetchall()) \
                        if gone else 0
                    # ids another node holds are left alone (ClusterDB.ingest); the upsert's
                    # WHERE guards against one written meanwhile, counted stale then
                    foreign = {i: n for i, n in conn.execute(
                        _OTHER_NODES, ([i.id for i in newest], node)).fetchall()} \
                        if newest else {}
                    mine = [i for i in newest if i.id not in foreign]
                    written = len(conn.execute(_UPSERT_INCIDENTS, [
                        [i.id for i in mine], [i.fingerprint for i in mine],
                        [i.state for i in mine], [i.severity for i in mine],
                        [i.rule for i in mine], [i.node for i in mine],
                        [i.started_ns for i in mine], [i.updated_ns for i in mine],
                        [docs[i.id] for i in mine]]).fetchall()) if mine else 0
                    imported = len(conn.execute(_INSERT_AUDIT, audit_rows).fetchall()) \
                        if ordered else 0
                    conn.execute(_UPSERT_NODE, (node, time.time_ns(), sent_ns,
                                                json.dumps(backlog), written, imported))
                break
            except retryable as exc:
                if attempt == RETRIES:
                    raise
                log.info("ingest from %s: %s; retrying (%d/%d)", node,
                         type(exc).__name__, attempt, RETRIES)
        for incident_id, held_by in sorted(foreign.items())[:10]:
            log.warning("node %s sent incident %s, which is node %s's: left alone",
                        node[:253], incident_id[:200], held_by)
        return {"incidents": written,
                "incidents_stale": dropped + len(newest) - len(foreign) - written,
                "incidents_foreign": len(foreign),
                "actions": imported, "actions_duplicate": len(ordered) - imported,
                "withdrawn": removed, "withdrawn_unknown": len(withdrawn) - removed}

    def nodes(self) -> dict[str, dict[str, Any]]:
        with self.pool.connection() as conn:
            rows = conn.execute("SELECT node, last_seen_ns, sent_ns, backlog, incidents, "
                                "actions FROM nodes").fetchall()
        return {r[0]: {"last_seen_ns": r[1], "sent_ns": r[2], "backlog": r[3],
                       "incidents": r[4], "actions": r[5]} for r in rows}

    def suffering(self, limit: int) -> tuple[list[SufferingNode], int]:
        with self.pool.connection() as conn:
            rows = conn.execute(_SUFFERING, (limit,)).fetchall()
        return ([SufferingNode(node, n, severity_named(worst), since)
                 for node, n, worst, since, _ in rows], rows[0][4] if rows else 0)

    def started_per_node(self, since_ns: int, bucket_ns: int, buckets: int,
                         limit: int) -> Timeline:
        q = {"since": since_ns, "until": since_ns + buckets * bucket_ns, "width": bucket_ns,
             "limit": limit}
        with self.pool.connection() as conn:
            rows = conn.execute(_TIMELINE, q).fetchall()
        nodes = next((int(r[2]) for r in rows if r[0] == "nodes"), 0)
        return timeline_of(
            since_ns, bucket_ns, buckets,
            sorted(((r[1], int(r[2]), nodes) for r in rows if r[0] == "top"),
                   key=lambda t: (-t[1], t[0])),  # as ordered for LIMIT: by code point
            [(r[1], int(r[2]), int(r[3])) for r in rows if r[0] == "node"],
            [(int(r[2]), int(r[3])) for r in rows if r[0] == "bucket"])

    def culprits(self, since_ns: int, until_ns: int,
                 limit: int) -> tuple[list[Culprit], int]:
        with self.pool.connection() as conn:
            rows = conn.execute(_CULPRITS, (since_ns, until_ns, limit)).fetchall()
        return ([Culprit(name, int(first), int(named), nodes)
                 for name, first, named, nodes, _ in rows],
                rows[0][4] if rows else 0)

    def close(self) -> None:
        self.pool.close()


class PgIncidents:
    """The incidents as the UI reads them (cluster_db.IncidentReader)."""

    def __init__(self, pool: Any) -> None:
        self.pool = pool

    def get(self, incident_id: str) -> Incident | None:
        if "\x00" in incident_id:
            return None  # PostgreSQL's text holds no NUL (a 500 otherwise)
        with self.pool.connection() as conn:
            row = conn.execute("SELECT doc FROM incidents WHERE id = %s",
                               (incident_id,)).fetchone()
        return Incident.from_dict(json.loads(row[0])) if row else None

    def query(self, state: str | None = None, severity: str | None = None,
              rule: str | None = None, node: str | None = None, since_ns: int | None = None,
              until_ns: int | None = None, limit: int = 100,
              before: tuple[int, str] | None = None) -> list[Incident]:
        if any("\x00" in v for v in (state, severity, rule, node, *(before or ("", "")))
               if isinstance(v, str)):
            return []  # PostgreSQL's text holds no NUL, so no incident has it
        tail, params = incident_page("%s", limit, state=state, severity=severity, rule=rule,
                                     node=node, since_ns=since_ns, until_ns=until_ns,
                                     before=before)
        with self.pool.connection() as conn:
            rows = conn.execute(f"SELECT doc FROM incidents {tail}", params).fetchall()
        return [Incident.from_dict(json.loads(doc)) for (doc,) in rows]

    def open_incidents(self) -> list[Incident]:
        with self.pool.connection() as conn:
            rows = conn.execute("SELECT doc FROM incidents WHERE state <> %s",
                                (RESOLVED,)).fetchall()
        return [Incident.from_dict(json.loads(doc)) for (doc,) in rows]

    def counts_by_state(self) -> dict[str, int]:
        counts = dict.fromkeys(STATES, 0)
        with self.pool.connection() as conn:
            counts.update(dict(conn.execute(
                "SELECT state, count(*) FROM incidents GROUP BY state").fetchall()))
        return counts


class PgAudit:
    """The forwarded audit log as the UI reads it (cluster_db.AuditReader). The server
    applies no levers, so it has no rungs in force and no lever record."""

    def __init__(self, pool: Any) -> None:
        self.pool = pool

    def audit_log(self, since_ns: int = 0, kind: str | None = None,
                  incident: str | None = None, limit: int = 500) -> list[AuditEntry]:
        if "\x00" in (kind or "") + (incident or ""):
            return []  # PostgreSQL's text holds no NUL, so no entry has it
        tail, params = audit_page("%s", limit, since_ns=since_ns, kind=kind, incident=incident)
        with self.pool.connection() as conn:
            rows = conn.execute(f"SELECT {_AUDIT_COLUMNS} FROM audit {tail}", params).fetchall()
        return [AuditEntry(*row) for row in rows]

    def rungs(self) -> list[Any]:
        return []

    def lever_stats(self) -> dict[str, tuple[int, int]]:
        return {}


def _reason(exc: Exception) -> str:
    """The error without the connection string psycopg may echo (it never holds a password:
    the URL is refused with one, and the password is passed apart)."""
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
