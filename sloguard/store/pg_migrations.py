"""The cluster server's PostgreSQL schema, as numbered steps applied in order.

Every replica runs `migrate` when it starts. The steps run under a PostgreSQL advisory lock,
so that replicas starting at once (a rollout, a restarted Deployment) take turns instead of
racing to create the same tables: the first applies what is missing, the others then find
nothing to do. Each step and its row in `schema_migrations` commit in one transaction, so a
step is either wholly applied and recorded or not at all (PostgreSQL's DDL is transactional).

A database that records a step this code does not know was migrated by a newer sloguard: its
tables may have changed in ways this code would misread or damage, so the replica refuses to
start (SchemaTooNew) rather than serve from it. Steps are only ever appended: an applied
step is never edited, since databases that ran it would not run it again.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from typing import Any

from sloguard.store import StoreError

log = logging.getLogger(__name__)

# pg_advisory_lock's key for schema changes: "sloguard" in ASCII, so that it is recognisable
# in pg_locks and unlikely to collide with another application's key on a shared server.
LOCK_KEY = int.from_bytes(b"sloguard", "big")


@dataclass(frozen=True)
class Step:
    version: int
    description: str
    statements: tuple[str, ...]


STEPS: tuple[Step, ...] = (
    Step(1, "incidents, forwarded audit entries, nodes", (
        # The whole incident as JSON (its shape grows with every issue), the columns the list
        # filters on beside it, as in the SQLite store (incidents_db.py).
        """CREATE TABLE incidents (
            id TEXT PRIMARY KEY,
            fingerprint TEXT NOT NULL,
            state TEXT NOT NULL,
            severity TEXT NOT NULL,
            rule TEXT NOT NULL,
            node TEXT NOT NULL,
            started_ns BIGINT NOT NULL,
            updated_ns BIGINT NOT NULL,
            doc TEXT NOT NULL
        )""",
        # One row per entry a node recorded: (node, source_id) is the entry's identity, what
        # makes a resend (or the same batch reaching two replicas) a no-op.
        """CREATE TABLE audit (
            id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            node TEXT NOT NULL,
            source_id BIGINT NOT NULL,
            time_ns BIGINT NOT NULL,
            incident TEXT NOT NULL,
            policy TEXT NOT NULL,
            rung INTEGER NOT NULL,
            kind TEXT NOT NULL,
            action TEXT NOT NULL,
            dry_run BOOLEAN NOT NULL,
            status TEXT NOT NULL,
            target TEXT NOT NULL,
            detail TEXT NOT NULL,
            reason TEXT NOT NULL,
            CONSTRAINT audit_once UNIQUE (node, source_id)
        )""",
        """CREATE TABLE nodes (
            node TEXT PRIMARY KEY,
            last_seen_ns BIGINT NOT NULL,
            sent_ns BIGINT NOT NULL,
            backlog JSONB NOT NULL DEFAULT '{}',
            incidents BIGINT NOT NULL DEFAULT 0,
            actions BIGINT NOT NULL DEFAULT 0
        )""",
    )),
    Step(2, "indexes of the incident list and the audit log", (
        # The list is newest first with a tiebreak on id (keyset pagination), optionally
        # narrowed by one of state, node, rule, severity: each has an index in that order, so
        # a page is an index range scan that stops after LIMIT rows, however many incidents
        # there are.
        "CREATE INDEX incidents_by_time ON incidents (started_ns, id)",
        "CREATE INDEX incidents_by_state ON incidents (state, started_ns, id)",
        "CREATE INDEX incidents_by_node ON incidents (node, started_ns, id)",
        "CREATE INDEX incidents_by_rule ON incidents (rule, started_ns, id)",
        "CREATE INDEX incidents_by_severity ON incidents (severity, started_ns, id)",
        "CREATE INDEX audit_by_incident ON audit (incident, id)",
        "CREATE INDEX audit_by_kind ON audit (kind, id)",
        "CREATE INDEX audit_by_time ON audit (time_ns)",
    )),
    Step(3, "the fleet summary: fired_ns and suspect names beside the document, indexed", (
        # What the cluster front page aggregates and the document alone holds: when each
        # incident fired, and the names of its suspects in order, each once (core/suspects.py:
        # workload_name, here in SQL; tests/test_cluster_summary.py holds the two to the same
        # answers). Generated columns, so ingest writes nothing new and no copy can disagree
        # with its document. Parsing the document must never fail an ingest (jsonb refuses
        # \u0000 and NaN, which a TEXT document holds): such a document has no suspects and
        # no fired_ns here, and is still stored.
        r"""CREATE FUNCTION sloguard_fired_ns(doc TEXT) RETURNS BIGINT
            LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
        BEGIN
            RETURN (doc::jsonb ->> 'fired_ns')::bigint;
        EXCEPTION WHEN OTHERS THEN
            RETURN NULL;
        END $$""",
        r"""CREATE FUNCTION sloguard_suspect_names(doc TEXT) RETURNS TEXT[]
            LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
        DECLARE
            suspects JSONB;
        BEGIN
            IF strpos(doc, '"suspects":[{') = 0 THEN
                -- none (the common case), no parsing: ingest writes compact JSON
                RETURN '{}';
            END IF;
            suspects := doc::jsonb -> 'suspects';
            IF jsonb_typeof(suspects) IS DISTINCT FROM 'array' THEN
                RETURN '{}';
            END IF;
            -- each name once, where it first comes (two containers of one pod are two
            -- suspects of one name): the summary then counts incidents without DISTINCT
            RETURN coalesce((
                SELECT array_agg(name ORDER BY first)
                FROM (SELECT name, min(ord) AS first FROM (
                    SELECT CASE WHEN coalesce(s #>> '{workload,pod}', '') <> ''
                                THEN ltrim(coalesce(s #>> '{workload,namespace}', '') || '/'
                                           || (s #>> '{workload,pod}'), '/')
                                ELSE coalesce(nullif(s #>> '{workload,workload}', ''),
                                              s ->> 'cgroup', '')
                           END AS name, ord
                    FROM jsonb_array_elements(suspects) WITH ORDINALITY AS t(s, ord)) named
                    GROUP BY name) once), '{}');
        EXCEPTION WHEN OTHERS THEN
            RETURN '{}';
        END $$""",
        "ALTER TABLE incidents ADD COLUMN fired_ns BIGINT "
        "GENERATED ALWAYS AS (sloguard_fired_ns(doc)) STORED",
        "ALTER TABLE incidents ADD COLUMN suspects TEXT[] NOT NULL "
        "GENERATED ALWAYS AS (sloguard_suspect_names(doc)) STORED",
        # Each section's query is then an index-only scan (once VACUUM has set the
        # visibility map, as autovacuum does): the firing incidents by node; the range's
        # incidents by start with their node; those with suspects, with their names.
        "CREATE INDEX incidents_firing ON incidents (node) "
        "INCLUDE (severity, started_ns, fired_ns) WHERE state = 'firing'",
        "CREATE INDEX incidents_by_time_node ON incidents (started_ns) INCLUDE (node)",
        "CREATE INDEX incidents_with_suspects ON incidents (started_ns) "
        "INCLUDE (node, id, suspects) WHERE cardinality(suspects) > 0",
    )),
)
LATEST = STEPS[-1].version


class SchemaTooNew(StoreError):
    """The database was migrated by a newer sloguard than this one."""


def migrate(conn: Any, where: str) -> tuple[int, list[int]]:
    """Bring the database `conn` (a psycopg connection in autocommit mode) to LATEST: the
    version it was at and the steps applied now. SchemaTooNew when it is ahead of this code.
    `where` names the database in messages (never with its password)."""
    conn.execute("SELECT pg_advisory_lock(%s)", (LOCK_KEY,))
    try:
        conn.execute("""CREATE TABLE IF NOT EXISTS schema_migrations (
            version INTEGER PRIMARY KEY,
            description TEXT NOT NULL,
            applied_at TIMESTAMPTZ NOT NULL DEFAULT now()
        )""")
        found = conn.execute("SELECT coalesce(max(version), 0) FROM schema_migrations"
                             ).fetchone()[0]
        if found > LATEST:
            raise SchemaTooNew(
                f"server.database ({where}): its schema is at version {found}, newer than "
                f"this sloguard's {LATEST}: a newer sloguard migrated it. Run that version "
                "(or newer) here; this one could misread or damage its tables")
        applied = []
        for step in STEPS:
            if step.version <= found:
                continue
            with conn.transaction():
                for statement in step.statements:
                    conn.execute(statement)
                conn.execute("INSERT INTO schema_migrations (version, description) "
                             "VALUES (%s, %s)", (step.version, step.description))
            log.info("%s: schema migrated to version %d (%s)", where, step.version,
                     step.description)
            applied.append(step.version)
        return found, applied
    finally:
        # A broken connection has lost its session, and the lock with it.
        with contextlib.suppress(Exception):
            conn.execute("SELECT pg_advisory_unlock(%s)", (LOCK_KEY,))
