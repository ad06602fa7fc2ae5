"""AnomalyLikelihoodBatch, the engine's batch form of anomaly_likelihood: slot for slot the
verdicts of one AnomalyLikelihood per series, over series chosen to take every rare path
(warm-up, pruning, width doubling, a row that moves, a slot spread too far for its row, the
median of direction up and down, NaN, a slot taken over by a new series, slots that appear
later)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from support.batch_verdicts import assert_same_verdict

from sloguard.detector.registry import DetectorRegistry
from sloguard.plugins import anomaly_likelihood
from sloguard.plugins.anomaly_likelihood import AnomalyLikelihood, AnomalyLikelihoodBatch

REGISTRY = DetectorRegistry()
STEPS = 700


def _series(rng: np.random.Generator) -> np.ndarray:
    """One column per kind of series, a few of each, all seeded."""
    t = np.arange(STEPS)
    columns = []
    for _ in range(3):
        noise = rng.normal(0, 1, STEPS)
        step = np.where(t > rng.integers(150, 500), rng.choice([-8.0, 8.0]), 0.0)
        columns.append(10 + noise + step)  # a level shift up or down
        spikes = 50 + rng.normal(0, 2, STEPS)
        hits = rng.random(STEPS) < 0.01
        spikes[hits] += rng.choice([-1, 1], hits.sum()) * rng.uniform(5, 3000, hits.sum())
        columns.append(spikes)  # spikes, some far enough to leave the row
        columns.append(np.cumsum(rng.normal(0, 1, STEPS)) * (1 + t / 40))  # ever wider: doubles
        columns.append(np.where((t // 40) % 2 == 0, 20.0, 80.0) + rng.normal(0, 1.5, STEPS))
        columns.append(np.round(rng.exponential(3, STEPS)))  # few distinct values, mostly 0..5
        columns.append(np.full(STEPS, float(rng.integers(0, 3))))  # flat (0 included)
        gappy = 5 + rng.normal(0, 0.5, STEPS) + np.where(t > 450, 3.0, 0.0)
        gappy[rng.random(STEPS) < 0.15] = np.nan
        gappy[300:340] = np.nan  # a long gap
        columns.append(gappy)
        counter = (t * t).astype(float)  # every value new, the range ever wider
        columns.append(counter)
    huge = 1 + rng.normal(0, 0.1, STEPS)
    huge[400] = 1e308  # near the float limit: the outermost bin
    huge[500] = -math.inf
    columns.append(huge)
    return np.stack(columns, axis=1)


PARAMS = [
    {"warmup": 20, "bins": 5, "memory": 50, "average": 4},
    {"warmup": 30, "bins": 5, "memory": 40, "average": 3, "direction": "up",
     "independence": 0.3, "novelty_span": 2.0},  # warm-up longer than a row
    {"warmup": 25, "bins": 8, "memory": 100, "radius": 2, "direction": "down",
     "resolution": 0.5, "recover_threshold": 0.0},
    {"warmup": 40, "bins": 12, "radius": 0, "independence": 1.0, "fading_factor": 0.05,
     "tolerance": 0.2, "threshold": 0.4, "recover_threshold": 0.2},
    {},  # the defaults
]


@pytest.mark.parametrize("params", PARAMS)
@pytest.mark.parametrize("block", [7, None])  # several blocks, some with gaps, or one
@pytest.mark.filterwarnings("error::RuntimeWarning")  # the per-series floats overflow silently
def test_batch_gives_the_verdicts_of_one_detector_per_series(params, block, monkeypatch):
    if block:
        monkeypatch.setattr(anomaly_likelihood, "_BLOCK", block)
    rng = np.random.default_rng(25)
    data = _series(rng)
    width = data.shape[1]
    later = width - 5  # the last slots appear only from step 60: the batch grows
    batch = AnomalyLikelihoodBatch(params)
    scalars: list[AnomalyLikelihood] = [REGISTRY.make("anomaly_likelihood", params)
                                        for _ in range(width)]
    moved_to_dict = crossings = 0
    for step in range(STEPS):
        if step in (250, 480):  # new series take over slots 2 and 9: they start from nothing
            batch.reset([2, 9])
            scalars[2] = REGISTRY.make("anomaly_likelihood", params)
            scalars[9] = REGISTRY.make("anomaly_likelihood", params)
        size = later if step < 60 else width
        out = batch.update(data[step, :size], step)
        assert len(out.crossed) == len(out.score) == batch._size
        for i in range(size):
            verdict = scalars[i].update(float(data[step, i]), step)
            where = (params, step, i)
            assert_same_verdict(out, i, verdict, where)
            assert batch.level[i] == pytest.approx(scalars[i].level, abs=1e-9), where
            if scalars[i].warm:  # the same bin width (doublings included) and recent range
                assert batch._width[i] == scalars[i]._width, where
                low, high = scalars[i].recent_range()
                assert batch._low[i] * batch._width[i] == low, where
                assert (batch._high[i] + 1) * batch._width[i] == high, where
        moved_to_dict = max(moved_to_dict, len(batch._sparse))
        crossings += int(out.crossed.sum())
    assert moved_to_dict > 0 and crossings > 0  # not only quiet, in-row series


def test_the_rare_paths_are_taken():
    """The side-by-side test covers them: the width doubles, rows move, slots go to a dict and
    come back, slots prune."""
    params = PARAMS[0]
    data = _series(np.random.default_rng(25))
    batch = AnomalyLikelihoodBatch(params)
    calls = {"_double": 0, "_move": 0, "_prune": 0, "_settle": 0, "_median": 0}
    for name in calls:
        original = getattr(batch, name)

        def counted(*args, name=name, original=original):
            calls[name] += 1
            return original(*args)

        setattr(batch, name, counted)
    for row in data:
        batch.update(row, 0)
    assert all(calls[name] > 0 for name in ("_double", "_move", "_prune", "_settle")), calls
    up = AnomalyLikelihoodBatch({**params, "direction": "up"})
    up_calls = []
    original = up._median
    up._median = lambda slots: up_calls.append(len(slots)) or original(slots)
    for row in data:
        up.update(row, 0)
    assert sum(up_calls) > 0


def test_memory_per_slot_is_bounded():
    batch = AnomalyLikelihoodBatch({})
    rng = np.random.default_rng(1)
    for _ in range(400):
        batch.update(rng.normal(0, 1, 100), 0)
    assert batch.bytes_per_slot() == 8 * (4 * 50 + 1 + 2 * 3 + 10) + 130
    own = AnomalyLikelihoodBatch({"warmup": 300, "bins": 10})
    own.update(np.zeros(10), 0)
    assert own.bytes_per_slot() == 8 * (41 + 6 + 10 + 300) + 130


def test_registered_as_the_batch_form():
    assert REGISTRY.batch_type("anomaly_likelihood") is AnomalyLikelihoodBatch
    with pytest.raises(ValueError):
        REGISTRY.make_batch("anomaly_likelihood", {"bins": 1})
