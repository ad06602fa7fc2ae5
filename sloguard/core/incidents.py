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
AGENT_GROUP = "sloguard"  # the group of the incidents the agent raises about itself
MAX_EVIDENCE = 50
# An incident that flaps for days (a lever applied and undone every few minutes) must not grow
# a document that is rewritten on every save: beyond MAX_ACTIONS, the middle is replaced by one
# record counting what was left out (the audit log in actuators.db keeps every action).
MAX_ACTIONS = 200
KEEP_FIRST_ACTIONS = 50
COMPACTED = "compacted"


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
    # the BE workloads the slowdown is attributed to, first suspect first (core/suspects.py:
    # Suspect.to_dict), and when they were last ranked; empty while none were
    suspects: list[dict[str, Any]] = field(default_factory=list)
    suspects_ns: int | None = None

    def add_evidence(self, item: Evidence) -> None:
        """Keep the first crossing and the most recent observations within a bound."""
        self.evidence.append(item)
        if len(self.evidence) > MAX_EVIDENCE:
            del self.evidence[1]

    def compact(self) -> None:
        """Bound evidence and actions, however they were added (the ladder appends actions
        itself): the first ones and the most recent stay, the middle is counted."""
        if len(self.evidence) > MAX_EVIDENCE:
            del self.evidence[1:len(self.evidence) - MAX_EVIDENCE + 1]
        if len(self.actions) <= MAX_ACTIONS:
            return
        head = self.actions[:KEEP_FIRST_ACTIONS]
        rest = self.actions[KEEP_FIRST_ACTIONS:]
        omitted = 0
        if rest and rest[0].step == COMPACTED:  # compacted before: add to its count
            omitted = int(rest[0].target or 0)
            rest = rest[1:]
        keep = MAX_ACTIONS - KEEP_FIRST_ACTIONS - 1
        dropped, tail = rest[:-keep], rest[-keep:]
        omitted += len(dropped)
        marker = ActionRecord(dropped[-1].time_ns if dropped else tail[0].time_ns, COMPACTED,
                              str(omitted), False, "omitted",
                              f"{omitted} actions left out of this incident; the audit log "
                              "(/api/actions) has every one")
        self.actions = [*head, marker, *tail]

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
