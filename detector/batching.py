"""How one signal of a rule is judged in a tick: by its batch (one numpy call for every series)
when the detector type offers one, else by one detector object per series.

A plan is built on the engine's thread, run on the detector worker under the rule's deadline
(plugin code, constructors included, runs only there), and kept only once the run succeeded.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sloguard.detector.api import Verdict
from sloguard.detector.registry import DetectorRegistry
from sloguard.detector.signals import SeriesKey, SignalKey


@dataclass
class Judged:
    """One signal's verdicts this tick: which series crossed, and each one's Verdict on demand."""

    inputs: dict[SeriesKey, float]
    crossed: set[SeriesKey]
    verdict: Callable[[SeriesKey], Verdict]
    # whether any series with a value is not back past its recover bound (None: no values);
    # a batch answers from its arrays, where a Verdict per series cost 5% of the tick
    still_there: Callable[[], bool | None] | None = None


@dataclass
class PerSeries:
    """One detector object per series (any plugin)."""

    key: SignalKey
    spec: Any
    inputs: dict[SeriesKey, float]
    known: dict[SeriesKey, Any]
    build: set[SeriesKey]

    def run(self, registry: DetectorRegistry, now_ns: int) -> tuple[dict, Judged, list[str]]:
        made = {s: registry.make(self.spec.detector, self.spec.params) for s in self.build}
        judged: dict[SeriesKey, Verdict] = {}
        failures = []
        for s, value in self.inputs.items():
            detector = made[s] if s in made else self.known[s][1]
            try:
                verdict = detector.update(value, now_ns)
            except Exception as exc:  # one bad series must not fail the others
                failures.append(f"{dict(s)}: {exc.__class__.__name__}: {exc}")
                verdict = Verdict(False, False, None, "detector error")
            if verdict.crossed and math.isnan(value):  # no data never fires
                verdict = Verdict(False, True, verdict.threshold, "no data")
            judged[s] = verdict
        crossed = {s for s, v in judged.items() if v.crossed}
        return made, Judged(self.inputs, crossed, judged.__getitem__), failures

    def without_series(self) -> tuple[dict, Judged, list[str]]:
        """What `run` gives when no series has a value or an alert: no detector is made or
        updated, so the engine need not hand it to the worker."""
        return {}, Judged({}, set(), {}.__getitem__), []

    def keep(self, engine: Any, made: dict) -> None:
        mine = engine._detectors.setdefault(self.key, {})
        for s, detector in made.items():
            mine[s] = (self.spec, detector)
        # every input has a detector now, so more detectors than inputs means series gone:
        # only then is this signal's map scanned (never the other rules')
        if len(mine) > len(self.inputs):
            for series in [s for s in mine if s not in self.inputs]:
                del mine[series]
                if not self.key.condition:
                    engine._history.pop((self.key.rule, series), None)


# Slots are compacted once fewer than 1 in COMPACT_BELOW is in use (hysteresis: a compaction
# leaves every slot in use, so the next needs three quarters of them gone, and its cost, a copy
# of the slots kept, is paid for by those departures), and only from COMPACT_FROM slots, under
# which the memory is small (3.2 MB at most in use for anomaly_channels with its defaults,
# prototype memory included; about 4 MB of address space with the room) and a rule's few
# series coming and going would move their state for nothing.
# And only after COMPACT_AFTER runs in a row with so few in use: series flapping each tick between
# many and few (a window shorter than their scrape interval) were compacted on each low tick and
# reallocated on each high one: 1.6x the tick of waiting (benchmarks/batch_growth.py --flapping).
COMPACT_BELOW = 4
COMPACT_FROM = 256
COMPACT_AFTER = 8


class Slots:
    """A batch detector's slot per series: freed when a series goes, reused by the next, and
    compacted (the live slots moved to the front, the others dropped) when most are free and
    the batch can (its optional `compact`): memory then falls after a peak of series, and a
    tick no longer sweeps the dead slots' NaN."""

    def __init__(self, spec: Any) -> None:
        self.spec = spec
        self.detector: Any = None
        self.index: dict[SeriesKey, int] = {}
        self.owner: list[SeriesKey | None] = []
        self.free: list[int] = []
        self.fresh: list[int] = []  # slots taken over since the batch last ran
        self.thin_runs = 0  # runs in a row with fewer than 1 in COMPACT_BELOW slots in use

    def arrange(self, inputs: dict[SeriesKey, float]) -> list[SeriesKey]:
        """Give new series a slot and free the slots of series gone; returns those gone."""
        new = inputs.keys() - self.index.keys()
        gone = []
        if len(self.index) > len(inputs) - len(new):
            gone = list(self.index.keys() - inputs.keys())
        for series in gone:
            slot = self.index.pop(series)
            self.owner[slot] = None
            self.free.append(slot)
        for series in new:
            if self.free:
                slot = self.free.pop()
            else:
                slot = len(self.owner)
                self.owner.append(None)
            self.index[series] = slot
            self.owner[slot] = series
            self.fresh.append(slot)
        return gone

    def thin(self) -> bool:
        """Whether fewer than 1 in COMPACT_BELOW slots (of COMPACT_FROM at least) has been in
        use for COMPACT_AFTER runs in a row, this one included (called once a run)."""
        size = len(self.owner)
        if size < COMPACT_FROM or len(self.index) * COMPACT_BELOW >= size:
            self.thin_runs = 0
            return False
        self.thin_runs += 1
        return self.thin_runs >= COMPACT_AFTER

    def compact(self, detector: Any) -> None:
        """Move the live slots to the front, in their order, when fewer than 1 in
        COMPACT_BELOW has been in use for COMPACT_AFTER runs and `detector` has `compact`
        (else the slots stay as they are: a batch without it never shrinks). Run after
        `reset` of the fresh slots, so every slot in use is one the detector has."""
        import numpy as np

        if not self.thin():
            return
        compact = getattr(detector, "compact", None)
        if compact is None:
            return
        keep = sorted(self.index.values())
        compact(np.asarray(keep, dtype=np.int64))
        moved = {old: new for new, old in enumerate(keep)}
        self.index = {series: moved[slot] for series, slot in self.index.items()}
        self.owner = [self.owner[slot] for slot in keep]
        self.free = []
        self.fresh = [moved[slot] for slot in self.fresh]
        self.thin_runs = 0


