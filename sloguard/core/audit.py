"""One audit entry: a step applied or undone (or proposed, in dry-run) on a node.

Vocabulary rather than part of the ledger, because three layers speak it: the actuators'
ledger writes it, the forwarder sends it, and the cluster server's stores (SQLite through the
ledger, PostgreSQL in sloguard/store/cluster_pg.py) keep and return it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class AuditEntry:
    time_ns: int
    node: str
    incident: str
    policy: str
    rung: int
    kind: str
    action: str  # apply | undo
    dry_run: bool
    status: str
    target: str
    detail: str
    reason: str
    id: int | None = None
