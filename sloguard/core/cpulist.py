"""The kernel's cpulist format (`0-3,8,10-11`): cpuset.cpus, /sys/devices/system/cpu/online,
taskset -c. One parser for the whole project; stdlib only, so the lab's load generator (a
child process that must start fast and stay small) can use it too."""

from __future__ import annotations


def parse_cpulist(text: str) -> list[int]:
    """`0-3,8,10-11` -> [0, 1, 2, 3, 8, 10, 11]; empty -> []. ValueError names the bad part."""
    cpus: set[int] = set()
    for part in filter(None, (p.strip() for p in text.strip().split(","))):
        low, _, high = part.partition("-")
        try:
            first, last = int(low), int(high or low)
        except ValueError:
            raise ValueError(f"not a CPU list entry: {part!r} (e.g. 0-3,8)") from None
        if first < 0 or last < first:
            raise ValueError(f"not a CPU range: {part!r}")
        cpus.update(range(first, last + 1))
    return sorted(cpus)


def format_cpulist(cpus: list[int] | set[int]) -> str:
    """[0, 1, 2, 3, 8, 10, 11] -> `0-3,8,10-11`; the inverse of parse_cpulist."""
    ranges: list[list[int]] = []
    for cpu in sorted(set(cpus)):
        if ranges and cpu == ranges[-1][1] + 1:
            ranges[-1][1] = cpu
        else:
            ranges.append([cpu, cpu])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in ranges)
