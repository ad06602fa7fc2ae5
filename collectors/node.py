"""Node-wide resource counters read straight from procfs.

Interference between co-located pods shows up first as node-level contention: CPU saturation,
PSI stall time, disk queueing, retransmits. This collector turns the kernel's cumulative counters
into per-interval rates so the detector can compare them against per-pod symptoms.

It runs every second on every node, so it reads each procfs file exactly once per collect, parses
with plain string splitting (no regex in the hot path; the device/interface filters are evaluated
once per new name and cached) and keeps only the previous raw counters as state. One unreadable
file never takes the others down: each part records its own reason in `status().details`.

The network files (`net/dev`, `net/snmp`) describe the network namespace of the reading process:
run the agent with `hostNetwork: true` for them to describe the node.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable

from sloguard.collectors.base import CollectorBase, CollectorContext
from sloguard.collectors.hookspecs import hookimpl
from sloguard.core.health import ComponentStatus
from sloguard.core.samples import FieldValue, Sample

__all__ = ["DEFAULT_DISK_EXCLUDE", "DEFAULT_NET_EXCLUDE", "NodeCollector"]

# Whole disks and partitions are kept; pseudo devices that only add noise are skipped.
DEFAULT_DISK_EXCLUDE = r"^(loop|ram|sr|fd)\d*$"
DEFAULT_NET_EXCLUDE = r"^lo$"

_SECTOR_BYTES = 512  # diskstats counts 512-byte sectors whatever the device's sector size
_CPU_FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")
_MEMINFO_FIELDS = {
    "MemTotal": "total",
    "MemAvailable": "available",
    "MemFree": "free",
    "Cached": "cached",
    "Buffers": "buffers",
    "Dirty": "dirty",
    "Writeback": "writeback",
}
_PSI_RESOURCES = ("cpu", "memory", "io")
_PSI_KEYS = {
    (kind, key): f"{kind}_{key}" for kind in ("some", "full") for key in ("avg10", "avg60", "total")
}
# /proc/net/dev columns after "iface:", in the order the output fields are listed.
_NET_FIELDS = (
    ("rx_bytes_per_s", 0),
    ("tx_bytes_per_s", 8),
    ("rx_packets_per_s", 1),
    ("tx_packets_per_s", 9),
    ("rx_drops_per_s", 3),
    ("tx_drops_per_s", 11),
    ("rx_errors_per_s", 2),
    ("tx_errors_per_s", 10),
)
_NET_COLS = tuple(col for _, col in _NET_FIELDS)
_FILTER_CACHE_MAX = 4096  # names churn (veths, loop devices); bound the memo, do not leak

FilterSpec = str | re.Pattern[str] | None


def _read(path: str) -> str:
    # Unbuffered binary read + latin-1 decode is the cheapest way to slurp a procfs file whole;
    # latin-1 never fails, so an odd byte in a device name cannot break a collect.
    with open(path, "rb", buffering=0) as f:
        return f.read().decode("latin-1")


def _compile(spec: FilterSpec) -> re.Pattern[str] | None:
    if spec is None or isinstance(spec, re.Pattern):
        return spec
    return re.compile(spec)


class NodeCollector(CollectorBase):
    """Collector of node-wide CPU, load, memory, PSI, disk, network and TCP figures.

    `disk_filter` and `net_filter` are exclusion patterns (`re.search`): a device or interface
    whose name matches is not reported; `None` reports everything. `clock` measures the interval
    between collects; it is monotonic so that NTP steps cannot produce bogus rates, and injectable
    so tests can check exact rates. `now_ns` passed to `collect` is only the sample timestamp.
    """

    name = "node"

    @classmethod
    def create(cls, ctx: CollectorContext) -> NodeCollector | None:
        cfg = ctx.section(cls.name)
        return cls(ctx.node, proc_root=cfg.proc_root) if cfg.enabled else None

    def __init__(
        self,
        node: str,
        proc_root: str = "/proc",
        disk_filter: FilterSpec = DEFAULT_DISK_EXCLUDE,
        net_filter: FilterSpec = DEFAULT_NET_EXCLUDE,
        *,
        clock: Callable[[], int] = time.monotonic_ns,
    ) -> None:
        self.node = node
        self.proc_root = proc_root
        self._clock = clock
        self._disk_re = _compile(disk_filter)
        self._net_re = _compile(net_filter)
        self._disk_keep: dict[str, bool] = {}
        self._net_keep: dict[str, bool] = {}

        join = os.path.join
        self._p_stat = join(proc_root, "stat")
        self._p_loadavg = join(proc_root, "loadavg")
        self._p_meminfo = join(proc_root, "meminfo")
        self._p_pressure_dir = join(proc_root, "pressure")
        self._p_pressure = {r: join(proc_root, "pressure", r) for r in _PSI_RESOURCES}
        self._p_diskstats = join(proc_root, "diskstats")
        self._p_netdev = join(proc_root, "net", "dev")
        self._p_snmp = join(proc_root, "net", "snmp")

        # Previous raw counters, one entry per part; cleared when a part fails so that a rate is
        # never computed across a gap longer than the measured interval.
        self._prev_mono: int | None = None
        self._prev_cpu: list[int] | None = None
        self._prev_psi: dict[str, tuple[int, int | None]] = {}
        self._prev_disk: dict[str, list[int]] = {}
        self._prev_net: dict[str, list[int]] = {}
        self._prev_tcp: tuple[int, int, int] | None = None

        self._part_status: dict[str, str] = {}
        self._malformed: dict[str, int] = {"diskstats": 0, "net_dev": 0}
        self._last_collect_us: float | None = None

    # -- public API -------------------------------------------------------------------------

    def collect(self, now_ns: int) -> list[Sample]:
        """Read every part once; a failing part is recorded and skipped, never fatal."""
        start = time.perf_counter_ns()
        mono = self._clock()
        dt = 0.0 if self._prev_mono is None else (mono - self._prev_mono) / 1e9
        self._prev_mono = mono
        out: list[Sample] = []
        status = self._part_status

        procs: dict[str, FieldValue] = {}
        try:
            procs = self._stat(now_ns, dt, out)
            status["stat"] = "ok"
        except Exception as exc:  # one part must not break the others
            self._prev_cpu = None
            status["stat"] = self._why(self._p_stat, exc)

        try:
            self._load(now_ns, procs, out)
            status["loadavg"] = "ok"
        except Exception as exc:
            status["loadavg"] = self._why(self._p_loadavg, exc)
            if procs:
                out.append(self._sample("node_load", None, dict(procs), now_ns))

        try:
            self._meminfo(now_ns, out)
            status["meminfo"] = "ok"
        except Exception as exc:
            status["meminfo"] = self._why(self._p_meminfo, exc)

        status["pressure"] = self._pressure(now_ns, dt, out)

        try:
            self._diskstats(now_ns, dt, out)
            status["diskstats"] = "ok"
        except Exception as exc:
            self._prev_disk = {}
            status["diskstats"] = self._why(self._p_diskstats, exc)

        try:
            self._netdev(now_ns, dt, out)
            status["net_dev"] = "ok"
        except Exception as exc:
            self._prev_net = {}
            status["net_dev"] = self._why(self._p_netdev, exc)

        try:
            self._snmp(now_ns, dt, out)
            status["snmp"] = "ok"
        except Exception as exc:
            self._prev_tcp = None
            status["snmp"] = self._why(self._p_snmp, exc)

        self._last_collect_us = (time.perf_counter_ns() - start) / 1000
        return out

    def status(self) -> ComponentStatus:
        """Usable when /proc/stat is; every other part's problem is spelled out, not hidden."""
        parts = dict(self._part_status)
        if not parts:  # not collected yet: probe the one file that decides `ok`
            try:
                _read(self._p_stat)
                parts["stat"] = "ok"
            except OSError as exc:
                parts["stat"] = self._why(self._p_stat, exc)
        reason = "; ".join(f"{part}: {why}" for part, why in parts.items() if why != "ok")
        details: dict[str, object] = dict(parts)
        details["malformed_lines"] = dict(self._malformed)
        details["last_collect_us"] = self._last_collect_us
        return ComponentStatus(self.name, parts.get("stat") == "ok", reason, details)

    # -- parts ------------------------------------------------------------------------------

    def _sample(
        self,
        measurement: str,
        extra: tuple[str, str] | None,
        fields: dict[str, FieldValue],
        now_ns: int,
    ) -> Sample:
        tags = {"node": self.node}
        if extra is not None:
            tags[extra[0]] = extra[1]
        return Sample(measurement, tags, fields, now_ns)

    def _stat(self, now_ns: int, dt: float, out: list[Sample]) -> dict[str, FieldValue]:
        text = _read(self._p_stat)
        cpu: list[int] | None = None
        ncpu = 0
        procs: dict[str, FieldValue] = {}
        for line in text.split("\n"):
            if line.startswith("cpu"):
                if line.startswith("cpu "):
                    cpu = [int(v) for v in line.split()[1:9]]
                else:
                    ncpu += 1
            elif line.startswith("procs_"):
                key, _, value = line.partition(" ")
                if key in ("procs_running", "procs_blocked"):
                    procs[key] = float(value)
        if cpu is None or len(cpu) < 5:
            raise ValueError("no usable 'cpu' line")
        cpu.extend([0] * (8 - len(cpu)))  # kernels before 2.6.11 lack irq/softirq/steal

        prev, self._prev_cpu = self._prev_cpu, cpu
        if prev is None or dt <= 0:
            return procs
        deltas = [c - p for c, p in zip(cpu, prev, strict=True)]
        total = sum(d for d in deltas if d > 0)
        if total <= 0:  # less than one USER_HZ tick elapsed: no meaningful shares
            return procs
        scale = 100.0 / total
        shares = {name: d * scale for name, d in zip(_CPU_FIELDS, deltas, strict=True) if d >= 0}
        fields: dict[str, FieldValue] = dict(shares)
        if "idle" in shares and "iowait" in shares:
            fields["busy"] = 100.0 - shares["idle"] - shares["iowait"]
        fields["cpus"] = ncpu
        out.append(self._sample("node_cpu", None, fields, now_ns))
        return procs

    def _load(self, now_ns: int, procs: dict[str, FieldValue], out: list[Sample]) -> None:
        parts = _read(self._p_loadavg).split()
        fields: dict[str, FieldValue] = {
            "load1": float(parts[0]),
            "load5": float(parts[1]),
            "load15": float(parts[2]),
        }
        fields.update(procs)
        out.append(self._sample("node_load", None, fields, now_ns))

    def _meminfo(self, now_ns: int, out: list[Sample]) -> None:
        fields: dict[str, FieldValue] = {}
        swap_total = swap_free = None
        for line in _read(self._p_meminfo).split("\n"):
            key, _, rest = line.partition(":")
            name = _MEMINFO_FIELDS.get(key)
            if name is not None:
                fields[name] = float(rest.split()[0]) * 1024
            elif key == "SwapTotal":
                swap_total = int(rest.split()[0])
            elif key == "SwapFree":
                swap_free = int(rest.split()[0])
        if swap_total is not None and swap_free is not None:
            fields["swap_used"] = float(swap_total - swap_free) * 1024
        if not fields:
            raise ValueError("none of the expected keys present")
        out.append(self._sample("node_memory", None, fields, now_ns))

    def _pressure(self, now_ns: int, dt: float, out: list[Sample]) -> str:
        problems: list[str] = []
        for resource in _PSI_RESOURCES:
            path = self._p_pressure[resource]
            try:
                psi = self._psi_file(path)
            except FileNotFoundError as exc:
                self._prev_psi.pop(resource, None)
                if not os.path.isdir(self._p_pressure_dir):
                    self._prev_psi.clear()
                    return (
                        f"PSI unavailable: {self._p_pressure_dir} missing (kernel built without "
                        "CONFIG_PSI or booted with psi=0)"
                    )
                problems.append(f"{resource}: {self._why(path, exc)}")
                continue
            except Exception as exc:  # e.g. EOPNOTSUPP, garbled content
                self._prev_psi.pop(resource, None)
                problems.append(f"{resource}: {self._why(path, exc)}")
                continue

            fields: dict[str, FieldValue] = dict(psi)
            some = int(psi["some_total"])
            full = psi.get("full_total")  # no cpu "full" line before kernel 5.13
            prev = self._prev_psi.get(resource)
            self._prev_psi[resource] = (some, None if full is None else int(full))
            if prev is not None and dt > 0:
                per_pct = 1.0 / (dt * 1e4)  # microseconds stalled -> percent of wall time
                if some >= prev[0]:
                    fields["some_rate"] = (some - prev[0]) * per_pct
                if full is not None and prev[1] is not None and int(full) >= prev[1]:
                    fields["full_rate"] = (full - prev[1]) * per_pct
            out.append(self._sample("node_pressure", ("resource", resource), fields, now_ns))
        return "; ".join(problems) if problems else "ok"

    @staticmethod
    def _psi_file(path: str) -> dict[str, int | float]:
        fields: dict[str, int | float] = {}
        for line in _read(path).split("\n"):
            tokens = line.split()
            if not tokens:
                continue
            kind = tokens[0]
            for token in tokens[1:]:
                key, _, value = token.partition("=")
                name = _PSI_KEYS.get((kind, key))
                if name is not None:
                    fields[name] = int(value) if key == "total" else float(value)
        if "some_total" not in fields:
            raise ValueError("no 'some' line")
        return fields

    def _keep(self, name: str, pattern: re.Pattern[str] | None, memo: dict[str, bool]) -> bool:
        keep = memo.get(name)
        if keep is None:
            keep = pattern is None or pattern.search(name) is None
            if len(memo) >= _FILTER_CACHE_MAX:
                memo.clear()
            memo[name] = keep
        return keep

    def _diskstats(self, now_ns: int, dt: float, out: list[Sample]) -> None:
        text = _read(self._p_diskstats)
        prev_all, current = self._prev_disk, {}
        dt_ms = dt * 1000.0
        pattern, memo = self._disk_re, self._disk_keep
        for line in text.split("\n"):
            p = line.split()
            if len(p) < 14:  # iostats.rst: at least 11 counters after major, minor, name
                if p:
                    self._malformed["diskstats"] += 1
                continue
            name = p[2]
            if not self._keep(name, pattern, memo):
                continue
            try:
                # reads, sectors read, ms reading, writes, sectors written, ms writing,
                # ms doing io, weighted ms
                cur = [
                    int(p[3]),
                    int(p[5]),
                    int(p[6]),
                    int(p[7]),
                    int(p[9]),
                    int(p[10]),
                    int(p[12]),
                    int(p[13]),
                ]
            except ValueError:
                self._malformed["diskstats"] += 1
                continue
            current[name] = cur
            prev = prev_all.get(name)
            if prev is None or dt <= 0:
                continue
            rd, rsec, rms, wr, wsec, wms, ticks, weighted = (
                c - q for c, q in zip(cur, prev, strict=True)
            )
            fields: dict[str, FieldValue] = {}
            if rd >= 0:
                fields["reads_per_s"] = rd / dt
            if wr >= 0:
                fields["writes_per_s"] = wr / dt
            if rsec >= 0:
                fields["read_bytes_per_s"] = rsec * _SECTOR_BYTES / dt
            if wsec >= 0:
                fields["write_bytes_per_s"] = wsec * _SECTOR_BYTES / dt
            if rd >= 0 and rms >= 0:
                fields["read_latency_ms"] = rms / rd if rd else 0.0
            if wr >= 0 and wms >= 0:
                fields["write_latency_ms"] = wms / wr if wr else 0.0
            if ticks >= 0:
                # io_ticks is jiffy-granular, so it can overshoot a short interval slightly.
                fields["util_percent"] = min(100.0, ticks * 100.0 / dt_ms)
            if weighted >= 0:
                fields["queue_depth"] = weighted / dt_ms
            if fields:
                out.append(self._sample("node_disk", ("device", name), fields, now_ns))
        self._prev_disk = current

    def _netdev(self, now_ns: int, dt: float, out: list[Sample]) -> None:
        text = _read(self._p_netdev)
        prev_all, current = self._prev_net, {}
        pattern, memo = self._net_re, self._net_keep
        for line in text.split("\n")[2:]:  # two header lines
            name, sep, rest = line.partition(":")
            if not sep:
                if line.strip():
                    self._malformed["net_dev"] += 1
                continue
            name = name.strip()
            if not self._keep(name, pattern, memo):
                continue
            p = rest.split()
            try:
                cur = [int(p[i]) for i in _NET_COLS]
            except (ValueError, IndexError):
                self._malformed["net_dev"] += 1
                continue
            current[name] = cur
            prev = prev_all.get(name)
            if prev is None or dt <= 0:
                continue
            fields: dict[str, FieldValue] = {}
            for (field, _), c, q in zip(_NET_FIELDS, cur, prev, strict=True):
                if c >= q:
                    fields[field] = (c - q) / dt
            if fields:
                out.append(self._sample("node_net", ("interface", name), fields, now_ns))
        self._prev_net = current

    def _snmp(self, now_ns: int, dt: float, out: list[Sample]) -> None:
        header: list[str] | None = None
        values: list[str] | None = None
        for line in _read(self._p_snmp).split("\n"):
            if line.startswith("Tcp:"):
                if header is None:
                    header = line.split()
                else:
                    values = line.split()
                    break
        if header is None or values is None or len(values) != len(header):
            raise ValueError("no complete 'Tcp:' header/values pair")
        retrans = int(values[header.index("RetransSegs")])
        out_segs = int(values[header.index("OutSegs")])
        in_errs = int(values[header.index("InErrs")])
        fields: dict[str, FieldValue] = {
            "curr_estab": float(values[header.index("CurrEstab")]),
        }
        prev, self._prev_tcp = self._prev_tcp, (retrans, out_segs, in_errs)
        if prev is not None and dt > 0:
            d_retrans, d_out, d_errs = retrans - prev[0], out_segs - prev[1], in_errs - prev[2]
            if d_retrans >= 0:
                fields["retrans_segs_per_s"] = d_retrans / dt
            if d_out >= 0:
                fields["out_segs_per_s"] = d_out / dt
            if d_errs >= 0:
                fields["in_errs_per_s"] = d_errs / dt
            if d_retrans >= 0 and d_out >= 0:
                fields["retrans_percent"] = d_retrans * 100.0 / d_out if d_out else 0.0
        out.append(self._sample("node_tcp", None, fields, now_ns))

    @staticmethod
    def _why(path: str, exc: BaseException) -> str:
        if isinstance(exc, OSError):
            return f"cannot read {path}: {exc.strerror or exc}"
        return f"cannot parse {path}: {type(exc).__name__}: {exc}"


@hookimpl
def sloguard_collectors() -> list[type]:
    return [NodeCollector]
