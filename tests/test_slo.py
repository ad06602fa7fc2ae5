"""SLO detectors: latency against its target, and multiwindow error-budget burn."""

from __future__ import annotations

import math

import pytest

from sloguard.detector.registry import DetectorRegistry

REGISTRY = DetectorRegistry()


def test_latency_against_target_with_hysteresis():
    slo = REGISTRY.make("slo_latency", {"target": 2.0, "recover_ratio": 0.8})
    verdicts = [slo.update(v, 0) for v in (1.0, 2.5, 1.9, 1.5)]
    assert [(v.crossed, v.recovered) for v in verdicts] == [
        (False, True), (True, False), (False, False), (False, True)]
    assert verdicts[1].note == "1.25x the target"
    for bad in ({}, {"target": 0}, {"target": 1, "recover_ratio": 2}, {"target": 1, "x": 1}):
        with pytest.raises(ValueError):
            REGISTRY.make("slo_latency", bad)


def test_burn_rate_needs_both_windows_and_resets_on_the_short_one():
    burn = REGISTRY.make("burn_rate", {"objective": 0.99, "factor": 10, "long": 20, "short": 3})
    # budget 1%: a 20% error ratio burns 20x
    quiet = [burn.update(0.001, i) for i in range(20)]
    assert not any(v.crossed for v in quiet)
    spike = [burn.update(0.2, 20 + i) for i in range(12)]
    # the short window burns at once; the long one passes 10x after 10 of 20 evaluations at 20x
    first = next(i for i, v in enumerate(spike) if v.crossed)
    assert first == 9
    assert "burning" in spike[first].note
    after = [burn.update(0.0, 40 + i) for i in range(3)]
    assert not after[-1].crossed and after[-1].recovered  # the short window has cleared
    assert burn.update(math.nan, 50).recovered
    with pytest.raises(ValueError, match="error ratio"):
        burn.update(3.0, 51)
    with pytest.raises(ValueError):
        REGISTRY.make("burn_rate", {"objective": 1.5})


def test_burn_rate_on_values_already_relative_to_each_services_objective():
    # app_slo's burn_rate field: the error ratio over the allowed one, per service
    burn = REGISTRY.make("burn_rate", {"input": "burn", "factor": 10, "long": 4, "short": 2})
    assert [burn.update(v, i).crossed for i, v in enumerate((0.5, 0.5, 30.0, 30.0))] == [
        False, False, False, True]  # long: 15.25x; short: 30x
    assert burn.update(0.0, 5).recovered is False  # short window still at 15x
    assert burn.update(0.0, 6).recovered is True
    with pytest.raises(ValueError, match="burn rate >= 0"):
        burn.update(-1.0, 7)
    for bad in ({"input": "burn", "objective": 0.99}, {"input": "percent"}):
        with pytest.raises(ValueError):
            REGISTRY.make("burn_rate", bad)
