"""The store contract: write batches of samples, read windows back as pandas DataFrames.

Two implementations fit behind it: the embedded SQLite store (the default, so a node works with
nothing else installed) and InfluxDB. The window query is shaped after InfluxQL's
`SELECT agg(field) ... WHERE tags AND time >= a AND time < b GROUP BY time(every), *` so the
InfluxDB implementation is a direct translation, and results look the same from both.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from sloguard.core.health import ComponentStatus
from sloguard.core.percentiles import is_percentile
from sloguard.core.samples import Sample
from sloguard.core.selectors import Matcher

if TYPE_CHECKING:
    import pandas as pd

AGGREGATIONS = ("mean", "min", "max", "sum", "count", "first", "last", "median")
# How often the agent calls `Store.maintain`: the embedded store's retention deletes this much of
# every table at a time (benchmarks/store_write.py --retention measures a store at that pace).
MAINTAIN_EVERY_S = 60.0


def check_aggregation(agg: str) -> str:
    """Accept the named aggregations and percentiles (sloguard/core/percentiles.py: p50, p99,
    p999, p99.9)."""
    if agg in AGGREGATIONS:
        return agg
    if is_percentile(agg):
        return agg.strip().lower()  # one spelling in specs, queries and field names
    raise ValueError(f"unknown aggregation {agg!r} (use {', '.join(AGGREGATIONS)} or a "
                     "percentile: p50, p99, p999, p99.9)")


@dataclass(frozen=True, slots=True)
class WindowQuery:
    """Samples of one measurement in [start_ns, end_ns), optionally aggregated per `every_ns`.

    The result has a `time` column (datetime64[ns, UTC]; the bucket start when aggregated), one
    column per tag key of the matching series, and one column per requested field.
    """

    measurement: str
    start_ns: int
    end_ns: int
    fields: tuple[str, ...] | None = None
    matchers: tuple[Matcher, ...] = ()
    every_ns: int | None = None
    agg: str = "mean"


class StoreError(Exception):
    """A store could not take or give data; the caller keeps the samples and retries."""


class Store(Protocol):
    name: str

    def write(self, samples: list[Sample]) -> None:
        """Persist a batch atomically, or raise StoreError leaving nothing half-written."""
        ...

    def read(self, query: WindowQuery) -> pd.DataFrame: ...

    def read_samples(self, query: WindowQuery) -> list[Sample]:
        """The raw window as samples, oldest first (no aggregation), without pandas."""
        ...

    def maintain(self, now_ns: int) -> None:
        """Apply retention; the agent calls it every MAINTAIN_EVERY_S."""
        ...

    def status(self) -> ComponentStatus: ...

    def close(self) -> None: ...


Series = tuple[dict[str, str], list[int], list[float]]  # tags, times (ns), values


def read_series(store: Store, query: WindowQuery) -> list[Series]:
    """One field's raw window per series, as (tags, times, values) in time order, without
    pandas and without a Sample per point: what a reader that bins hundreds of series needs
    (detector/attribution/: one ranking over 100 cgroups read 70,000 points). The store's own
    `read_series` when it has one (the embedded store: its rows, grouped), else `read_samples`
    grouped by tags."""
    if len(query.fields or ()) != 1:
        raise ValueError("read_series reads one field")
    own = getattr(store, "read_series", None)
    if own is not None:
        return own(query)
    (name,) = query.fields or ()
    grouped: dict[tuple, Series] = {}
    for sample in store.read_samples(query):
        value = sample.fields.get(name)
        if not isinstance(value, int | float) or isinstance(value, bool):
            continue
        key = tuple(sorted(sample.tags.items()))
        found = grouped.get(key)
        if found is None:
            found = grouped[key] = (sample.tags, [], [])
        found[1].append(sample.time_ns)
        found[2].append(float(value))
    return list(grouped.values())


Totals = tuple[dict[str, str], float, int]  # tags, sum, count


def read_totals(store: Store, query: WindowQuery) -> list[Totals]:
    """One field's sum and count of points per series over the whole window: what a reader
    that needs a level, not a curve, asks (attribution's share of the BE tier: 100 rows where
    the series would be 12,000 points). The store's own `read_totals` when it has one (the
    embedded store sums in SQL), else `read_series` summed."""
    own = getattr(store, "read_totals", None)
    if own is not None:
        return own(query)
    return [(tags, float(sum(values)), len(values))
            for tags, _, values in read_series(store, query) if values]
