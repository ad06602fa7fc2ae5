"""The EWMA detector: river's exponentially weighted statistics, a z-score band, a warm-up,
and no learning while an alert is active."""

from __future__ import annotations

import math
import random

import pytest
from river import stats

from sloguard.detector.registry import DetectorRegistry

REGISTRY = DetectorRegistry()


def _feed(detector, values, start=0):
    return [detector.update(float(v), (start + i) * 10**9) for i, v in enumerate(values)]


def test_mean_and_variance_are_river_s_with_learning_frozen_during_alerts():
    detector = REGISTRY.make("ewma", {"fading_factor": 0.2, "warmup": 5, "band": 3})
    rng = random.Random(7)
    quiet = [50 + rng.gauss(0, 2) for _ in range(200)]
    mean, var = stats.EWMean(fading_factor=0.2), stats.EWVar(fading_factor=0.2)
    verdicts = _feed(detector, quiet)
    for value, verdict in zip(quiet, verdicts, strict=True):
        if not verdict.crossed:  # what the detector learned from, river learns from too
            mean.update(value)
            var.update(value)
    assert math.isclose(detector.mean.get(), mean.get())
    assert math.isclose(detector.var.get(), var.get())
    crossings = sum(v.crossed for v in verdicts)
    # z > 3 on Gaussian noise is rare, though a short memory (0.2) makes the variance estimate
    # noisy: measured 1.2-2.9% of points at 0.2, 0.35-1.2% at the default 0.1.
    assert crossings <= 10, crossings
    before = detector.mean.get()
    step = _feed(detector, [80.0] * 20, start=200)
    assert all(v.crossed for v in step)  # a step of +15 sigma stays crossed...
    assert detector.mean.get() == before  # ...because the incident is not learned as normal
    assert step[0].threshold == pytest.approx(before + 3 * math.sqrt(detector.var.get()))
    back = _feed(detector, [50.0] * 3, start=220)
    assert back[0].recovered and not back[0].crossed


def test_warmup_direction_and_no_data():
    up = REGISTRY.make("ewma", {"warmup": 10})
    verdicts = _feed(up, [1.0, 1.1, 0.9] * 3 + [1.0, 100.0])
    assert not any(v.crossed for v in verdicts[:10])  # warming up
    assert verdicts[10].crossed
    down = REGISTRY.make("ewma", {"warmup": 10, "direction": "down"})
    assert not _feed(down, [1.0, 1.1, 0.9] * 4 + [100.0])[-1].crossed
    assert _feed(down, [-100.0], start=20)[0].crossed
    both = REGISTRY.make("ewma", {"warmup": 10, "direction": "both"})
    assert _feed(both, [1.0, 1.1, 0.9] * 4 + [-100.0])[-1].crossed
    nan = up.update(math.nan, 0)
    assert not nan.crossed and nan.recovered


def test_flat_signal_and_min_std():
    flat = REGISTRY.make("ewma", {"warmup": 3})
    assert not any(v.crossed for v in _feed(flat, [5.0] * 10))
    assert flat.update(5.01, 11).crossed  # any change of a perfectly flat signal
    tolerant = REGISTRY.make("ewma", {"warmup": 3, "min_std": 1.0})
    _feed(tolerant, [5.0] * 10)
    assert not tolerant.update(5.5, 11).crossed and tolerant.update(9.0, 12).crossed


@pytest.mark.parametrize("params", [
    {"fading_factor": 0}, {"fading_factor": 1.5}, {"band": -1}, {"band": 2, "recover_band": 3},
    {"direction": "sideways"}, {"warmup": -1}, {"bandd": 3}, {"band": "wide"},
])
def test_bad_parameters_are_refused(params):
    with pytest.raises(ValueError):
        REGISTRY.make("ewma", params)


@pytest.mark.parametrize("params", [
    {"warmup": 10},
    {"warmup": 5, "direction": "both", "fading_factor": 0.3, "band": 2.5, "freeze": False},
    {"warmup": 0, "direction": "down", "min_std": 0.5},
])
def test_vectorised_batch_gives_the_same_numbers_as_the_river_detector(params):
    import numpy as np

    from sloguard.plugins.ewma import EWMABatch

    rng = np.random.default_rng(11)
    series, steps = 60, 250
    data = rng.normal(10, 1, (steps, series))
    data[150:, :20] += 8  # level shifts up
    data[150:, 20:40] -= 8  # and down
    data[rng.random((steps, series)) < 0.03] = np.nan  # missing values
    data[:, 59] = 4.0  # a perfectly flat series
    batch = EWMABatch(params)
    scalars = [REGISTRY.make("ewma", params) for _ in range(series)]
    for step in range(steps):
        if step == 200:  # a new series takes over slot 3: it starts from nothing, as a new
            batch.reset([3])  # per-series detector does
            scalars[3] = REGISTRY.make("ewma", params)
        out = batch.update(data[step], step)
        for i, detector in enumerate(scalars):
            verdict = detector.update(float(data[step, i]), step)
            assert (out.crossed[i], out.recovered[i]) == (verdict.crossed, verdict.recovered), (
                step, i)
            assert out.note(i) == verdict.note, (step, i)
            if verdict.threshold is None:
                assert np.isnan(out.threshold[i])
            else:
                assert out.threshold[i] == pytest.approx(verdict.threshold), (step, i)
    means = [d.mean.get() for d in scalars]
    variances = [d.var.get() for d in scalars]
    assert np.allclose(batch.mean, means)
    assert np.allclose(batch.square - batch.mean**2, variances, atol=1e-9)


def test_refractory_holds_the_score_not_the_alert():
    detector = REGISTRY.make("ewma", {"warmup": 10, "refractory": 3})
    _feed(detector, [1.0, 1.1, 0.9] * 4)
    spike = _feed(detector, [100.0] * 5, start=20)
    assert all(v.crossed for v in spike)  # alerting is unaffected
    assert [v.score > 0.9 for v in spike] == [True, False, False, False, True]
    with pytest.raises(ValueError):
        REGISTRY.make("ewma", {"refractory": -1})
