"""The memory lever: BE may not grow while LS suffers from memory pressure.

Each BE cgroup gets a ceiling just above what it uses now: max(usage x factor, min_bytes),
rounded up to a page, never below current usage and never looser than a limit it already has.

- v2: `memory.high`. Above it the kernel throttles the cgroup's allocations and reclaims its
  memory, but never OOM-kills for it: BE slows down instead of dying, which is what a reversible
  suppression lever should do (eviction is a later rung).
- v1 has no such throttle. `v1: limit` (default) writes `memory.limit_in_bytes`, the hard limit
  the issue asks for: set above current usage it does not OOM-kill at once, the kernel first
  reclaims BE's page cache when BE grows, and only a BE that keeps growing with nothing to
  reclaim meets the OOM killer (in its own cgroup, not LS's). `v1: soft` writes
  `memory.soft_limit_in_bytes` instead, which never kills but only acts under node-wide
  pressure (reclaim takes BE's pages above the soft limit first).

colocation-lab (docs/actuators.md) saw memory PSI stay 0 under its vm antagonist (2 x 1 GiB) on
this machine and no lever meet the target against it; this lever addresses memory pressure
(LS memory stalls, reclaim), not memory bandwidth. Undo restores the previous values.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, ClassVar

from sloguard.actuators.cgroupfs import (
    Cgroups,
    Changes,
    Target,
    cgroups_unavailable,
    read_value,
    select_targets,
    undo_writes,
)
from sloguard.actuators.env import ActuatorEnv
from sloguard.actuators.hookspecs import hookimpl
from sloguard.actuators.step import StepContext, StepResult, reject_unknown
from sloguard.core.units import parse_size

WHAT = "memory ceiling for BE"
PAGE = 4096
UNLIMITED_V1 = 1 << 62  # v1 prints "no limit" as a huge page-aligned number


def _limit(text: str | None) -> int | None:
    if text is None or text == "max":
        return None
    try:
        value = int(text)
    except ValueError:
        return None
    return None if value >= UNLIMITED_V1 else value


class MemoryLimit:
    kind: ClassVar[str] = "memory_limit"
    per_workload: ClassVar[bool] = True  # targets ctx.be_workloads(): `target: suspects`

    def __init__(self, params: dict[str, Any], env: ActuatorEnv) -> None:
        reject_unknown(params, {"factor", "min_bytes", "v1"}, self.kind)
        factor = params.get("factor", 1.2)
        if isinstance(factor, bool) or not isinstance(factor, int | float) or not (
                1.0 <= factor <= 100.0):
            raise ValueError("factor must be a number from 1.0 (never below current usage) "
                             "to 100")
        self.factor = float(factor)
        self.min_bytes = parse_size(params.get("min_bytes", "64MiB"))
        self.v1 = params.get("v1", "limit")
        if self.v1 not in ("limit", "soft"):
            raise ValueError("v1 must be limit (memory.limit_in_bytes) or soft "
                             "(memory.soft_limit_in_bytes)")
        self.params = dict(params)
        self.env = env

    def available(self) -> str | None:
        return cgroups_unavailable(self.env, "memory")

    @staticmethod
    def target(ctx: StepContext) -> str:
        return f"node/{ctx.node} BE cgroups (memory)"

    def apply(self, ctx: StepContext) -> StepResult:
        cgroups = Cgroups(self.env.cgroup_root)
        targets, refused = select_targets(ctx, "workload")
        changes = Changes(ctx, self.env, self.kind, self.params)
        for target in targets:
            located = cgroups.controller_dir("memory", target.parts)
            if located is None:
                changes.fail(f"{target.name}: no memory controller")
                continue
            directory, version = located
            with changes.each(target):
                if version == "v1":
                    name = "memory.limit_in_bytes" if self.v1 == "limit" else \
                        "memory.soft_limit_in_bytes"
                    self._apply(changes, target, directory / "memory.usage_in_bytes",
                                directory / name)
                else:
                    self._apply(changes, target, directory / "memory.current",
                                directory / "memory.high")
        return changes.result(self.target(ctx), WHAT, refused)

    def _apply(self, changes: Changes, target: Target, usage_file: Path,
               limit_file: Path) -> None:
        if not usage_file.parent.is_dir():
            changes.note(f"{target.name}: gone")
            return
        usage_text, current = read_value(usage_file), read_value(limit_file)
        if usage_text is None or current is None or not usage_text.isdigit():
            changes.fail(f"{target.name}: no {usage_file.name} or {limit_file.name} (memory "
                         "controller not enabled for it)")
            return
        usage = int(usage_text)
        ceiling = max(math.ceil(usage * self.factor), self.min_bytes, usage)
        ceiling = -(-ceiling // PAGE) * PAGE
        existing = _limit(current)
        if existing is not None and existing <= ceiling and not changes.ours(limit_file,
                                                                            current):
            changes.already(f"{target.name}: {limit_file.name} already {existing} <= {ceiling} "
                         f"(usage {usage}): left as it is")
            return
        outcome = changes.set(target, target.parts, limit_file, str(ceiling))
        if outcome.startswith("error") or outcome == "absent":
            changes.fail(f"{target.name}: {limit_file.name} = {ceiling}: {outcome}")
        elif outcome == "written":
            changes.note(f"{target.name}: usage {usage}")

    def undo(self, ctx: StepContext, undo: dict[str, Any]) -> StepResult:
        return undo_writes(ctx, self.target(ctx), WHAT, undo.get("writes", []))


@hookimpl
def sloguard_steps() -> list[type]:
    return [MemoryLimit]
