"""Per-cgroup run-queue, block I/O, memory-reclaim (and optionally syscall) latency from eBPF.

CPU usage and PSI say that a node is busy; they do not say how long an LS container's threads
waited for a CPU, how long its I/O took, or how long it stalled reclaiming memory. BCC programs
on scheduler, block and vmscan tracepoints measure exactly that, in the kernel, into log2
histograms keyed by cgroup; every interval the agent drains the maps and writes p50, p99,
mean, sum and count per cgroup (collectors/log2hist.py explains the bucket error).

Loading needs root (or CAP_BPF + CAP_PERFMON), Debian's BCC and something to compile against:
kernels like this lab's have no headers, so scripts/bcc-setup.sh builds a stand-in tree and
the programs use only tracepoint arguments and BPF helpers (collectors/bpf/common.h). Any
missing piece makes the collector report "eBPF unavailable: <reason>" instead of failing the
agent; collectors/kernel_latency.py then falls back to procfs.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from sloguard.collectors.bpf_maps import MapDrainer
from sloguard.collectors.cgroup_ids import CgroupAttribution
from sloguard.collectors.ebpf_programs import (
    FAMILIES,
    DeviceNames,
    Family,
    missing_tracepoints,
    program_text,
    tracefs_root,
)
from sloguard.collectors.log2hist import Log2Histogram
from sloguard.config import EbpfCollectorConfig
from sloguard.health import ComponentStatus
from sloguard.samples import Sample

log = logging.getLogger(__name__)

DEFAULT_KERNEL_SOURCE = "/var/cache/sloguard/bcc-kernel"
_CAP_SYS_ADMIN, _CAP_PERFMON, _CAP_BPF = 21, 38, 39


class EbpfUnavailable(Exception):
    """Why the programs cannot run here, phrased for the /readyz reader."""


def privilege_problem(status_file: str = "/proc/self/status") -> str | None:
    """None when this process may load tracing programs, else what it lacks."""
    if os.geteuid() == 0:
        return None
    caps = 0
    with contextlib.suppress(OSError, ValueError), open(status_file) as handle:
        for line in handle:
            if line.startswith("CapEff:"):
                caps = int(line.split()[1], 16)
    if caps >> _CAP_SYS_ADMIN & 1 or (caps >> _CAP_BPF & 1 and caps >> _CAP_PERFMON & 1):
        return None
    return (f"needs root or CAP_BPF and CAP_PERFMON (running as uid {os.geteuid()} "
            "without them)")


def kernel_source(config: EbpfCollectorConfig) -> str | None:
    """What BCC compiles against: the configured tree, $BCC_KERNEL_SOURCE, or the tree
    scripts/bcc-setup.sh builds; None leaves BCC to find the kernel's own headers."""
    if config.kernel_source:
        return config.kernel_source
    if os.environ.get("BCC_KERNEL_SOURCE"):
        return os.environ["BCC_KERNEL_SOURCE"]
    if os.path.isdir(DEFAULT_KERNEL_SOURCE):
        return DEFAULT_KERNEL_SOURCE
    return None


def import_bcc() -> Any:
    try:
        import bcc
    except ImportError as exc:
        raise EbpfUnavailable(
            f"BCC is not installed for this Python ({exc}); install Debian's python3-bpfcc "
            "and libbpfcc (scripts/bcc-setup.sh does, and links it into the venv)") from exc
    except OSError as exc:  # the module is there but libbcc.so.0 is not
        raise EbpfUnavailable(f"BCC cannot load libbcc: {exc}") from exc
    return bcc


class _Captured:
    text = ""


@contextlib.contextmanager
def _output_captured() -> Iterator[_Captured]:
    """BCC prints compiler errors (and "Unable to find kernel headers") from C++ to file
    descriptors 1 and 2, where nobody reads them; catch them for /readyz and the log."""
    captured = _Captured()
    with tempfile.TemporaryFile() as tmp:
        sys.stdout.flush()
        sys.stderr.flush()
        saved = [os.dup(1), os.dup(2)]
        os.dup2(tmp.fileno(), 1)
        os.dup2(tmp.fileno(), 2)
        try:
            yield captured
        finally:
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved:
                os.close(fd)
            tmp.seek(0)
            captured.text = tmp.read().decode(errors="replace")


