"""Issue #25, constant memory per series: a batch grows its room geometrically (a series count
rising by one each tick reallocates O(log n) times, not every tick) and gives memory back when
most of its series are gone (the engine's Slots compact the live slots to the front), with the
same verdicts, series for series, as one detector per series and as a batch never compacted."""

from __future__ import annotations

import copy
import math
import pickle
from types import SimpleNamespace

import numpy as np
import pytest
from support.batch_verdicts import assert_same_verdict

from sloguard.detector import batching
from sloguard.detector.batching import Batch, Slots
from sloguard.detector.registry import DetectorRegistry
from sloguard.plugins.anomaly_channels import AnomalyChannelsBatch
from sloguard.plugins.anomaly_likelihood import AnomalyLikelihoodBatch
from sloguard.plugins.ewma import EWMABatch

REGISTRY = DetectorRegistry()
LIKELIHOOD = {"warmup": 20, "bins": 5, "memory": 50, "average": 4}
CHANNELS = {"warmup": 20, "bins": 5, "memory": 60, "volatility_span": 5, "segments": 3,
            "segment": 4, "prototypes": 3, "vigilance": 0.1}
CASES = [
    ("anomaly_likelihood", LIKELIHOOD, lambda batch: batch._store),
    ("anomaly_channels", CHANNELS, lambda batch: batch.value._store),
]


