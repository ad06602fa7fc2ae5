"""Latency percentiles from cumulative histograms, per interval, the way PromQL estimates them.

A service's cumulative histogram says nothing about the last ten seconds; the difference of two
scrapes does. The quantile is then interpolated inside the bucket that holds its rank, exactly as
PromQL's `histogram_quantile` does, so the figures agree with the dashboards SREs already have.

Estimation error: the result is only known to lie inside that bucket. Interpolation assumes the
observations are spread evenly in it, so the error is bounded by the bucket's width (a p99 in the
100-250 ms bucket is somewhere in 100-250 ms, whatever the number says). A rank that falls in the
+Inf bucket is reported as the largest finite bound: a lower bound of the truth. Services that
care about a latency objective should have a bucket boundary at it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

INF = math.inf


@dataclass(frozen=True, slots=True)
class Buckets:
    """A classic histogram: ascending upper bounds (the last is +Inf) and cumulative counts."""

    bounds: tuple[float, ...]
    counts: tuple[float, ...]

    @property
    def total(self) -> float:
        return self.counts[-1] if self.counts else 0.0

    def scaled(self, factor: float) -> Buckets:
        """The same counts with bounds in another unit (seconds -> milliseconds)."""
        return Buckets(tuple(b * factor for b in self.bounds), self.counts)


def check_buckets(bounds: Sequence[float], counts: Sequence[float]) -> str:
    """Why these buckets cannot be a histogram, or "" when they can."""
    if not bounds or bounds[-1] != INF:
        return "no +Inf bucket"
    if any(b >= a for a, b in zip(bounds[1:], bounds, strict=False)):
        return "bucket bounds are not ascending"
    for i in range(1, len(counts)):
        if counts[i] < counts[i - 1]:
            return (f"cumulative bucket counts go down (le={_fmt(bounds[i])}: {counts[i]:g} < "
                    f"le={_fmt(bounds[i - 1])}: {counts[i - 1]:g})")
    if any(c < 0 or math.isnan(c) for c in counts):
        return "negative or NaN bucket count"
    return ""


def histogram_quantile(q: float, buckets: Buckets) -> float:
    """PromQL's histogram_quantile over one histogram; NaN when it holds no observation."""
    if not buckets.bounds or math.isnan(q):
        return math.nan
    total = buckets.total
    if total <= 0:
        return math.nan
    if q <= 0:
        return -INF
    if q >= 1:
        return INF
    rank = q * total
    index = next(i for i, c in enumerate(buckets.counts) if c >= rank)
    upper = buckets.bounds[index]
    if upper == INF:  # the rank is past every finite bound: the largest one is a lower bound
        return buckets.bounds[-2] if len(buckets.bounds) > 1 else math.nan
    if index == 0:
        lower, below = (0.0 if upper > 0 else upper), 0.0
    else:
        lower, below = buckets.bounds[index - 1], buckets.counts[index - 1]
    inside = buckets.counts[index] - below
    if inside <= 0:
        return upper
    return lower + (upper - lower) * (rank - below) / inside


def delta(previous: Buckets | None, current: Buckets) -> tuple[Buckets, bool]:
    """The observations between two scrapes of one series, and whether the series was reset.

    A counter that went down (a restarted process) restarted from zero, so everything it holds
    now is new: the new values are the delta, as PromQL's `increase` treats resets. A change of
    bucket layout is a reset too (a redeploy with other buckets).
    """
    if previous is None or previous.bounds != current.bounds:
        return current, previous is not None
    if any(c < p for c, p in zip(current.counts, previous.counts, strict=True)):
        return current, True
    diff = tuple(c - p for c, p in zip(current.counts, previous.counts, strict=True))
    return Buckets(current.bounds, diff), False


def merge(histograms: Iterable[Buckets]) -> Buckets | None:
    """One histogram from several (label sets, pods of one service, intervals of a window).

    Layouts that differ are merged on the bounds they share (+Inf always is): coarser, but
    every count stays exact, where interpolating counts onto foreign bounds would invent them.
    """
    histograms = [h for h in histograms if h.bounds]
    if not histograms:
        return None
    shared = set(histograms[0].bounds)
    for h in histograms[1:]:
        shared &= set(h.bounds)
    bounds = tuple(sorted(shared))
    totals = dict.fromkeys(bounds, 0.0)
    for h in histograms:
        for bound, count in zip(h.bounds, h.counts, strict=True):
            if bound in totals:
                totals[bound] += count
    return Buckets(bounds, tuple(totals[b] for b in bounds))


def from_values(values: Iterable[float], bounds: Sequence[float]) -> Buckets:
    """Raw observations counted into these bounds (to merge pushed values with a histogram)."""
    import bisect

    per_bucket = [0.0] * len(bounds)
    for value in values:
        per_bucket[min(bisect.bisect_left(bounds, value), len(bounds) - 1)] += 1
    cumulative, running = [], 0.0
    for count in per_bucket:
        running += count
        cumulative.append(running)
    return Buckets(tuple(bounds), tuple(cumulative))


def from_counts(bounds: Sequence[float], counts: Sequence[float]) -> Buckets:
    """A histogram from per-bucket (not cumulative) counts: len(counts) == len(bounds) + 1, the
    last one counting observations above every bound."""
    cumulative, running = [], 0.0
    for count in counts:
        running += count
        cumulative.append(running)
    return Buckets((*bounds, INF), tuple(cumulative))


def exact_quantile(ordered: Sequence[float], q: float) -> float:
    """The quantile of raw observations, linearly interpolated (numpy's default method)."""
    if not ordered:
        return math.nan
    pos = (len(ordered) - 1) * q
    low = math.floor(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def _fmt(bound: float) -> str:
    return "+Inf" if bound == INF else f"{bound:g}"
