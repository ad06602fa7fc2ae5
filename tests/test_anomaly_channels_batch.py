"""AnomalyChannelsBatch, the engine's batch form of anomaly_channels: slot for slot the verdicts
of one AnomalyChannels per series, over series that take its rare paths (the volatility's exact
recomputation, segment boundaries, prototypes matched, added and replaced, NaN, a slot taken
over by a new series, slots that appear later)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from support.batch_verdicts import assert_same_verdict

from sloguard.detector.registry import DetectorRegistry
from sloguard.plugins.anomaly_channels import AnomalyChannels, AnomalyChannelsBatch

REGISTRY = DetectorRegistry()
STEPS = 900


def _series(rng: np.random.Generator) -> np.ndarray:
    t = np.arange(STEPS)
    columns = []
    for _ in range(2):
        columns.append(10 + rng.normal(0, 1, STEPS) + np.where(t > rng.integers(200, 600), 6.0,
                                                               0.0))
        wave = 5 + 5 * np.sin(2 * np.pi * t / 60) + rng.normal(0, 0.05, STEPS)
        wave[500:560] = 5 + 0.3 * np.sin(2 * np.pi * t[500:560] / 3)  # oscillates in the band
        columns.append(wave)
        spikes = 50 + rng.normal(0, 2, STEPS)
        hits = rng.random(STEPS) < 0.01
        spikes[hits] += rng.uniform(30, 3000, hits.sum())  # a large change leaves the window
        columns.append(spikes)
        days = np.where((t % 96) < 40, 80.0, 20.0) + rng.normal(0, 1, STEPS)
        days[600:696] = np.where(((t[600:696] - 30) % 96) < 40, 80.0, 20.0)  # a late day
        columns.append(days)
        gappy = 5 + rng.normal(0, 0.5, STEPS)
        gappy[rng.random(STEPS) < 0.1] = np.nan
        columns.append(gappy)
        columns.append(np.full(STEPS, 3.0))  # flat: no range, no shape
        columns.append(np.round(rng.exponential(2, STEPS)))
    tiny = 1 + rng.normal(0, 1e-6, STEPS)
    tiny[[400, 401, 700]] = 1e12  # its rounding residue would outweigh the tiny changes after it
    columns.append(tiny)
    unknown = 20 + rng.normal(0, 1, STEPS)
    unknown[300:480:7] = 1e308  # an exporter's "unknown": two overflow a mean and the exact sum
    columns.append(unknown)
    return np.stack(columns, axis=1)


PARAMS = [
    {"warmup": 20, "bins": 5, "memory": 60, "volatility_span": 5, "segments": 3, "segment": 4,
     "prototypes": 3, "vigilance": 0.1},
    {"warmup": 30, "volatility_span": 8, "segments": 4, "segment": 6, "prototypes": 8,
     "direction": "up", "penalty": 0.1, "independence": 0.0, "learning_rate": 0.5},
    {"warmup": 40, "segments": 6, "segment": 8, "penalty": 0.0, "vigilance": 0.0},
    {},  # the defaults: a shape every 24 values from the 288th
]


@pytest.mark.parametrize("params", PARAMS)
@pytest.mark.filterwarnings("error::RuntimeWarning")  # the per-series floats overflow silently
def test_batch_gives_the_verdicts_of_one_detector_per_series(params):
    data = _series(np.random.default_rng(25))
    width = data.shape[1]
    later = width - 3
    batch = AnomalyChannelsBatch(params)
    scalars: list[AnomalyChannels] = [REGISTRY.make("anomaly_channels", params)
                                      for _ in range(width)]
    crossings = derived = 0
    for step in range(STEPS):
        if step in (300, 650):  # new series take over slots 1 and 6
            batch.reset([1, 6])
            scalars[1] = REGISTRY.make("anomaly_channels", params)
            scalars[6] = REGISTRY.make("anomaly_channels", params)
        size = later if step < 80 else width
        out = batch.update(data[step, :size], step)
        for i in range(size):
            verdict = scalars[i].update(float(data[step, i]), step)
            where = (params, step, i)
            assert_same_verdict(out, i, verdict, where)
            mine = scalars[i]
            if mine._volatility._previous is not None:  # the same volatility, bit for bit
                assert batch._sum[i] == mine._volatility._sum, where
            if mine._shape.distance is None:
                assert math.isnan(batch._distance[i]), where
            else:
                assert batch._distance[i] == mine._shape.distance, where
            derived += "unusual (score" in verdict.note
        crossings += int(out.crossed.sum())
    assert crossings > 0 and derived > 0  # the derived channels were chosen, and it fired
    # the window shapes went through the prototype memory
    assert any(len(kept[0]) for kept in batch._prototypes.values())


def test_prototypes_are_replaced_when_the_memory_is_full():
    params = PARAMS[0]
    data = _series(np.random.default_rng(25))
    batch = AnomalyChannelsBatch(params)
    scalars = [REGISTRY.make("anomaly_channels", params) for _ in range(data.shape[1])]
    for row in data:
        batch.update(row, 0)
        for detector, value in zip(scalars, row, strict=True):
            detector.update(float(value), 0)
    full = [slot for slot, kept in batch._prototypes.items() if len(kept[0]) == 3]
    assert full  # the memory of 3 filled, so shapes replaced the least used
    for slot in full:
        mine = scalars[slot]._shape
        assert np.array_equal(batch._prototypes[slot][0], mine._prototypes)
        assert np.array_equal(batch._prototypes[slot][1], mine._uses)


def test_memory_per_slot_is_bounded():
    batch = AnomalyChannelsBatch({})
    batch.update(np.zeros(10), 0)
    assert batch.bytes_per_slot() == 3 * 1866 + 8 * (30 + 12 + 9)


def test_registered_as_the_batch_form():
    assert REGISTRY.batch_type("anomaly_channels") is AnomalyChannelsBatch
    with pytest.raises(ValueError):
        REGISTRY.make_batch("anomaly_channels", {"segments": 1})


def test_the_prototype_memory_of_reset_slots_is_given_again():
    params = PARAMS[0]  # a shape every 4 values from the 12th
    data = _series(np.random.default_rng(25))
    batch = AnomalyChannelsBatch(params)
    for row in data[:100]:
        batch.update(row, 0)
    rows, held = batch._store.shape[:2]
    before = batch.prototype_bytes()
    assert held <= 3 and len(batch._prototypes) > 5
    for _ in range(3):  # every series replaced by a new one, three times
        batch.reset(np.arange(data.shape[1]))
        assert not batch._prototypes
        for row in data[100:200]:
            batch.update(row, 0)
    assert batch._store.shape[:2] == (rows, held) and batch.prototype_bytes() == before
