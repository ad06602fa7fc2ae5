"""Cycles per instruction per cgroup, from hardware counters (perf_event_open), as in CPI2.

Interference through shared caches and memory bandwidth leaves CPU usage, PSI and run-queue
latency unchanged (the lab saw none of them move under a cache antagonist) but makes every
instruction of the victim take more cycles. Google's CPI2 detects it from per-task CPI; this
collector counts cycles and instructions per tracked pod (perf cgroup mode) and for the node.

Hardware counters are often hidden in VMs (this lab's hypervisor exposes no PMU: opening a
cycles counter fails with ENOENT). Then the collector reports itself unavailable, with the
kernel's answer, and writes nothing: a CPI of 0 or a missing counter read as 0 would look like
a healthy or an infinitely fast node.

The counter plumbing (groups per CPU, the group read format, multiplexing scale) is the same
for software events, which is how it is tested on machines without a PMU.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import logging
import os
import platform
import struct
import time
from dataclasses import dataclass

from sloguard.collectors.base import CollectorBase, CollectorContext
from sloguard.collectors.cgroups import CgroupCollector
from sloguard.collectors.hookspecs import hookimpl
from sloguard.core.cpulist import parse_cpulist
from sloguard.core.health import ComponentStatus
from sloguard.core.samples import Sample

log = logging.getLogger(__name__)

PERF_TYPE_HARDWARE, PERF_TYPE_SOFTWARE = 0, 1
PERF_COUNT_HW_CPU_CYCLES, PERF_COUNT_HW_INSTRUCTIONS = 0, 1
PERF_COUNT_SW_CPU_CLOCK, PERF_COUNT_SW_TASK_CLOCK = 0, 1
PERF_FORMAT_TOTAL_TIME_ENABLED, PERF_FORMAT_TOTAL_TIME_RUNNING = 1, 2
PERF_FORMAT_ID, PERF_FORMAT_GROUP = 4, 8
READ_FORMAT = (PERF_FORMAT_TOTAL_TIME_ENABLED | PERF_FORMAT_TOTAL_TIME_RUNNING | PERF_FORMAT_ID
               | PERF_FORMAT_GROUP)
PERF_FLAG_FD_CLOEXEC, PERF_FLAG_PID_CGROUP = 8, 4
PERF_EVENT_IOC_ENABLE, PERF_EVENT_IOC_ID, PERF_IOC_FLAG_GROUP = 0x2400, 0x80082407, 1
_ATTR = struct.Struct("=IIQQQQQIIQQQQIiQIHH")  # perf_event_attr, PERF_ATTR_SIZE_VER5 (112)
_SYSCALL_NR = {"x86_64": 298, "aarch64": 241}
_ATTR_DISABLED, _ATTR_EXCLUDE_HV = 1 << 0, 1 << 6

CYCLES = (PERF_TYPE_HARDWARE, PERF_COUNT_HW_CPU_CYCLES)
INSTRUCTIONS = (PERF_TYPE_HARDWARE, PERF_COUNT_HW_INSTRUCTIONS)


def event_attr(kind: tuple[int, int], leader: bool) -> bytes:
    """A counting (not sampling) perf_event_attr read as a group with enabled/running times."""
    flags = _ATTR_EXCLUDE_HV | (_ATTR_DISABLED if leader else 0)
    return _ATTR.pack(kind[0], _ATTR.size, kind[1], 0, 0, READ_FORMAT, flags,
                      0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)


_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


def perf_event_open(attr: bytes, pid: int, cpu: int, group_fd: int = -1,
                    flags: int = PERF_FLAG_FD_CLOEXEC) -> int:
    nr = _SYSCALL_NR.get(platform.machine())
    if nr is None:
        raise OSError(errno.ENOSYS, f"perf_event_open: unknown syscall number on "
                                    f"{platform.machine()}")
    buf = ctypes.create_string_buffer(attr, len(attr))
    fd = _libc.syscall(ctypes.c_long(nr), buf, ctypes.c_int(pid), ctypes.c_int(cpu),
                       ctypes.c_int(group_fd), ctypes.c_ulong(flags))
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"perf_event_open: {os.strerror(err)}")
    return fd


@dataclass(frozen=True)
class GroupReading:
    time_enabled: int
    time_running: int
    values: dict[int, int]  # event id -> raw count

    def scaled(self, event_id: int) -> float:
        """The count extrapolated over the time the group was enabled: with more groups than
        hardware counters the kernel multiplexes them, and each ran only part of the time."""
        raw = self.values.get(event_id, 0)
        if self.time_running <= 0:
            return 0.0
        return raw * self.time_enabled / self.time_running


def parse_group_read(data: bytes) -> GroupReading:
    """Decode a read() of a group leader opened with READ_FORMAT (see perf_event_open(2)):
    u64 nr, u64 time_enabled, u64 time_running, then nr pairs of (u64 value, u64 id)."""
    if len(data) < 24:
        raise ValueError(f"short perf group read: {len(data)} bytes")
    nr, enabled, running = struct.unpack_from("=QQQ", data, 0)
    if len(data) < 24 + 16 * nr:
        raise ValueError(f"perf group read says {nr} events but holds {len(data)} bytes")
    values = {}
    for i in range(nr):
        value, event_id = struct.unpack_from("=QQ", data, 24 + 16 * i)
        values[event_id] = value
    return GroupReading(enabled, running, values)


def _event_id(fd: int) -> int:
    buf = bytearray(8)
    fcntl.ioctl(fd, PERF_EVENT_IOC_ID, buf)
    return struct.unpack("=Q", bytes(buf))[0]


class CounterGroup:
    """Two counters (numerator, denominator) on every CPU, for one cgroup or the whole node."""

    def __init__(self, numerator: tuple[int, int], denominator: tuple[int, int],
                 cgroup_fd: int = -1, cpus: list[int] | None = None) -> None:
        self.fds: list[tuple[int, int, int, int]] = []  # leader fd, member fd, ids
        if cpus is None:
            cpus = _online_cpus() or list(range(os.cpu_count() or 1))
        pid = cgroup_fd if cgroup_fd >= 0 else -1
        flags = PERF_FLAG_FD_CLOEXEC | (PERF_FLAG_PID_CGROUP if cgroup_fd >= 0 else 0)
        try:
            for cpu in cpus:
                leader = perf_event_open(event_attr(numerator, True), pid, cpu, -1, flags)
                try:
                    member = perf_event_open(event_attr(denominator, False), pid, cpu, leader,
                                             flags)
                except OSError:
                    os.close(leader)
                    raise
                self.fds.append((leader, member, _event_id(leader), _event_id(member)))
                fcntl.ioctl(leader, PERF_EVENT_IOC_ENABLE, PERF_IOC_FLAG_GROUP)
        except OSError:
            self.close()
            raise

    def read(self) -> tuple[float, float]:
        """Cumulative (numerator, denominator) over all CPUs, scaled for multiplexing."""
        num = den = 0.0
        for leader, _, num_id, den_id in self.fds:
            reading = parse_group_read(os.read(leader, 24 + 16 * 2))
            num += reading.scaled(num_id)
            den += reading.scaled(den_id)
        return num, den

    def close(self) -> None:
        for leader, member, _, _ in self.fds:
            for fd in (member, leader):
                with contextlib.suppress(OSError):
                    os.close(fd)
        self.fds = []


def _online_cpus() -> list[int]:
    try:
        with open("/sys/devices/system/cpu/online") as handle:
            return parse_cpulist(handle.read())
    except (OSError, ValueError):
        return []


def unavailable_reason(exc: OSError) -> str:
    """The kernel's answer to opening a hardware counter, for an operator."""
    name = errno.errorcode.get(exc.errno or 0, str(exc.errno))
    if exc.errno in (errno.ENOENT, errno.EOPNOTSUPP, errno.ENODEV, errno.EINVAL):
        return f"hardware counters not exposed on this machine (perf_event_open cycles: {name})"
    if exc.errno in (errno.EACCES, errno.EPERM):
        return ("not permitted to count system-wide (needs CAP_PERFMON or "
                f"kernel.perf_event_paranoid <= 0; perf_event_open: {name})")
    return f"perf_event_open cycles failed: {name} ({exc.strerror})"


