"""The first suppression lever: BE runs only when LS does not want the CPU.

Measured on this project's lab machine (docs/actuators.md, colocation-lab): SCHED_IDLE for the
BE cgroup (`cpu.idle = 1`, kernel >= 5.15, v1 cpu controller and v2) or the minimum CPU weight
protected LS tail latency against a CPU antagonist while BE kept ~100% of its throughput, where
a CFS quota did neither. It is the cheapest lever to try first: BE loses nothing while LS is idle.

Where `cpu.idle` is missing (older kernels) or refused, `mode: auto` falls back to the minimum
weight (`cpu.shares = 2` on v1, `cpu.weight = 1` on v2). Setting cpu.idle makes the kernel reset
the group's weight (to 3, and to 1024 when idle is cleared), so the weight from before is
recorded too and put back on undo.

Which cgroup: SCHED_IDLE decides preemption between sibling entities, so it has to be set where
BE meets LS. `scope: auto` (default) sets it on the kubelet's besteffort QoS cgroup when the BE
pods sit in one (what koordlet does; its siblings are the LS pods' cgroups) and on each BE
workload's own cgroup otherwise; `workload` and `parent` force one or the other.
"""

from __future__ import annotations

from typing import Any, ClassVar

from sloguard.actuators.cgroupfs import (
    SCOPES,
    Cgroups,
    Changes,
    Target,
    cgroups_unavailable,
    select_targets,
    undo_writes,
)
from sloguard.actuators.env import ActuatorEnv
from sloguard.actuators.hookspecs import hookimpl
from sloguard.actuators.step import StepContext, StepResult, reject_unknown

MODES = ("auto", "idle", "weight")
WHAT = "SCHED_IDLE / minimum weight for BE"


class CpuIdle:
    kind: ClassVar[str] = "cpu_idle"
    per_workload: ClassVar[bool] = True  # targets ctx.be_workloads(): `target: suspects`
    can_stand: ClassVar[bool] = True  # its value needs no measurement: a policy's `standing:`

    def __init__(self, params: dict[str, Any], env: ActuatorEnv) -> None:
        reject_unknown(params, {"mode", "scope"}, self.kind)
        self.mode = params.get("mode", "auto")
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}")
        self.scope = params.get("scope", "auto")
        if self.scope not in SCOPES:
            raise ValueError(f"scope must be one of {', '.join(SCOPES)}")
        self.params = dict(params)
        self.env = env

    def available(self) -> str | None:
        return cgroups_unavailable(self.env, "cpu")

    @staticmethod
    def target(ctx: StepContext) -> str:
        return f"node/{ctx.node} BE cgroups (cpu)"

    def apply(self, ctx: StepContext) -> StepResult:
        cgroups = Cgroups(self.env.cgroup_root)
        targets, refused = select_targets(ctx, self.scope)
        changes = Changes(ctx, self.env, self.kind, self.params)
        for target in targets:
            with changes.each(target):
                self._one(changes, cgroups, target)
        return changes.result(self.target(ctx), WHAT, refused)

    def _one(self, changes: Changes, cgroups: Cgroups, target: Target) -> None:
        located = cgroups.controller_path("cpu", target.parts)  # a string: it may stand
        if located is None:
            changes.fail(f"{target.name}: no cpu controller")
            return
        directory, version = located
        weight_file, weight = ("cpu.shares", "2") if version == "v1" else ("cpu.weight", "1")
        if self.mode in ("auto", "idle"):
            outcome = changes.set(target, target.parts, f"{directory}/cpu.idle", "1",
                                  also=[f"{directory}/{weight_file}"])
            if outcome in ("written", "kept", "gone", "refused"):
                return
            why = "absent (kernel < 5.15, or no cpu controller here)" if \
                outcome == "absent" else outcome
            if self.mode == "idle":
                changes.fail(f"{target.name}: cpu.idle {why}")
                return
            changes.note(f"{target.name}: cpu.idle {why}: minimum weight instead")
        outcome = changes.set(target, target.parts, f"{directory}/{weight_file}", weight)
        if outcome == "absent":
            changes.fail(f"{target.name}: no {weight_file} (cpu controller not enabled for it)")
        elif outcome.startswith("error"):
            changes.fail(f"{target.name}: {weight_file} = {weight}: {outcome}")

    def undo(self, ctx: StepContext, undo: dict[str, Any]) -> StepResult:
        return undo_writes(ctx, self.target(ctx), WHAT, undo.get("writes", []))


@hookimpl
def sloguard_steps() -> list[type]:
    return [CpuIdle]