def _data(rng: np.random.Generator, steps: int, width: int) -> np.ndarray:
    """Noisy levels, some shifted, with spikes (some far enough to leave a slot's row) and
    gaps; one row per step, one column per series."""
    data = rng.normal(10, 1, (steps, width)) + rng.choice([0.0, 20.0, 50.0], width)
    data[steps // 2:, ::5] += 8.0
    hits = rng.random((steps, width)) < 0.02
    data[hits] += rng.choice([-1, 1], hits.sum()) * rng.uniform(10, 3000, hits.sum())
    data[rng.random((steps, width)) < 0.05] = np.nan
    return data


@pytest.mark.parametrize(("kind", "params", "store"), CASES)
@pytest.mark.filterwarnings("error::RuntimeWarning")
def test_a_series_count_rising_by_one_each_tick_reallocates_log_n_times(kind, params, store):
    n, steps = 200, 260
    data = _data(np.random.default_rng(3), steps, n)
    batch = REGISTRY.make_batch(kind, params)
    scalars = []
    reallocated, before = 0, None
    for step in range(steps):
        size = min(step + 1, n)
        while len(scalars) < size:
            scalars.append(REGISTRY.make(kind, params))
        out = batch.update(data[step, :size], step)
        if before is not None and not np.may_share_memory(before, store(batch)):
            reallocated += 1
        before = store(batch)
        for i in range(size):
            assert_same_verdict(out, i, scalars[i].update(float(data[step, i]), step),
                                (kind, step, i))
    assert reallocated <= math.ceil(math.log(n, 1.5)) + 1, reallocated
    assert batch._size == n and batch.nbytes() <= 1.5 * n * batch.bytes_per_slot() + 1


def _series(i: int) -> tuple[tuple[str, str], ...]:
    return (("pod", f"p{i}"),)


def _present(step: int, i: int) -> bool:
    """300 series joining ten a tick, then all but one in ten gone from tick 60 (a few more
    at 90), and 50 new ones (300..349) from tick 120."""
    if i >= 300:
        return step >= 120
    if step < i // 10:
        return False
    if step >= 60 and i % 10 != 3:
        return False
    return not (step >= 90 and i in (13, 113, 213))


def _drive(kind: str, params: dict, data: np.ndarray, registry=REGISTRY) -> dict:
    """What the engine does with one signal's batch, tick by tick: the verdicts per series,
    the slots in use and the batch's memory."""
    spec = SimpleNamespace(detector=kind, params=params)
    slots = Slots(spec)
    engine = SimpleNamespace(_batches={})
    verdicts, sizes, memory, sparse = {}, [], [], []
    for step in range(len(data)):
        inputs = {_series(i): float(data[step, i]) for i in range(data.shape[1])
                  if _present(step, i)}
        slots.arrange(inputs)
        batch = Batch("key", spec, inputs, slots)
        detector, judged, failed = batch.run(registry, step) if inputs else batch.without_series()
        assert not failed
        batch.keep(engine, detector)
        for series in inputs:
            verdicts[step, series] = judged.verdict(series)
        sizes.append(len(slots.owner))
        nbytes = getattr(detector, "nbytes", None)
        memory.append(nbytes() if nbytes else None)
        sparse.append(len(getattr(getattr(detector, "value", detector), "_sparse", ())))
    return {"verdicts": verdicts, "sizes": sizes, "memory": memory, "sparse": sparse,
            "detector": slots.detector}


@pytest.mark.parametrize(("kind", "params"), [
    ("anomaly_likelihood", LIKELIHOOD), ("anomaly_channels", CHANNELS), ("ewma", {"warmup": 5}),
    ("threshold", {"above": 30}),
])
@pytest.mark.filterwarnings("error::RuntimeWarning")
def test_compaction_gives_memory_back_and_the_verdicts_of_a_batch_never_compacted(
        kind, params, monkeypatch):
    data = _data(np.random.default_rng(4), 180, 350)
    monkeypatch.setattr(batching, "COMPACT_FROM", 10**9)  # never compacted
    kept = _drive(kind, params, data)
    monkeypatch.setattr(batching, "COMPACT_FROM", 16)
    monkeypatch.setattr(batching, "COMPACT_AFTER", 1)  # the waiting: the flapping test below
    compacted = _drive(kind, params, data)
    assert compacted["verdicts"] == kept["verdicts"]  # every series, every tick, field for field
    assert any(verdict.crossed for (step, _), verdict in compacted["verdicts"].items()
               if step > 60)
    assert kept["sizes"][119] == 300 and kept["sizes"][-1] == 300  # freed slots reused
    assert compacted["sizes"][59] == 300 and compacted["sizes"][60] == 30
    assert compacted["sizes"][-1] == 27 + 50
    if kind.startswith("anomaly"):
        assert compacted["memory"][60] * 5 < kept["memory"][60]
        assert compacted["memory"][-1] * 2 < kept["memory"][-1]
        assert compacted["sparse"][60] > 0  # far-spread slots' dicts were moved too
    if kind == "anomaly_channels":
        assert len(compacted["detector"]._prototypes) == 77  # the prototype memory moved
        assert compacted["detector"]._store.shape[0] < kept["detector"]._store.shape[0] / 2


def test_a_batch_without_compact_keeps_its_slots(monkeypatch):
    """`compact` is optional in the batch contract: a batch without it never shrinks."""

    class Plain:
        def __init__(self, params):
            self.inner = EWMABatch(params)
            self.reset, self.update = self.inner.reset, self.inner.update

    registry = SimpleNamespace(make_batch=lambda kind, params: Plain(params))
    monkeypatch.setattr(batching, "COMPACT_FROM", 16)
    data = _data(np.random.default_rng(4), 180, 350)
    plain = _drive("ewma", {"warmup": 5}, data, registry)
    assert plain["sizes"][-1] == 300
    assert plain["verdicts"] == _drive("ewma", {"warmup": 5}, data)["verdicts"]


def test_a_large_batch_whose_series_are_all_gone_is_dropped(monkeypatch):
    monkeypatch.setattr(batching, "COMPACT_FROM", 16)
    spec = SimpleNamespace(detector="anomaly_likelihood", params=LIKELIHOOD)
    slots = Slots(spec)
    engine = SimpleNamespace(_batches={})
    for inputs in ({_series(i): 1.0 for i in range(40)}, *[{}] * batching.COMPACT_AFTER):
        assert isinstance(slots.detector, AnomalyLikelihoodBatch) or not slots.owner
        slots.arrange(inputs)
        batch = Batch("key", spec, inputs, slots)
        batch.keep(engine, batch.run(REGISTRY, 0)[0] if inputs else batch.without_series()[0])
    assert slots.detector is None and slots.owner == [] and slots.free == []


def test_compact_keeps_the_named_slots_in_order():
    batch = AnomalyChannelsBatch(CHANNELS)
    data = _data(np.random.default_rng(5), 60, 12)
    for row in data:
        batch.update(row, 0)
    keep = np.array([1, 4, 5, 11])
    levels = batch.value.level[keep].copy()
    shapes = {slot: [a.copy() for a in batch._prototypes[slot]] for slot in keep.tolist()
              if slot in batch._prototypes}
    batch.compact(keep)
    assert batch._size == batch.value._size == 4 and len(batch._changes[0]) == 4
    assert np.array_equal(batch.value.level, levels)
    for new, old in enumerate(keep.tolist()):
        if old in shapes:
            assert all(np.array_equal(a, b) for a, b in zip(batch._prototypes[new], shapes[old],
                                                             strict=True))


@pytest.mark.parametrize(("kind", "params", "store"), CASES)
def test_a_pickled_or_copied_batch_goes_on_as_the_original(kind, params, store):
    """A view and its buffer are copied apart: the copy keeps the slots in use as its
    buffers, so it grows and judges as the original does."""
    data = _data(np.random.default_rng(6), 140, 50)
    batch = REGISTRY.make_batch(kind, params)
    for step in range(74):  # copied between two growths: the copies learn, then grow
        batch.update(data[step, :20 + step // 6], step)
    assert batch._room > batch._size  # room to lose
    copies = [pickle.loads(pickle.dumps(batch)), copy.deepcopy(batch)]
    for step in range(74, 140):
        outs = [b.update(data[step, :20 + step // 6], step) for b in [batch, *copies]]
        for out in outs[1:]:
            for field in ("crossed", "recovered", "threshold", "score"):
                assert np.array_equal(getattr(out, field), getattr(outs[0], field),
                                      equal_nan=field in ("threshold", "score")), (step, field)
    assert np.may_share_memory(copies[0]._flat if kind == "anomaly_likelihood"
                               else copies[0].value._flat, store(copies[0]))


def test_series_flapping_between_many_and_few_are_not_compacted_every_other_tick():
    """A batch whose series flap each tick between many and under a quarter of them (a window
    shorter than most series' scrape interval, a collector up every other tick) was compacted
    on each low tick and reallocated on each high one (benchmarks/batch_growth.py --flapping).
    A compaction waits for COMPACT_AFTER low runs in a row, and a lasting fall still gets one."""

    class Counting(EWMABatch):
        compactions = 0

        def compact(self, keep):
            Counting.compactions += 1
            super().compact(keep)

    registry = SimpleNamespace(make_batch=lambda kind, params: Counting(params))
    spec = SimpleNamespace(detector="ewma", params={"warmup": 5})
    slots = Slots(spec)
    engine = SimpleNamespace(_batches={})
    every = [_series(i) for i in range(400)]
    few = every[::10]
    for step in range(60):
        inputs = dict.fromkeys(every if step % 2 == 0 else few, 1.0)
        slots.arrange(inputs)
        batch = Batch("key", spec, inputs, slots)
        batch.keep(engine, batch.run(registry, step)[0])
    assert Counting.compactions == 0 and len(slots.owner) == 400
    for step in range(60, 60 + batching.COMPACT_AFTER):
        inputs = dict.fromkeys(few, 1.0)
        slots.arrange(inputs)
        batch = Batch("key", spec, inputs, slots)
        batch.keep(engine, batch.run(registry, step)[0])
    assert Counting.compactions == 1 and len(slots.owner) == 40


@pytest.mark.parametrize("params", [LIKELIHOOD, {**LIKELIHOOD, "warmup": 30}])  # _first own
def test_a_pickled_batch_holds_its_arrays_once(params):
    """The views of the bin store (_counts, _flat, and _first when the warm-up shares the rows)
    were pickled as copies of the whole store."""
    batch = AnomalyLikelihoodBatch(params)
    data = _data(np.random.default_rng(7), 40, 2000)
    for step, row in enumerate(data):
        batch.update(row, step)
    arrays = batch.bytes_per_slot() * batch._size
    copied = pickle.loads(pickle.dumps(batch))
    assert len(pickle.dumps(batch)) < 1.1 * arrays
    assert np.may_share_memory(copied._flat, copied._store)
    assert np.may_share_memory(copied._counts, copied._store)
    assert copied._own_first or copied._first is copied._counts
