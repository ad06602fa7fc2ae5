"""What one source said about a service's requests over some interval: the unit of latency data.

Scrapes (histogram deltas, summary quantiles), pushes (raw latencies, histograms, precomputed
percentiles) all become a LatencyBatch, so the `app_latency` fields and the SLO windows are
computed one way whatever the source.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

from sloguard.collectors.histograms import (
    Buckets,
    exact_quantile,
    from_values,
    histogram_quantile,
    merge,
)
from sloguard.core.percentiles import percentile_name

QUANTILES = (0.5, 0.9, 0.99, 0.999)  # the p50 p90 p99 p999 fields of every app_latency sample


@dataclass(slots=True)
class LatencyBatch:
    buckets: Buckets | None = None  # the interval's observations, bounds in ms
    values: list[float] | None = None  # raw observations in ms
    quantiles: dict[float, float] = field(default_factory=dict)  # precomputed, ms
    requests: float = 0.0
    errors: float | None = None  # None: this source does not say
    seconds: float | None = None  # length of the interval, when known

    def quantile(self, q: float) -> float:
        """Milliseconds; NaN when this batch cannot tell."""
        if self.buckets is not None and self.buckets.total > 0:
            return histogram_quantile(q, self.buckets)
        if self.values:
            return exact_quantile(sorted(self.values), q)
        return self.quantiles.get(q, math.nan)

    def fields(self) -> dict[str, float]:
        """The app_latency fields: p50 p90 p99 p999 (ms), rate (req/s), requests and errors
        (counts in the interval), error_rate (errors / requests, 0..1)."""
        out: dict[str, float] = {}
        for q in sorted({*QUANTILES, *self.quantiles}):
            value = self.quantile(q)
            if math.isfinite(value):
                out[percentile_name(q)] = float(value)
        out["requests"] = float(self.requests)
        if self.seconds:
            out["rate"] = self.requests / self.seconds
        if self.errors is not None:
            out["errors"] = float(self.errors)
            if self.requests > 0:
                out["error_rate"] = min(1.0, self.errors / self.requests)
        return out


def combined_quantile(batches: Iterable[LatencyBatch], q: float) -> float:
    """The quantile over several batches (a window, several pods), in ms.

    Histograms and raw values merge into one distribution. Precomputed quantiles (summaries,
    pushed percentiles) cannot be merged with anything; the worst of them counts, so the
    estimate errs towards reporting a breach rather than hiding one.
    """
    batches = list(batches)
    histograms = [b.buckets for b in batches if b.buckets is not None and b.buckets.total > 0]
    values = [v for b in batches if b.values for v in b.values]
    estimates = []
    if histograms:
        merged = merge(histograms)
        if merged is not None and values:
            merged = merge([merged, from_values(values, merged.bounds)])
        if merged is not None:
            estimates.append(histogram_quantile(q, merged))
    elif values:
        estimates.append(exact_quantile(sorted(values), q))
    estimates.extend(b.quantiles[q] for b in batches
                     if b.buckets is None and not b.values and q in b.quantiles)
    estimates = [e for e in estimates if not math.isnan(e)]
    return max(estimates) if estimates else math.nan
