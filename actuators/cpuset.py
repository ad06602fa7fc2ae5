"""The second suppression lever: BE off the LS cores.

Measured in colocation-lab (docs/actuators.md): cpuset separation was the only lever that helped
against the cache and I/O antagonists (LS p99 back to 1.0-1.1x baseline, BE keeping 56-100% of
its throughput), because SCHED_IDLE and weights only arbitrate a CPU that LS and BE share, while
separation stops BE from sharing LS's cores (and their L1/L2 and run queues) at all.

LS is never touched: the lever reserves cores for LS by moving BE off them (LS keeps its own
cpuset, which then has those cores to itself). Reserved cores: `ls_cpus` (a list, or a cpulist
such as "0-3,8"), or `reserve: N` cores chosen deterministically (whole SMT cores first, lowest
numbers first), by default half of the node's CPUs rounded up; BE is never left with no CPU.

v1 (cpuset controller): a child's cpuset.cpus must stay a subset of its parent's, so the BE
cgroup's whole subtree is narrowed deepest first (containers, then the pod) and widened back in
the reverse order on undo. cpuset.mems is left as it is (a cgroup that holds tasks already has
mems; one without tasks does not need them to get cpus). v2: cpuset.cpus of the BE cgroup (its
children's effective CPUs follow), with the cpuset controller enabled in the parent's
cgroup.subtree_control when it is not yet (and disabled again on undo).
"""

from __future__ import annotations

import contextlib
import os
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
    write_value,
)
from sloguard.actuators.env import ActuatorEnv
from sloguard.actuators.hookspecs import hookimpl
from sloguard.actuators.step import (
    DONE,
    FAILED,
    SKIPPED,
    StepContext,
    StepResult,
    reject_unknown,
)
from sloguard.core.cpulist import format_cpulist, parse_cpulist

WHAT = "cpuset separation (BE off the LS cores)"
SYS_CPU = Path("/sys/devices/system/cpu")


def ordered_for_reservation(cpus: list[int], sys_cpu: Path = SYS_CPU) -> list[int]:
    """CPUs in the order cores are reserved: SMT siblings together, lowest core first, so LS
    gets whole physical cores and does not share a core's pipeline with BE."""
    order: list[int] = []
    seen: set[int] = set()
    for cpu in sorted(cpus):
        if cpu in seen:
            continue
        siblings = [cpu]
        text = read_value(sys_cpu / f"cpu{cpu}" / "topology" / "thread_siblings_list")
        if text:
            with contextlib.suppress(ValueError):
                siblings = [c for c in parse_cpulist(text) if c in cpus] or [cpu]
        for sibling in sorted(siblings):
            if sibling not in seen:
                seen.add(sibling)
                order.append(sibling)
    return order


