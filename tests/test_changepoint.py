"""The change-point detector on level shifts: when, by how much, and back."""

from __future__ import annotations

import math
import random

import pytest

from sloguard.detector.registry import DetectorRegistry

REGISTRY = DetectorRegistry()
S = 10**9


def _feed(detector, values, start=0):
    return [detector.update(float(v), (start + i) * S) for i, v in enumerate(values)]


def test_a_level_shift_fires_quickly_names_its_size_and_recovers():
    rng = random.Random(3)
    detector = REGISTRY.make("changepoint", {"window": 120, "min_relative": 0.5})
    quiet = _feed(detector, [10 + rng.gauss(0, 0.5) for _ in range(100)])
    assert not any(v.crossed for v in quiet)
    shifted = _feed(detector, [30 + rng.gauss(0, 0.5) for _ in range(40)], start=100)
    first = next(i for i, v in enumerate(shifted) if v.crossed)
    assert first < 10  # established once min_size (5) points sit at the new level
    note = shifted[first].note  # the change was at t = 100 s (00:01:40), from 10 to 30
    assert note.startswith("changed at 00:01:40 by +"), note
    assert float(note.split("by ")[1].split()[0]) == pytest.approx(20, abs=1)
    assert shifted[first].threshold == pytest.approx(10, abs=0.5)  # the level before
    assert all(v.crossed for v in shifted[first:])  # holds while the level stays up
    # when it began, for the incident chart: the first point of the new level, while it holds
    assert {v.change_ns for v in shifted[first:]} == {100 * S}
    back = _feed(detector, [10 + rng.gauss(0, 0.5) for _ in range(20)], start=140)
    recovered = next(i for i, v in enumerate(back) if v.recovered)
    assert recovered < 5 and not back[recovered].crossed


def test_direction_thresholds_and_no_data():
    rng = random.Random(5)
    base = [100 + rng.gauss(0, 1) for _ in range(60)]
    up_only = REGISTRY.make("changepoint", {"window": 80})
    _feed(up_only, base)
    assert not any(v.crossed for v in _feed(up_only, [60.0] * 15, start=60))  # a drop
    down = REGISTRY.make("changepoint", {"window": 80, "direction": "down"})
    _feed(down, base)
    assert any(v.crossed for v in _feed(down, [60.0] * 15, start=60))
    small = REGISTRY.make("changepoint", {"window": 80, "min_shift": 20})
    _feed(small, base)
    assert not any(v.crossed for v in _feed(small, [110.0] * 15, start=60))  # +10 < 20
    nan = small.update(math.nan, 0)
    assert not nan.crossed and nan.recovered


def test_binseg_method_and_bad_parameters():
    detector = REGISTRY.make("changepoint", {"method": "binseg", "window": 60})
    _feed(detector, [1.0, 1.2, 0.8] * 15)
    assert any(v.crossed for v in _feed(detector, [9.0] * 10, start=45))
    for bad in ({"window": 5}, {"window": 10_000}, {"method": "magic"}, {"direction": "x"},
                {"penalty": 0}, {"windw": 10}, {"min_size": "big"}, {"cost": "magic"},
                {"method": "kernel", "cost": "linear"}):
        with pytest.raises(ValueError):
            REGISTRY.make("changepoint", bad)


def test_a_ramp_is_no_change_and_a_jump_off_it_is_measured_from_where_it_got():
    rng = random.Random(0)
    ramp = [10 + 0.05 * i + rng.gauss(0, 0.3) for i in range(150)]
    detector = REGISTRY.make("changepoint", {"window": 120})  # the default: cost linear
    assert not any(v.crossed for v in _feed(detector, ramp))
    jump = _feed(detector, [15 + 0.05 * i + rng.gauss(0, 0.3) for i in range(150, 170)],
                 start=150)
    first = next(i for i, v in enumerate(jump) if v.crossed)
    assert first < 6
    note = jump[first].note  # at t = 150 s the ramp was at 17.5 and jumped by 5
    assert note.startswith("changed at 00:02:30 by +"), note
    assert float(note.split("by ")[1].split()[0]) == pytest.approx(5, abs=0.5)
    assert jump[first].threshold == pytest.approx(17.5, abs=0.3)
    # levels only (the default before #25): the ramp itself reads as a shift, and holds
    levels = REGISTRY.make("changepoint", {"window": 120, "cost": "constant"})
    assert sum(v.crossed for v in _feed(levels, ramp)) > 100


def _optimum(x, pen, min_size, linear):
    """Brute-force optimal partitioning (every split considered), the reference."""
    import numpy as np

    def cost(a, b):
        y, t = x[a:b], np.arange(a, b, dtype=float)
        fit = np.polyval(np.polyfit(t, y, 1), t) if linear else y.mean()
        return float(((y - fit) ** 2).sum())

    n = len(x)
    best, last = [0.0 - pen] + [math.inf] * n, [0] * (n + 1)
    for b in range(min_size, n + 1):
        for a in [0, *range(min_size, b - min_size + 1)]:
            total = best[a] + cost(a, b) + pen
            if total < best[b]:
                best[b], last[b] = total, a
    out, b = [], n
    while (b := last[b]) > 0:
        out.append(b)
    return out[::-1]


