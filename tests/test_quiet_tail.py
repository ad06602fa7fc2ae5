"""The anomaly batches skip the tail of a quiet slot (one whose deviation is below the bound where
its tail would be red or its score not recovered) and compute its score only when read. This
holds them to what the tail of every slot every tick gives (`_defer` False), bit for bit:
verdicts, scores read slot by slot or whole, levels, notes, the red-zone state, over many seeds
of heavy-tailed, gappy series with values at the float limit, every direction, both tails; and
checks the bounds themselves on deviations around them."""

from __future__ import annotations

import math

import numpy as np
import pytest

from sloguard.plugins import anomaly_likelihood
from sloguard.plugins.anomaly_channels import AnomalyChannelsBatch
from sloguard.plugins.anomaly_likelihood import AnomalyLikelihoodBatch, _log_scores

STEPS = 260


def _series(rng: np.random.Generator, width: int) -> np.ndarray:
    t = np.arange(STEPS)[:, None]
    kind = np.arange(width) % 6
    data = 10 + rng.normal(0, 1, (STEPS, width))
    heavy = rng.standard_t(1.5, (STEPS, width))  # heavy tails: rare values come often
    data = np.where(kind == 1, 10 + heavy, data)
    data = np.where(kind == 2, np.round(rng.exponential(2, (STEPS, width))), data)
    shift = t > rng.integers(60, 220, width)
    data = np.where((kind == 3) & shift, data + rng.choice([-6.0, 6.0], width), data)
    data = np.where(kind == 4, 5 + 3 * np.sin(t / rng.uniform(3, 20, width)), data)
    data[rng.random((STEPS, width)) < 0.05] = np.nan  # gaps
    data[rng.random((STEPS, width)) < 0.002] = 1e308  # an exporter's "unknown"
    data[rng.random((STEPS, width)) < 0.001] = -math.inf
    return data


PARAMS = [
    {"warmup": 12, "bins": 6, "memory": 60, "average": 3},
    {"warmup": 15, "bins": 5, "memory": 40, "direction": "up", "independence": 0.3,
     "fading_factor": 0.02},  # the Student-t tail, its n saturating at 15 averages
    {"warmup": 10, "bins": 8, "direction": "down", "independence": 1.0,
     "recover_threshold": 0.05, "threshold": 0.3},
    {"warmup": 20, "bins": 5, "threshold": 1.0, "recover_threshold": 0.0, "average": 1},
    {"warmup": 12, "independence": 0.5, "fading_factor": 0.01, "novelty_span": 1.0,
     "recover_threshold": 0.6},
]


def _differences(params: dict, seed: int) -> tuple[list, int]:
    """Where a deferring batch and an eager one differ, and how many tails were deferred."""
    rng = np.random.default_rng(seed)
    data = _series(rng, 36)
    lazy, eager = AnomalyLikelihoodBatch(params), AnomalyLikelihoodBatch(params)
    eager._defer = False
    found, deferred = [], 0
    for step, row in enumerate(data):
        size = 30 if step < 40 else 36  # slots that join later
        a, b = lazy.update(row[:size], step), eager.update(row[:size], step)
        deferred += int((~np.isnan(lazy._pending[:size])).sum())
        # read slot by slot first (as the engine does), or whole
        scores = ([a.score[i] for i in range(size)] if step % 3
                  else np.asarray(a.score).tolist())
        same = (np.array_equal(a.crossed, b.crossed) and np.array_equal(a.recovered, b.recovered)
                and np.array_equal(a.threshold, b.threshold, equal_nan=True)
                and np.array_equal(scores, np.asarray(b.score), equal_nan=True)
                and np.array_equal(lazy._red, eager._red)
                and all(a.note(i) == b.note(i) for i in range(size)))
        if step % 7 == 0 or step == len(data) - 1:  # levels left unread carry over ticks
            same = same and np.array_equal(lazy.level, eager.level, equal_nan=True)
        if not same:
            found.append(step)
    return found, deferred


@pytest.mark.parametrize("params", PARAMS)
@pytest.mark.parametrize("seed", range(5))
@pytest.mark.filterwarnings("error::RuntimeWarning")
def test_deferred_tails_give_what_every_tail_gives(params, seed):
    found, deferred = _differences(params, seed)
    assert not found, found
    if params.get("recover_threshold") != 0.0:  # nothing is below a score of 0
        assert deferred > 0  # the shortcut was taken


def test_a_bound_too_high_is_noticed(monkeypatch):
    """The comparison above fails when quiet slots are not: a bound 1.5 deviations too high."""
    right = AnomalyLikelihoodBatch._bounds

    def too_high(self, n):
        calm, below, above = right(self, n)
        return calm + 1.5, below, above

    monkeypatch.setattr(AnomalyLikelihoodBatch, "_bounds", too_high)
    assert any(_differences(params, 0)[0] for params in PARAMS[:3])


