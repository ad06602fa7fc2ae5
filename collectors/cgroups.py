"""Per-cgroup CPU, throttling, memory and PSI, for cgroup v1, v2 and hybrid hosts.

The hierarchy is walked only every `rediscover` seconds; each tick reads a precomputed list of
files per cgroup, because this runs every second on every node and 100 pods mean hundreds of
reads. A cgroup that disappears between discovery and read (a container exited) is skipped and
counted, never an error.
"""

from __future__ import annotations

import contextlib
import fnmatch
import logging
import os
import re
import resource
import time
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sloguard.collectors.base import CollectorBase, CollectorContext
from sloguard.collectors.config import CgroupCollectorConfig
from sloguard.collectors.hookspecs import hookimpl
from sloguard.core.cgroup_layout import CgroupLayout, detect_layout, layout_from_root
from sloguard.core.health import ComponentStatus
from sloguard.core.pod_cgroups import parse_pod_cgroup, static_pod_uid
from sloguard.core.pods import PodMeta, pod_class
from sloguard.core.samples import Sample
from sloguard.core.selectors import Selector

log = logging.getLogger(__name__)

_UNLIMITED_V1 = 1 << 62  # v1 reports "no limit" as a huge page-aligned number
PSI_RESOURCES = ("cpu", "memory", "io")
# Per resource, per kind: the parsed total, the counter kept between ticks, the rate's field.
_PSI_COUNTERS = {res: tuple((f"{kind}_total", f"psi_{res}_{kind}", f"{kind}_rate")
                            for kind in ("some", "full")) for res in PSI_RESOURCES}


