"""The last suppression lever: a CFS quota on BE, sized as Koordinator's BE CPU suppress does.

    BE quota = node capacity x threshold_percent / 100 - CPU used by everything but BE
               (never below min_cores)

Measured in colocation-lab (docs/actuators.md): a quota alone did NOT protect LS tail latency
(throttled BE runs in bursts and still preempts LS; p99 stayed 10-40x baseline at 100%, 50% and
25% of a CPU, while BE lost throughput in proportion). So it comes after SCHED_IDLE, cpuset and
memory_limit: it is a throughput cap that leaves LS and the system their share of the node, not
a latency fix.

"Everything but BE" is measured, not taken from the store (a step has none): the cgroup CPU
counters of the hierarchy root (all tasks) and of the BE cgroups are read `sample` seconds apart
(0.5 s by default; the ladder tick waits that long). Root minus BE is LS plus system daemons,
which is what Koordinator subtracts too (LS pods' usage and the system's); the LS pods' own
usage is measured alongside and reported.

Which cgroup: `scope: auto` (default) puts one quota on the kubelet's besteffort QoS cgroup when
the BE pods sit there (what Koordinator does: one budget for all BE, which BE pods share as
their demand goes, and no per-pod guess), else the budget is split evenly over the BE
workloads' own cgroups. v1 writes cpu.cfs_period_us and cpu.cfs_quota_us, v2 cpu.max.

`repeat` in the policy re-applies with the current numbers (the quota follows LS usage); the
values restored on undo stay the ones from before the first apply. An existing quota that is
already tighter than the computed one and is not sloguard's is left as it is.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, ClassVar

from sloguard.actuators.cgroupfs import (
    SCOPES,
    Cgroups,
    Changes,
    Guard,
    Target,
    cgroups_unavailable,
    parts_of,
    read_value,
    select_targets,
    undo_writes,
)
from sloguard.actuators.env import ActuatorEnv
from sloguard.actuators.hookspecs import hookimpl
from sloguard.actuators.step import BE, StepContext, StepResult, reject_unknown
from sloguard.core.units import parse_duration

WHAT = "CPU quota for BE"
MIN_QUOTA_US = 1000  # the kernel refuses quotas below 1 ms


def usage_seconds(cgroups: Cgroups, parts: tuple[str, ...]) -> float | None:
    """Cumulative CPU time of a cgroup (the root: of every task), or None when unreadable."""
    if "cpuacct" in cgroups.layout.v1:
        text = read_value(cgroups.layout.v1["cpuacct"].joinpath(*parts) / "cpuacct.usage")
        return int(text) / 1e9 if text and text.isdigit() else None
    if cgroups.layout.unified is not None:
        stat = read_value(cgroups.layout.unified.joinpath(*parts) / "cpu.stat") or ""
        for line in stat.splitlines():
            key, _, value = line.partition(" ")
            if key == "usage_usec" and value.strip().isdigit():
                return int(value) / 1e6
    return None


def _proc_stat_busy() -> float | None:
    """Busy CPU seconds of the whole node (fallback when the root cgroup has no counter)."""
    try:
        with open("/proc/stat") as handle:
            fields = handle.readline().split()
    except OSError:
        return None
    ticks = [int(v) for v in fields[1:8]]  # user nice system idle iowait irq softirq
    busy = ticks[0] + ticks[1] + ticks[2] + ticks[5] + ticks[6]
    return busy / os.sysconf("SC_CLK_TCK")


def _topmost(paths: list[tuple[str, ...]]) -> list[tuple[str, ...]]:
    """Drop cgroups inside another listed one, so nested workloads are not counted twice."""
    unique = set(paths)
    return sorted(p for p in unique if not any(p[:len(o)] == o and p != o for o in unique))


class CpuQuota:
    kind: ClassVar[str] = "cpu_quota"
    per_workload: ClassVar[bool] = True  # targets ctx.be_workloads(): `target: suspects`

    def __init__(self, params: dict[str, Any], env: ActuatorEnv) -> None:
        reject_unknown(params, {"threshold_percent", "min_cores", "period_us", "scope",
                                "sample", "capacity_cores"}, self.kind)
        self.threshold = _number(params, "threshold_percent", 65.0, 1.0, 100.0)
        self.min_cores = _number(params, "min_cores", 0.5, 0.01, 1024.0)
        period = params.get("period_us", 100_000)
        if not isinstance(period, int) or isinstance(period, bool) or not (
                1000 <= period <= 1_000_000):
            raise ValueError("period_us must be a whole number from 1000 to 1000000")
        self.period_us = period
        self.scope = params.get("scope", "auto")
        if self.scope not in SCOPES:
            raise ValueError(f"scope must be one of {', '.join(SCOPES)}")
        self.sample = parse_duration(params.get("sample", 0.5))
        if not 0.01 <= self.sample <= 10:
            raise ValueError("sample must be from 10ms to 10s")
        self.capacity = _number(params, "capacity_cores", 0.0, 0.01, 4096.0) \
            if "capacity_cores" in params else None
        self.params = dict(params)
        self.env = env

    def available(self) -> str | None:
        return cgroups_unavailable(self.env, "cpu")

    @staticmethod
    def target(ctx: StepContext) -> str:
        return f"node/{ctx.node} BE cgroups (cpu quota)"

    # -- the budget --------------------------------------------------------------------------

    def measure(self, cgroups: Cgroups, ctx: StepContext) -> tuple[float, float, float]:
        """(CPU cores used by everything but BE, by BE, by LS) over the last `sample` s."""
        inventory = ctx.inventory()
        be = _topmost([p for w in inventory if w.get("class") == BE
                       and (p := parts_of(w.get("cgroup", ""))) is not None])
        ls = _topmost([t for t in Guard(inventory).protected if t])

        def read() -> tuple[float | None, float, float]:
            root = usage_seconds(cgroups, ())
            if root is None:
                root = _proc_stat_busy()
            return (root, sum(usage_seconds(cgroups, p) or 0.0 for p in be),
                    sum(usage_seconds(cgroups, p) or 0.0 for p in ls))

        start, first = time.monotonic(), read()
        time.sleep(self.sample)
        elapsed, second = time.monotonic() - start, read()
        if first[0] is None or second[0] is None:
            raise OSError("no CPU usage counter for the node (root cgroup or /proc/stat)")
        node = max(0.0, second[0] - first[0]) / elapsed
        be_used = max(0.0, second[1] - first[1]) / elapsed
        ls_used = max(0.0, second[2] - first[2]) / elapsed
        return max(0.0, node - be_used), be_used, ls_used

    # -- apply and undo ----------------------------------------------------------------------

    def apply(self, ctx: StepContext) -> StepResult:
        cgroups = Cgroups(self.env.cgroup_root)
        targets, refused = select_targets(ctx, self.scope)
        changes = Changes(ctx, self.env, self.kind, self.params)
        if not targets:
            return changes.result(self.target(ctx), WHAT, refused)
        non_be, be_used, ls_used = self.measure(cgroups, ctx)
        capacity = self.capacity or float(os.cpu_count() or 1)
        budget = max(self.min_cores, capacity * self.threshold / 100 - non_be)
        share = budget / len(targets)
        quota_us = max(MIN_QUOTA_US, round(share * self.period_us))
        changes.note(
            f"{capacity:g} cores x {self.threshold:g}% - {non_be:.2f} used by all but BE "
            f"(LS pods {ls_used:.2f}; BE was using {be_used:.2f}) = {budget:.2f} cores"
            + (f", {share:.2f} per cgroup" if len(targets) > 1 else ""))
        for target in targets:
            located = cgroups.controller_dir("cpu", target.parts)
            if located is None:
                changes.fail(f"{target.name}: no cpu controller")
                continue
            directory, version = located
            with changes.each(target):
                if version == "v1":
                    self._apply_v1(changes, target, directory, quota_us)
                else:
                    self._apply_v2(changes, target, directory, quota_us)
        return changes.result(self.target(ctx), WHAT, refused, {
            "budget_cores": round(budget, 3), "non_be_cores": round(non_be, 3)})

    def _tighter_already(self, changes: Changes, target: Target, path: Path,
                         limit_cores: float | None, quota_us: int) -> bool:
        current = read_value(path) if path.parent.is_dir() else None
        if limit_cores is None or changes.ours(path, current):
            return False
        if limit_cores <= quota_us / self.period_us:
            changes.already(f"{target.name}: already limited to {limit_cores:.2f} cores (not by "
                         "sloguard): left as it is")
            return True
        return False

    def _apply_v1(self, changes: Changes, target: Target, directory: Path,
                  quota_us: int) -> None:
        quota_file, period_file = directory / "cpu.cfs_quota_us", directory / "cpu.cfs_period_us"
        quota, period = read_value(quota_file), read_value(period_file)
        if quota is None or period is None:
            if directory.is_dir():
                changes.fail(f"{target.name}: no cpu.cfs_quota_us (CONFIG_CFS_BANDWIDTH off?)")
            else:
                changes.note(f"{target.name}: gone")
            return
        limit = int(quota) / int(period) if int(quota) > 0 and int(period) > 0 else None
        if self._tighter_already(changes, target, quota_file, limit, quota_us):
            return
        for path, value in ((period_file, str(self.period_us)), (quota_file, str(quota_us))):
            outcome = changes.set(target, target.parts, path, value)
            if outcome.startswith("error") or outcome == "absent":
                changes.fail(f"{target.name}: {path.name} = {value}: {outcome}")
                return

    def _apply_v2(self, changes: Changes, target: Target, directory: Path,
                  quota_us: int) -> None:
        path = directory / "cpu.max"
        current = read_value(path)
        if current is None:
            if directory.is_dir():
                changes.fail(f"{target.name}: no cpu.max (cpu controller not enabled for it)")
            else:
                changes.note(f"{target.name}: gone")
            return
        quota, _, period = current.partition(" ")
        limit = int(quota) / int(period) if quota.isdigit() and period.isdigit() else None
        if self._tighter_already(changes, target, path, limit, quota_us):
            return
        value = f"{quota_us} {self.period_us}"
        outcome = changes.set(target, target.parts, path, value)
        if outcome.startswith("error") or outcome == "absent":
            changes.fail(f"{target.name}: cpu.max = {value}: {outcome}")

    def undo(self, ctx: StepContext, undo: dict[str, Any]) -> StepResult:
        return undo_writes(ctx, self.target(ctx), WHAT, undo.get("writes", []))


def _number(params: dict[str, Any], name: str, default: float, low: float,
            high: float) -> float:
    value = params.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not (
            low <= value <= high):
        raise ValueError(f"{name} must be a number from {low:g} to {high:g}")
    return float(value)


@hookimpl
def sloguard_steps() -> list[type]:
    return [CpuQuota]