@pytest.mark.parametrize("params", [*PARAMS[:3], {"warmup": 20}])  # else the defaults
@pytest.mark.filterwarnings("error::RuntimeWarning")
def test_deferred_channels_give_what_every_tail_gives(params):
    params = {**params, "volatility_span": 5, "segments": 3, "segment": 4, "prototypes": 4}
    data = _series(np.random.default_rng(3), 24)
    lazy, eager = AnomalyChannelsBatch(params), AnomalyChannelsBatch(params)
    for channel in (eager.value, eager.volatility, eager.shape):
        channel._defer = False
    deferred = 0
    for step, row in enumerate(data):
        a, b = lazy.update(row, step), eager.update(row, step)
        deferred += sum(int((~np.isnan(c._pending)).sum())
                        for c in (lazy.value, lazy.volatility, lazy.shape))
        assert np.array_equal(a.crossed, b.crossed), step
        assert np.array_equal(a.recovered, b.recovered), step
        for i in range(len(row)):
            assert a.score[i] == b.score[i], (step, i)
            assert a.note(i) == b.note(i), (step, i)
        assert np.array_equal(np.asarray(a.score), np.asarray(b.score)), step
    for mine, theirs in ((lazy.value, eager.value), (lazy.volatility, eager.volatility),
                         (lazy.shape, eager.shape)):
        assert np.array_equal(mine.level, theirs.level, equal_nan=True)
    assert deferred > 0


@pytest.mark.parametrize("params", [*PARAMS, {"direction": "up", "recover_threshold": 0.05},
                                    {"threshold": 0.01, "recover_threshold": 0.01}])
@pytest.mark.parametrize("n", [None, 1.0, 1.5, 2.0, 4.5, 30.0, 300.0, 1e6])
def test_the_bounds_hold_just_past_them(params, n):
    """Every deviation the bounds call quiet (or surely on one side of a score of 0) is so by its
    computed tail: on a grid over the reach and on deviations a few ulps to 1e-3 from each
    bound."""
    if n is not None and not params.get("independence"):
        params = {**params, "independence": 0.3}
    if n is None:
        params = {k: v for k, v in params.items() if k != "independence"}
    batch = AnomalyLikelihoodBatch(params)
    calm, below, above = batch._bounds(n)
    deviations = [np.linspace(-80, 80, 200_001)]
    for bound in (calm, below, above):
        if math.isfinite(bound):
            steps = np.concatenate([np.arange(-50, 51), np.geomspace(1e-12, 1e-3, 40),
                                    -np.geomspace(1e-12, 1e-3, 40)])
            deviations.append(bound + steps * np.where(np.abs(steps) >= 1, math.ulp(bound), 1))
    d = np.concatenate(deviations)
    tail = batch._tail_of(d, None if n is None else np.full(len(d), n))
    likely = _log_scores(tail)
    quiet = d < calm
    assert (likely[quiet] < batch.recover_threshold).all()
    assert (tail[quiet] > anomaly_likelihood._RED_TAIL).all()
    assert not (likely[d < below] > 0).any()
    assert (likely[d > above] > 0).all()
    if batch.recover_threshold > 0.01:  # a bound that is of use
        assert math.isfinite(calm) and calm > 0


@pytest.mark.parametrize("params", [PARAMS[1], PARAMS[4], {"independence": 0.3},
                                    {"independence": 1.0, "recover_threshold": 0.05,
                                     "direction": "down"}])
@pytest.mark.parametrize("largest", [1.5, 2.0, 4.5, 30.0, 300.0, 1e6])
def test_the_largest_n_bounds_hold_for_every_smaller_n(params, largest):
    """A block's bounds are those of its largest n: below the calm one and above the positive
    one, a slot with a smaller n (a heavier tail) is quiet and above a score of 0 as well."""
    batch = AnomalyLikelihoodBatch(params)
    calm, _, above = batch._bounds(largest)
    d = np.concatenate([np.linspace(-80, 80, 20_001),
                        calm - np.geomspace(1e-12, 1, 200), above + np.geomspace(1e-12, 1, 200)])
    for n in np.concatenate([np.geomspace(1.0, largest, 15), [largest * (1 - 1e-12)]]):
        tail = batch._tail_of(d, np.full(len(d), n))
        likely = _log_scores(tail)
        quiet = d < calm
        assert (likely[quiet] < batch.recover_threshold).all(), n
        assert (tail[quiet] > anomaly_likelihood._RED_TAIL).all(), n
        assert (likely[d > above] > 0).all(), n


@pytest.mark.parametrize("recover", [0.0, 0.01, 0.02, 0.03, 0.3])
@pytest.mark.parametrize("direction", ["both", "up"])
def test_a_mixed_n_block_defers_only_slots_quiet_by_their_own_n(recover, direction):
    """Below a deviation of 0 a smaller n (heavier tail) has the smaller tail, so the higher
    score: with a recover threshold under the score of a tail of 0.5 (0.0301) the calm bound of
    the largest n is negative, and a younger slot just under it is not recovered. Whatever
    `_quiet` defers in a block of mixed n must be calm (and on its side of 0) by its own n."""
    batch = AnomalyLikelihoodBatch({"independence": 1.0, "recover_threshold": recover,
                                    "direction": direction})
    grid = np.concatenate([np.linspace(-80, 80, 4001), np.linspace(-8, 1, 4001)])
    ns = np.array([1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 30.0, 300.0, 1000.0])
    deviation = np.repeat(grid, len(ns))
    n = np.tile(ns, len(grid))
    quiet, positive = batch._quiet(deviation, n, np.ones(len(n), dtype=bool), None)
    if quiet is None:
        return
    tail = batch._tail_of(deviation, n)
    likely = _log_scores(tail)
    assert (likely[quiet] < recover).all(), sorted(set(n[quiet & (likely >= recover)]))
    assert (tail[quiet] > anomaly_likelihood._RED_TAIL).all()
    if direction != "both":
        assert (likely[quiet & positive] > 0).all()
        assert not (likely[quiet & ~positive] > 0).any()