def _read(path: str) -> bytes | None:
    """One whole cgroup file (they are small), or None when it is gone."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        return os.read(fd, 65536)
    except OSError:
        return None
    finally:
        os.close(fd)


def _kv(data: bytes) -> dict[bytes, int]:
    """Parse flat keyed files (cpu.stat, memory.stat): `key value` per line."""
    out = {}
    for line in data.split(b"\n"):
        key, _, value = line.partition(b" ")
        if value:
            try:
                out[key] = int(value)
            except ValueError:
                continue
    return out


class _OpenFiles:
    """Cgroup files kept open and re-read with pread.

    Opening a kernfs file costs ~15x a pread of an open one (measured here: 16 us vs 1.1 us),
    and a node reads hundreds of them every second. Holding descriptors is bounded by a budget
    below RLIMIT_NOFILE; past it, files are opened per read. A held file of a removed cgroup
    fails with ENODEV, which is how a vanished container is noticed.
    """

    def __init__(self, hold: bool = True) -> None:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft != hard:
            with contextlib.suppress(ValueError, OSError):
                resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
                soft = hard
        limit = soft if soft != resource.RLIM_INFINITY else 1 << 20
        self.budget = max(0, min(limit - 512, 200_000)) if hold else 0
        self.fds: dict[str, int] = {}
        self._parsed: dict[str, tuple[bytes, Any]] = {}  # path -> (bytes read, their parse)

    def read(self, path: str) -> bytes | None:
        fd = self.fds.get(path)
        if fd is None:
            if len(self.fds) >= self.budget:
                return _read(path)
            try:
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                return None
            self.fds[path] = fd
        try:
            return os.pread(fd, 65536, 0)
        except OSError:
            self.close(path)
            return None

    def parsed(self, path: str, parse: Callable[[bytes], Any]) -> Any:
        """`parse` of the file's content, or None when it is gone; the same object as
        the last time while the file reads the same bytes, so callers must not change it.

        Most of a node's pressure files (and the cpu.stat of an idle container) read the same
        from one tick to the next: the memory and io stall totals of a container that did not
        stall, every figure of one that did not run. Parsing them again was a tenth of the
        100-cgroup tick in a py-spy profile of benchmarks/agent_tick.py ("collect cgroups" is
        this; the measured run is in docs/performance.md)."""
        data = self.read(path)
        if data is None:
            self._parsed.pop(path, None)
            return None
        last = self._parsed.get(path)
        if last is not None and last[0] == data:
            return last[1]
        value = parse(data)
        self._parsed[path] = (data, value)
        return value

    def close(self, *paths: str | None) -> None:
        for path in paths:
            if path:
                self._parsed.pop(path, None)
            fd = self.fds.pop(path, None) if path else None
            if fd is not None:
                os.close(fd)

    def close_all(self) -> None:
        self.close(*list(self.fds))
        self._parsed.clear()


# (inactive file cache, anonymous memory, page cache) keys of memory.stat.
_MEM_KEYS_V1 = (b"total_inactive_file ", b"total_rss ", b"total_cache ")
_MEM_KEYS_V2 = (b"inactive_file ", b"anon ", b"file ")


def _stat_value(data: bytes, key: bytes) -> int | None:
    """The value of one `key value` line; memory.stat is long and read every tick."""
    if data.startswith(key):
        begin = len(key)
    else:
        found = data.find(b"\n" + key)
        if found < 0:
            return None
        begin = found + 1 + len(key)
    end = data.find(b"\n", begin)
    try:
        return int(data[begin:end if end >= 0 else None])
    except ValueError:
        return None


# The kernel's PSI line, whole: three files per cgroup per tick, so the usual file is parsed in
# one regex pass (1.4 us against 2.5 us for the split below; benchmarks/agent_tick.py puts the
# cgroup collection at a third of the tick). Any other shape goes the general way.
_PSI_LINE = re.compile(rb"(some|full) avg10=([0-9.]+) avg60=([0-9.]+) avg300=[0-9.]+ "
                       rb"total=([0-9]+)\n")
_PSI_KEYS = {b"some": ("some_avg10", "some_avg60", "some_total"),
             b"full": ("full_avg10", "full_avg60", "full_total")}


def parse_psi(data: bytes) -> dict[str, float]:
    """PSI lines (`some avg10=0.00 avg60=0.00 avg300=0.00 total=0`) -> {some_avg10: ..}."""
    out: dict[str, float] = {}
    lines = _PSI_LINE.findall(data)
    if lines and len(lines) == data.count(b"\n") and data.endswith(b"\n"):
        for kind, avg10, avg60, total in lines:
            k10, k60, ktotal = _PSI_KEYS[kind]
            out[k10], out[k60], out[ktotal] = float(avg10), float(avg60), int(total)
        return out
    for line in data.decode().splitlines():
        kind, *pairs = line.split()
        for pair in pairs:
            key, _, value = pair.partition("=")
            if key in ("avg10", "avg60", "total"):
                out[f"{kind}_{key}"] = int(value) if key == "total" else float(value)
    return out


@dataclass(slots=True)
class _Tracked:
    """One cgroup being collected: its tags, the files to read, and the previous counters."""

    path: str
    tags: dict[str, str]
    cpu_usage: str | None  # file; unit given by cpu_usage_v2
    cpu_usage_v2: bool
    cpu_stat: str | None
    mem_usage: str | None
    mem_stat: str | None
    mem_v2: bool
    psi: dict[str, str] = field(default_factory=dict)
    psi_tags: dict[str, dict[str, str]] = field(default_factory=dict)  # with "resource"
    limit_cores: float | None = None
    limit_bytes: int | None = None
    cpu_limit: tuple[str, ...] = ()  # cpu.max, or cfs_quota_us and cfs_period_us
    mem_limit: str | None = None
    complete: bool = False  # every file a cgroup of this host can have was found
    mem_stat_due: int = 0  # monotonic ns: when memory.stat is read next
    inactive: int | None = None  # inactive file cache at the last memory.stat read
    prev: dict[str, float] = field(default_factory=dict)
    prev_mono: int = 0
    cores: float = 0.0  # CPU usage (cores) at the last collection: what cpu_rise starts from

    def files(self) -> list[str | None]:
        return [self.cpu_usage, self.cpu_stat, self.mem_usage, self.mem_stat,
                *self.psi.values(), *self.cpu_limit, self.mem_limit]


# what cpu_rise reads for a group of selected cgroups with one parent: that parent (None where
# it cannot stand for them), their names under it, the cgroups themselves (_probes)
_Probe = tuple[_Tracked | None, frozenset[str], list[_Tracked]]


class CgroupCollector(CollectorBase):
    name = "cgroups"
    # what `collect` writes: a read that has no sample of one of these for a series means the
    # series has gone (the agent's fresh read, Engine._newest), not that it was not read
    measurements = ("container_cpu", "container_memory", "container_pressure")

    @classmethod
    def create(cls, ctx: CollectorContext) -> CgroupCollector | None:
        cfg = ctx.section(cls.name)
        if not cfg.enabled:
            return None
        return cls(ctx.node, cfg, pod_lookup=ctx.pods.get if ctx.pods is not None else None)

    def __init__(
        self,
        node: str,
        config: CgroupCollectorConfig,
        pod_lookup: Callable[[str], PodMeta | None] | None = None,
        mountinfo: str = "/proc/self/mountinfo",
    ) -> None:
        self.node = node
        self.config = config
        self.pod_lookup = pod_lookup or (lambda uid: None)
        self._mountinfo = mountinfo
        self.layout: CgroupLayout | None = None
        self._error = ""
        self._tracked: dict[str, _Tracked] = {}
        self._selected: dict[tuple[Selector, ...], list[_Probe]] = {}  # cpu_rise
        self._unnamed: frozenset[str] = frozenset()  # _publish
        self._next_discovery = 0.0
        self.vanished_total = 0
        self.discoveries = 0
        # bumped whenever the tracked cgroups or their tags change (_publish): what the eBPF
        # and CPI collectors key their copies of the tags on
        self.generation = 0
        self.tracked = 0
        self._workloads: tuple[dict[str, str], ...] = ()
        # pod uid -> {"cpu": cores, "memory": working-set bytes}, as of the last collection
        self._usage: dict[str, dict[str, float]] = {}
        self._tags_by_path: dict[str, dict[str, str]] = {}
        # Only kernfs reports a removed cgroup through an open descriptor (ENODEV); a tree
        # given as `root` may be ordinary files (a copy, a fixture), so it is opened per read.
        self._files = _OpenFiles(hold=config.root is None)
        self._detect()

    def _detect(self) -> None:
        try:
            self.layout = (
                layout_from_root(self.config.root) if self.config.root
                else detect_layout(self._mountinfo)
            )
            self.layout.primary  # noqa: B018 - raises when no usable hierarchy exists
            self._error = ""
        except (OSError, LookupError) as exc:
            self.layout = None
            self._error = f"no usable cgroup hierarchy: {exc}"

    # -- discovery -----------------------------------------------------------------------

    def discover(self) -> None:
        """Walk the configured subtrees and declared globs; keep counters of known cgroups."""
        if self.layout is None:
            self._detect()
            if self.layout is None:
                return
        root = self.layout.primary
        found: set[str] = set()
        for include in self.config.include:
            base = root / include.strip("/")
            if base.is_dir():
                self._walk(root, base, 0, found)
        for decl in self.config.declare:
            pattern = decl.path.strip("/")
            for match in root.glob(pattern):
                if match.is_dir():
                    found.add(str(match.relative_to(root)))
        for rel, old in self._tracked.items():
            if rel not in found:
                self._files.close(*old.files())
        tracked = {}
        for rel in sorted(found):
            old = self._tracked.get(rel)
            if old is not None and old.complete:
                item = self._refresh(old)
            else:
                item = self._track(rel)
                if old is not None:
                    item.prev, item.prev_mono, item.cores = old.prev, old.prev_mono, old.cores
            tracked[rel] = item
        self._tracked = tracked
        self.discoveries += 1
        self._publish()

    def _walk(self, root: Path, directory: Path, depth: int, found: set[str]) -> None:
        found.add(str(directory.relative_to(root)))
        if depth < self.config.max_depth:
            self._walk_below(str(directory), len(str(root).rstrip("/")) + 1, depth, found)

    def _walk_below(self, directory: str, strip: int, depth: int, found: set[str]) -> None:
        # Strings, not Path objects: a walk of 100 cgroups spent a third of its time in
        # pathlib (cProfile of CgroupCollector.discover).
        try:
            entries = list(os.scandir(directory))
        except OSError:
            return
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                found.add(entry.path[strip:])
                if depth + 1 < self.config.max_depth:
                    self._walk_below(entry.path, strip, depth + 1, found)

    def _refresh(self, item: _Tracked) -> _Tracked:
        """A cgroup tracked at the last discovery with all its files keeps them (and its
        counters); what can change in place is read again: its tags (pod metadata arrives
        late, a label changes) and its limits (a resize, a lever). Re-tracking each cgroup
        from scratch cost 20 ms per discovery of 100 cgroups, most of it in stat calls
        (benchmarks/agent_tick.py's "collect cgroups" includes it every `rediscover`)."""
        item.tags = self._tags(item.path)
        item.psi_tags = _psi_tags(item.tags, item.psi)
        self._read_limits(item)
        return item

    def _read_limits(self, item: _Tracked) -> None:
        # Held open like the counters: opening them anew was most of a refresh (kernfs open
        # ~15x a pread, _OpenFiles).
        read = self._files.read
        if item.cpu_usage_v2:
            item.limit_cores = _v2_cpu_limit(read(item.cpu_limit[0]))
        elif item.cpu_limit:
            item.limit_cores = _v1_cpu_limit(*(read(f) for f in item.cpu_limit))
        item.limit_bytes = _limit_bytes(read(item.mem_limit)) if item.mem_limit else None

    def _track(self, rel: str) -> _Tracked:
        # Paths as strings, not pathlib: every tracked cgroup is tracked anew at each
        # rediscovery, and Path joins were a twentieth of the 100-cgroup agent's CPU
        # (benchmarks/agent_tick.py, py-spy of benchmarks/agent_overhead.py).
        layout = self.layout
        assert layout is not None
        tags = self._tags(rel)
        unified = f"{layout.unified}/{rel}" if layout.unified else None
        if layout.mode == "v2":
            assert unified is not None
            d = unified
            # Without the memory controller enabled for it, a v2 cgroup has no memory files.
            has_memory = os.path.exists(f"{d}/memory.current")
            item = _Tracked(
                rel, tags, f"{d}/cpu.stat", True, f"{d}/cpu.stat",
                f"{d}/memory.current" if has_memory else None,
                f"{d}/memory.stat" if has_memory else None, True,
                cpu_limit=(f"{d}/cpu.max",), mem_limit=f"{d}/memory.max",
                complete=has_memory,
            )
        else:
            # A cgroup may exist in some v1 hierarchies only: read just those.
            cpuacct, cpu, memory = (
                f"{layout.v1[c]}/{rel}" if c in layout.v1 and os.path.isdir(
                    f"{layout.v1[c]}/{rel}") else None
                for c in ("cpuacct", "cpu", "memory")
            )
            item = _Tracked(
                rel, tags,
                f"{cpuacct}/cpuacct.usage" if cpuacct else None, False,
                f"{cpu}/cpu.stat" if cpu else None,
                f"{memory}/memory.usage_in_bytes" if memory else None,
                f"{memory}/memory.stat" if memory else None, False,
                cpu_limit=(f"{cpu}/cpu.cfs_quota_us", f"{cpu}/cpu.cfs_period_us") if cpu
                else (),
                mem_limit=f"{memory}/memory.limit_in_bytes" if memory else None,
                # caught while the runtime was still creating it in every hierarchy: not yet
                complete=all((d is not None) or c not in layout.v1 for c, d in
                             (("cpuacct", cpuacct), ("cpu", cpu), ("memory", memory))),
            )
        if unified is not None:
            for res in PSI_RESOURCES:
                path = f"{unified}/{res}.pressure"
                if os.path.exists(path):
                    item.psi[res] = path
            item.psi_tags = _psi_tags(tags, item.psi)
            if layout.mode != "v2":  # hybrid: the unified directory is made on its own
                item.complete = item.complete and os.path.isdir(unified)
        self._read_limits(item)
        return item

    def _tags(self, rel: str) -> dict[str, str]:
        tags = {"node": self.node, "cgroup": "/" + rel}
        pod = parse_pod_cgroup(rel)
        if pod is not None:
            tags["level"] = pod.level
            if pod.qos:
                tags["qos"] = pod.qos
            if pod.pod_uid:
                tags["pod_uid"] = pod.pod_uid
                # a static pod's uid is never the API's (its mirror has its own): not asked
                meta = None if pod.static else self.pod_lookup(pod.pod_uid)
                if meta is not None:
                    tags["pod"], tags["namespace"] = meta.name, meta.namespace
                    if pod.container_id in meta.containers:
                        tags["container"] = meta.containers[pod.container_id]
                # a static pod (sloguard/core/pod_cgroups.py) is LS: the node admin's, often
                # the control plane's, its labels unknown; `declare` may say otherwise
                tags["class"] = "LS" if pod.static else pod_class(
                    meta, pod.qos, self.config.class_label, self.config.trusted_namespaces)
            elif pod.level == "qos":
                tags["class"] = "BE" if pod.qos == "besteffort" else "LS"
            if pod.container_id:
                tags["container_id"] = pod.container_id
        else:
            tags["level"] = "cgroup"
        for decl in self.config.declare:
            if fnmatch.fnmatchcase(rel, decl.path.strip("/")):
                tags["class"] = decl.class_
                if decl.name:
                    tags["workload"] = decl.name
                break
        return tags

    # -- collection ----------------------------------------------------------------------

    def collect(self, now_ns: int) -> list[Sample]:
        mono = time.monotonic()
        if mono >= self._next_discovery:
            self.discover()
            self._next_discovery = mono + self.config.rediscover
        elif self._unnamed and any(self.pod_lookup(uid) is not None for uid in self._unnamed):
            self._name_late()
        samples: list[Sample] = []
        gone = []
        for rel, item in self._tracked.items():
            if not self._collect_one(item, now_ns, samples):
                gone.append(rel)
        usage: dict[str, dict[str, float]] = {}
        for sample in samples:  # what the eviction ranking compares BE pods by
            uid = sample.tags.get("pod_uid")
            if uid and sample.tags.get("level") == "pod":
                if sample.measurement == "container_cpu" and "usage_cores" in sample.fields:
                    usage.setdefault(uid, {})["cpu"] = sample.fields["usage_cores"]
                elif sample.measurement == "container_memory" and (
                        "working_set_bytes" in sample.fields):
                    usage.setdefault(uid, {})["memory"] = sample.fields["working_set_bytes"]
        self._usage = usage
        for rel in gone:
            self._files.close(*self._tracked.pop(rel).files())
        self.vanished_total += len(gone)
        if gone:
            self._publish()
        return samples

    def _collect_one(self, item: _Tracked, now_ns: int, out: list[Sample]) -> bool:
        """Append the cgroup's samples; False when it vanished.

        Written flat (counters by local name, no helper calls per counter, each PSI sample's
        tags built once at tracking): it runs for every cgroup every second, and this shape
        took 0.90x the CPU of the per-counter helpers it replaced on 100 cgroups (9.4 against
        8.5 ms a tick, the two alternated in one process; "collect cgroups" in
        benchmarks/agent_tick.py is this).
        """
        read, parsed = self._files.read, self._files.parsed
        mono = time.monotonic_ns()
        stat = parsed(item.cpu_stat, _kv) if item.cpu_stat else None  # None: gone
        stat_kv = stat or {}
        usage_ns: int | None = None
        if item.cpu_usage_v2:
            if stat is None:
                return False
            usec = stat_kv.get(b"usage_usec")
            if usec is not None:
                usage_ns = usec * 1000
            throttled_ns = stat_kv.get(b"throttled_usec", 0) * 1000
        else:
            usage = read(item.cpu_usage) if item.cpu_usage else None
            if item.cpu_usage and usage is None:
                return False
            if usage:
                usage_ns = int(usage)
            throttled_ns = stat_kv.get(b"throttled_time", 0)
        periods = stat_kv.get(b"nr_periods")
        throttled = stat_kv.get(b"nr_throttled", 0) if periods is not None else None
        current: dict[str, float] = {"throttled_ns": throttled_ns}
        if usage_ns is not None:
            current["usage_ns"] = usage_ns
        if periods is not None:
            current["periods"], current["throttled"] = periods, throttled
        psi: list[tuple[str, dict[str, float]]] = []
        for res, path in item.psi.items():
            values = parsed(path, parse_psi)
            if values:
                values = dict(values)  # the rates are added to it: the parse is shared
                psi.append((res, values))
                for total_key, counter, _ in _PSI_COUNTERS[res]:
                    total = values.get(total_key)
                    if total is not None:
                        current[counter] = total

        prev, elapsed = item.prev, (mono - item.prev_mono) / 1e9
        cpu_fields: dict[str, float] = {}
        if usage_ns is not None:
            cpu_fields["usage_seconds_total"] = usage_ns / 1e9
        if prev and elapsed > 0:
            # A counter absent before or lower than before (reset) gives no rate.
            before = prev.get("usage_ns")
            if usage_ns is not None and before is not None and usage_ns >= before:
                cpu_fields["usage_cores"] = item.cores = (usage_ns - before) / 1e9 / elapsed
            if periods is not None:
                periods_before, throttled_before = prev.get("periods"), prev.get("throttled")
                if (periods_before is not None and throttled_before is not None
                        and periods >= periods_before and throttled >= throttled_before):
                    ran, held = periods - periods_before, throttled - throttled_before
                    cpu_fields["periods"] = ran
                    cpu_fields["throttled_periods"] = held
                    cpu_fields["throttled_ratio"] = held / ran if ran else 0.0
                before = prev.get("throttled_ns")
                if before is not None and throttled_ns >= before:
                    cpu_fields["throttled_seconds"] = (throttled_ns - before) / 1e9
            for res, values in psi:
                for _, counter, rate_key in _PSI_COUNTERS[res]:
                    now_total, before = current.get(counter), prev.get(counter)
                    if now_total is not None and before is not None and now_total >= before:
                        values[rate_key] = (now_total - before) / 1e6 / elapsed * 100
        if item.limit_cores is not None:
            cpu_fields["limit_cores"] = item.limit_cores
        item.prev, item.prev_mono = current, mono
        if cpu_fields:
            out.append(Sample("container_cpu", item.tags, cpu_fields, now_ns))

        mem_fields = self._memory(item, mono)
        if mem_fields is None and item.mem_usage is not None:
            return False
        if mem_fields:
            out.append(Sample("container_memory", item.tags, mem_fields, now_ns))
        psi_tags = item.psi_tags
        for res, values in psi:
            out.append(Sample("container_pressure", psi_tags[res], values, now_ns))
        return True

    def _memory(self, item: _Tracked, mono: int) -> dict[str, float] | None:
        """Usage every tick; memory.stat every `memory_stat_every`, staggered over cgroups.

        memory.stat was 31% of the collection of 100 cgroups (the kernel sums it over the
        subtree; measured with and without it, alternated in one process), and what it adds
        moves slowly: the working set is the fresh usage less the inactive file cache of
        the last read, and rss and cache come with the ticks that read it (cAdvisor, which
        kubelet's working set comes from, reads it every 10 s)."""
        read = self._files.read
        if item.mem_usage is None:
            return {}
        usage = read(item.mem_usage)
        if usage is None:
            return None
        fields: dict[str, float] = {"usage_bytes": int(usage)}
        if item.mem_stat and mono >= item.mem_stat_due:
            stat = read(item.mem_stat)
            if stat:
                every = int(self.config.memory_stat_every * 1e9)
                # the first read sets a phase of its own, so the cgroups' reads spread
                item.mem_stat_due = mono + (every if item.inactive is not None else
                                            every * (zlib.crc32(item.path.encode()) % 997) // 997)
                keys = _MEM_KEYS_V2 if item.mem_v2 else _MEM_KEYS_V1
                item.inactive = _stat_value(stat, keys[0]) or 0
                for name, key in (("rss_bytes", keys[1]), ("cache_bytes", keys[2])):
                    value = _stat_value(stat, key)
                    if value is not None:
                        fields[name] = value
        if item.inactive is not None:
            fields["working_set_bytes"] = max(0, fields["usage_bytes"] - item.inactive)
        if item.limit_bytes is not None:
            fields["limit_bytes"] = item.limit_bytes
        return fields

    def cpu_rise(self, selectors: Iterable[Selector]) -> float:
        """How much more CPU (cores) the busiest of the cgroups `selectors` select uses since
        the last collection than over the interval before it: one file a cgroup (or a parent
        for all its children, _probes), nothing written, the next collection's rates unchanged.
        The agent's evaluation on arrival asks it while a rule is held back on those cgroups,
        to read them in full only when work has started there: on 100 cgroups the look takes
        0.11 ms of CPU back to back, the full read 5.8 ms (benchmarks/agent_tick.py). A
        selector matches the tags of the samples of its own measurement (a pressure selector
        those of each resource)."""
        chosen = tuple(s for s in selectors if s.measurement in self.measurements)
        if not chosen:
            return 0.0
        selected = self._selected.get(chosen)
        if selected is None:  # matched once per discovery: matching on each look took it
            # from 0.11 to 0.26 ms (benchmarks/agent_tick.py's 100 cgroups)
            selected = self._selected[chosen] = self._probes([
                rel for rel, item in self._tracked.items()
                if any(s.matches(item.tags) if s.measurement != "container_pressure" else
                       any(s.matches(tags) for tags in item.psi_tags.values())
                       for s in chosen)])
        parsed, read = self._files.parsed, self._files.read
        mono = time.monotonic_ns()
        rise = 0.0
        for parent, names, children in selected:
            # whole at discovery, and still: a cgroup made since, or a task moved into the
            # parent, would count in its sum (a stat and a read at each look)
            whole = parent is not None and self._only_children(parent, names, listed=False)
            for item in (parent,) if whole else children:
                before, elapsed = item.prev.get("usage_ns"), (mono - item.prev_mono) / 1e9
                if before is None or elapsed <= 0:
                    continue
                if item.cpu_usage_v2:
                    stat = parsed(item.cpu_stat, _kv) if item.cpu_stat else None
                    usec = stat.get(b"usage_usec") if stat else None
                    usage_ns = None if usec is None else usec * 1000
                else:
                    data = read(item.cpu_usage) if item.cpu_usage else None
                    usage_ns = int(data) if data else None
                if usage_ns is not None and usage_ns >= before:
                    rise = max(rise, (usage_ns - before) / 1e9 / elapsed - item.cores)
        return rise

    def _probes(self, rels: list[str]) -> list[_Probe]:
        """The cgroups whose counters `cpu_rise` reads for the selected `rels`: a tracked
        parent in place of its children where they are all of its children and it runs nothing
        of its own (the kubelet's besteffort QoS cgroup on a node whose BE pods are its
        BestEffort ones), else each cgroup. The parent's rise is the sum of its children's:
        one BE that starts shows whole, one file instead of a file a pod: 0.21 against 0.73 ms
        an arrival on 90 BE cgroups, the check at each look included
        (benchmarks/agent_arrival.py --grouped against the default layout). What the
        sum cannot show is one BE starting as much as another stops at the same moment: that
        start is seen at the next tick, as without evaluation on arrival. Decided once per
        discovery, and checked again at each look."""
        by_parent: dict[str, list[str]] = {}
        for rel in rels:
            by_parent.setdefault(rel.rpartition("/")[0], []).append(rel)
        probes: list[_Probe] = []
        for parent, children in by_parent.items():
            names = frozenset(rel.rpartition("/")[2] for rel in children)
            whole = self._tracked.get(parent) if parent and len(children) > 1 else None
            if whole is not None and not self._only_children(whole, names):
                whole = None
            probes.append((whole, names, [self._tracked[rel] for rel in children]))
        return probes

    def _only_children(self, parent: _Tracked, names: frozenset[str],
                       listed: bool = True) -> bool:
        """The cgroups under `parent`, in the hierarchy its CPU is read from, are `names`, and
        no task sits in it directly (cgroup v1 allows one; `tasks` lists threads too,
        `cgroup.procs` only the leaders). `listed` at discovery; at each look, as many
        cgroups as `names` by the link count (a kernfs directory's is two plus its
        subdirectories): listing them cost 0.25 ms a look on 90 (benchmarks/agent_arrival.py
        --grouped). A cgroup gone and another made between two discoveries keeps the count:
        the newcomer counts in the sum until the next discovery."""
        usage = parent.cpu_stat if parent.cpu_usage_v2 else parent.cpu_usage
        if not usage:
            return False
        directory = os.path.dirname(usage)
        try:
            if listed:
                with os.scandir(directory) as entries:
                    if {e.name for e in entries if e.is_dir(follow_symlinks=False)} != names:
                        return False
            elif os.stat(directory).st_nlink != len(names) + 2:
                return False
            # opened afresh: cgroup v1 serves a held file's list again for a second (its
            # pidlist cache), and a task moved in meanwhile went unseen
            for listing in ("tasks", "cgroup.threads", "cgroup.procs"):
                try:
                    with open(f"{directory}/{listing}", "rb") as tasks:
                        return not tasks.read(1)
                except FileNotFoundError:
                    continue
        except OSError:
            return False
        return False

    # -- inventory and health ------------------------------------------------------------

    def workloads(self, cls: str | None = None) -> list[dict[str, str]]:
        """Pod-level (or declared) cgroups known now, optionally of one class (LS or BE).

        Safe from other threads (the API, /metrics): it reads the snapshot the loop published.
        """
        return [dict(w) for w in self._workloads if cls is None or w["class"] == cls]

    def usage(self, pod_uid: str, resource: str) -> float | None:
        """A pod's current CPU (cores) or memory (working-set bytes); None when unknown.
        Safe from other threads: it reads the dict the last collection published."""
        return self._usage.get(pod_uid, {}).get(resource)

    def tracked_tags(self) -> dict[str, dict[str, str]]:
        """The tags of every tracked cgroup by path (relative to the hierarchy root), as of the
        last discovery: other collectors (eBPF, schedstat) attribute their samples with them so
        that every signal of a container carries the same pod, container and class tags.
        The dicts are shared: copy before changing them."""
        return self._tags_by_path

    def _name_late(self) -> None:
        """The pod cgroups tracked before their pod's metadata was known, tagged again now
        that it is: named, and classed by their label, at this collection rather than at the
        next walk (`rediscover`). Until then a BestEffort pod labelled LS counted as BE, a
        lever's target, and a lever's audit named a pod by its cgroup path."""
        for item in self._tracked.values():
            if item.tags.get("pod_uid") in self._unnamed and "pod" not in item.tags:
                self._refresh(item)
        self._publish()

    def _publish(self) -> None:
        self.generation += 1
        self._selected = {}  # cpu_rise's cgroups by selectors: tags and cgroups may change
        # pod uids of tracked cgroups without their pod's metadata (_name_late)
        self._unnamed = frozenset(item.tags["pod_uid"] for item in self._tracked.values()
                                  if "pod_uid" in item.tags and "pod" not in item.tags
                                  and not static_pod_uid(item.tags["pod_uid"]))  # never named
        self._tags_by_path = {rel: item.tags for rel, item in self._tracked.items()}
        self._workloads = tuple(
            {k: v for k, v in item.tags.items() if k != "node"}
            for item in list(self._tracked.values())
            if item.tags.get("level") in ("pod", "cgroup") and "class" in item.tags
        )
        self.tracked = len(self._tracked)

    def close(self) -> None:
        self._files.close_all()

    def status(self) -> ComponentStatus:
        details: dict[str, object] = {
            "cgroups": self.tracked,
            "open_files": len(self._files.fds),
            "vanished_total": self.vanished_total,
        }
        if self.layout is not None:
            details["mode"] = self.layout.mode
            details["root"] = str(self.layout.primary)
        return ComponentStatus("collector:cgroups", ok=not self._error, reason=self._error,
                               details=details)


def _psi_tags(tags: dict[str, str], psi: dict[str, str]) -> dict[str, dict[str, str]]:
    """Each PSI sample's tags, made when the cgroup's tags are, not on every tick."""
    return {res: {**tags, "resource": res} for res in psi}


def _v1_cpu_limit(quota: bytes | None, period: bytes | None) -> float | None:
    try:
        q, p = int(quota or b"-1"), int(period or b"0")
    except ValueError:
        return None
    return q / p if q > 0 and p > 0 else None


def _v2_cpu_limit(data: bytes | None) -> float | None:
    if not data:
        return None
    quota, _, period = data.decode().strip().partition(" ")
    if quota == "max" or not period:
        return None
    try:
        return int(quota) / int(period)
    except ValueError:
        return None


def _limit_bytes(data: bytes | None) -> int | None:
    if not data or data.strip() == b"max":
        return None
    try:
        value = int(data)
    except ValueError:
        return None
    return None if value >= _UNLIMITED_V1 else value


@hookimpl
def sloguard_collectors() -> list[type]:
    return [CgroupCollector]
