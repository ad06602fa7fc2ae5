"""Run-queue wait per cgroup from /proc/PID/schedstat: the fallback when eBPF cannot run.

Without eBPF there is no per-event latency, but the scheduler still accounts, per thread, the
total time spent runnable-but-waiting and the number of timeslices (/proc/TID/schedstat:
run_ns wait_ns slices). Summing the increases over a cgroup's threads gives what rules need:
seconds waited per second (how much of the interval its threads lost to contention) and the
mean wait per timeslice (in the lab, an LS process went from ~8 to ~23 us per timeslice when a
CPU antagonist started). It costs one small read per thread per tick, so it runs only when
eBPF's run-queue histogram is unavailable (or when configured so).

Threads that appear during an interval start counting at the next one (their earlier wait may
have been spent in another cgroup); threads that exit take their last interval with them.
"""

from __future__ import annotations

import os
import time
from collections import defaultdict

from sloguard.collectors.cgroup_ids import CgroupAttribution
from sloguard.core.health import ComponentStatus
from sloguard.core.samples import Sample

MEASUREMENT = "container_runqueue"


def parse_schedstat(data: bytes) -> tuple[int, int] | None:
    """(wait_ns, timeslices) from a /proc/TID/schedstat line `run_ns wait_ns timeslices`."""
    parts = data.split()
    if len(parts) < 3:
        return None
    try:
        return int(parts[1]), int(parts[2])
    except ValueError:
        return None


def _read(path: str) -> bytes | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        return os.read(fd, 4096)
    except OSError:
        return None
    finally:
        os.close(fd)


class SchedstatCollector:
    name = "schedstat"

    def __init__(self, node: str, attribution: CgroupAttribution, proc_root: str = "/proc",
                 reason: str = "") -> None:
        self.node = node
        self.attribution = attribution
        self.proc_root = proc_root
        self.reason = reason  # why it runs (what it stands in for)
        self._prev: dict[int, tuple[int, int]] = {}
        self._prev_mono = 0.0
        self.threads = 0

    def _tasks_file(self, rel: str) -> str | None:
        layout = self.attribution.cgroups.layout
        if layout is None:
            return None
        if layout.mode == "v2":
            return f"{layout.primary / rel}/cgroup.threads"
        return f"{layout.primary / rel}/tasks"

    def collect(self, now_ns: int) -> list[Sample]:
        self.attribution.refresh()
        mono = time.monotonic()
        elapsed = mono - self._prev_mono if self._prev_mono else 0.0
        current: dict[int, tuple[int, int]] = {}
        waited: dict[str, int] = defaultdict(int)
        slices: dict[str, int] = defaultdict(int)
        tasks: dict[str, int] = defaultdict(int)
        measured: dict[str, int] = defaultdict(int)  # threads seen at the previous tick too
        for rel in self.attribution.paths():
            path = self._tasks_file(rel)
            data = _read(path) if path else None
            if not data:
                continue
            charged = self.attribution.charged(rel)
            for tid_text in data.split():
                tid = int(tid_text)
                stat = _read(f"{self.proc_root}/{tid}/schedstat")
                parsed = parse_schedstat(stat) if stat else None
                if parsed is None:
                    continue
                current[tid] = parsed
                prev = self._prev.get(tid)
                for target in charged:
                    tasks[target] += 1
                if prev is None or parsed[0] < prev[0] or parsed[1] < prev[1]:
                    continue
                for target in charged:
                    measured[target] += 1
                    waited[target] += parsed[0] - prev[0]
                    slices[target] += parsed[1] - prev[1]
        self._prev, self._prev_mono = current, mono
        self.threads = len(current)
        if elapsed <= 0:
            return []
        samples = []
        for rel, count in tasks.items():
            if not measured.get(rel):
                continue  # only new threads: nothing measured yet, which is not "no wait"
            wait_ns, n = waited.get(rel, 0), slices.get(rel, 0)
            fields = {
                "wait_rate": wait_ns / 1e9 / elapsed,
                "wait_per_timeslice_us": wait_ns / n / 1000 if n else 0.0,
                "timeslices_per_s": n / elapsed,
                "tasks": count,
            }
            samples.append(Sample(MEASUREMENT, self.attribution.tags(rel), fields, now_ns))
        return samples

    def status(self) -> ComponentStatus:
        return ComponentStatus(
            "collector:schedstat", ok=True, reason=self.reason,
            details={"threads": self.threads, "cgroups": self.attribution.tracked})
