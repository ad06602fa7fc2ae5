"""The cluster server (`sloguard server`): every node's incidents and actions in one UI.

Agents send what changed (sloguard/forwarder.py) to POST /api/v1/ingest (ui/ingest.py); this
object keeps it in its own data dir (an IncidentStore, and a Ledger whose audit entries are
kept once per (node, id on that node)) and offers the web UI (ui/app.py) what it reads of an
agent. It runs no rules and takes no actions: acknowledge and resolve happen on the node's
agent (answered 409 here), and it keeps no samples (the incident page says so).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from datetime import UTC, datetime
from typing import Any

from prometheus_client import CollectorRegistry

from sloguard.actuators.ledger import AuditEntry, Ledger
from sloguard.core.health import ComponentStatus
from sloguard.core.incidents import Incident
from sloguard.core.selfmetrics import AgentMetrics, ClusterMetrics
from sloguard.settings import Settings
from sloguard.store import StoreError
from sloguard.store.incidents_db import IncidentStore

log = logging.getLogger(__name__)
CLUSTER = "cluster"
NOT_HERE = "this is the cluster view: acknowledge and resolve on the node's agent"


class ClusterServer:
    cluster = True  # the UI shows where changes are made instead of its forms

    def __init__(self, settings: Settings, registry: CollectorRegistry | None = None) -> None:
        self.settings = settings
        self.node = CLUSTER
        self.registry = registry or CollectorRegistry()
        data_dir = settings.data_dir
        try:
            data_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"data_dir {data_dir}: cannot create it: {exc.strerror}") from exc
        self.incidents = IncidentStore(data_dir / "incidents.db")
        self.ledger = Ledger(data_dir / "actuators.db")
        self.nodes_file = data_dir / "nodes.json"
        self.nodes: dict[str, dict[str, Any]] = self._load_nodes()
        self._lock = threading.Lock()
        self.store = None  # no samples here
        self.silences = None  # silences mute each node's own alerting: made on the node
        self.ticks = 0
        metrics = AgentMetrics(self.registry)
        metrics.gauge_callback("sloguard_incidents", "Incidents by state (all nodes)", "state",
                               self.incidents.counts_by_state)
        metrics.gauge_callback(
            "sloguard_cluster_node_last_seen_seconds", "When each node last reported", "node",
            lambda: {n: v["last_seen_ns"] / 1e9 for n, v in self.nodes.items()})
        counts = ClusterMetrics(self.registry)
        self.received, self.refused = counts.received, counts.refused

    def _load_nodes(self) -> dict[str, dict[str, Any]]:
        try:
            return json.loads(self.nodes_file.read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            log.error("%s unreadable (%s): nodes are listed again as they report",
                      self.nodes_file, exc)
            return {}

    # -- what the agents send ----------------------------------------------------------------

    def ingest(self, node: str, incidents: list[Incident], actions: list[dict[str, Any]],
               sent_ns: int, backlog: dict[str, int]) -> dict[str, int]:
        stored = {"incidents": 0, "incidents_stale": 0, "actions": 0, "actions_duplicate": 0}
        with self._lock:
            for incident in incidents:
                held = self.incidents.updated_ns_of(incident.id)
                if held is not None and incident.updated_ns < held:  # an older copy: keep ours
                    stored["incidents_stale"] += 1
                    continue
                self.incidents.save(incident)
                stored["incidents"] += 1
            for action in actions:
                source_id = action.pop("id")
                if self.ledger.import_audit(AuditEntry(**action), source_id):
                    stored["actions"] += 1
                else:
                    stored["actions_duplicate"] += 1
            now = time.time_ns()
            seen = self.nodes.setdefault(node, {"incidents": 0, "actions": 0})
            seen.update(last_seen_ns=now, sent_ns=sent_ns, backlog=backlog)
            seen["incidents"] += stored["incidents"]
            seen["actions"] += stored["actions"]
            tmp = self.nodes_file.with_suffix(".tmp")
            tmp.write_text(json.dumps(self.nodes))
            os.replace(tmp, self.nodes_file)
        self.received.labels("incidents", "stored").inc(stored["incidents"])
        self.received.labels("incidents", "stale").inc(stored["incidents_stale"])
        self.received.labels("actions", "stored").inc(stored["actions"])
        self.received.labels("actions", "duplicate").inc(stored["actions_duplicate"])
        return stored

    def ingest_router(self) -> tuple[Any, frozenset[str]]:
        from sloguard.ui.ingest import INGEST_PATH, ingest_router

        return ingest_router(self), frozenset({INGEST_PATH})

    # -- what the UI reads -------------------------------------------------------------------

    # The cluster view runs no rules and takes no actions (ui/view.py).

    def rules_view(self) -> tuple[list[tuple[Any, Any]], dict[str, str]]:
        return [], {}

    def policies_view(self) -> tuple[list[Any], dict[str, str], dict[str, str]]:
        return [], {}, {}

    def change_incident(self, incident_id: str, what: str, author: str,
                        comment: str) -> Incident:
        if self.incidents.get(incident_id) is None:
            raise KeyError(incident_id)
        raise ValueError(NOT_HERE)

    def workloads(self) -> list[dict[str, Any]]:
        return []

    def guard_costs(self) -> list[dict[str, Any]]:
        return []  # each node's agent keeps its own

    def app_targets(self) -> list[dict[str, Any]]:
        return []

    def receiver(self) -> Any:
        return None

    def components(self) -> list[ComponentStatus]:
        now = time.time_ns()
        stale_after = self.settings.server.stale_after
        out = []
        for name in sorted(self.nodes):
            seen = dict(self.nodes[name])
            ago = (now - seen.get("last_seen_ns", 0)) / 1e9
            when = datetime.fromtimestamp(seen.get("last_seen_ns", 0) / 1e9, UTC)
            backlog = seen.get("backlog") or {}
            reason = (f"last seen {when:%Y-%m-%d %H:%M:%S} UTC ({ago:.0f}s ago)"
                      + (f"; {sum(backlog.values())} items still to send" if any(
                          backlog.values()) else ""))
            out.append(ComponentStatus(
                f"node:{name}", ok=ago < stale_after, reason=reason,
                details={**seen, "lag_s": round(ago, 3)}))
        return out

    def alive(self) -> bool:
        return True

    def liveness_problem(self) -> str:
        return ""

    def ready(self) -> bool:
        return True

    def start(self) -> None:
        log.info("cluster server: %d nodes known, data in %s", len(self.nodes),
                 self.settings.data_dir)

    def stop(self) -> None:
        self.incidents.close()
        self.ledger.close()
        log.info("cluster server stopped")
