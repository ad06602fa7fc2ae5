"""Helpers for the suppression lever tests: contexts, inventories, the ledger row the ladder
would keep between two applies, and the LS probe's run-queue wait."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sloguard.actuators.env import ActuatorEnv
from sloguard.actuators.ledger import Ledger, RungState
from sloguard.actuators.step import StepContext, StepResult

# An LS service in miniature: wakes every 0.5 ms and computes for 1.5 ms (75% of a CPU, more
# than its fair share beside a busy BE of the same weight), so it queues behind BE unless a
# lever stops BE from competing.
LS_PROBE = """\
import time
while True:
    time.sleep(0.0005)
    end = time.thread_time() + 0.0015
    while time.thread_time() < end:
        pass
"""


def workload(cgroup: str, cls: str, **tags: str) -> dict[str, str]:
    return {"cgroup": "/" + cgroup.strip("/"), "class": cls, "level": "cgroup", **tags}


def context(inventory: list[dict[str, str]], dry_run: bool = False) -> StepContext:
    return StepContext("node-a", time.time_ns(), dry_run, "inc-1", "test",
                       lambda: [dict(w) for w in inventory])


def make_env(tmp_path: Path, cgroup_root: Path = Path("/sys/fs/cgroup"),
             resctrl_root: Path | None = None) -> ActuatorEnv:
    env = ActuatorEnv("node-a", Ledger(tmp_path / "actuators.db"), cgroup_root=cgroup_root)
    if resctrl_root is not None:
        env.resctrl_root = resctrl_root
    return env


def keep(env: ActuatorEnv, kind: str, params: dict[str, Any], result: StepResult,
         rung: int = 0, policy: str = "guard") -> None:
    """Store the result as the ladder does after an apply, so the next apply sees it."""
    env.ledger.put(RungState(policy, rung, kind, result.status, "inc-1", False, result.undo,
                             time.time_ns(), spec={"step": kind, "params": params},
                             target=result.target))


def wait_per_slice_us(pid: int, seconds: float) -> float:
    """Run-queue wait per timeslice (/proc/PID/schedstat: run ns, wait ns, timeslices)."""

    def read() -> tuple[int, int]:
        _, wait, slices = (int(v) for v in Path(f"/proc/{pid}/schedstat").read_text().split())
        return wait, slices

    wait0, slices0 = read()
    time.sleep(seconds)
    wait1, slices1 = read()
    return (wait1 - wait0) / max(1, slices1 - slices0) / 1000


def paired_waits(pid: int, on: Callable[[], None], off: Callable[[], None], pairs: int = 10,
                 window: float = 0.3) -> tuple[list[float], list[float]]:
    """LS wait without and with the lever, alternating, so that the load other programs put on
    this machine hits both sides alike."""
    without, with_lever = [], []
    for _ in range(pairs):
        without.append(wait_per_slice_us(pid, window))
        on()
        with_lever.append(wait_per_slice_us(pid, window))
        off()
    return without, with_lever


def median(values: list[float]) -> float:
    return statistics.median(values)


def status_field(pid: int, name: str) -> str:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key == name:
            return value.strip()
    raise KeyError(name)


def last_cpu(pid: int) -> int:
    """The CPU the task last ran on (field 39 of /proc/PID/stat)."""
    rest = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(rest[36])