def test_the_exact_search_finds_the_optimum_and_binseg_the_planted_changes():
    import numpy as np

    from sloguard.plugins.changepoint import make_algorithm, penalty

    rng = np.random.default_rng(4)
    misses = 0
    for trial in range(40):
        n = int(rng.integers(12, 70))
        levels = np.repeat(rng.normal(0, 2, 4), n // 4 + 1)[:n]
        x = levels + np.arange(n) * rng.normal(0, 0.05) + rng.normal(0, 1, n)
        for cost in ("linear", "constant"):
            pen = penalty(x, float(rng.uniform(0.3, 3)), cost)
            optimum = _optimum(x, pen, 3, cost == "linear")
            for method in ("pelt", "grid"):  # grid: every point is a candidate up to 100
                found = make_algorithm(method, 3, cost).fit(x.reshape(-1, 1)).predict(pen=pen)
                assert found[:-1] == optimum, (trial, cost, method)
                assert found[-1] == n
            binseg = make_algorithm("binseg", 3, cost).fit(x.reshape(-1, 1)).predict(pen=pen)
            misses += binseg[:-1] != optimum
    assert misses > 0  # the greedy search does miss the optimum: the check above can fail
    # two dimensions segmented jointly: a jump in one, a small jump onto a slope in the other
    t = np.arange(300, dtype=float)
    signal = np.column_stack([np.where(t < 100, 0.0, 4.0),
                              np.where(t < 200, 0.0, 1.5 + (t - 200) / 20)])
    signal += rng.normal(0, 0.5, signal.shape)
    for method in ("grid", "binseg", "pelt"):
        breaks = make_algorithm(method, 5, "linear").fit(signal).predict(
            pen=penalty(signal, 3.0, "linear"))
        assert len(breaks) == 3 and abs(breaks[0] - 100) <= 2 and abs(breaks[1] - 200) <= 2, breaks


def test_the_grid_search_of_a_long_window_finds_changes_between_its_grid_points():
    """A 1,000-point window: candidates every 10th point, then each change moved to its best
    place within a step; the planted changes (333 and 667, off the grid) come out where the exact
    optimum puts them, not rounded to the grid."""
    import numpy as np

    from sloguard.plugins.changepoint import GRID_POINTS, make_algorithm, penalty

    t = np.arange(1000, dtype=float)
    assert len(t) > GRID_POINTS
    signal = (np.where(t < 333, 0.0, 3.0) + np.where(t < 667, 0.0, -2.0)
              + np.where(t < 871, 0.0, (t - 871) / 20))
    for seed in range(5):
        x = (signal + np.random.default_rng(seed).normal(0, 1, len(t))).reshape(-1, 1)
        pen = penalty(x, 3.0, "linear")
        grid = make_algorithm("grid", 5, "linear").fit(x).predict(pen=pen)
        assert grid == make_algorithm("pelt", 5, "linear").fit(x).predict(pen=pen), seed
        assert grid[0] == 333 and abs(grid[1] - 667) <= 1, (seed, grid)
    assert make_algorithm("grid", 5, "linear").fit(x[:9]).predict(pen=pen) == [9]  # < 2 x 5

def test_page_hinkley_streams_a_shift_and_recovers():
    rng = random.Random(0)
    detector = REGISTRY.make("page_hinkley", {"threshold": 50})
    quiet = _feed(detector, [rng.gauss(10, 1) for _ in range(200)])
    assert not any(v.crossed for v in quiet)
    shifted = _feed(detector, [rng.gauss(15, 1) for _ in range(40)], start=200)
    first = next(i for i, v in enumerate(shifted) if v.crossed)
    assert first < 15 and shifted[first].threshold == pytest.approx(10, abs=0.3)
    assert all(v.crossed for v in shifted[first + 5:])
    back = _feed(detector, [rng.gauss(10, 1) for _ in range(10)], start=240)
    assert any(v.recovered and not v.crossed for v in back)
    with pytest.raises(ValueError):
        REGISTRY.make("page_hinkley", {"threshold": -1})


def test_a_lone_outlier_is_not_a_change_and_a_step_is_measured_right():
    rng = random.Random(9)
    detector = REGISTRY.make("changepoint", {"window": 120})
    _feed(detector, [1 + rng.gauss(0, 0.1) for _ in range(100)])
    spike = _feed(detector, [10.0] + [1 + rng.gauss(0, 0.1) for _ in range(20)], start=100)
    assert not any(v.crossed for v in spike)
    step = REGISTRY.make("changepoint", {"window": 120})
    _feed(step, [1 + rng.gauss(0, 0.1) for _ in range(100)])
    up = _feed(step, [10 + rng.gauss(0, 0.1) for _ in range(20)], start=100)
    first = next(v for v in up if v.crossed)
    assert first.note.startswith("changed at 00:01:40 by +9"), first.note  # when, how much
    down = _feed(step, [4 + rng.gauss(0, 0.1) for _ in range(10)], start=120)
    assert any(v.recovered for v in down)  # two thirds of the way back: recovered


def test_page_hinkley_recovers_against_the_full_shift():
    rng = random.Random(4)
    detector = REGISTRY.make("page_hinkley", {"threshold": 20})
    _feed(detector, [1 + rng.gauss(0, 0.1) for _ in range(100)])
    up = _feed(detector, [10 + rng.gauss(0, 0.1) for _ in range(30)], start=100)
    assert any(v.crossed for v in up)
    down = _feed(detector, [4 + rng.gauss(0, 0.1) for _ in range(10)], start=130)
    assert any(v.recovered and not v.crossed for v in down)
