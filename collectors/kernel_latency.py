"""Kernel latency signals for the agent: eBPF when it works, procfs when it does not.

Rules must keep working on nodes where eBPF cannot run (no BCC, no privileges, a kernel that
rejects the programs): this collector loads the eBPF programs when the agent starts and, if the
run-queue histogram is not attached, runs the /proc/PID/schedstat collector in its place. One
component in /readyz says which of the two is feeding the rules, and why ("eBPF unavailable:
<reason>"); PSI and cpu.stat keep coming from the container collector either way.
"""

from __future__ import annotations

from sloguard.collectors.base import CollectorBase, CollectorContext
from sloguard.collectors.cgroup_ids import CgroupAttribution
from sloguard.collectors.cgroups import CgroupCollector
from sloguard.collectors.config import CollectorsConfig
from sloguard.collectors.ebpf import EbpfCollector
from sloguard.collectors.hookspecs import hookimpl
from sloguard.collectors.schedstat import SchedstatCollector
from sloguard.core.health import ComponentStatus
from sloguard.core.samples import Sample
from sloguard.core.selfmetrics import EbpfMetrics


def attribution_mode(key: str, cgroups: CgroupCollector) -> str:
    """Cgroup v2 ids identify a task's cgroup wherever a v2 hierarchy is mounted; on a pure v1
    host they say nothing, and the process id (mapped via /proc/PID/cgroup) is used instead."""
    if key != "auto":
        return key
    layout = cgroups.layout
    return "pid" if layout is not None and layout.mode == "v1" else "cgroup"


class KernelLatencyCollector(CollectorBase):
    name = "ebpf"

    @classmethod
    def create(cls, ctx: CollectorContext) -> KernelLatencyCollector | None:
        """eBPF latencies, or their procfs fallback, attributed to the cgroup collector's
        inventory when it runs."""
        cfg = ctx.settings.collectors
        if not (cfg.ebpf.enabled or cfg.ebpf.fallback):
            return None
        collector = cls(ctx.node, cfg, ctx.built.get("cgroups"))
        if ctx.metrics is not None:
            ctx.metrics.register(EbpfMetrics(collector.ebpf.attachment))
        return collector

    def __init__(self, node: str, config: CollectorsConfig,
                 cgroups: CgroupCollector | None) -> None:
        """`cgroups` is the agent's container collector (None when it is disabled: then a
        private one is kept for attribution only, and rediscovered here)."""
        polled = cgroups is not None
        if cgroups is None:
            cgroups = CgroupCollector(node, config.cgroups)
        self.node = node
        self.config = config.ebpf
        self.attribution = CgroupAttribution(
            cgroups, attribution_mode(self.config.key, cgroups), polled=polled)
        self.ebpf = EbpfCollector(node, self.config, self.attribution)
        self.fallback: SchedstatCollector | None = None
        self._owns_cgroups = not polled
        self._cgroups = cgroups

    def start(self) -> None:
        self.ebpf.start()
        if self.config.fallback and "runqueue" not in self.ebpf.attached:
            self.fallback = SchedstatCollector(
                self.node, self.attribution,
                reason="run-queue wait from /proc/PID/schedstat (measurement "
                       "container_runqueue) stands in for eBPF run-queue latency")

    def collect(self, now_ns: int) -> list[Sample]:
        samples = self.ebpf.collect(now_ns)
        if self.fallback is not None:
            samples.extend(self.fallback.collect(now_ns))
        return samples

    def status(self) -> ComponentStatus:
        status = self.ebpf.status()
        if self.fallback is not None:
            fallback = self.fallback.status()
            status.reason = "; ".join(r for r in (status.reason, f"fallback: {fallback.reason}")
                                      if r)
            status.details["fallback"] = {"collector": "schedstat", **fallback.details}
        return status

    def close(self) -> None:
        self.ebpf.close()
        if self._owns_cgroups:
            self._cgroups.close()


@hookimpl
def sloguard_collectors() -> list[type]:
    return [KernelLatencyCollector]
