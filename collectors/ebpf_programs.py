"""The eBPF signal families: their C source, tracepoints, map layout and sample vocabulary.

Each family is compiled and attached on its own, so a kernel that lacks one family's
tracepoints (or a verifier that rejects one program) costs that family only, and /readyz says
which one and why. The C sources live in collectors/bpf/ (docs/ebpf.md describes what each
measures); user space only needs to know how to decode their histogram keys.
"""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass
from importlib import resources

# x86_64 syscalls that exist to wait: their duration is chosen by the caller, not a stall.
_X86_64_WAITING_SYSCALLS = (
    7,    # poll
    23,   # select
    34,   # pause
    35,   # nanosleep
    61,   # wait4
    128,  # rt_sigtimedwait
    130,  # rt_sigsuspend
    202,  # futex
    230,  # clock_nanosleep
    232,  # epoll_wait
    247,  # waitid
    270,  # pselect6
    271,  # ppoll
    281,  # epoll_pwait
    441,  # epoll_pwait2
)

OPS = ("read", "write", "discard", "other")
RECLAIM_KINDS = ("direct", "memcg", "compaction")


HIST_VALUE_FORMAT = "=64QQ"  # struct hist: u64 slots[64]; u64 sum
BLAME_TABLE = "rq_blame"  # runqueue.c: (victim id, culprit id) -> (wait_ns, count)
BLAME_KEY_FORMAT, BLAME_VALUE_FORMAT = "=QQ", "=QQ"


@dataclass(frozen=True)
class Family:
    name: str  # config switch and status key
    measurement: str
    source: str  # file in collectors/bpf/
    table: str  # the histogram map
    key_type: str  # its C key type
    key_format: str  # struct layout of that key; the first field is the id
    tracepoints: tuple[tuple[str, str], ...]  # all must exist
    # further maps the agent drains beside the histogram: (name, key format, value format)
    tables: tuple[tuple[str, str, str], ...] = ()

    def extra_tags(self, extra: tuple[int, ...], devices: DeviceNames) -> tuple[tuple[str, str],
                                                                              ...]:
        """Tags decoded from the key fields after the id."""
        if self.name == "block_io":
            dev, op = extra
            return (("device", devices.name(dev)), ("op", OPS[op] if op < len(OPS) else "other"))
        if self.name == "reclaim":
            (kind,) = extra
            return (("kind", RECLAIM_KINDS[kind] if kind < len(RECLAIM_KINDS) else str(kind)),)
        return ()


FAMILIES = (
    Family("runqueue", "ebpf_runqueue", "runqueue.c", "rq_hist", "struct rq_key", "=Q",
           (("sched", "sched_wakeup"), ("sched", "sched_wakeup_new"), ("sched", "sched_switch")),
           ((BLAME_TABLE, BLAME_KEY_FORMAT, BLAME_VALUE_FORMAT),)),
    Family("block_io", "ebpf_block_io", "block_io.c", "io_hist", "struct io_key", "=QII",
           (("block", "block_rq_complete"),)),
    Family("reclaim", "ebpf_reclaim", "reclaim.c", "rc_hist", "struct rc_key", "=QQ",
           (("vmscan", "mm_vmscan_direct_reclaim_begin"),
            ("vmscan", "mm_vmscan_direct_reclaim_end"),
            ("vmscan", "mm_vmscan_memcg_reclaim_begin"),
            ("vmscan", "mm_vmscan_memcg_reclaim_end"),
            ("compaction", "mm_compaction_try_to_compact_pages"),
            ("compaction", "mm_compaction_begin"),
            ("compaction", "mm_compaction_end"))),
    Family("syscall", "ebpf_syscall", "syscall.c", "sc_hist", "struct sc_key", "=Q",
           (("raw_syscalls", "sys_enter"), ("raw_syscalls", "sys_exit"))),
)


def tracefs_root() -> str:
    for root in ("/sys/kernel/tracing", "/sys/kernel/debug/tracing"):
        if os.path.isdir(f"{root}/events"):
            return root
    return ""


def tracepoint_exists(category: str, event: str) -> bool:
    root = tracefs_root()
    return bool(root) and os.path.isdir(f"{root}/events/{category}/{event}")


def block_start_event() -> str | None:
    """block_io_start (kernel >= 6.5) runs in the submitter's context; before it existed,
    block_rq_insert is the closest event that mostly does."""
    for event in ("block_io_start", "block_rq_insert"):
        if tracepoint_exists("block", event):
            return event
    return None


def program_text(family: Family, key_by_pid: bool) -> tuple[str, list[str]]:
    """The C text and compiler flags of one family."""
    bpf = resources.files("sloguard.collectors") / "bpf"
    hist_add = ((bpf / "hist_add.c").read_text()
                .replace("HIST_ADD_FN", f"{family.table}_add")
                .replace("HIST_MAP_NAME", family.table)
                .replace("KEY_TYPE", family.key_type))
    text = ((bpf / "common.h").read_text()
            + (bpf / family.source).read_text().replace("HIST_FUNCTIONS", hist_add))
    cflags = ["-DSLOGUARD_KEY_TGID"] if key_by_pid else []
    if family.name == "block_io":
        # BCC reads TRACEPOINT_PROBE names from the text before preprocessing: substitute.
        text = text.replace("BLOCK_START_EVENT", block_start_event() or "block_io_start")
    if family.name == "syscall":
        waiting = _X86_64_WAITING_SYSCALLS if platform.machine() == "x86_64" else ()
        test = "||".join(f"(nr)=={n}" for n in waiting) or "0"
        cflags.append(f"-DSKIP_SYSCALL(nr)=({test})")
    return text, cflags


def missing_tracepoints(family: Family) -> list[str]:
    needed = list(family.tracepoints)
    if family.name == "block_io":
        start = block_start_event()
        if start is None:
            return ["block:block_io_start (or block:block_rq_insert)"]
        needed.append(("block", start))
    return [f"{c}:{e}" for c, e in needed if not tracepoint_exists(c, e)]


class DeviceNames:
    """Kernel dev_t (major << 20 | minor) -> the disk's name, as node_disk tags it."""

    def __init__(self, sys_root: str = "/sys") -> None:
        self.sys_root = sys_root
        self._names: dict[int, str] = {}

    def name(self, dev: int) -> str:
        found = self._names.get(dev)
        if found is None:
            major, minor = dev >> 20, dev & 0xFFFFF
            found = f"{major}:{minor}"
            try:
                with open(f"{self.sys_root}/dev/block/{major}:{minor}/uevent") as handle:
                    for line in handle:
                        if line.startswith("DEVNAME="):
                            found = line.strip().partition("=")[2]
                            break
            except OSError:
                pass
            self._names[dev] = found
        return found
