"""An example lever plugin: freeze each best-effort workload's cgroup, thaw it on undo.

The strongest suppression there is short of eviction: a frozen BE task takes no CPU, no memory
bandwidth and no I/O, and keeps its memory, so thawing resumes it where it was. cgroup v2 has
`cgroup.freeze` (0/1) in every cgroup; v1 has the freezer controller's `freezer.state`
(THAWED/FROZEN). Every write goes through sloguard's one cgroup executor (`Changes`), which
records the intent before the write, refuses LS cgroups, honours dry-run and keeps the original
for undo, so this file only says which file gets which value.

    policies:                  # a policy file; a rule names it with `policy: freeze-be`
      - name: freeze-be
        steps:
          - step: notify
          - step: freeze
            after: 30s           # only if interference outlasts half a minute
"""

from __future__ import annotations

from typing import Any, ClassVar

from sloguard.actuators.cgroupfs import Cgroups, Changes, Target, select_targets, undo_writes
from sloguard.actuators.env import ActuatorEnv
from sloguard.actuators.hookspecs import hookimpl
from sloguard.actuators.step import StepContext, StepResult, reject_unknown

WHAT = "frozen BE cgroups"


class Freeze:
    kind: ClassVar[str] = "freeze"

    def __init__(self, params: dict[str, Any], env: ActuatorEnv) -> None:
        reject_unknown(params, set(), self.kind)  # nothing to tune: a BE cgroup is frozen or not
        self.params = dict(params)
        self.env = env

    def available(self) -> str | None:
        try:
            cgroups = Cgroups(self.env.cgroup_root)
        except (OSError, LookupError) as exc:
            return f"no cgroup hierarchy at {self.env.cgroup_root}: {exc}"
        if "freezer" not in cgroups.layout.v1 and cgroups.layout.mode != "v2":
            # on a hybrid host the tasks' freezer is v1's: the unified tree only tracks them
            return "no freezer: neither a v1 freezer hierarchy nor a pure cgroup v2 host"
        return None

    @staticmethod
    def target(ctx: StepContext) -> str:
        return f"node/{ctx.node} BE cgroups (freezer)"

    def apply(self, ctx: StepContext) -> StepResult:
        cgroups = Cgroups(self.env.cgroup_root)
        targets, refused = select_targets(ctx, "workload")  # each BE workload, never a parent
        changes = Changes(ctx, self.env, self.kind, self.params)
        for target in targets:
            with changes.each(target):
                self._one(changes, cgroups, target)
        return changes.result(self.target(ctx), WHAT, refused)

    def _one(self, changes: Changes, cgroups: Cgroups, target: Target) -> None:
        located = cgroups.controller_dir("freezer", target.parts)
        if located is None or (located[1] == "v2" and cgroups.layout.mode != "v2"):
            changes.fail(f"{target.name}: no freezer for it")
            return
        directory, version = located
        path, value = (directory / "freezer.state", "FROZEN") if version == "v1" else (
            directory / "cgroup.freeze", "1")
        outcome = changes.set(target, target.parts, path, value)
        if outcome == "absent":
            changes.fail(f"{target.name}: no {path.name}")
        elif outcome.startswith("error"):
            changes.fail(f"{target.name}: {path.name} = {value}: {outcome}")

    def undo(self, ctx: StepContext, undo: dict[str, Any]) -> StepResult:
        return undo_writes(ctx, self.target(ctx), WHAT, undo.get("writes", []))


@hookimpl
def sloguard_steps() -> list[type]:
    return [Freeze]
