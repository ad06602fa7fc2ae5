"""Which tracked cgroups a kernel-side id belongs to, with the container collector's tags.

The eBPF programs key their histograms by what a BPF helper can tell about the current task:
its cgroup v2 id (the inode number of its directory in the v2 hierarchy) or, on hosts where
the workloads live in cgroup v1 only, its process id. This module turns either into the
cgroups the container collector tracks, so that an eBPF sample of a container carries exactly
the pod, container and class tags its CPU and memory samples carry (the tags are computed once,
by `CgroupCollector`, not duplicated here).

A latency is charged to the task's own cgroup and to every tracked ancestor: tasks live in
container cgroups, and rules usually select the pod level, which must see all its containers.
"""

from __future__ import annotations

import os
import time

from sloguard.collectors.cgroups import CgroupCollector

PID_CACHE_S = 10.0
WORKLOAD_LEVELS = ("pod", "cgroup")


class CgroupAttribution:
    def __init__(
        self,
        cgroups: CgroupCollector,
        mode: str,
        polled: bool = True,
        proc_root: str = "/proc",
    ) -> None:
        """`mode` is "cgroup" (ids are cgroup v2 ids) or "pid" (ids are process ids).

        `polled` says whether the agent polls `cgroups` (and so rediscovers the hierarchy);
        when it does not (the container collector is disabled), this object does.
        """
        if mode not in ("cgroup", "pid"):
            raise ValueError(f"unknown attribution mode {mode!r}")
        self.cgroups = cgroups
        self.mode = mode
        self.polled = polled
        self.proc_root = proc_root
        self._seen_generation = -1
        self._next_discovery = 0.0
        self._tags: dict[str, dict[str, str]] = {}
        self._by_id: dict[int, str] = {}
        self._pids: dict[int, tuple[str | None, float]] = {}
        self._targets: dict[str, tuple[str, ...]] = {}
        self._v1_controller = ""
        self.unmirrored: list[str] = []  # tracked cgroups without a v2 directory (cgroup mode)

    def refresh(self) -> None:
        """Pick up the container collector's latest discovery or re-tagging (call once per
        tick)."""
        if not self.polled and time.monotonic() >= self._next_discovery:
            self.cgroups.discover()
            self._next_discovery = time.monotonic() + self.cgroups.config.rediscover
        if self.cgroups.generation == self._seen_generation:
            return
        self._seen_generation = self.cgroups.generation
        self._tags = dict(self.cgroups.tracked_tags())
        self._targets = {}
        self._pids = {}
        layout = self.cgroups.layout
        if layout is None:
            self._by_id = {}
            return
        if self.mode == "cgroup":
            by_id, unmirrored = {}, []
            for rel in self._tags:
                if layout.unified is None:
                    unmirrored.append(rel)
                    continue
                try:
                    by_id[os.stat(layout.unified / rel).st_ino] = rel
                except OSError:
                    unmirrored.append(rel)
            self._by_id, self.unmirrored = by_id, unmirrored
        else:
            self._v1_controller = next(
                (name for name, root in layout.v1.items() if root == layout.primary), "")

    @property
    def tracked(self) -> int:
        return len(self._tags)

    def tags(self, rel: str) -> dict[str, str]:
        return self._tags[rel]

    def paths(self) -> list[str]:
        """The tracked cgroups, as paths relative to the walked hierarchy's root."""
        return list(self._tags)

    def targets(self, kernel_id: int) -> tuple[str, ...]:
        """The tracked cgroups (paths) charged for an event of `kernel_id`: its own cgroup if
        tracked and every tracked ancestor. Empty when the id belongs to no tracked subtree."""
        rel = self._by_id.get(kernel_id) if self.mode == "cgroup" else self._pid_cgroup(kernel_id)
        return () if rel is None else self.charged(rel)

    def workload(self, kernel_id: int) -> str | None:
        """The workload (pod, or a cgroup outside the kubepods tree) `kernel_id` belongs to:
        the nearest tracked cgroup at the pod or cgroup level, else the nearest tracked one.
        What the run-queue blame charges a pair to: a container's threads and its pod's are
        one suspect."""
        chain = self.targets(kernel_id)
        for rel in chain:  # the task's own cgroup first
            if self._tags[rel].get("level") in WORKLOAD_LEVELS:
                return rel
        return chain[0] if chain else None

    def charged(self, rel: str) -> tuple[str, ...]:
        """The tracked cgroups at or above the cgroup `rel` (a path in the walked hierarchy)."""
        found = self._targets.get(rel)
        if found is None:
            chain, path = [], rel
            while True:
                if path in self._tags:
                    chain.append(path)
                if not path:
                    break
                path = path.rpartition("/")[0]
            found = self._targets[rel] = tuple(chain)
        return found

    def _pid_cgroup(self, pid: int) -> str | None:
        """The cgroup (path in the walked hierarchy) of a process, from /proc/PID/cgroup."""
        now = time.monotonic()
        cached = self._pids.get(pid)
        if cached is not None and cached[1] > now:
            return cached[0]
        rel = None
        try:
            with open(f"{self.proc_root}/{pid}/cgroup") as handle:
                lines = handle.read().splitlines()
        except OSError:
            lines = []
        for line in lines:
            _, controllers, path = line.split(":", 2)
            names = controllers.split(",")
            if (self._v1_controller and self._v1_controller in names) or (
                    not self._v1_controller and controllers == ""):
                rel = path.strip("/")
                break
        self._pids[pid] = (rel, now + PID_CACHE_S)
        return rel
