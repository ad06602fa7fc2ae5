"""The cluster server's default store: SQLite files in its data dir, for one replica.

The incidents in an IncidentStore, the forwarded audit entries in a ledger's audit table
(kept once per (node, id on that node)), and the nodes' last-seen records in nodes.json.
The nodes are held in this process's memory and the files are opened by this process only,
which is why a second replica needs PostgreSQL (cluster_pg.py) instead.

The fleet summary's queries read the incidents through a connection of their own (WAL: they
never wait for an ingest, nor it for them), with an index of the cluster's own on the
incidents' start and node. Suspects and fired_ns are read out of the documents by SQLite's
JSON functions, in SQL, only for the incidents a query selects (those of the range, the
firing ones): there is one replica to serve and no column to keep beside the document.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from sloguard.core.audit import AuditEntry
from sloguard.core.incidents import Incident
from sloguard.store.cluster_db import (
    AuditReader,
    Culprit,
    SufferingNode,
    Timeline,
    newest_per_id,
    severity_case,
    severity_named,
    timeline_of,
)
from sloguard.store.incidents_db import IncidentStore
from sloguard.store.sqlite import open_db

log = logging.getLogger(__name__)

# The per-node timeline reads only the index (started_ns's range, node), not the documents.
_SUMMARY_INDEXES = "CREATE INDEX IF NOT EXISTS incidents_by_time_node ON incidents " \
                   "(started_ns, node);"
# A document SQLite cannot parse (json.dumps writes NaN, which JSON has not) is read as one
# without suspects or fired_ns, rather than failing the whole query.
_FIRED_NS = "CASE WHEN json_valid(doc) THEN json_extract(doc, '$.fired_ns') END"
_SUFFERING = f"""
SELECT node, count(*), max({severity_case()}), min(coalesce({_FIRED_NS}, started_ns)),
       count(*) OVER ()
FROM incidents WHERE state = 'firing'
GROUP BY node ORDER BY 3 DESC, 2 DESC, 4, node LIMIT ?
"""
# Documents are compact JSON (IncidentStore.save), so one without `"suspects":[{` has none
# and is not parsed. core/suspects.py's workload_name in SQL (pg_migrations.py has it for
# PostgreSQL; the tests hold all three to the same answers).
_NAME = """CASE WHEN coalesce(json_extract(s.value, '$.workload.pod'), '') <> ''
    THEN ltrim(coalesce(json_extract(s.value, '$.workload.namespace'), '') || '/'
               || json_extract(s.value, '$.workload.pod'), '/')
    ELSE coalesce(nullif(json_extract(s.value, '$.workload.workload'), ''),
                  json_extract(s.value, '$.cgroup'), '') END"""
_CULPRITS = f"""
SELECT name, count(DISTINCT CASE WHEN pos = 0 THEN id END), count(DISTINCT id),
       count(DISTINCT node), count(*) OVER ()
FROM (SELECT i.id AS id, i.node AS node, s.key AS pos, {_NAME} AS name
      FROM incidents AS i, json_each(
          CASE WHEN json_valid(i.doc) AND json_type(i.doc, '$.suspects') = 'array'
               THEN i.doc ELSE '{{}}' END, '$.suspects') AS s
      WHERE i.started_ns >= ? AND i.started_ns < ? AND instr(i.doc, '"suspects":[{{') > 0)