@dataclass
class Batch:
    """Every series of a signal through one batch detector call."""

    key: SignalKey
    spec: Any
    inputs: dict[SeriesKey, float]
    slots: Slots

    def run(self, registry: DetectorRegistry, now_ns: int) -> tuple[Any, Judged, list[str]]:
        import numpy as np

        slots = self.slots
        detector = slots.detector or registry.make_batch(self.spec.detector, self.spec.params)
        if slots.fresh:
            detector.reset(np.asarray(slots.fresh, dtype=np.int64))
        slots.compact(detector)
        values = np.full(len(slots.owner), np.nan)
        count = len(self.inputs)
        where = np.fromiter(map(slots.index.__getitem__, self.inputs), np.int64, count)
        values[where] = np.fromiter(self.inputs.values(), float, count)
        result = detector.update(values, now_ns)
        crossed = np.asarray(result.crossed, dtype=bool) & ~np.isnan(values)
        recovered = np.asarray(result.recovered, dtype=bool) | np.isnan(values)
        owner = slots.owner

        def verdict(series: SeriesKey) -> Verdict:
            slot = slots.index[series]
            threshold = result.threshold
            if threshold is not None and not isinstance(threshold, int | float):
                threshold = threshold[slot]
            threshold = None if threshold is None or math.isnan(threshold) else float(threshold)
            score = None if result.score is None else float(result.score[slot])
            note = result.note(slot) if result.note is not None else ""
            if math.isnan(values[slot]):
                note = "no data"
            return Verdict(bool(crossed[slot]), bool(recovered[slot]), threshold, note, score)

        hit = {owner[slot] for slot in np.flatnonzero(crossed).tolist()}
        hit.discard(None)

        def still_there() -> bool | None:
            if bool(np.isnan(values).all()):
                return None
            return bool((~recovered).any())  # NaN counts as recovered: only series with values

        return detector, Judged(self.inputs, hit, verdict, still_there), []

    def without_series(self) -> tuple[Any, Judged, list[str]]:
        """What `run` gives when no series has a value or an alert, without the detector's
        call: every slot would get NaN, which the batch contract says neither learns nor
        crosses (a batch not made yet is made when a series comes). A large batch whose
        series have all been gone for COMPACT_AFTER runs is dropped here, as no compaction can
        run without the worker: a new one is made when a series comes."""
        slots = self.slots
        if not slots.index and slots.thin():
            slots.owner, slots.free, slots.fresh = [], [], []
            slots.thin_runs = 0
            return None, Judged({}, set(), {}.__getitem__, lambda: None), []
        return slots.detector, Judged({}, set(), {}.__getitem__, lambda: None), []

    def keep(self, engine: Any, detector: Any) -> None:
        self.slots.detector = detector
        self.slots.fresh = []
        engine._batches[self.key] = self.slots
