"""Per-service SLO signals: the objective's percentile and error ratio over the service's window,
next to the objective itself, so one generic rule can judge every service.

Rules have fixed parameters and see one value per series, but each service has its own target.
Dividing by the target makes the value comparable: `latency_ratio` 1.0 is "exactly at the
objective" for every service, and `burn_rate` 1.0 is "spending the error budget exactly as fast
as allowed" (the SRE workbook's burn rate). The shipped rules compare those against 1 and 14.4;
the raw figures (`latency_ms`, `target_ms`, `error_rate`, `error_target`) are in the same sample
for people reading it.

The percentile is computed over every request the service's targets on this node saw in the
window (histograms merged bucket by bucket), not averaged from per-scrape percentiles, which
would understate the tail.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from typing import Any

from sloguard.collectors.latency import LatencyBatch, combined_quantile
from sloguard.core.samples import Sample

MAX_VALUES = 200_000  # raw pushed latencies kept per service window; the oldest go first


class SloTracker:
    def __init__(self, slos: list[Any]) -> None:
        self.slos = list(slos)
        self._lock = threading.Lock()
        self._entries: list[deque[tuple[int, LatencyBatch]]] = [deque() for _ in self.slos]
        self._dirty: set[int] = set()

    def find(self, service: str, namespace: str = "", own_namespace: bool = False) -> Any | None:
        """The SLO of a service: one naming its namespace first, else one for any namespace.

        With `own_namespace` (data from a pod's annotations, which any tenant who can create a
        pod writes), only an SLO naming that namespace: a pod cannot feed another team's SLO,
        nor one for any namespace, by calling itself their service.
        """
        index = self._index(service, namespace, own_namespace)
        return None if index is None else self.slos[index]

    def _index(self, service: str, namespace: str, own_namespace: bool = False) -> int | None:
        fallback = None
        for i, slo in enumerate(self.slos):
            if slo.service != service:
                continue
            if slo.namespace and slo.namespace == namespace:
                return i
            if slo.namespace is None and fallback is None and not own_namespace:
                fallback = i
        return fallback

    def add(self, service: str, namespace: str, batch: LatencyBatch, time_ns: int,
            own_namespace: bool = False) -> None:
        """One batch of the service; the window is pruned against the agent's clock, never
        `time_ns`: a pushed batch stamped ahead must not empty the service's window."""
        index = self._index(service, namespace, own_namespace)
        if index is None:
            return
        with self._lock:
            entries = self._entries[index]
            entries.append((time_ns, batch))
            self._prune(index, time.time_ns())
            self._dirty.add(index)

    def _prune(self, index: int, now_ns: int) -> None:
        entries = self._entries[index]
        cutoff = now_ns - int(self.slos[index].window * 1e9)
        while entries and entries[0][0] < cutoff:
            entries.popleft()
        values = sum(len(b.values or ()) for _, b in entries)
        while values > MAX_VALUES and len(entries) > 1:
            values -= len(entries.popleft()[1].values or ())

    def samples(self, node: str, now_ns: int) -> list[Sample]:
        """An `app_slo` sample for each service that got data since the last call."""
        with self._lock:
            dirty, self._dirty = self._dirty, set()
            windows = {}
            for index in dirty:
                self._prune(index, now_ns)
                cutoff = now_ns - int(self.slos[index].window * 1e9)
                # pushed batches arrive out of order: one stamped before the window may sit
                # behind newer ones until they are pruned
                windows[index] = [b for t, b in self._entries[index] if t >= cutoff]
        out = []
        for index, batches in sorted(windows.items()):
            slo = self.slos[index]
            tags = {"node": node, "service": slo.service, "percentile": slo.percentile,
                    "class": "LS"}
            if slo.namespace:
                tags["namespace"] = slo.namespace
            out.append(Sample("app_slo", tags, slo_fields(slo, batches), now_ns))
        return out


def slo_fields(slo: Any, batches: list[LatencyBatch]) -> dict[str, float]:
    """The app_slo fields of one service's window (see docs/app-latency.md)."""
    requests = sum(b.requests for b in batches)
    fields: dict[str, float] = {"target_ms": float(slo.latency_ms), "requests": float(requests),
                                "window_s": float(slo.window)}
    latency = combined_quantile(batches, slo.quantile)
    if math.isfinite(latency):
        fields["latency_ms"] = float(latency)
        fields["latency_ratio"] = float(latency) / slo.latency_ms
    told = [b for b in batches if b.errors is not None]  # sources that tell errors apart
    if told:
        errors = float(sum(b.errors or 0.0 for b in told))
        counted = sum(b.requests for b in told)
        fields["errors"] = errors
        if counted > 0:
            ratio = min(1.0, errors / counted)
            fields["error_rate"] = ratio
            if slo.error_rate:
                fields["burn_rate"] = ratio / slo.error_rate
    if slo.error_rate:
        fields["error_target"] = float(slo.error_rate)
    return fields
