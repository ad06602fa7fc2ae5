"""What a scorer sees: one incident, the node's BE workloads, and store windows on one grid.

Every signal a scorer reads comes back on the same one-second grid as the LS signal, from
`lookback` before the incident's onset to now, one array per workload (keyed by its cgroup
tag), NaN where a second has no sample: scorers compare arrays, not timestamps. Reads go to the
store (embedded or InfluxDB) through `read_series` (store/__init__.py): per series, its times
and values, without pandas and without an object per point, which made one ranking over 100
cgroups 4x cheaper than reading samples (benchmarks/attribution_cost.py); each read is bounded
by the window and by the matchers (BE workloads only).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from sloguard.collectors.cgroup_ids import WORKLOAD_LEVELS as LEVELS
from sloguard.core.selectors import Matcher

STEP_NS = 10**9
WORKLOAD_LEVELS = "|".join(LEVELS)  # the levels a workload (a suspect) is tracked at
MAX_SERIES_PER_READ = 20_000  # a read past this is cut (and said so): attribution is bounded

# (tags, times ns, values) of one field, per series; (tags, sum, count) over a window
Series = tuple[dict[str, str], list[int], list[float]]
Totals = tuple[dict[str, str], float, int]


class Reader(Protocol):
    """Where a Case reads (`as_reader(store)`; tests give their own)."""

    def series(self, measurement: str, field_name: str, matchers: tuple[Matcher, ...],
               start_ns: int, end_ns: int) -> list[Series]: ...

    def totals(self, measurement: str, field_name: str, matchers: tuple[Matcher, ...],
               start_ns: int, end_ns: int) -> list[Totals]: ...


@dataclass
class Case:
    """One incident to attribute. `victims` are the LS workloads it concerns (tags, with
    `cgroup` when known); `candidates` the BE workloads on the node (tags with `cgroup`),
    the only workloads a suspect can be. `resource` is the rule's `resource` label (cpu, io,
    memory), "" when it has none. `ls` is the incident's own signal on the grid."""

    incident_id: str
    resource: str
    victims: list[dict[str, str]]
    candidates: list[dict[str, str]]
    onset_ns: int
    start_ns: int
    end_ns: int
    read: Reader
    ls: np.ndarray = field(default_factory=lambda: np.array([]))
    notes: list[str] = field(default_factory=list)  # reads that were cut, for /readyz

    @property
    def grid(self) -> np.ndarray:
        """The start of each second of the window (ns)."""
        return np.arange(self.start_ns, self.end_ns, STEP_NS, dtype=np.int64)

    @property
    def onset_index(self) -> int:
        """The grid index of the onset: `[:onset_index]` is before it, the rest is after."""
        return int(min(len(self.grid), max(0, (self.onset_ns - self.start_ns) // STEP_NS)))

    def series(self, measurement: str, field_name: str,
               matchers: tuple[Matcher, ...] = ()) -> list[Series]:
        """One field's raw series in the window (tags, times, values), bounded."""
        found = self.read.series(measurement, field_name, matchers, self.start_ns, self.end_ns)
        if len(found) > MAX_SERIES_PER_READ:
            self.notes.append(f"{measurement}: {len(found)} series, only "
                              f"{MAX_SERIES_PER_READ} read")
            found = found[:MAX_SERIES_PER_READ]
        return found

    def totals(self, measurement: str, field_name: str, start_ns: int, end_ns: int,
               matchers: tuple[Matcher, ...] = ()) -> list[Totals]:
        """One field's sum and count per series over [start_ns, end_ns) within the window."""
        start, end = max(start_ns, self.start_ns), min(end_ns, self.end_ns)
        if end <= start:
            return []
        return self.read.totals(measurement, field_name, matchers, start, end)

    def per_workload(self, measurement: str, field_name: str, by: str = "cgroup",
                     only: set[str] | None = None, **equals: str) -> dict[str, np.ndarray]:
        """One array per value of tag `by` (a BE workload's cgroup), on the grid: the mean of
        each series' points within a second, summed over the series sharing that tag (a
        cgroup's disks and operations). Only BE workloads at the pod or cgroup level, and
        only the candidates when `by` is `cgroup` (`only`: just these cgroups; a scorer that
        has ranked the candidates by `levels` reads the curves of the first few alone)."""
        matchers = self._be(only, equals)
        wanted = {c["cgroup"] for c in self.candidates} if by == "cgroup" else None
        return self.bucket(self.series(measurement, field_name, matchers), by, wanted)

    def levels(self, measurement: str, field_name: str, since_ns: int | None = None,
               only: set[str] | None = None, **equals: str) -> dict[str, float]:
        """Each BE candidate's level of one signal from `since_ns` (default: the window's
        start) to the end: the mean of each of its series, summed over its series. Read as
        sums in the store, one row a series: a ranking over 100 cgroups read 60,000 points
        when it took the curves of all of them (benchmarks/attribution_cost.py)."""
        wanted = {c["cgroup"] for c in self.candidates}
        out: dict[str, float] = {}
        for tags, total, count in self.totals(measurement, field_name,
                                              since_ns or self.start_ns, self.end_ns,
                                              self._be(only, equals)):
            key = tags.get("cgroup")
            if key in wanted and count:
                out[key] = out.get(key, 0.0) + total / count
        return out

    @staticmethod
    def _be(only: set[str] | None, equals: dict[str, str]) -> tuple[Matcher, ...]:
        matchers = [Matcher("class", "=", "BE"), Matcher("level", "=~", WORKLOAD_LEVELS),
                    *(Matcher(k, "=", v) for k, v in equals.items())]
        if only is not None:
            matchers.append(Matcher("cgroup", "=~", "|".join(map(re.escape, sorted(only)))
                                    or "(?!)"))
        return tuple(matchers)

    def bucket(self, found: list[Series], by: str,
               wanted: set[str] | None = None) -> dict[str, np.ndarray]:
        """`per_workload`'s binning, for series a scorer read itself."""
        out: dict[str, np.ndarray] = {}
        for tags, times, values in found:
            key = tags.get(by)
            if key is None or (wanted is not None and key not in wanted):
                continue
            mean = self.on_grid(times, values)
            if key in out:
                both = np.isnan(out[key]) & np.isnan(mean)
                out[key] = np.where(both, np.nan, np.nan_to_num(out[key]) + np.nan_to_num(mean))
            else:
                out[key] = mean
        return out

    def on_grid(self, times: list[int], values: list[float]) -> np.ndarray:
        """One series' mean per second of the grid; NaN where a second has no point."""
        n = len(self.grid)
        at = np.asarray(times, dtype=np.int64)
        v = np.asarray(values, dtype=float)
        slot = (at - self.start_ns) // STEP_NS
        keep = (slot >= 0) & (slot < n) & ~np.isnan(v)
        slot, v = slot[keep], v[keep]
        total = np.bincount(slot, weights=v, minlength=n)
        count = np.bincount(slot, minlength=n)
        with np.errstate(invalid="ignore", divide="ignore"):
            return total / count


def correlation(x: np.ndarray, y: np.ndarray, min_points: int = 8) -> float | None:
    """Pearson's correlation over the seconds both arrays have, each first clipped to its
    own 5th-95th percentiles; None with too few points, 0 when either is flat.

    Clipped, because a latency series is spiky: one 50 ms second would otherwise decide the
    coefficient. Not ranks: a BE job's usage is step-like (off, then flat out), and ranks
    shuffle the noise within each step, which caps Spearman's coefficient of two clean steps
    that coincide (30 of 90 seconds high) at ~0.67, where this gives ~0.95."""
    both = ~(np.isnan(x) | np.isnan(y))
    if int(both.sum()) < min_points:
        return None
    cx, cy = _clipped(x[both]), _clipped(y[both])
    sx, sy = cx.std(), cy.std()
    if sx == 0 or sy == 0:
        return 0.0
    return float(((cx - cx.mean()) * (cy - cy.mean())).mean() / (sx * sy))


def _clipped(values: np.ndarray) -> np.ndarray:
    low, high = np.percentile(values, [5, 95])
    return np.clip(values, low, high)


def mean_of(values: np.ndarray) -> float:
    """The mean over the seconds that have data; 0 when none do."""
    found = values[~np.isnan(values)]
    return float(found.mean()) if len(found) else 0.0


def as_reader(store: Any) -> Reader:
    """A store's windows as the Case reads them (store/__init__.py's `read_series` and
    `read_totals`)."""
    return _StoreReader(store)


class _StoreReader:
    def __init__(self, store: Any) -> None:
        self.store = store

    def series(self, measurement: str, field_name: str, matchers: tuple[Matcher, ...],
               start_ns: int, end_ns: int) -> list[Series]:
        from sloguard.store import WindowQuery, read_series

        return read_series(self.store, WindowQuery(measurement, start_ns, end_ns,
                                                   fields=(field_name,), matchers=matchers))

    def totals(self, measurement: str, field_name: str, matchers: tuple[Matcher, ...],
               start_ns: int, end_ns: int) -> list[Totals]:
        from sloguard.store import WindowQuery, read_totals

        return read_totals(self.store, WindowQuery(measurement, start_ns, end_ns,
                                                   fields=(field_name,), matchers=matchers))
