"""What `sloguard server` keeps, behind one interface: every node's incidents, the audit
entries the nodes forwarded, and when each node last reported.

Two implementations: SQLite files in the data dir (cluster_sqlite.py, the default: nothing to
run beside the server, one replica) and PostgreSQL (cluster_pg.py: several replicas behind one
address share it). The web UI reads either through the two reader protocols here and never
learns which one it has; the ingest API writes through `ClusterDB.ingest`.

The fleet summary of the cluster front page (which nodes suffer now, incidents per node over
time, the BE workloads most often named as culprits) is three aggregate queries here, answered
by the database with bounded results (top N, at most MAX_BUCKETS buckets): the server never
loads the incidents of a range into Python to count them, so the page costs the same with a
hundred incidents or a hundred thousand.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, Protocol

from sloguard.core.audit import AuditEntry
from sloguard.core.incidents import SEVERITIES, Incident

# What one ingest call stored, by kind: the ingest API's answer and the server's counters.
STORED_KEYS = ("incidents", "incidents_stale", "incidents_foreign", "actions",
               "actions_duplicate", "withdrawn", "withdrawn_unknown")
# Bounds of the fleet summary's answers, whatever a caller asks: rows are sent to a browser.
MAX_TOP = 50
MAX_BUCKETS = 96


class IncidentReader(Protocol):
    """The incidents as the UI reads them (the agent's IncidentStore is one too)."""

    def get(self, incident_id: str) -> Incident | None: ...

    def query(self, state: str | None = None, severity: str | None = None,
              rule: str | None = None, node: str | None = None, since_ns: int | None = None,
              until_ns: int | None = None, limit: int = 100,
              before: tuple[int, str] | None = None) -> list[Incident]:
        """Newest first (started_ns, then id, descending), at most `limit`; `before` is the
        (started_ns, id) of the last one of the previous page (keyset pagination: a page
        deep in a large list costs what the first one does)."""
        ...

    def counts_by_state(self) -> dict[str, int]: ...


class AuditReader(Protocol):
    """The audit log and the actuators' state as the UI reads them (the agent's Ledger is
    one too; the cluster server has no rungs or levers of its own)."""

    def audit_log(self, since_ns: int = 0, kind: str | None = None,
                  incident: str | None = None, limit: int = 500) -> list[AuditEntry]: ...

    def rungs(self) -> list[Any]: ...

    def lever_stats(self) -> dict[str, tuple[int, int]]: ...


class ClusterDB(Protocol):
    incidents: IncidentReader
    ledger: AuditReader

    def ingest(self, node: str, incidents: list[Incident],
               actions: list[tuple[int, AuditEntry]], sent_ns: int,
               backlog: dict[str, int], withdrawn: Sequence[str] = ()) -> dict[str, int]:
        """Keep one batch of `node`'s: the incidents it deleted removed (`withdrawn`: only
        that node's; an id another node holds, or one never received, is left alone and
        counted as unknown, never refused, which would stop the node's forwarder on it for
        ever), each incident unless a newer copy (a larger updated_ns) is held or the id is
        another node's (left alone and counted as foreign, for the same reason), each (source
        id, audit entry) once per (node, source id), and the node's last-seen record.
        Idempotent (a batch sent twice, or to two replicas, is stored once). Returns the
        counts of STORED_KEYS."""
        ...

    def nodes(self) -> dict[str, dict[str, Any]]:
        """Each node that ever reported: last_seen_ns, sent_ns, backlog, and how many
        incidents and actions it had stored."""
        ...

    def suffering(self, limit: int) -> tuple[list[SufferingNode], int]:
        """The nodes with firing incidents now, worst severity first, then the most firing,
        then the longest firing: at most `limit` of them, and how many there are in all."""
        ...

    def started_per_node(self, since_ns: int, bucket_ns: int, buckets: int,
                         limit: int) -> Timeline:
        """Incidents started in each of `buckets` buckets of `bucket_ns` from `since_ns`,
        for the `limit` nodes that started the most in that range, the rest summed."""
        ...

    def culprits(self, since_ns: int, until_ns: int,
                 limit: int) -> tuple[list[Culprit], int]:
        """The BE workloads the incidents started in [since_ns, until_ns) name among their
        suspects, the most often named first suspect first (then named anywhere): at most
        `limit`, and how many workloads were named in all."""
        ...

    def close(self) -> None: ...


def newest_per_id(incidents: list[Incident]) -> tuple[list[Incident], int]:
    """One copy of each incident of a batch, the newest (a batch may carry an id twice), in
    id order, and how many older copies were dropped: both stores count those as stale, and
    PostgreSQL cannot upsert one row twice in one statement."""
    newest: dict[str, Incident] = {}
    for incident in incidents:
        held = newest.get(incident.id)
        if held is None or incident.updated_ns >= held.updated_ns:
            newest[incident.id] = incident
    return [newest[k] for k in sorted(newest)], len(incidents) - len(newest)


# -- the fleet summary -------------------------------------------------------------------------


def severity_case(column: str = "severity") -> str:
    """SQL ranking a severity by SEVERITIES (-1 for one it does not know), the same text in
    both dialects: `max()` of it is a node's worst. Built from the constant tuple, never from
    input."""
    arms = " ".join(f"WHEN '{s}' THEN {n}" for n, s in enumerate(SEVERITIES))
    return f"CASE {column} {arms} ELSE -1 END"


def severity_named(rank: int | None) -> str:
    return SEVERITIES[rank] if rank is not None and 0 <= rank < len(SEVERITIES) else ""


@dataclass(frozen=True, slots=True)
class SufferingNode:
    node: str
    firing: int  # its firing incidents
    worst: str  # the worst severity among them
    since_ns: int  # when the longest-firing of them fired (its start, if it never said)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class NodeCounts:
    node: str
    total: int
    counts: list[int]  # incidents started in each bucket

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class Timeline:
    """Incidents started per node per bucket: the top nodes, and the others summed so that
    the totals stay true when there are more nodes than rows."""

    since_ns: int
    bucket_ns: int
    buckets: int
    nodes: list[NodeCounts]
    other_nodes: int  # nodes with incidents in the range beyond `nodes`
    other: NodeCounts  # their incidents, summed per bucket

    @property
    def total(self) -> int:
        return sum(n.total for n in self.nodes) + self.other.total

    def to_dict(self) -> dict[str, Any]:
        return {"since_ns": self.since_ns, "bucket_ns": self.bucket_ns,
                "buckets": [self.since_ns + k * self.bucket_ns for k in range(self.buckets)],
                "nodes": [n.to_dict() for n in self.nodes],
                "other": {"nodes": self.other_nodes, "total": self.other.total,
                          "counts": self.other.counts},
                "total": self.total}


def timeline_of(since_ns: int, bucket_ns: int, buckets: int,
                top: list[tuple[str, int, int]], per_node: list[tuple[str, int, int]],
                per_bucket: list[tuple[int, int]]) -> Timeline:
    """A Timeline from the three bounded answers both stores' queries give: the top nodes
    (node, total, nodes in the range), their counts (node, bucket, n) and everyone's counts
    per bucket (bucket, n); the others are everyone's less the top nodes'."""
    counts = {node: [0] * buckets for node, _, _ in top}
    for node, bucket, n in per_node:
        if node in counts and 0 <= bucket < buckets:
            counts[node][int(bucket)] += n
    everyone = [0] * buckets
    for bucket, n in per_bucket:
        if 0 <= bucket < buckets:
            everyone[int(bucket)] += n
    rows = [NodeCounts(node, total, counts[node]) for node, total, _ in top]
    rest = [all_n - sum(row.counts[k] for row in rows) for k, all_n in enumerate(everyone)]
    in_range = top[0][2] if top else 0
    return Timeline(since_ns, bucket_ns, buckets, rows, max(0, in_range - len(rows)),
                    NodeCounts("", sum(rest), rest))


@dataclass(frozen=True, slots=True)
class Culprit:
    workload: str  # as people name it (core/suspects.py: workload_name)
    first: int  # incidents naming it first suspect
    named: int  # incidents naming it among their suspects, first or not
    nodes: int  # nodes those incidents were on

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class FleetSummary:
    """What the cluster front page and GET /api/cluster/summary show."""

    since_ns: int
    until_ns: int
    suffering: list[SufferingNode]
    suffering_total: int
    timeline: Timeline
    culprits: list[Culprit]
    culprits_total: int

    def to_dict(self) -> dict[str, Any]:
        return {"since_ns": self.since_ns, "until_ns": self.until_ns,
                "suffering": {"nodes": [n.to_dict() for n in self.suffering],
                              "total": self.suffering_total},
                "per_node": self.timeline.to_dict(),
                "culprits": {"workloads": [c.to_dict() for c in self.culprits],
                             "total": self.culprits_total}}


def fleet_summary(db: ClusterDB, since_ns: int, until_ns: int, buckets: int,
                  limit: int) -> FleetSummary:
    """The three sections over [since_ns, until_ns), each bounded by `limit` (at most
    MAX_TOP) and `buckets` (at most MAX_BUCKETS) whatever was asked."""
    limit = max(1, min(limit, MAX_TOP))
    buckets = max(1, min(buckets, MAX_BUCKETS))
    bucket_ns = max(1, -(-(until_ns - since_ns) // buckets))
    until_ns = since_ns + buckets * bucket_ns  # the last bucket's end: as asked, or a little after
    suffering, suffering_total = db.suffering(limit)
    culprits, culprits_total = db.culprits(since_ns, until_ns, limit)
    return FleetSummary(since_ns, until_ns, suffering, suffering_total,
                        db.started_per_node(since_ns, bucket_ns, buckets, limit),
                        culprits, culprits_total)
