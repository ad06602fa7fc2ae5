"""Directory trees in the documented cgroup file formats, for what this host cannot show for
real: the v2 controller files (this host mounts v1 controllers) and property tests over
arbitrary hierarchies. Formats: Documentation/admin-guide/cgroup-v2.rst and cgroup-v1/*.rst.
They are files, not a kernel: writing one changes its content and nothing else."""

from __future__ import annotations

from pathlib import Path

V2_FILES = {
    "cgroup.controllers": "cpuset cpu io memory pids",
    "cgroup.subtree_control": "cpuset cpu io memory pids",
    "cgroup.procs": "",
    "cgroup.threads": "",
    "cpu.idle": "0",
    "cpu.weight": "100",
    "cpu.max": "max 100000",
    "cpu.stat": "usage_usec 1000000\nuser_usec 600000\nsystem_usec 400000\nnr_periods 0\n"
                "nr_throttled 0\nthrottled_usec 0",
    "memory.current": str(100 << 20),
    "memory.high": "max",
    "memory.max": "max",
    "cpuset.cpus": "",
    "cpuset.cpus.effective": "0-3",
    "cpuset.mems": "",
}

V1_FILES = {
    "cpu": {"cpu.idle": "0", "cpu.shares": "1024", "cpu.cfs_quota_us": "-1",
            "cpu.cfs_period_us": "100000", "cpu.stat": "nr_periods 0\nnr_throttled 0\n"
            "throttled_time 0", "cgroup.procs": "", "tasks": ""},
    "cpuacct": {"cpuacct.usage": "1000000000", "cgroup.procs": "", "tasks": ""},
    "memory": {"memory.usage_in_bytes": str(100 << 20),
               "memory.limit_in_bytes": "9223372036854771712",
               "memory.soft_limit_in_bytes": "9223372036854771712", "cgroup.procs": "",
               "tasks": ""},
    "cpuset": {"cpuset.cpus": "0-3", "cpuset.effective_cpus": "0-3", "cpuset.mems": "0",
               "cgroup.procs": "", "tasks": ""},
}


def _write(directory: Path, files: dict[str, str]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for name, content in files.items():
        if not (directory / name).exists():
            (directory / name).write_text(content + "\n" if content else "")


def v2_tree(root: Path, cgroups: list[str], overrides: dict[str, dict[str, str]] | None = None,
            threads: dict[str, list[int]] | None = None) -> Path:
    """A v2 hierarchy at `root` with the given cgroups (and their parents) in it."""
    overrides = overrides or {}
    threads = threads or {}
    root_only = ("cpu.idle", "cpu.weight", "cpu.max", "memory.high", "memory.max", "cpuset.cpus",
                 "cpuset.mems")  # the root cgroup has none of these
    _write(root, {k: v for k, v in V2_FILES.items() if k not in root_only})
    for rel in cgroups:
        parts = [p for p in rel.split("/") if p]
        for depth in range(1, len(parts) + 1):
            sub = "/".join(parts[:depth])
            directory = root / sub
            directory.mkdir(parents=True, exist_ok=True)
            for name, content in overrides.get(sub, {}).items():
                if content is None:
                    (directory / name).unlink(missing_ok=True)
                    continue
                (directory / name).write_text(content + "\n" if content else "")
            _write(directory, {k: v for k, v in V2_FILES.items()
                               if k not in overrides.get(sub, {})})
            if threads.get(sub):
                (directory / "cgroup.threads").write_text(
                    "".join(f"{t}\n" for t in threads[sub]))
    return root


def v1_tree(root: Path, cgroups: list[str], threads: dict[str, list[int]] | None = None
            ) -> Path:
    """v1 hierarchies cpu, cpuacct, memory and cpuset under `root`, as /sys/fs/cgroup is on a
    v1 (or hybrid) host, with the given cgroups in each."""
    threads = threads or {}
    for controller, files in V1_FILES.items():
        _write(root / controller, files)
        for rel in cgroups:
            parts = [p for p in rel.split("/") if p]
            for depth in range(1, len(parts) + 1):
                sub = "/".join(parts[:depth])
                _write(root / controller / sub, files)
                tids = threads.get(sub)
                if tids and controller == "cpu":
                    (root / controller / sub / "tasks").write_text(
                        "".join(f"{t}\n" for t in tids))
    return root


def snapshot(root: Path) -> dict[str, str]:
    """Every file's content under `root`."""
    return {str(p): p.read_text() for p in root.rglob("*") if p.is_file()}
