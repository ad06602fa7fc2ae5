"""The dry-run actuator: records what the guardrail would do, touching nothing.

Until the escalation ladder lands, every firing incident gets the first rung proposed (notify),
and the record of it is undone on recovery, so the incident timeline already has the shape the
real actuators will fill: step, target, dry-run flag, status, detail.
"""

from __future__ import annotations

from sloguard.core.incidents import ActionRecord, Incident


class DryRunActuator:
    def __init__(self, node: str) -> None:
        self.node = node

    def on_firing(self, incident: Incident, now_ns: int) -> list[ActionRecord]:
        return [
            ActionRecord(
                now_ns, "notify", f"node/{self.node}", dry_run=True, status="proposed",
                detail=f"would notify: [{incident.severity}] {incident.summary}",
            )
        ]

    def on_resolved(self, incident: Incident, now_ns: int) -> list[ActionRecord]:
        return [
            ActionRecord(
                now_ns, "notify", f"node/{self.node}", dry_run=True, status="proposed",
                detail=f"would notify resolved: {incident.rule}",
            )
        ]
