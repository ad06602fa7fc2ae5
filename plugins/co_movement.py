"""Suspect scorer `co_movement`: which BE workload's own signals rose with the LS signal.

CPI2's test, without the PMU: a workload that causes the LS slowdown is busy when the LS
service suffers and quiet when it does not. For each BE workload and each of its signals (CPU
usage; block I/O operations and I/O pressure; memory reclaim stalls and memory pressure), two
measures over the window, on the one-second grid:

- its share of the BE tier's activity on that signal since the onset (what it did), and
- the correlation of that signal with the LS signal over the whole window, from
  `attribution.lookback` before the onset to now (whether what it did moved with the LS
  slowdown; Pearson's on both series clipped to their 5th-95th percentiles, case.py says
  why not ranks).

The grade is share x max(0, correlation), the best over the workload's signals, which also
names the resource. Shares come from the store's sums (one row a series); only the curves of
the `MAX_CORRELATED` workloads with the largest share (of at least `MIN_SHARE`) are read and
correlated: a grade cannot exceed its share, so the others could not rank above them.

Both factors are needed: a sleepy job whose small CPU use happens to track the LS signal has a
tiny share; a job that has run flat out for hours before and through the
incident has a large share but no correlation (the run-queue blame scorer, not this one, says
whether it delays the LS tasks). The product is parameter-free and needs no per-resource
threshold, so it carries from one node to another.

Params: `min_points` (default 8): seconds both series need for a correlation.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from sloguard.detector.attribution.api import (
    Case,
    Clue,
    correlation,
    hookimpl,
    mean_of,
    reject_unknown,
)

# (resource, measurement, field, extra tag, what it is in a sentence)
SIGNALS = (
    ("cpu", "container_cpu", "usage_cores", {}, "CPU (cores)"),
    ("io", "ebpf_block_io", "count", {}, "block I/Os per interval"),
    ("io", "container_pressure", "some_rate", {"resource": "io"}, "I/O pressure (%)"),
    ("memory", "ebpf_reclaim", "total_us", {}, "reclaim stall (us per interval)"),
    ("memory", "container_pressure", "some_rate", {"resource": "memory"},
     "memory pressure (%)"),
)


MIN_SHARE = 0.02  # of the tier's activity: below it, a workload's grade is below it too
MAX_CORRELATED = 5  # the workloads that did most, per signal, whose curves are compared


class CoMovement:
    name = "co_movement"

    def __init__(self, params: dict[str, Any]) -> None:
        reject_unknown(params, {"min_points"}, self.name)
        self.min_points = int(params.get("min_points", 8))
        if self.min_points < 3:
            raise ValueError("min_points must be >= 3")

    def score(self, case: Case) -> dict[str, Clue]:
        ls = case.ls
        if len(ls) == 0 or int((~np.isnan(ls)).sum()) < self.min_points:
            return {}  # no LS signal to compare with
        onset = case.onset_index
        best: dict[str, Clue] = {}
        for resource, measurement, field, extra, what in SIGNALS:
            after = case.levels(measurement, field, case.onset_ns, **extra)
            tier = sum(v for v in after.values() if v > 0)
            if tier <= 0:
                continue
            shares = {cg: max(0.0, v) / tier for cg, v in after.items()}
            # The curves of the few that did most, not of all: a workload's grade is at most
            # its share, so one under MIN_SHARE, or behind the first MAX_CORRELATED, cannot
            # reach more than that (and reading every curve cost a ranking 10x the CPU)
            chosen = [cg for cg, share in sorted(shares.items(), key=lambda kv: -kv[1])
                      [:MAX_CORRELATED] if share >= MIN_SHARE]
            if not chosen:
                continue
            per = case.per_workload(measurement, field, only=set(chosen), **extra)
            for cgroup in chosen:
                values = per.get(cgroup)
                if values is None:
                    continue
                rho = correlation(values, ls, self.min_points)
                if rho is None:
                    continue
                share = shares[cgroup]
                grade = share * max(0.0, rho)
                known = best.get(cgroup)
                if known is not None and known.score >= grade:
                    continue
                before = mean_of(values[:onset])
                best[cgroup] = Clue(
                    self.name, grade, resource,
                    f"{what}: {after[cgroup]:.3g} since the onset ({share:.0%} of the BE "
                    f"tier's), {before:.3g} before; moved with the LS signal "
                    f"(correlation {rho:+.2f})",
                    {"after": round(after[cgroup], 6), "before": round(before, 6),
                     "share": round(share, 4), "rho": round(rho, 4)})
        return best


@hookimpl
def sloguard_suspect_scorers() -> list[type]:
    return [CoMovement]
