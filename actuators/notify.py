"""The notify rung: hand the incident to the alert pipeline (Slack, with Alertmanager-style
routing, grouping and silences) at the point of the ladder the policy puts it."""

from __future__ import annotations

from typing import Any, ClassVar

from sloguard.actuators.env import ActuatorEnv
from sloguard.actuators.step import DONE, PROPOSED, StepContext, StepResult, reject_unknown


class Notify:
    kind: ClassVar[str] = "notify"

    def __init__(self, params: dict[str, Any], env: ActuatorEnv) -> None:
        reject_unknown(params, set(), self.kind)
        self.env = env

    def available(self) -> str | None:
        if self.env.notifier is None:
            return "no notifier configured"
        return None

    def apply(self, ctx: StepContext) -> StepResult:
        target = "alerting"
        if ctx.dry_run:
            return StepResult(PROPOSED, target, f"would notify about incident {ctx.incident_id}")
        self.env.notifier.notify(ctx.incident_id, ctx.now_ns)
        return StepResult(DONE, target, f"incident {ctx.incident_id} handed to alerting")

    def undo(self, ctx: StepContext, undo: dict[str, Any]) -> StepResult:
        return StepResult(DONE, "alerting", "nothing to undo: the resolve notification follows "
                                            "the incident")
