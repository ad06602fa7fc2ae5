"""The cluster server (`sloguard server`): every node's incidents and actions in one UI.

Agents send what changed (sloguard/forwarder.py) to POST /api/v1/ingest (ui/ingest.py); this
object keeps it in a ClusterDB (sloguard/store/cluster_db.py: SQLite files in its data dir by
default, or PostgreSQL shared by several replicas when server.database is set) and offers the
web UI (ui/app.py) what it reads of an agent. It runs no rules and takes no actions:
acknowledge and resolve happen on the node's agent (answered 409 here), and it keeps no
samples (the incident page says so).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from prometheus_client import CollectorRegistry

from sloguard.actuators.ledger import AuditEntry, Ledger
from sloguard.core.config import ConfigError, SecretUnavailable, read_secret, secret_sources
from sloguard.core.health import ComponentStatus
from sloguard.core.incidents import Incident
from sloguard.core.selfmetrics import AgentMetrics, ClusterMetrics
from sloguard.settings import Settings
from sloguard.store import StoreError
from sloguard.store.cluster_db import ClusterDB, FleetSummary, fleet_summary
from sloguard.store.cluster_sqlite import SqliteClusterDB

log = logging.getLogger(__name__)
CLUSTER = "cluster"
NOT_HERE = "this is the cluster view: acknowledge and resolve on the node's agent"


def open_cluster_db(settings: Settings) -> ClusterDB:
    """The store server.database selects: PostgreSQL, which several replicas may share, or
    by default SQLite files in data_dir for one replica. StoreError naming the field when it
    cannot be opened (the CLI exits 2 with it)."""
    cfg = settings.server
    if cfg.database:
        from sloguard.store.cluster_pg import PostgresClusterDB

        try:
            password = read_secret(cfg, "database_password")
        except SecretUnavailable as exc:
            raise StoreError(f"server.{exc}") from None
        return PostgresClusterDB(cfg.database, password, cfg.database_pool,
                                 where=cfg.database_where())
    data_dir = settings.data_dir
    try:
        data_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise StoreError(f"data_dir {data_dir}: cannot create it: {exc.strerror}") from exc
    # The Ledger's audit table keeps forwarded entries once per (node, id on that node).
    return SqliteClusterDB(data_dir, Ledger(data_dir / "actuators.db"))


class ClusterServer:
    cluster = True  # the UI shows where changes are made instead of its forms

    def __init__(self, settings: Settings, registry: CollectorRegistry | None = None) -> None:
        self.settings = settings
        self.node = CLUSTER
        self.registry = registry or CollectorRegistry()
        self.db = open_cluster_db(settings)
        self.incidents = self.db.incidents
        self.ledger = self.db.ledger
        self.store = None  # no samples here
        self.silences = None  # silences mute each node's own alerting: made on the node
        self.ticks = 0
        metrics = AgentMetrics(self.registry)
        metrics.gauge_callback("sloguard_incidents", "Incidents by state (all nodes)", "state",
                               self.incidents.counts_by_state)
        metrics.gauge_callback(
            "sloguard_cluster_node_last_seen_seconds", "When each node last reported", "node",
            lambda: {n: v["last_seen_ns"] / 1e9 for n, v in self.db.nodes().items()})
        counts = ClusterMetrics(self.registry)
        self.received, self.refused = counts.received, counts.refused
        # Which node each agent's token names (server.node_tokens_file); None: every agent
        # presents the shared server.ingest_token and the body's node is taken on trust.
        self.node_tokens = None
        if settings.server.node_tokens_file:
            from sloguard.ui.node_tokens import NodeTokens

            self.node_tokens = NodeTokens(settings.server.node_tokens_file)
        # server.node_auth: tokenreview: the agents' pod-bound service-account tokens, checked
        # with the apiserver (ui/tokenreview.py)
        self.tokenreview = None
        if settings.server.node_auth == "tokenreview":
            self.tokenreview = self._tokenreview(settings.server)

    @staticmethod
    def _tokenreview(cfg: Any) -> Any:
        """The reviewer, with the apiserver client of server.kubeconfig or the pod's service
        account; ConfigError naming the field when neither can be loaded (exit 2)."""
        from sloguard.collectors.kube_pods import load_api_client
        from sloguard.ui.tokenreview import TokenReviewer

        try:
            api = load_api_client(cfg.kubeconfig)
        except Exception as exc:  # the client's ConfigException, or the file's OSError
            where = f"server.kubeconfig {cfg.kubeconfig}" if cfg.kubeconfig else \
                "the in-cluster service account (server.kubeconfig unset)"
            raise ConfigError(f"server.node_auth: tokenreview: cannot load {where}: "
                              f"{str(exc)[:300]}") from None
        return TokenReviewer(api, cfg.tokenreview_audiences, cfg.tokenreview_service_accounts,
                             cfg.tokenreview_cache)

    # -- what the agents send ----------------------------------------------------------------

    def ingest(self, node: str, incidents: list[Incident], actions: list[dict[str, Any]],
               sent_ns: int, backlog: dict[str, int],
               withdrawn: Sequence[str] = ()) -> dict[str, int]:
        """Store what `node` sent; what was stored, what was older than held, what is gone."""
        entries = []
        for action in actions:
            source_id = action.pop("id")
            entries.append((source_id, AuditEntry(**action)))
        stored = self.db.ingest(node, incidents, entries, sent_ns, backlog, withdrawn)
        self.received.labels("incidents", "stored").inc(stored["incidents"])
        self.received.labels("incidents", "stale").inc(stored["incidents_stale"])
        self.received.labels("incidents", "foreign").inc(stored["incidents_foreign"])
        self.received.labels("actions", "stored").inc(stored["actions"])
        self.received.labels("actions", "duplicate").inc(stored["actions_duplicate"])
        self.received.labels("incidents", "withdrawn").inc(stored["withdrawn"])
        self.received.labels("incidents", "withdrawn_unknown").inc(stored["withdrawn_unknown"])
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

    def fleet_summary(self, since_ns: int, until_ns: int, buckets: int,
                      limit: int) -> FleetSummary:
        return fleet_summary(self.db, since_ns, until_ns, buckets, limit)

    def components(self) -> list[ComponentStatus]:
        now = time.time_ns()
        stale_after = self.settings.server.stale_after
        out = [checker.status() for checker in (self.node_tokens, self.tokenreview)
               if checker is not None]
        nodes = self.db.nodes()
        for name in sorted(nodes):
            seen = nodes[name]
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
        where = self.settings.server.database_where()
        if not self.settings.server.database:
            where += f" ({self.settings.data_dir})"
        log.info("cluster server: %d nodes known, data in %s", len(self.db.nodes()), where)
        cfg = self.settings.server
        own = self.node_tokens is not None or self.tokenreview is not None
        if own and secret_sources(cfg, "ingest_token"):
            if cfg.allow_shared_token:
                log.warning("ingest: server.allow_shared_token is on: an agent with the shared "
                            "ingest_token may still post as any node; turn it off once every "
                            "agent has its own token")
            else:
                log.warning("ingest: server.ingest_token is ignored: the nodes have their own "
                            "tokens (node_tokens_file or node_auth: tokenreview) and "
                            "allow_shared_token is off")

    def stop(self) -> None:
        self.db.close()
        log.info("cluster server stopped")
