"""Subscription.reduce must give, for every orderless aggregate, exactly what copying the window
out and aggregating it gives (the engine used to do that, and `rate`, `first` still do): the
same series, the same floats to the bit, NaN where there is nothing to aggregate."""

from __future__ import annotations

import math
import random
import re
from collections import deque

import pytest

from sloguard.core.selectors import parse_selector
from sloguard.detector.recent import Subscription
from sloguard.detector.signals import aggregate, orderless

S = 10**9
SPECIAL = [math.nan, math.inf, -math.inf, 0.0, -0.0, 1e308, -1e308, 5e-324]


def _subscription(seed: int) -> Subscription:
    rng = random.Random(seed)
    sub = Subscription(parse_selector("m"), "f", 10 * S)
    for i in range(60):
        key = (("s", str(i)),)
        times = sorted(rng.randrange(0, 30) * S // 2 for _ in range(rng.randrange(1, 12)))
        if rng.random() < 0.2:  # late points: the series is out of time order
            rng.shuffle(times)
            sub.unordered.add(key)
        points = sub.series[key] = deque()
        for t in times:
            pick = rng.random()
            value = (rng.choice(SPECIAL) if pick < 0.15 else
                     float(rng.randrange(-3, 4)) if pick < 0.4 else rng.uniform(-5, 5))
            points.append((t, value))
    return sub


def _same(a: float, b: float) -> bool:
    return repr(a) == repr(b)  # NaN equals NaN, -0.0 is not 0.0


@pytest.mark.parametrize("how", ["max", "min", "mean", "sum", "count", "median", "p99", "p5",
                                 "p99.9"])
@pytest.mark.parametrize("seed", range(8))
def test_reduce_is_window_then_aggregate(how, seed):
    assert orderless(how)
    sub = _subscription(seed)
    compared = 0
    for start, end in ((5 * S, 12 * S + 1), (0, 30 * S), (14 * S, 15 * S), (40 * S, 50 * S)):
        for key, (times, values) in sub.window(start, end).items():
            one = Subscription(sub.selector, sub.field, sub.window_ns)
            one.series[key] = sub.series[key]
            one.unordered = sub.unordered & {key}
            try:
                expected = aggregate(times, values, how)
            except (ValueError, OverflowError) as exc:  # not since fsum's overflow and inf -
                # inf are caught (tests/test_aggregate_extremes.py); both ways alike if it did
                with pytest.raises(type(exc), match=re.escape(str(exc))):
                    one.reduce(start, end, how)
                continue
            got = one.reduce(start, end, how)
            assert list(got) == [key] and _same(got[key], expected), (key, got, expected)
            compared += 1
        inside = set(sub.window(start, end))
        assert {k for k in sub.series if k not in inside}.isdisjoint(
            Subscription.reduce(_without_failing(sub, start, end, how), start, end, how))
    assert compared > 100


def _without_failing(sub: Subscription, start: int, end: int, how: str) -> Subscription:
    """`sub` less the series whose aggregate raises, to check which series come out at all."""
    keep = Subscription(sub.selector, sub.field, sub.window_ns)
    keep.unordered = set(sub.unordered)
    for key, points in sub.series.items():
        window = sub.window(start, end).get(key)
        try:
            if window is not None:
                aggregate(*window, how)
        except (ValueError, OverflowError):
            continue
        keep.series[key] = points
    return keep


@pytest.mark.parametrize("how", ["max", "min", "mean", "p99"])
def test_a_window_of_nan_only_is_nan_and_an_empty_one_is_absent(how):
    sub = Subscription(parse_selector("m"), "f", 10 * S)
    sub.series[(("s", "nan"),)] = deque([(1 * S, math.nan), (2 * S, math.nan)])
    sub.series[(("s", "old"),)] = deque([(0, 1.0)])
    sub.series[(("s", "mixed"),)] = deque([(1 * S, math.nan), (2 * S, -0.0), (3 * S, 0.0)])
    got = sub.reduce(1 * S, 4 * S, how)
    assert set(got) == {(("s", "nan"),), (("s", "mixed"),)}
    assert math.isnan(got[(("s", "nan"),)])
    assert _same(got[(("s", "mixed"),)], aggregate((2 * S, 3 * S), (-0.0, 0.0), how))


def test_order_dependent_aggregates_are_not_reduced():
    assert not any(orderless(how) for how in ("rate", "first", "last"))
