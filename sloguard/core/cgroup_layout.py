"""Where the cgroup hierarchies are on this host: pure v2, pure v1, or hybrid.

Production nodes are mostly cgroup v2; many still run v1 controllers with a v2 mount beside them
(this lab machine does). Reading /proc/self/mountinfo instead of assuming /sys/fs/cgroup paths
is what makes the same agent work on all three.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

V1_CONTROLLERS = ("cpu", "cpuacct", "memory", "cpuset", "blkio", "freezer")


@dataclass(frozen=True)
class CgroupLayout:
    mode: str  # "v2", "v1" or "hybrid"
    v1: dict[str, Path] = field(default_factory=dict)  # controller -> hierarchy mount
    unified: Path | None = None

    @property
    def primary(self) -> Path:
        """The hierarchy walked to discover cgroups (the one the workload layout lives in)."""
        if self.mode == "v2" and self.unified:
            return self.unified
        for name in ("cpu", "cpuacct", "memory"):
            if name in self.v1:
                return self.v1[name]
        raise LookupError("no cpu, cpuacct or memory cgroup hierarchy is mounted")


def _unescape(path: str) -> str:
    return path.encode().decode("unicode_escape") if "\\" in path else path


def detect_layout(mountinfo: str = "/proc/self/mountinfo") -> CgroupLayout:
    """Find the mounted hierarchies from mountinfo (see proc(5))."""
    v1: dict[str, Path] = {}
    unified: Path | None = None
    with open(mountinfo) as handle:
        for line in handle:
            left, _, right = line.partition(" - ")
            parts, rest = left.split(), right.split()
            if len(parts) < 5 or len(rest) < 3:
                continue
            mount_point, fstype = _unescape(parts[4]), rest[0]
            if fstype == "cgroup2" and unified is None:
                unified = Path(mount_point)
            elif fstype == "cgroup":
                for option in rest[2].split(","):
                    if option in V1_CONTROLLERS and option not in v1:
                        v1[option] = Path(mount_point)
    if not v1 and unified is None:
        raise LookupError(f"no cgroup hierarchy found in {mountinfo}")
    if not v1:
        return CgroupLayout("v2", {}, unified)
    return CgroupLayout("hybrid" if unified else "v1", v1, unified)


def layout_from_root(root: str | Path) -> CgroupLayout:
    """Layout of a tree given in the config (or a test fixture) instead of mountinfo.

    A root holding `cgroup.controllers` is a v2 hierarchy; otherwise its subdirectories named
    after v1 controllers are the v1 hierarchies, and `unified/` (if any) the v2 one beside them.
    """
    root = Path(root)
    if (root / "cgroup.controllers").exists():
        return CgroupLayout("v2", {}, root)
    v1 = {name: root / name for name in V1_CONTROLLERS if (root / name).is_dir()}
    unified = root / "unified" if (root / "unified" / "cgroup.controllers").exists() else None
    if not v1 and unified is None:
        raise LookupError(f"{root}: neither a cgroup v2 hierarchy nor v1 controller directories")
    if not v1:
        return CgroupLayout("v2", {}, unified)
    return CgroupLayout("hybrid" if unified else "v1", v1, unified)
