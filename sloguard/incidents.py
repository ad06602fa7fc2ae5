"""The incident vocabulary: what fired, on what evidence, and every action taken or proposed.

An incident is the unit an SRE reads in the UI and Slack, and the unit actuators attach their
steps to. Its lifecycle follows Prometheus alerting: pending (the condition holds, `for` has not
elapsed) -> firing -> resolved. Dependency-free: the detector, actuators, stores and UI share it.
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass, field
from typing import Any

PENDING = "pending"
FIRING = "firing"
RESOLVED = "resolved"
STATES = (PENDING, FIRING, RESOLVED)
SEVERITIES = ("info", "warning", "critical")
MAX_EVIDENCE = 50


def new_incident_id(now_ns: int | None = None) -> str:
    """Time-ordered id (sortable as text), unique without coordination between nodes."""
    now_ns = now_ns or time.time_ns()
    return f"{now_ns // 1_000_000:013x}-{os.urandom(4).hex()}"


@dataclass(slots=True)
class Evidence:
    """One observation that supports (or ends) the incident."""

    time_ns: int
    value: float | None
    threshold: float | None
    note: str = ""
    change_ns: int | None = None  # when the level changed, if the detector knows


@dataclass(slots=True)
class ActionRecord:
    """A step an actuator took, or would take in dry-run, with its outcome."""

    time_ns: int
    step: str
    target: str
    dry_run: bool
    status: str  # proposed | done | failed | undone
    detail: str = ""


@dataclass
class Incident:
    id: str
    fingerprint: str
    rule: str
    group: str
    severity: str
    node: str
    state: str
    series: dict[str, str]
    started_ns: int
    updated_ns: int
    fired_ns: int | None = None
    resolved_ns: int | None = None
    # Firing, but the condition has not crossed since then (recovering, or in the hysteresis
    # band); None while the latest evaluation crossed. The ladder climbs only while it is None:
    # a signal that recovered under the last lever must not have another stacked on it.
    quiet_since_ns: int | None = None
    summary: str = ""
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    affected: list[dict[str, str]] = field(default_factory=list)
    evidence: list[Evidence] = field(default_factory=list)
    actions: list[ActionRecord] = field(default_factory=list)
    policy: str = ""  # the escalation policy this incident drives, from its rule
    # what was watched: measurement, field, expr, aggregate, window (for charts and backtests)
    signal: dict[str, str] = field(default_factory=dict)

    def add_evidence(self, item: Evidence) -> None:
        """Keep the first crossing and the most recent observations within a bound."""
        self.evidence.append(item)
        if len(self.evidence) > MAX_EVIDENCE:
            del self.evidence[1]

    @property
    def peak(self) -> float | None:
        values = [e.value for e in self.evidence if e.value is not None]
        return max(values) if values else None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Incident:
        data = dict(data)
        data["evidence"] = [Evidence(**e) for e in data.get("evidence", [])]
        data["actions"] = [ActionRecord(**a) for a in data.get("actions", [])]
        return cls(**data)