def _first_error(text: str) -> str:
    """The line of BCC's output that says what went wrong (compiler errors come first)."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for marker in ("error:", "fatal", "unable", "no such file", "error"):
        for line in lines:
            if marker in line.lower():
                return line[:300]
    return lines[0][:300] if lines else ""


@dataclass
class _Program:
    family: Family
    bpf: Any
    drainer: MapDrainer
    load_seconds: float


@dataclass
class _Counters:
    drains: int = 0
    events: int = 0
    unattributed_events: int = 0
    errors: dict[str, str] = field(default_factory=dict)


class EbpfCollector:
    name = "ebpf"

    def __init__(
        self,
        node: str,
        config: EbpfCollectorConfig,
        attribution: CgroupAttribution,
    ) -> None:
        self.node = node
        self.config = config
        self.attribution = attribution
        self.devices = DeviceNames()
        self.programs: list[_Program] = []
        self.failed: dict[str, str] = {}  # family -> why it is not attached
        self.unavailable = ""  # why nothing can be loaded at all
        self.started = False
        self.kernel_source: str | None = None
        self.counters = _Counters()

    # -- loading -------------------------------------------------------------------------

    def wanted(self) -> list[Family]:
        return [f for f in FAMILIES if getattr(self.config, f.name)]

    def start(self) -> None:
        """Load every enabled family; never raises (reasons go to status())."""
        if self.started:
            return
        self.started = True
        if not self.config.enabled:
            return
        try:
            self._check_environment()
            bcc = import_bcc()
        except EbpfUnavailable as exc:
            self.unavailable = str(exc)
            log.warning("eBPF unavailable: %s", exc)
            return
        for family in self.wanted():
            try:
                self.programs.append(self._load(bcc, family))
            except EbpfUnavailable as exc:
                self.failed[family.name] = str(exc)
                log.warning("eBPF %s unavailable: %s", family.name, exc)
        if self.wanted() and not self.programs:
            self.unavailable = "; ".join(f"{k}: {v}" for k, v in self.failed.items())
        loaded = ", ".join(p.family.name for p in self.programs)
        if loaded:
            log.info("eBPF attached: %s (attribution by %s)", loaded, self.attribution.mode)

    def _check_environment(self) -> None:
        problem = privilege_problem()
        if problem:
            raise EbpfUnavailable(problem)
        if not tracefs_root():
            raise EbpfUnavailable(
                "tracefs is not mounted (mount -t tracefs nodev /sys/kernel/tracing; "
                "scripts/bcc-setup.sh does it)")
        self.kernel_source = kernel_source(self.config)
        if self.kernel_source is not None:
            if not os.path.isdir(self.kernel_source):
                raise EbpfUnavailable(
                    f"no kernel headers for BCC: {self.kernel_source} does not exist "
                    "(scripts/bcc-setup.sh builds it)")
            # BCC reads it when it compiles, which happens after this point.
            os.environ["BCC_KERNEL_SOURCE"] = self.kernel_source

    def _load(self, bcc: Any, family: Family) -> _Program:
        missing = missing_tracepoints(family)
        if missing:
            raise EbpfUnavailable(f"kernel lacks tracepoint {', '.join(missing)}")
        text, cflags = program_text(family, key_by_pid=self.attribution.mode == "pid")
        started = time.perf_counter()
        try:
            with _output_captured() as errors:
                program = bcc.BPF(text=text.encode(), cflags=cflags)
        except Exception as exc:
            detail = _first_error(errors.text)
            if errors.text.strip():
                log.warning("BCC output while loading %s:\n%s", family.name, errors.text[-4000:])
            where = f" (BCC_KERNEL_SOURCE={self.kernel_source})" if self.kernel_source else ""
            raise EbpfUnavailable(
                f"{exc}{': ' + detail if detail else ''}{where}") from exc
        try:
            drainer = MapDrainer(program[family.table.encode()], family.key_format)
        except Exception as exc:
            program.cleanup()
            raise EbpfUnavailable(f"unexpected map layout: {exc}") from exc
        return _Program(family, program, drainer, time.perf_counter() - started)

    @property
    def attached(self) -> list[str]:
        return [p.family.name for p in self.programs]

    # -- collection ----------------------------------------------------------------------

    def collect(self, now_ns: int) -> list[Sample]:
        if not self.programs:
            return []
        self.attribution.refresh()
        samples: list[Sample] = []
        for program in self.programs:
            try:
                entries = program.drainer.drain()
            except OSError as exc:
                self.counters.errors[program.family.name] = str(exc)
                log.warning("eBPF %s: cannot read its map: %s", program.family.name, exc)
                continue
            self.counters.errors.pop(program.family.name, None)
            self._samples(program.family, entries, now_ns, samples)
        self.counters.drains += 1
        return samples

    def _samples(self, family: Family, entries: list[tuple[tuple[int, ...], int]],
                 now_ns: int, out: list[Sample]) -> None:
        per_id: dict[tuple[int, tuple[int, ...]], Log2Histogram] = defaultdict(Log2Histogram)
        for key, value in entries:
            per_id[(key[0], key[1:-1])].add(key[-1], value)
        node: dict[tuple[int, ...], Log2Histogram] = defaultdict(Log2Histogram)
        cgroups: dict[tuple[str, tuple[int, ...]], Log2Histogram] = defaultdict(Log2Histogram)
        targets = self.attribution.targets
        for (kernel_id, extra), hist in per_id.items():
            node[extra].merge(hist)
            charged = targets(kernel_id)
            if not charged:
                self.counters.unattributed_events += hist.count
            for rel in charged:
                cgroups[(rel, extra)].merge(hist)
        for extra, hist in node.items():
            self.counters.events += hist.count
            fields = hist.fields()
            if fields:
                tags = {"node": self.node, "level": "node",
                        **dict(family.extra_tags(extra, self.devices))}
                out.append(Sample(family.measurement, tags, fields, now_ns))
        for (rel, extra), hist in cgroups.items():
            fields = hist.fields()
            if fields:
                tags = {**self.attribution.tags(rel), **dict(family.extra_tags(extra,
                                                                                self.devices))}
                out.append(Sample(family.measurement, tags, fields, now_ns))

    # -- health --------------------------------------------------------------------------

    def status(self) -> ComponentStatus:
        signals = {}
        for family in FAMILIES:
            if not getattr(self.config, family.name):
                signals[family.name] = "off"
            elif family.name in self.failed:
                signals[family.name] = f"unavailable: {self.failed[family.name]}"
            elif family.name in self.attached:
                signals[family.name] = "attached"
            else:
                signals[family.name] = "not loaded"
        details: dict[str, object] = {
            "signals": signals,
            "attribution": self.attribution.mode,
            "kernel_source": self.kernel_source,
            "events_total": self.counters.events,
            "unattributed_events_total": self.counters.unattributed_events,
            "load_seconds": {p.family.name: round(p.load_seconds, 3) for p in self.programs},
        }
        if self.attribution.unmirrored:
            details["cgroups_without_v2_directory"] = len(self.attribution.unmirrored)
        if not self.config.enabled:
            return ComponentStatus("collector:ebpf", ok=True,
                                   reason="eBPF disabled by collectors.ebpf.enabled",
                                   details=details)
        if self.unavailable:
            reason = f"eBPF unavailable: {self.unavailable}"
        elif not self.started:
            reason = "eBPF not loaded yet (the agent loads it when it starts)"
        elif self.failed:
            reason = "eBPF partly unavailable: " + "; ".join(
                f"{k}: {v}" for k, v in self.failed.items())
        elif self.counters.errors:
            reason = "eBPF map read failed: " + "; ".join(
                f"{k}: {v}" for k, v in self.counters.errors.items())
        else:
            reason = ""
        if self.attribution.unmirrored and not reason:
            reason = (f"{len(self.attribution.unmirrored)} tracked cgroups have no cgroup v2 "
                      "directory, so their tasks cannot be attributed by cgroup id; set "
                      "collectors.ebpf.key: pid")
        return ComponentStatus("collector:ebpf", ok=not reason, reason=reason, details=details)

    def close(self) -> None:
        for program in self.programs:
            with contextlib.suppress(Exception):
                program.bpf.cleanup()
        self.programs = []
