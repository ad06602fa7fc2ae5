"""A series' aggregate never raises on the values a pusher may send: /api/v1/write takes any
finite float, and `math.fsum` raised on two points of 1e308 (intermediate overflow) or on inf
and -inf. The exception failed the whole rule, so one pushed series blinded it for every other
series it watches (`mean` is the default aggregate) for as long as the points stayed in its
window. A percentile between -1e308 and 1e308, or of two infinities, was NaN (inf * 0). These
tests fail if mean or sum raise, if a percentile there is NaN, or if the normal case changes by
one bit."""

from __future__ import annotations

import math
import random
from collections import deque

import pytest

from sloguard.core.samples import Sample
from sloguard.core.selectors import parse_selector
from sloguard.detector.recent import Subscription
from sloguard.detector.signals import aggregate

S = 10**9
BIG = 1e308


@pytest.mark.parametrize(("values", "mean", "total"), [
    ([BIG, BIG], BIG, math.inf),
    ([-BIG, -BIG, -BIG], -BIG, -math.inf),
    ([BIG, BIG, -BIG], BIG / 3, BIG),  # the exact total is a float: it is the answer
    ([math.inf, -math.inf], math.nan, math.nan),
    ([math.inf, 1.0], math.inf, math.inf),
])
def test_mean_and_sum_of_extremes(values, mean, total):
    times = list(range(len(values)))
    for how, expected in (("mean", mean), ("sum", total)):
        got = aggregate(times, values, how)
        assert repr(got) == repr(expected) or math.isclose(got, expected, rel_tol=1e-15), (
            how, got, expected)
        sub = Subscription(parse_selector("m"), "f", 10 * S)
        sub.series[(("s", "x"),)] = deque((t * S, v) for t, v in zip(times, values, strict=True))
        assert repr(sub.reduce(0, 10 * S, how)) == repr({(("s", "x"),): got})


@pytest.mark.parametrize(("values", "how", "expected"), [
    ([-BIG, BIG], "median", 0.0),
    ([-BIG, BIG], "p90", 0.8 * BIG),
    ([math.inf, math.inf], "median", math.inf),
    ([1.0, math.inf], "p50", math.inf),
    ([-math.inf, 1.0, 2.0], "p99", 1.98),
])
def test_a_percentile_between_extremes_is_a_number_between_them(values, how, expected):
    got = aggregate(list(range(len(values))), values, how)
    assert got == expected or math.isclose(got, expected, rel_tol=1e-12), (how, got, expected)


@pytest.mark.parametrize("seed", range(20))
def test_ordinary_percentiles_are_interpolated_as_before(seed):
    rng = random.Random(seed)
    values = [rng.gauss(0, 10) for _ in range(rng.randrange(1, 40))]
    ordered = sorted(values)
    for how, q in (("median", 0.5), ("p90", 0.9), ("p99", 0.99), ("p10", 0.1)):
        pos = (len(ordered) - 1) * q
        low = math.floor(pos)
        high = min(low + 1, len(ordered) - 1)
        before = ordered[low] + (ordered[high] - ordered[low]) * (pos - low)
        assert repr(aggregate(list(range(len(values))), values, how)) == repr(before)


def test_ordinary_values_are_summed_as_fsum_does():
    rng = random.Random(7)
    for _ in range(200):
        values = [rng.uniform(-1e6, 1e6) * 10 ** rng.randrange(-20, 20)
                  for _ in range(rng.randrange(1, 30))]
        assert aggregate([0] * len(values), values, "sum") == math.fsum(values)
        assert aggregate([0] * len(values), values, "mean") == math.fsum(values) / len(values)


def test_a_pushed_extreme_does_not_fail_the_rule(tmp_path):
    from test_rules_engine import _Harness  # the engine over a rule file and a store

    rules = """\
groups:
  - name: ls
    rules:
      - alert: LSSlow
        expr: lat{class="LS"}
        field: p99
        aggregate: mean
        window: 3s
        params: {above: 10, recover_below: 5}
        for: 0s
        severity: critical
"""
    h = _Harness(tmp_path, rules)
    for p99 in (1.0, 1.0, 50.0):  # web-1 turns slow once the pushed points are in the window
        h.now = now = h.now + S
        h.windows.add([Sample("lat", {"class": "LS", "pod": "evil"}, {"p99": BIG}, now),
                       Sample("lat", {"class": "LS", "pod": "web-1"}, {"p99": p99}, now)])
        h.engine.evaluate(now)
    assert h.engine.status["ls/LSSlow"].error == ""
    assert "web-1" in {i.series.get("pod") for i in h.all()}