class CpiCollector(CollectorBase):
    name = "cpi"

    @classmethod
    def create(cls, ctx: CollectorContext) -> CpiCollector | None:
        return cls(ctx.node, ctx.built.get("cgroups")) if ctx.section(cls.name).enabled else None
    MEASUREMENT = "cpi"

    def __init__(self, node: str, cgroups: CgroupCollector | None,
                 events: tuple[tuple[int, int], tuple[int, int]] = (CYCLES, INSTRUCTIONS),
                 per_cgroup: bool = True) -> None:
        self.node = node
        self.cgroups = cgroups
        self.events = events
        self.per_cgroup = per_cgroup and cgroups is not None
        self.unavailable = ""
        self.started = False
        self._node: CounterGroup | None = None
        self._groups: dict[str, tuple[CounterGroup, int]] = {}  # rel -> (counters, dir fd)
        self._prev: dict[str, tuple[float, float, float]] = {}
        self._seen_generation = -1
        self.cgroup_errors: dict[str, str] = {}

    def start(self) -> None:
        if self.started:
            return
        self.started = True
        try:
            self._node = CounterGroup(*self.events)
        except OSError as exc:
            self.unavailable = unavailable_reason(exc)
            log.info("CPI unavailable: %s", self.unavailable)

    def _perf_root(self) -> str | None:
        """The hierarchy perf's cgroup mode uses: a mounted v1 perf_event one, else v2."""
        try:
            with open("/proc/self/mountinfo") as handle:
                for line in handle:
                    left, _, right = line.partition(" - ")
                    rest = right.split()
                    if len(rest) >= 3 and rest[0] == "cgroup" and "perf_event" in \
                            rest[2].split(","):
                        return left.split()[4]
        except OSError:
            return None
        layout = self.cgroups.layout if self.cgroups else None
        return str(layout.unified) if layout is not None and layout.unified else None

    def _sync_cgroups(self) -> None:
        assert self.cgroups is not None
        if self.cgroups.generation == self._seen_generation:
            return
        self._seen_generation = self.cgroups.generation
        tags = self.cgroups.tracked_tags()
        wanted = {rel for rel, t in tags.items() if t.get("level") in ("pod", "cgroup")}
        for rel in list(self._groups):
            if rel not in wanted:
                self._close_group(rel)
        root = self._perf_root()
        if root is None:
            self.cgroup_errors["*"] = "no perf_event cgroup hierarchy (v1) or cgroup v2 mount"
            return
        for rel in wanted - set(self._groups):
            try:
                dir_fd = os.open(f"{root}/{rel}", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            except OSError as exc:
                self.cgroup_errors[rel] = f"cannot open the cgroup: {exc.strerror}"
                continue
            try:
                self._groups[rel] = (CounterGroup(*self.events, cgroup_fd=dir_fd), dir_fd)
                self.cgroup_errors.pop(rel, None)
            except OSError as exc:
                os.close(dir_fd)
                self.cgroup_errors[rel] = str(exc)

    def _close_group(self, rel: str) -> None:
        group, dir_fd = self._groups.pop(rel)
        group.close()
        os.close(dir_fd)
        self._prev.pop(rel, None)

    def collect(self, now_ns: int) -> list[Sample]:
        if self._node is None:
            return []  # unavailable: nothing, never zeros
        if self.per_cgroup:
            self._sync_cgroups()
        samples = []
        fields = self._fields("", self._node)
        if fields:
            samples.append(Sample(self.MEASUREMENT, {"node": self.node, "level": "node"},
                                  fields, now_ns))
        tags = self.cgroups.tracked_tags() if self.cgroups else {}
        for rel, (group, _) in list(self._groups.items()):
            fields = self._fields(rel, group)
            if fields and rel in tags:
                samples.append(Sample(self.MEASUREMENT, tags[rel], fields, now_ns))
        return samples

    def _fields(self, key: str, group: CounterGroup) -> dict[str, float] | None:
        try:
            num, den = group.read()
        except (OSError, ValueError) as exc:
            self.cgroup_errors[key or "node"] = f"read failed: {exc}"
            return None
        mono = time.monotonic()
        prev = self._prev.get(key)
        self._prev[key] = (num, den, mono)
        if prev is None:
            return None
        return cpi_fields(num - prev[0], den - prev[1], mono - prev[2])

    def status(self) -> ComponentStatus:
        details: dict[str, object] = {"cgroups": len(self._groups)}
        if self.cgroup_errors:
            details["errors"] = dict(list(self.cgroup_errors.items())[:20])
        if self.unavailable:
            return ComponentStatus("collector:cpi", ok=False,
                                   reason=f"CPI unavailable: {self.unavailable}", details=details)
        if not self.started:
            return ComponentStatus("collector:cpi", ok=False, reason="not started yet",
                                   details=details)
        return ComponentStatus("collector:cpi", ok=True, details=details)

    def close(self) -> None:
        for rel in list(self._groups):
            self._close_group(rel)
        if self._node is not None:
            self._node.close()
            self._node = None


def cpi_fields(cycles: float, instructions: float, seconds: float) -> dict[str, float] | None:
    """CPI over one interval; None when nothing ran (no instructions: CPI is undefined)."""
    if instructions <= 0 or seconds <= 0 or cycles < 0:
        return None
    return {
        "cpi": cycles / instructions,
        "cycles_per_s": cycles / seconds,
        "instructions_per_s": instructions / seconds,
    }


@hookimpl
def sloguard_collectors() -> list[type]:
    return [CpiCollector]
