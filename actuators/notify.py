"""The notify rung: hand the incident to the alert pipeline (Slack, with Alertmanager-style
routing, grouping and silences) at the point of the ladder the policy puts it.

In dry-run the hand-over still happens when the pipeline says so (`alerting.send_in_dry_run`,
the default): a message changes nothing on the node, and shadow mode is for people to read
what the guardrail would do, which they do in Slack.
"""

from __future__ import annotations

from typing import Any, ClassVar

from sloguard.actuators.env import ActuatorEnv
from sloguard.actuators.hookspecs import hookimpl
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
        notifier = self.env.notifier
        if ctx.dry_run and not getattr(notifier, "send_in_dry_run", False):
            return StepResult(PROPOSED, target, f"would notify about incident {ctx.incident_id}")
        notifier.notify(ctx.incident_id, ctx.now_ns)
        note = " (alerting notifies in dry-run: a message changes nothing)" if ctx.dry_run else ""
        return StepResult(DONE, target, f"incident {ctx.incident_id} handed to alerting{note}")

    def undo(self, ctx: StepContext, undo: dict[str, Any]) -> StepResult:
        return StepResult(DONE, "alerting", "nothing to undo: the resolve notification follows "
                                            "the incident")


@hookimpl
def sloguard_steps() -> list[type]:
    return [Notify]
