"""What the web UI/API reads of the node it shows, and the few things it asks of it.

The agent (sloguard/agent.py) and the cluster server (sloguard/cluster.py) both implement
this, so the UI depends on neither and neither fakes the other's internals: the UI never
reaches into the engine, the ladder or the stores of the loop. Reads are safe from uvicorn's
threads (the stores have their own connections); `change_incident` runs on the agent's loop.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from sloguard.actuators.alerting.silences import SilenceStore
    from sloguard.core.health import ComponentStatus
    from sloguard.core.incidents import Incident
    from sloguard.store import Store
    from sloguard.store.cluster_db import AuditReader, FleetSummary, IncidentReader


class NodeView(Protocol):
    node: str  # the node's name, or "cluster"
    cluster: bool  # the cluster view: changes are made on the node's agent, not here
    settings: Any  # its ui, app_latency.receive and actuators.dry_run sections
    registry: CollectorRegistry  # /metrics
    incidents: IncidentReader  # read: query, get (SQLite or, on a server, PostgreSQL)
    ledger: AuditReader  # read: the audit log, the rungs in force, the levers' record
    store: Store | None  # read: the samples behind charts; None where none are kept
    silences: SilenceStore | None  # None: silences are made on the node's agent
    ticks: int

    def start(self) -> None: ...

    def stop(self) -> None: ...

    def liveness_problem(self) -> str:
        """Why it is not keeping its beat ("" while it is): /healthz."""
        ...

    def ready(self) -> bool: ...

    def components(self) -> list[ComponentStatus]:
        """Every part's health: /readyz and the node page."""
        ...

    def rules_view(self) -> tuple[list[tuple[Any, Any]], dict[str, str]]:
        """The loaded rules, each with its evaluation status (None before its first), and
        the rule files' errors by file."""
        ...

    def policies_view(self) -> tuple[list[Any], dict[str, str], dict[str, str]]:
        """The loaded escalation policies, the policy files' errors and the ladder's."""
        ...

    def change_incident(self, incident_id: str, what: str, author: str,
                        comment: str) -> Incident:
        """Acknowledge (`ack`) or resolve (`resolve`) by hand; KeyError for an unknown id,
        ValueError when it cannot be done (already resolved; not here)."""
        ...

    def workloads(self) -> list[dict[str, Any]]:
        """The node's workloads (cgroup, class, pod, ...): the node page."""
        ...

    def guard_costs(self) -> list[dict[str, Any]]:
        """What guarding has cost each BE workload (actuators/guard_cost.py): lever time, CPU
        wanted and got while held and free, evictions, times named first suspect."""
        ...

    def app_targets(self) -> list[dict[str, Any]]:
        """The application-latency targets and how their last scrape went."""
        ...

    def receiver(self) -> Any:
        """The collector pushed observations go to, when this node receives them (else None)."""
        ...

    def ingest_router(self) -> tuple[Any, frozenset[str]] | None:
        """The cluster server's ingest API and its paths (which check their own token)."""
        ...

    def fleet_summary(self, since_ns: int, until_ns: int, buckets: int,
                      limit: int) -> FleetSummary | None:
        """The cluster front page's summary (store/cluster_db.py: which nodes suffer now,
        incidents started per node per bucket, the most-named culprits), each bounded by
        `limit` rows; None on an agent, which shows one node."""
        ...
