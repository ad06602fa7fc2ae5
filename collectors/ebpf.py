"""Per-cgroup run-queue, block I/O, memory-reclaim (and optionally syscall) latency from eBPF.

CPU usage and PSI say that a node is busy; they do not say how long an LS container's threads
waited for a CPU, how long its I/O took, or how long it stalled reclaiming memory. BCC programs
on scheduler, block and vmscan tracepoints measure exactly that, in the kernel, into log2
histograms keyed by cgroup; every interval the agent drains the maps and writes p50, p99,
mean, sum and count per cgroup (collectors/log2hist.py explains the bucket error).

Loading needs root (or CAP_BPF + CAP_PERFMON), Debian's BCC and something to compile against:
kernels like this lab's have no headers, so scripts/bcc-setup.sh builds a stand-in tree and
the programs use only tracepoint arguments and BPF helpers (collectors/bpf/common.h). They
are compiled in a child process that hands back only file descriptors, so the agent never
carries LLVM (collectors/ebpf_loader.py). Any missing piece makes the collector report
"eBPF unavailable: <reason>" instead of failing the agent; collectors/kernel_latency.py then
falls back to procfs.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
from collections import defaultdict
from dataclasses import dataclass, field

from sloguard.collectors import ebpf_loader
from sloguard.collectors.bpf_maps import MapDrainer
from sloguard.collectors.cgroup_ids import CgroupAttribution
from sloguard.collectors.config import EbpfCollectorConfig
from sloguard.collectors.ebpf_loader import LoadedFamily, LoaderError
from sloguard.collectors.ebpf_programs import (
    BLAME_TABLE,
    FAMILIES,
    HIST_VALUE_FORMAT,
    DeviceNames,
    Family,
    missing_tracepoints,
    tracefs_root,
)
from sloguard.collectors.log2hist import Log2Histogram
from sloguard.core.health import ComponentStatus
from sloguard.core.samples import Sample

log = logging.getLogger(__name__)

DEFAULT_KERNEL_SOURCE = "/var/cache/sloguard/bcc-kernel"
BLAME_MEASUREMENT = "ebpf_runqueue_blame"
OTHER_CULPRIT = "(other)"  # a runner that is not a BE workload (LS, a system daemon, kthreads)
# The (victim, culprit) pairs written per drain, the largest waits first: pairs are at most
# (tracked workloads)^2, and one drain must not write more than the rest of a tick.
MAX_BLAME_PAIRS = 2000
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


def bcc_problem() -> str | None:
    """None when Debian's BCC can be imported (by the loader process), else why not. The agent
    itself never imports it (collectors/ebpf_loader.py says why)."""
    try:
        spec = importlib.util.find_spec("bcc")
    except (ImportError, ValueError) as exc:
        spec, error = None, str(exc)
    else:
        error = "no module named 'bcc'"
    if spec is None:
        return (f"BCC is not installed for this Python ({error}); install Debian's "
                "python3-bpfcc and libbpfcc (scripts/bcc-setup.sh does, and links it into the "
                "venv)")
    return None


@dataclass
class _Program:
    family: Family
    loaded: LoadedFamily
    drainer: MapDrainer
    tables: dict[str, MapDrainer] = field(default_factory=dict)


@dataclass
class _Counters:
    drains: int = 0
    events: int = 0
    unattributed_events: int = 0
    blame_pairs_dropped: int = 0
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
            self._load()
        except (EbpfUnavailable, LoaderError, OSError) as exc:
            self.unavailable = str(exc)
            log.warning("eBPF unavailable: %s", exc)
            return
        for name, reason in self.failed.items():
            log.warning("eBPF %s unavailable: %s", name, reason)
        if self.wanted() and not self.programs:
            self.unavailable = "; ".join(f"{k}: {v}" for k, v in self.failed.items())
        loaded = ", ".join(p.family.name for p in self.programs)
        if loaded:
            log.info("eBPF attached: %s (attribution by %s)", loaded, self.attribution.mode)

    def _check_environment(self) -> None:
        problem = privilege_problem() or bcc_problem()
        if problem:
            raise EbpfUnavailable(problem)
        if not tracefs_root():
            raise EbpfUnavailable(
                "tracefs is not mounted (mount -t tracefs nodev /sys/kernel/tracing; "
                "scripts/bcc-setup.sh does it)")
        self.kernel_source = kernel_source(self.config)
        if self.kernel_source is not None and not os.path.isdir(self.kernel_source):
            raise EbpfUnavailable(
                f"no kernel headers for BCC: {self.kernel_source} does not exist "
                "(scripts/bcc-setup.sh builds it)")

    def _load(self) -> None:
        wanted = []
        for family in self.wanted():
            missing = missing_tracepoints(family)
            if missing:
                self.failed[family.name] = f"kernel lacks tracepoint {', '.join(missing)}"
            else:
                wanted.append(family)
        if not wanted:
            return
        loaded, failed = ebpf_loader.load(
            [f.name for f in wanted], key_by_pid=self.attribution.mode == "pid",
            kernel_source=self.kernel_source)
        where = f" (BCC_KERNEL_SOURCE={self.kernel_source})" if self.kernel_source else ""
        for name, reason in failed.items():
            self.failed[name] = reason + where
        for family in wanted:
            if family.name in loaded:
                fds = loaded[family.name]
                tables = {name: MapDrainer(fds.tables[name], key, value)
                          for name, key, value in family.tables if name in fds.tables}
                self.programs.append(_Program(family, fds, MapDrainer(
                    fds.map_fd, family.key_format, HIST_VALUE_FORMAT), tables))

    @property
    def attached(self) -> list[str]:
        return [p.family.name for p in self.programs]

    def attachment(self) -> dict[str, bool]:
        """Each wanted family: attached and its map read on the last drain ({} while eBPF is
        off or not started: nothing was expected of it yet)."""
        if not (self.config.enabled and self.started):
            return {}
        attached = set(self.attached)
        return {f.name: f.name in attached and f.name not in self.counters.errors
                for f in self.wanted()}

    # -- collection ----------------------------------------------------------------------

    def collect(self, now_ns: int) -> list[Sample]:
        if not self.programs:
            return []
        self.attribution.refresh()
        samples: list[Sample] = []
        for program in self.programs:
            try:
                entries = program.drainer.drain()
                blame = (program.tables[BLAME_TABLE].drain()
                         if BLAME_TABLE in program.tables else [])
            except OSError as exc:
                self.counters.errors[program.family.name] = str(exc)
                log.warning("eBPF %s: cannot read its map: %s", program.family.name, exc)
                continue
            self.counters.errors.pop(program.family.name, None)
            self._samples(program.family, entries, now_ns, samples)
            if blame:
                self._blame_samples(blame, now_ns, samples)
        self.counters.drains += 1
        return samples

    def _samples(self, family: Family, entries: list[tuple[tuple[int, ...], tuple[int, ...]]],
                 now_ns: int, out: list[Sample]) -> None:
        per_id = {(key[0], key[1:]): Log2Histogram.from_values(values)
                  for key, values in entries}
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

    def _blame_samples(self, entries: list[tuple[tuple[int, ...], tuple[int, ...]]],
                       now_ns: int, out: list[Sample]) -> None:
        """The run-queue wait of each non-BE workload, by the workload whose task it waited
        behind (runqueue.c says how a wait is charged): the culprit evidence of
        detector/attribution/. A workload's own threads are not its culprit."""
        tags_of, workload = self.attribution.tags, self.attribution.workload
        # per kernel id, once a drain (ids repeat across pairs): the victim it is (None: BE or
        # untracked, nobody's SLO) and the culprit it is (its workload, and the name charged:
        # only BE workloads are suspects, waits behind anything else are one `(other)` sum; a
        # node of LS pods made one pair per LS pair: 770 samples a second for 50 LS sleepers,
        # two thirds of the drain's time, in benchmarks/ebpf_overhead.py)
        victims: dict[int, str | None] = {}
        culprits: dict[int, tuple[str | None, str]] = {}
        pairs: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0])
        for (victim_id, culprit_id), (wait_ns, count) in entries:
            if victim_id in victims:
                victim = victims[victim_id]
            else:
                victim = victims[victim_id] = workload(victim_id)
                if victim is not None and tags_of(victim).get("class") == "BE":
                    victim = victims[victim_id] = None
            if victim is None:
                continue
            if culprit_id in culprits:
                runner, charged = culprits[culprit_id]
            else:
                runner = workload(culprit_id)
                charged = runner if runner is not None and \
                    tags_of(runner).get("class") == "BE" else OTHER_CULPRIT
                culprits[culprit_id] = (runner, charged)
            if runner != victim:  # a workload's own threads are not its culprit
                pair = pairs[(victim, charged)]
                pair[0] += wait_ns
                pair[1] += count
        ranked = sorted(pairs.items(), key=lambda item: item[1][0], reverse=True)
        self.counters.blame_pairs_dropped += max(0, len(ranked) - MAX_BLAME_PAIRS)
        for (victim, culprit), (wait_ns, count) in ranked[:MAX_BLAME_PAIRS]:
            tags = {**tags_of(victim), "culprit": culprit}
            if culprit != OTHER_CULPRIT:
                ran = tags_of(culprit)
                tags["culprit"] = ran.get("cgroup", culprit)
                for key in ("class", "pod", "namespace", "workload"):
                    if key in ran:
                        tags[f"culprit_{key}"] = ran[key]
            out.append(Sample(BLAME_MEASUREMENT, tags,
                              {"wait_us": wait_ns / 1000, "count": count}, now_ns))

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
            "drains_total": self.counters.drains,
            "events_total": self.counters.events,
            "unattributed_events_total": self.counters.unattributed_events,
            "blame_pairs_dropped_total": self.counters.blame_pairs_dropped,
            "load_seconds": {p.family.name: round(p.loaded.load_seconds, 3)
                             for p in self.programs},
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
        for program in self.programs:  # closing the perf events detaches the programs
            program.loaded.close()
        self.programs = []