GROUP BY name ORDER BY 2 DESC, 3 DESC, name LIMIT ?
"""


class AuditImporter(AuditReader, Protocol):
    """The actuators' Ledger, as this store uses it: given by the caller, since the store
    layer sits below the actuators and may not open one itself."""

    def import_audit(self, entry: AuditEntry, source_id: int) -> bool: ...

    def close(self) -> None: ...


class SqliteClusterDB:
    def __init__(self, data_dir: Path, ledger: AuditImporter) -> None:
        self.incidents = IncidentStore(data_dir / "incidents.db")
        self.ledger = ledger
        self.nodes_file = data_dir / "nodes.json"
        self._nodes: dict[str, dict[str, Any]] = self._load_nodes()
        self._lock = threading.Lock()
        self._summary = open_db(data_dir / "incidents.db", _SUMMARY_INDEXES,
                                "the incident store (summaries)")
        self._summary_lock = threading.Lock()

    def _load_nodes(self) -> dict[str, dict[str, Any]]:
        try:
            return json.loads(self.nodes_file.read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            log.error("%s unreadable (%s): nodes are listed again as they report",
                      self.nodes_file, exc)
            return {}

    def ingest(self, node: str, incidents: list[Incident],
               actions: list[tuple[int, AuditEntry]], sent_ns: int,
               backlog: dict[str, int], withdrawn: Sequence[str] = ()) -> dict[str, int]:
        newest, dropped = newest_per_id(incidents)
        stored = {"incidents": 0, "incidents_stale": dropped, "incidents_foreign": 0,
                  "actions": 0, "actions_duplicate": 0, "withdrawn": 0,
                  "withdrawn_unknown": 0}
        with self._lock:
            for incident_id in withdrawn:
                if self.incidents.delete(incident_id, node=node):
                    stored["withdrawn"] += 1
                    continue
                stored["withdrawn_unknown"] += 1
                held = self.incidents.get(incident_id)
                if held is not None:
                    log.warning("node %s withdrew incident %s of node %s: left alone",
                                node[:253], incident_id[:200], held.node)
            for incident in newest:
                held = self.incidents.updated_ns_and_node_of(incident.id)
                if held is not None and held[1] != incident.node:  # another node's id
                    stored["incidents_foreign"] += 1
                    log.warning("node %s sent incident %s, which is node %s's: left alone",
                                node[:253], incident.id[:200], held[1])
                    continue
                if held is not None and incident.updated_ns < held[0]:  # older: keep ours
                    stored["incidents_stale"] += 1
                    continue
                self.incidents.save(incident)
                stored["incidents"] += 1
            for source_id, entry in actions:
                if self.ledger.import_audit(entry, source_id):
                    stored["actions"] += 1
                else:
                    stored["actions_duplicate"] += 1
            seen = self._nodes.setdefault(node, {"incidents": 0, "actions": 0})
            seen["last_seen_ns"] = time.time_ns()
            if sent_ns >= seen.get("sent_ns", 0):  # not a resent older batch's backlog
                seen.update(sent_ns=sent_ns, backlog=backlog)
            seen["incidents"] += stored["incidents"]
            seen["actions"] += stored["actions"]
            tmp = self.nodes_file.with_suffix(".tmp")
            tmp.write_text(json.dumps(self._nodes))
            os.replace(tmp, self.nodes_file)
        return stored

    def nodes(self) -> dict[str, dict[str, Any]]:
        with self._lock:
            return {name: dict(seen) for name, seen in self._nodes.items()}

    def _read(self, sql: str, params: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        with self._summary_lock:
            return self._summary.execute(sql, params).fetchall()

    def suffering(self, limit: int) -> tuple[list[SufferingNode], int]:
        rows = self._read(_SUFFERING, (limit,))
        return ([SufferingNode(node, n, severity_named(worst), int(since))
                 for node, n, worst, since, _ in rows], rows[0][4] if rows else 0)

    def started_per_node(self, since_ns: int, bucket_ns: int, buckets: int,
                         limit: int) -> Timeline:
        until_ns = since_ns + buckets * bucket_ns
        span = "started_ns >= ? AND started_ns < ?"
        top = self._read(f"SELECT node, count(*), count(*) OVER () FROM incidents "
                         f"WHERE {span} GROUP BY node ORDER BY 2 DESC, node LIMIT ?",
                         (since_ns, until_ns, limit))
        per_node: list[tuple[Any, ...]] = []
        per_bucket: list[tuple[Any, ...]] = []
        if top:
            nodes = [t[0] for t in top]
            per_node = self._read(
                f"SELECT node, (started_ns - ?) / ? AS b, count(*) FROM incidents "
                f"WHERE {span} AND node IN ({','.join('?' * len(nodes))}) GROUP BY node, b",
                (since_ns, bucket_ns, since_ns, until_ns, *nodes))
            per_bucket = self._read(
                f"SELECT (started_ns - ?) / ? AS b, count(*) FROM incidents WHERE {span} "
                "GROUP BY b", (since_ns, bucket_ns, since_ns, until_ns))
        return timeline_of(since_ns, bucket_ns, buckets, top, per_node, per_bucket)

    def culprits(self, since_ns: int, until_ns: int,
                 limit: int) -> tuple[list[Culprit], int]:
        rows = self._read(_CULPRITS, (since_ns, until_ns, limit))
        return ([Culprit(name, first, named, nodes) for name, first, named, nodes, _ in rows],
                rows[0][4] if rows else 0)

    def close(self) -> None:
        with self._summary_lock:
            self._summary.close()
        self.incidents.close()
        self.ledger.close()
