"""The lab's cgroups: real ones, in every hierarchy the agent reads and the levers write.

A cgroup made here looks to the agent like any declared workload (`cgroups.declare` in the lab's
config names its class), so the levers the guardrail pulls in the lab are the ones it pulls on a
node. Processes are moved in before they run their workload (they wait on a pipe), so none of a
stressor's work is done outside its cgroup.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sloguard.core.cgroup_layout import detect_layout

# v1 controllers the collectors read and the levers write (cpu.idle, cpuset, quota, memory)
V1_CONTROLLERS = ("cpu", "cpuacct", "cpuset", "memory", "blkio")


def hierarchies() -> list[Path]:
    """The mount points of every hierarchy a lab cgroup is made in (v1 controllers, then v2)."""
    layout = detect_layout()
    roots = [layout.v1[c] for c in V1_CONTROLLERS if c in layout.v1]
    if layout.unified is not None:
        roots.append(layout.unified)
    return list(dict.fromkeys(roots))


class LabCgroup:
    """One cgroup (a relative path such as `sloguard-lab/be`) in every hierarchy."""

    def __init__(self, rel: str, roots: Sequence[Path] | None = None) -> None:
        self.rel = rel.strip("/")
        self.roots = list(roots) if roots is not None else hierarchies()
        for root in self.roots:
            path = root / self.rel
            for depth, _ in enumerate(self.rel.split("/"), start=1):
                sub = root / "/".join(self.rel.split("/")[:depth])
                if not sub.exists():
                    sub.mkdir()
                    _inherit_cpuset(sub)
            _inherit_cpuset(path)

    def pin(self, cpus: str) -> bool:
        """Give the cgroup its own cpuset (v1 cpuset controller); False where there is none."""
        done = False
        for path in self.paths():
            if (path / "cpuset.cpus").exists() and (path / "tasks").exists():
                (path / "cpuset.cpus").write_text(cpus)
                done = True
        return done

    def paths(self) -> list[Path]:
        return [root / self.rel for root in self.roots]

    def add(self, pid: int) -> None:
        for path in self.paths():
            (path / "cgroup.procs").write_text(str(pid))

    def spawn(self, argv: Sequence[str], **popen: Any) -> subprocess.Popen:
        """Start `argv` inside this cgroup: the child moves itself in between fork and exec, so
        not one instruction of the program runs outside."""
        targets = [str(path / "cgroup.procs") for path in self.paths()]

        def move_in() -> None:
            for target in targets:
                fd = os.open(target, os.O_WRONLY)
                try:
                    os.write(fd, b"0")
                finally:
                    os.close(fd)

        return subprocess.Popen(list(argv), preexec_fn=move_in, **popen)

    def pids(self) -> list[int]:
        return pids_in(self.rel, self.roots)

    def remove(self, timeout: float = 5.0) -> None:
        """Kill what is left inside, then remove the cgroup everywhere (parents if empty)."""
        deadline = time.monotonic() + timeout
        while (pids := self.pids()) and time.monotonic() < deadline:
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, 9)
            time.sleep(0.05)
        for root in self.roots:
            parts = self.rel.split("/")
            for depth in range(len(parts), 0, -1):
                with contextlib.suppress(FileNotFoundError, OSError):
                    (root / "/".join(parts[:depth])).rmdir()


def pids_in(rel: str, roots: Sequence[Path] | None = None) -> list[int]:
    """The processes in a cgroup, without creating it: [] when it does not exist."""
    root = (list(roots) if roots is not None else hierarchies())[0]
    try:
        return [int(p) for p in (root / rel.strip("/") / "cgroup.procs").read_text().split()]
    except FileNotFoundError:
        return []


def _inherit_cpuset(path: Path) -> None:
    """A new v1 cpuset cgroup starts with no CPUs and no memory nodes: give it its parent's."""
    for name in ("cpuset.cpus", "cpuset.mems"):
        own = path / name
        if own.exists() and not own.read_text().strip():
            own.write_text((path.parent / name).read_text().strip())
