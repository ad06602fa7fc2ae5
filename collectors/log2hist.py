"""Percentiles from the log2 histograms the eBPF programs keep in the kernel.

A kernel-side histogram costs one map update per event and a fixed, small amount of memory
per cgroup, whatever the event rate; exact percentiles would need every value copied to user
space. The price is resolution: slot s >= 1 counts values in [2^(s-1), 2^s) nanoseconds (slot 1
also holds 0), so a percentile is only known to lie within a bucket whose bounds differ by a
factor of 2. `quantile` interpolates linearly inside that bucket (assuming values spread evenly
in it), which keeps the estimate inside the bucket: it is never off by more than a factor of 2
from the true value, and usually by much less. Means are exact: the programs also keep the sum.
"""

from __future__ import annotations

SLOTS = 64  # as HIST_SLOTS in collectors/bpf/common.h; the last slot holds everything above


def slot_bounds(slot: int) -> tuple[int, int]:
    """The [low, high) range in ns of values counted in `slot` (as bpf_log2l assigns them)."""
    if slot <= 0:
        return 0, 1
    if slot == 1:
        return 0, 2
    return 1 << (slot - 1), 1 << slot


class Log2Histogram:
    """Counts per log2 slot plus the exact sum; mergeable (a pod is the sum of its containers)."""

    __slots__ = ("counts", "sum_ns")

    def __init__(self) -> None:
        self.counts = [0] * SLOTS
        self.sum_ns = 0

    @classmethod
    def from_values(cls, values: tuple[int, ...]) -> Log2Histogram:
        """A drained `struct hist`: SLOTS counts, then the sum of the values in ns."""
        hist = cls()
        hist.counts = list(values[:SLOTS])
        hist.sum_ns = values[SLOTS]
        return hist

    def add(self, slot: int, count: int = 1) -> None:
        self.counts[min(max(slot, 0), SLOTS - 1)] += count

    def merge(self, other: Log2Histogram) -> None:
        counts = self.counts
        for slot, n in enumerate(other.counts):
            if n:
                counts[slot] += n
        self.sum_ns += other.sum_ns

    @property
    def count(self) -> int:
        return sum(self.counts)

    def quantile(self, q: float) -> float:
        """The q-quantile (0 < q <= 1) in ns, interpolated within its bucket; NaN when empty."""
        total = self.count
        if total == 0:
            return float("nan")
        rank = q * total
        seen = 0
        for slot, n in enumerate(self.counts):
            if not n:
                continue
            if seen + n >= rank:
                low, high = slot_bounds(slot)
                return low + (high - low) * max(0.0, rank - seen) / n
            seen += n
        low, high = slot_bounds(max(s for s, n in enumerate(self.counts) if n))
        return float(high)

    def mean(self) -> float:
        total = self.count
        return self.sum_ns / total if total else float("nan")

    def fields(self) -> dict[str, float]:
        """The sample fields every eBPF latency measurement carries (microseconds)."""
        count = self.count
        if not count:
            return {}
        return {
            "p50_us": self.quantile(0.50) / 1000,
            "p99_us": self.quantile(0.99) / 1000,
            "mean_us": self.sum_ns / count / 1000,
            "total_us": self.sum_ns / 1000,
            "count": count,
        }
