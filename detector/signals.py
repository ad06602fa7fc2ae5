"""The names of what a rule judges: a series (its tags), a signal (the rule's own, or one of
its compound conditions), and the one value a series' window is reduced to each evaluation.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import NamedTuple

from sloguard.core.percentiles import parse_percentile
from sloguard.detector.rules import LoadedRule

SeriesKey = tuple[tuple[str, str], ...]


class SignalKey(NamedTuple):
    """Which signal of which rule: the rule's own (`condition` "") or one of its compound
    conditions ("and0", "unless1"). A tuple, not a suffix glued to the rule key: group names
    may contain `#`, and parsing `#andN` back off once missed `#unlessN`, so every detector
    under `unless:` was thrown away after each evaluation and never warmed up."""

    rule: str
    condition: str = ""


def signal_keys(rule: LoadedRule) -> list[SignalKey]:
    """The rule's own signal first, then one per compound condition, in the rule's order."""
    return [SignalKey(rule.key), *(SignalKey(rule.key, f"{kind}{index}")
                                   for kind, index, _ in rule.spec.conditions)]


def orderless(how: str) -> bool:
    """Whether the aggregate needs the window's values only, in any order (not their times nor
    their order of arrival): Subscription.reduce then computes it without copying the window."""
    return how not in ("rate", "first", "last")


def aggregate_values(values: Sequence[float], how: str) -> float:
    """`aggregate` for an orderless `how`, from the values alone (the same arithmetic)."""
    total = sum(values)
    if total != total:  # a NaN inside (or inf - inf): filter, rarely needed
        values = [v for v in values if not math.isnan(v)]
    if not values:
        return math.nan
    return _orderless(values, how)


def aggregate(times: Sequence[int], values: Sequence[float], how: str) -> float:
    """The rule's aggregate over one series' window; NaN when it cannot be computed."""
    if orderless(how):
        return aggregate_values(values, how)
    total = sum(values)
    if total != total:  # a NaN inside (or inf - inf): filter, rarely needed
        pairs = [(t, v) for t, v in zip(times, values, strict=True) if not math.isnan(v)]
        times, values = [t for t, _ in pairs], [v for _, v in pairs]
    if not values:
        return math.nan
    if how in ("first", "last"):
        return values[0] if how == "first" else values[-1]
    # rate: the per-second increase of a counter, across resets (as Prometheus does)
    if len(values) < 2 or times[-1] <= times[0]:
        return math.nan
    increase = 0.0
    for before, after in itertools.pairwise(values):
        increase += after - before if after >= before else after  # a drop is a reset
    return increase / ((times[-1] - times[0]) / 1e9)


_SCALE = 2.0**-64  # what brings any number of floats' partial sums within the float range


def _fsum(values: Sequence[float], divisor: int = 1) -> float:
    """math.fsum(values) / divisor, without fsum's exceptions: a pusher may send any finite
    float, and fsum raised on two points of 1e308 (intermediate overflow) or on inf and -inf,
    which failed the rule for every series it watches for as long as the points stayed in its
    window (tests/test_aggregate_extremes.py). The usual case is fsum's result to the bit;
    past the float range it is +-inf (as sum() gives), and inf - inf is NaN."""
    try:
        return math.fsum(values) / divisor
    except OverflowError:  # scaled down, the partial sums fit (a power of two: no rounding)
        return math.fsum(v * _SCALE for v in values) / divisor / _SCALE
    except ValueError:  # inf and -inf
        return math.nan


def _orderless(values: Sequence[float], how: str) -> float:
    if how == "mean":
        return _fsum(values, len(values))
    if how in ("min", "max"):
        return min(values) if how == "min" else max(values)
    if how == "sum":
        return _fsum(values)
    if how == "count":
        return float(len(values))
    q = 0.5 if how == "median" else parse_percentile(how)
    ordered = sorted(values)  # linear interpolation, as numpy's and pandas' default
    pos = (len(ordered) - 1) * q
    low = math.floor(pos)
    high = min(low + 1, len(ordered) - 1)
    below, above, t = ordered[low], ordered[high], pos - low
    if t == 0 or below == above:
        return below
    step = above - below
    if math.isfinite(step):
        return below + step * t
    # -1e308 and 1e308 (a pusher may send any finite float), or an infinity: the difference
    # overflows and inf * 0 gave NaN; weighted, the answer is what lies between them
    return below * (1 - t) + above * t
