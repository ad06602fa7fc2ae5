"""Suspect scorer `runqueue_blame`: whose tasks the LS tasks waited behind for a CPU.

The eBPF run-queue program charges each wait of a task to the task it displaced when it got
the CPU (collectors/bpf/runqueue.c), per (waiting workload, running workload) pair:
`ebpf_runqueue_blame{cgroup=<LS>, culprit=<cgroup>} wait_us`. A BE workload's grade is its
share of the LS victims' blamed wait since the onset: direct evidence, measured in the
kernel, that the LS tasks were kept off a CPU by that workload. It abstains where eBPF is
unavailable (no blame samples), and for incidents about I/O or memory (a run-queue wait
says nothing about a disk or reclaim).

Params: `min_wait_ms` (default 1): below this much blamed wait since the onset, the evidence is
too thin to grade (a victim that hardly waited was not slowed by the run queue).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from sloguard.core.suspects import workload_name
from sloguard.detector.attribution.api import Case, Clue, hookimpl, reject_unknown

MEASUREMENT = "ebpf_runqueue_blame"
NOT_CPU = ("io", "memory")


class RunqueueBlame:
    name = "runqueue_blame"

    def __init__(self, params: dict[str, Any]) -> None:
        reject_unknown(params, {"min_wait_ms"}, self.name)
        self.min_wait_ms = float(params.get("min_wait_ms", 1.0))
        if self.min_wait_ms < 0:
            raise ValueError("min_wait_ms must be >= 0")

    def score(self, case: Case) -> dict[str, Clue]:
        if case.resource in NOT_CPU:
            return {}
        victims = {v["cgroup"] for v in case.victims if v.get("cgroup")}
        after: dict[str, float] = defaultdict(float)
        before: dict[str, float] = defaultdict(float)
        waited: dict[str, float] = defaultdict(float)  # by victim name: the most-waited first
        for side, start, end in ((after, case.onset_ns, case.end_ns),
                                 (before, case.start_ns, case.onset_ns)):
            for tags, total, _ in case.totals(MEASUREMENT, "wait_us", start, end):
                if tags.get("class") == "BE" or (victims and tags.get("cgroup") not in victims):
                    continue
                if side is after:
                    waited[workload_name(tags)] += total
                side[tags.get("culprit", "")] += total
        total_after, total_before = sum(after.values()), sum(before.values())
        if total_after < self.min_wait_ms * 1000:
            return {}
        who = _listed(sorted(waited, key=lambda name: -waited[name])) or "the LS workloads"
        clues = {}
        for candidate in case.candidates:
            cgroup = candidate["cgroup"]
            share = after.get(cgroup, 0.0) / total_after
            earlier = before.get(cgroup, 0.0) / total_before if total_before else 0.0
            text = (f"{who} waited {after.get(cgroup, 0.0) / 1000:.1f} ms for a CPU behind its "
                    f"tasks since the onset: {share:.0%} of the wait charged to another "
                    f"workload ({earlier:.0%} before the onset)")
            clues[cgroup] = Clue(self.name, share, "cpu", text,
                                 {"blamed_wait_ms": round(after.get(cgroup, 0.0) / 1000, 3),
                                  "share": round(share, 4), "share_before": round(earlier, 4)})
        return clues


def _listed(names: list[str], most: int = 3) -> str:
    """A few victims by name: the evidence is read by people, and a node may run hundreds."""
    if len(names) <= most:
        return ", ".join(names)
    return ", ".join(names[:most]) + f" and {len(names) - most} more"


@hookimpl
def sloguard_suspect_scorers() -> list[type]:
    return [RunqueueBlame]