class Cpuset:
    kind: ClassVar[str] = "cpuset"
    per_workload: ClassVar[bool] = True  # targets ctx.be_workloads(): `target: suspects`
    can_stand: ClassVar[bool] = True  # its value needs no measurement: a policy's `standing:`

    def __init__(self, params: dict[str, Any], env: ActuatorEnv) -> None:
        reject_unknown(params, {"ls_cpus", "reserve"}, self.kind)
        if "ls_cpus" in params and "reserve" in params:
            raise ValueError("give ls_cpus or reserve, not both")
        self.ls_cpus: list[int] | None = None
        self.reserve: int | None = None
        if "ls_cpus" in params:
            raw = params["ls_cpus"]
            try:
                if isinstance(raw, str):
                    self.ls_cpus = parse_cpulist(raw)
                elif isinstance(raw, list) and all(
                        isinstance(c, int) and not isinstance(c, bool) and c >= 0 for c in raw):
                    self.ls_cpus = sorted(set(raw))
                else:
                    raise ValueError
            except ValueError:
                raise ValueError("ls_cpus must be a list of CPU numbers or a cpulist such as "
                                 "'0-3,8'") from None
            if not self.ls_cpus:
                raise ValueError("ls_cpus is empty: nothing would be reserved for LS")
        if "reserve" in params:
            reserve = params["reserve"]
            if not isinstance(reserve, int) or isinstance(reserve, bool) or reserve < 1:
                raise ValueError("reserve must be a whole number of CPUs, at least 1")
            self.reserve = reserve
        self.params = dict(params)
        self.env = env

    def available(self) -> str | None:
        return cgroups_unavailable(self.env, "cpuset")

    @staticmethod
    def target(ctx: StepContext) -> str:
        return f"node/{ctx.node} BE cgroups (cpuset)"

    # -- which CPUs --------------------------------------------------------------------------

    def node_cpus(self, cgroups: Cgroups) -> list[int]:
        """The CPUs workloads may use: the cpuset root's, else the online ones."""
        root = cgroups.hierarchy_of("cpuset")
        names = ("cpuset.effective_cpus", "cpuset.cpus") if "cpuset" in cgroups.layout.v1 \
            else ("cpuset.cpus.effective",)
        for name in names:
            text = read_value(root / name) if root is not None else None
            if text:
                return parse_cpulist(text)
        return parse_cpulist(read_value(SYS_CPU / "online") or "0")

    def split(self, cpus: list[int]) -> tuple[list[int], str]:
        """(the cores reserved for LS, why not, when no separation is possible)."""
        if len(cpus) < 2:
            return [], f"the node has {len(cpus)} CPU: nothing to separate"
        if self.ls_cpus is not None:
            ls = [c for c in self.ls_cpus if c in cpus]
            if not ls:
                return [], f"none of ls_cpus {format_cpulist(self.ls_cpus)} is among the " \
                           f"node's CPUs {format_cpulist(cpus)}"
            if len(ls) >= len(cpus):
                return [], "ls_cpus covers every CPU: BE would have none"
            return ls, ""
        wanted = self.reserve if self.reserve is not None else (len(cpus) + 1) // 2
        wanted = min(wanted, len(cpus) - 1)  # never BE with zero CPUs
        return sorted(ordered_for_reservation(cpus)[:wanted]), ""

    # -- apply and undo ----------------------------------------------------------------------

    def apply(self, ctx: StepContext) -> StepResult:
        cgroups = Cgroups(self.env.cgroup_root)
        targets, refused = select_targets(ctx, "workload")
        changes = Changes(ctx, self.env, self.kind, self.params)
        cpus = self.node_cpus(cgroups)
        ls, impossible = self.split(cpus)
        if impossible:
            return StepResult(SKIPPED, self.target(ctx), f"{WHAT}: {impossible}",
                              {"writes": []})
        changes.note(f"LS cores {format_cpulist(ls)}")
        enabled: list[str] = []
        changes.extra["ls_cpus"] = format_cpulist(ls)
        for target in targets:
            located = cgroups.controller_dir("cpuset", target.parts)
            if located is None:
                changes.fail(f"{target.name}: no cpuset controller")
                continue
            directory, version = located
            with changes.each(target):
                if version == "v1":
                    elsewhere = cgroups.controller_dir("cpu", target.parts)
                    exists = elsewhere is not None and elsewhere[0].is_dir()
                    self._apply_v1(changes, target, directory, ls, exists)
                else:
                    self._apply_v2(changes, target, directory, ls, enabled)
        return changes.result(self.target(ctx), WHAT, refused,
                              {"enabled": enabled, "ls_cpus": format_cpulist(ls)})

    def _apply_v1(self, changes: Changes, target: Target, directory: Path,
                  ls: list[int], exists: bool) -> None:
        if not directory.is_dir():
            if exists:  # the pod is there (cpu hierarchy), its cpuset cgroup is not
                changes.fail(f"{target.name}: no cpuset cgroup (the runtime made none)")
            else:
                changes.note(f"{target.name}: gone")
            return
        parent = read_value(directory.parent / "cpuset.cpus")
        allowed = parse_cpulist(parent) if parent else []
        be = [c for c in allowed if c not in ls]
        if not be:
            changes.fail(f"{target.name}: its parent allows only CPUs "
                         f"{format_cpulist(allowed) or '(none)'}: BE would have none left")
            return
        value = format_cpulist(be)
        subtree: list[tuple[str, ...]] = []
        for dirpath, _dirs, _files in os.walk(directory):
            relative = Path(dirpath).relative_to(directory).parts
            subtree.append(target.parts + relative)
        for parts in sorted(subtree, key=len, reverse=True):  # v1: children first
            path = directory.joinpath(*parts[len(target.parts):]) / "cpuset.cpus"
            outcome = changes.set(target, parts, path, value)
            if outcome == "refused":
                return  # the ones above would fail the subset rule
            if outcome.startswith("error") or outcome == "absent":
                changes.fail(f"/{'/'.join(parts)}: cpuset.cpus = {value}: {outcome}")
                return

    def _apply_v2(self, changes: Changes, target: Target, directory: Path, ls: list[int],
                  enabled: list[str]) -> None:
        if not directory.is_dir():
            changes.note(f"{target.name}: gone")
            return
        allowed_text = read_value(directory.parent / "cpuset.cpus.effective")
        allowed = parse_cpulist(allowed_text) if allowed_text else []
        be = [c for c in allowed if c not in ls]
        if not be:
            changes.fail(f"{target.name}: its parent has only CPUs "
                         f"{format_cpulist(allowed) or '(none)'}: BE would have none left")
            return
        value = format_cpulist(be)
        controllers = (read_value(directory / "cgroup.controllers") or "").split()
        if "cpuset" not in controllers and not self._enable_in_parent(
                changes, target, directory, enabled, value):
            return
        outcome = changes.set(target, target.parts, directory / "cpuset.cpus", value)
        if outcome.startswith("error") or outcome == "absent":
            changes.fail(f"{target.name}: cpuset.cpus = {value}: {outcome}")

    def _enable_in_parent(self, changes: Changes, target: Target, directory: Path,
                          enabled: list[str], value: str) -> bool:
        parent = directory.parent
        parent_parts = target.parts[:-1]
        available = (read_value(parent / "cgroup.controllers") or "").split()
        if not parent_parts or "cpuset" not in available:
            changes.fail(f"{target.name}: the cpuset controller is not enabled for it, and its "
                         "parent cannot enable it (enable cpuset down to the BE cgroups)")
            return False
        why = changes.refusal(target, parent_parts)
        if why:
            changes.refused.append(why)
            return False
        control = parent / "cgroup.subtree_control"
        if changes.ctx.dry_run:
            changes.note(f"/{'/'.join(parent_parts)}: would enable cpuset for its children, "
                         f"then write {target.name} cpuset.cpus = {value}")
            changes.records.append({"cgroup": target.name, "file": str(
                directory / "cpuset.cpus"), "old": "", "wrote": value})
            enabled.append(str(control))
            return False
        changes.extra["enabled"] = [*enabled, str(control)]
        changes.intend()  # undo disables it again, even if the agent dies right after
        try:
            self._subtree_control(control, "+cpuset")
        except OSError as exc:
            changes.fail(f"/{'/'.join(parent_parts)}: cannot enable cpuset: "
                         f"{exc.strerror or exc}")
            return False
        enabled.append(str(control))
        changes.note(f"/{'/'.join(parent_parts)}: cpuset enabled for its children")
        return True

    def _subtree_control(self, path: Path, change: str) -> None:
        """Enable or disable a controller for a cgroup's children (a format test replays what
        the kernel does on this write)."""
        write_value(path, change)

    def undo(self, ctx: StepContext, undo: dict[str, Any]) -> StepResult:
        result = undo_writes(ctx, self.target(ctx), WHAT, undo.get("writes", []))
        if result.status == FAILED or ctx.dry_run:
            return result
        notes = []
        for control in undo.get("enabled", []):
            path = Path(control)
            current = read_value(path)
            if current is None or "cpuset" not in current.split():
                continue
            try:
                self._subtree_control(path, "-cpuset")
                notes.append(f"cpuset disabled again in {path.parent}")
            except OSError as exc:  # a child enabled it further down since: theirs now
                notes.append(f"cpuset left enabled in {path.parent}: {exc.strerror or exc}")
        if notes:
            result = StepResult(DONE, result.target, f"{result.detail}; {'; '.join(notes)}")
        return result


@hookimpl
def sloguard_steps() -> list[type]:
    return [Cpuset]
