"""The anomaly-likelihood detector (a built-in plugin): is the series somewhere it rarely goes,
more often than it usually is?

A z-score assumes one level and Gaussian noise; node metrics are rarely like that (CPU that idles
and saturates, bursty disk and network bytes, latency with a long tail, PSI that is mostly 0).
This detector makes no such assumption. It works in three steps, each in constant time per value
(bounded by the number of bins):

1. Rarity (the raw score). A histogram of the series' recent values, with exponential forgetting
   (`memory`), tells how much of the recent past was spent near the current value (within
   `radius` bins). Less than the share `rarity` gives a raw score towards 1 (1 = never seen
   here), common values give 0. The bin width is the range of the first `warmup` values divided
   by `bins` (at least `resolution`), and doubles when the series spreads over 4 x `bins`
   bins, so memory stays bounded.
2. Anomaly likelihood (Numenta's post-processing, Ahmad et al. 2017, "Unsupervised real-time
   anomaly detection for streaming data"). The mean of the last `average` raw scores is
   compared with the long-run mean and variance of that mean (river's EWMean and EWVar,
   `fading_factor`): the Gaussian tail probability says how unusual the current amount of
   rarity is for this series. A noisy series, whose raw score is often high, has to be much
   rarer than usual to count; a steady one fires on its first unusual values. The score is
   log10(1 / tail) / 10, so 0.5 is a tail of 1e-5 and 1.0 of 1e-10. As in Numenta's code, a
   tail that stays in the red zone (<= 1e-5) reports at most 0.3 after its first value: one
   event, one high score.
3. Range novelty. A value more than `tolerance` x the recent range outside that range scores
   1.0 at once, without waiting for the average to fill (Numenta's "spatial anomaly"), or,
   with `novelty_span`, a score that rises from `threshold` just past the margin to 1.0, so a
   value barely past a new record ranks below a far one.

It fires (crossed) when the likelihood score (before the red-zone damping) or range novelty
reaches `threshold`, and recovers below `recover_threshold`. With `independence` > 0 the tail is
a Student-t one with that share of the averaged raw scores (at most 1 / `fading_factor`) as
samples: a young series, whose long-run mean and variance are estimated from few values, needs
a larger deviation for the same score. It is a novelty alarm: when a new
level persists, it becomes common after about `rarity` x `memory` values and the alert recovers.
NaN (and an infinity) is missing data: not learnt, never fires. The state is bounded: at most
4 x `bins` + 1 bins, `average` raw scores and a few numbers per series.

Parameters (rule `params`):
  threshold          score that counts as crossed (default 0.6: tail 1e-6)
  recover_threshold  score under which it counts as recovered (default 0.3: tail 1e-3)
  direction          up, down or both (default both): up fires only above the recent median
  warmup             values that set the bin width; it may fire after 2 x warmup (default 150)
  bins               bins over the warm-up range (default 50)
  resolution         smallest bin width, in the signal's unit (default 0: no floor)
  radius             bins either side counted as "near" (default 1)
  rarity             share of the recent past under which a value is rare (default 0.01)
  memory             values the histogram remembers, 1 / (1 - decay) (default 2000)
  average            raw scores averaged before the likelihood (default 10, as Numenta's)
  fading_factor      weight of the newest average in its long-run mean and variance
                     (default 0.001)
  tolerance          range novelty margin, share of the recent range (default 0.05, as Numenta's)
  novelty_span       share of the recent range over which range novelty rises from threshold to
                     1.0 (default 0: 1.0 at once)
  independence       share of the averaged raw scores counted as independent samples of the
                     Student-t tail (default 0: the Gaussian tail)
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any

from sloguard.detector.api import BatchVerdicts, Verdict, hookimpl, reject_unknown

PARAMS = {"threshold", "recover_threshold", "direction", "warmup", "bins", "resolution",
           "radius", "rarity", "memory", "average", "fading_factor", "tolerance",
           "novelty_span", "independence"}
_LOG_EPSILON = math.log(1e-10)  # score 1.0: a tail probability of 1e-10
_RED_TAIL, _YELLOW_TAIL = 1e-5, 1e-3  # Numenta's red and yellow zones
_MIN_MEAN, _MIN_VAR = 0.03, 0.0003  # Numenta's floors of the raw scores' statistics
_PRUNE = 0.01  # a bin whose weight decayed under 1% of one fresh value is forgotten
_EXACT_KEY = 2.0**52  # bin numbers a float still counts one by one (the batch's dense bins)
# Slots the batch judges at a time: a float temporary (128,000 bytes) stays under glibc's 128 KiB
# mmap threshold, so it is reused from the heap rather than faulted in page by page. The batch of
# benchmarks/detector_throughput.py over 100,000 series, blocks alternated tick by tick in one
# run: median 13.5 ms a tick at 16,000, 14.1 at 8,192, 17.6 at 4,096, 22.1 at 100,000 slots.
_BLOCK = 16_000
# A quiet slot's tail is skipped only this far (a share of the deviation, at least 1 x this)
# below the bound found on the computed tail; over +-_REACH deviations.
_MARGIN, _REACH = 0.01, 64.0


class AnomalyLikelihood:
    name = "anomaly_likelihood"

    def __init__(self, params: dict[str, Any]) -> None:
        reject_unknown(params, PARAMS, self.name)
        try:
            self.threshold = float(params.get("threshold", 0.6))
            self.recover_threshold = float(params.get("recover_threshold", 0.3))
            self.warmup = whole_number(params.get("warmup", 150))
            self.bins = whole_number(params.get("bins", 50))
            self.resolution = float(params.get("resolution", 0.0))
            self.radius = whole_number(params.get("radius", 1))
            self.rarity = float(params.get("rarity", 0.01))
            self.memory = whole_number(params.get("memory", 2000))
            self.average = whole_number(params.get("average", 10))
            fading = float(params.get("fading_factor", 0.001))
            self.tolerance = float(params.get("tolerance", 0.05))
            self.novelty_span = float(params.get("novelty_span", 0.0))
            self.independence = float(params.get("independence", 0.0))
        except (TypeError, ValueError, OverflowError) as exc:
            raise ValueError(f"anomaly_likelihood parameters must be numbers: {exc}") from exc
        if not all(map(math.isfinite, (self.threshold, self.recover_threshold, self.resolution,
                                       self.rarity, fading, self.tolerance,
                                       self.novelty_span, self.independence))):
            raise ValueError("anomaly_likelihood parameters must be finite numbers")
        self.direction = params.get("direction", "both")
        if self.direction not in ("up", "down", "both"):
            raise ValueError("direction must be up, down or both")
        if not 0 < self.threshold <= 1 or not 0 <= self.recover_threshold <= self.threshold:
            raise ValueError("need 0 < threshold <= 1 and 0 <= recover_threshold <= threshold")
        if self.warmup < 2 or self.bins < 2 or self.memory < 10 or self.average < 1:
            raise ValueError("need warmup >= 2, bins >= 2, memory >= 10 and average >= 1")
        if min(self.radius, self.resolution, self.tolerance, self.novelty_span,
               self.independence) < 0:
            raise ValueError("radius, resolution, tolerance, novelty_span and independence must "
                             "not be negative")
        if not 0 < self.rarity <= 1 or not 0 < fading <= 1:
            raise ValueError("rarity and fading_factor must be in (0, 1]")
        from river import stats  # only nodes with these rules pay for river

        self._stdtr = None
        if self.independence > 0:
            from scipy.special import stdtr  # scipy comes with river

            self._stdtr = stdtr

        self._mean = stats.EWMean(fading_factor=fading)  # of the averaged raw score
        self._var = stats.EWVar(fading_factor=fading)
        self._decay = 1.0 - 1.0 / self.memory
        self._horizon = 1.0 / fading  # the averages the long-run mean and variance remember
        self._first: list[float] | None = []  # the warm-up values, until the bin width is set
        self._width = 0.0
        self._counts: dict[int, float] = {}  # bin -> weight, scaled by self._scale
        self._total = 0.0
        self._scale = 1.0  # the weight of the newest value: older ones decay lazily
        self._learned = 0
        self._raw: deque[float] = deque(maxlen=self.average)
        self._judged = 0  # averaged raw scores seen by the likelihood
        self._red = False  # the previous tail was in the red zone
        self.level = 0.0  # the last undamped score, what `crossed` is judged on

    def update(self, value: float, time_ns: int) -> Verdict:
        if not math.isfinite(value):  # NaN is no data; an infinity has no bin either
            return Verdict(False, True, None, "no data", score=0.0)
        if self._first is not None:
            self._first.append(value)
            seen = len(self._first)
            if seen >= self.warmup:
                self._start()
            return Verdict(False, True, None, f"warming up ({seen}/{2 * self.warmup})",
                           score=0.0)
        low, high = self._range()
        margin = self.tolerance * (high - low)
        novel = high > low and (value >= high + margin or value < low - margin)
        novelty = 1.0
        if novel and self.novelty_span > 0:  # graded: a value just past a record ranks lower
            excess = max(value - high, low - value) / (high - low) - self.tolerance
            novelty = min(1.0, self.threshold + excess / self.novelty_span)
        share = self._share(value)
        self._learn(self._bin(value))
        self._raw.append(max(0.0, 1.0 - share / self.rarity))
        recent = sum(self._raw) / len(self._raw)
        self._mean.update(recent)
        self._var.update(recent)
        self._judged += 1
        if self._judged < self.warmup:
            self.level = 0.0
            return Verdict(False, True, None, f"warming up ({self.warmup + self._judged}/"
                           f"{2 * self.warmup})", score=0.0)
        tail = self._tail(recent)
        level = max(novelty, _log_score(tail)) if novel else _log_score(tail)
        reported = tail
        if tail <= _RED_TAIL:  # one event, one high score: a red run reports yellow after
            reported = _YELLOW_TAIL if self._red else tail
            self._red = True
        else:
            self._red = False
        score = max(novelty, _log_score(reported)) if novel else _log_score(reported)
        if self.direction != "both" and (level > 0 or score > 0) and (
                value > self._median()) != (self.direction == "up"):
            level = score = 0.0  # the harmless side of the usual level
        below = self.direction == "down" or (self.direction == "both" and value < (low + high) / 2)
        bound = low - margin if below else high + margin
        self.level = level
        note = (f"outside the recent range {low:.4g}..{high:.4g}" if novel else
                f"{100 * share:.2g}% of recent values near it, tail {tail:.1e}")
        return Verdict(level >= self.threshold, level < self.recover_threshold, bound, note,
                       score=score)

    @property
    def warm(self) -> bool:
        """The bin width is set: the histogram has a recent range."""
        return self._first is None

    def recent_range(self) -> tuple[float, float]:
        """The span of the values the histogram remembers (once warm)."""
        return self._range()

    def _tail(self, recent: float) -> float:
        """Probability of an average of raw scores at least this high, for this series."""
        mean = max(self._mean.get(), _MIN_MEAN)
        std = math.sqrt(max(self._var.get(), _MIN_VAR))
        if self._stdtr is None:
            return 0.5 * math.erfc((recent - mean) / (std * math.sqrt(2)))
        # the predictive Student-t of one more average, given n samples of mean and variance
        n = max(self.independence * min(self._judged, self._horizon), 1.0)
        deviation = (recent - mean) / (std * math.sqrt(1 + 1 / n))
        return float(self._stdtr(max(n - 1.0, 1.0), -deviation))

    def _start(self) -> None:
        first, self._first = self._first or [], None
        spread = max(first) - min(first)
        level = max(max(map(abs, first)), 1.0)
        if spread > 0:  # never finer than float precision can tell apart
            self._width = max(spread / self.bins, self.resolution, level * 1e-12)
        else:  # a flat warm-up: a bin is a share of its level (or of 1 at 0)
            self._width = max(level / self.bins, self.resolution)
        for value in first:
            self._learn(self._bin(value))

    def _bin(self, value: float) -> int:
        position = value / self._width
        if not math.isfinite(position):  # near the float limit: the outermost bin there is
            position = math.copysign(1e300, position)
        return math.floor(position)

    def _share(self, value: float) -> float:
        """Share of the (decayed) recent past within `radius` bins of the value."""
        k = self._bin(value)
        near = sum(self._counts.get(j, 0.0) for j in range(k - self.radius, k + self.radius + 1))
        return near / self._total

    def _learn(self, k: int) -> None:
        self._scale /= self._decay
        self._counts[k] = self._counts.get(k, 0.0) + self._scale
        self._total += self._scale
        self._learned += 1
        if self._learned % max(self.memory // 10, 1) == 0 or self._scale > 1e30:
            floor = _PRUNE * self._scale  # rescale to 1 and forget the faded bins
            self._counts = {j: w / self._scale for j, w in self._counts.items() if w >= floor}
            self._total = sum(self._counts.values())
            self._scale = 1.0
        if len(self._counts) > 4 * self.bins:  # spread far beyond the warm-up range: coarser
            self._width *= 2
            merged: dict[int, float] = {}
            for j, w in self._counts.items():
                merged[j // 2] = merged.get(j // 2, 0.0) + w
            self._counts = merged

    def _range(self) -> tuple[float, float]:
        return min(self._counts) * self._width, (max(self._counts) + 1) * self._width

    def _median(self) -> float:
        half, seen = self._total / 2, 0.0
        for k in sorted(self._counts):
            seen += self._counts[k]
            if seen >= half:
                return (k + 0.5) * self._width
        return math.nan  # not reached: the weights sum to the total


def _log_score(tail: float) -> float:
    return math.log(tail + 1e-10) / _LOG_EPSILON


def whole_number(value: Any) -> int:
    if isinstance(value, bool) or float(value) != int(float(value)):
        raise ValueError(f"{value!r} is not a whole number")
    return int(float(value))


@hookimpl
def sloguard_detectors() -> list[type]:
    return [AnomalyLikelihood]


class SlotArrays:
    """What the anomaly batches share: per-slot arrays, grown and compacted together, and an
    update whose arithmetic overflows silently.

    Each per-slot array (declared with `_per_slot`) is a view of the first `_size` slots of a
    buffer with room for more. When a batch needs more slots than its room, every buffer is
    reallocated 1.5 times larger (amortised, a slot is copied two to three times in all); a
    batch whose series count rises by a few each tick would otherwise copy every slot each
    tick (1,866 bytes a slot for anomaly_likelihood: 187 MB a tick at 100,000 series). The room
    is kept here rather than as NaN slots in the engine's `Slots`: the arrays an update sweeps
    are those of the slots in use, so a tick costs what it did before, while slots beyond
    `_size`, never written, cost only address space until used (buffers are `np.empty`, and a
    new slot's values are written when it joins). `compact` (by `_take`) moves the slots kept to
    the front and reallocates the buffers to their number: the engine calls it when most slots
    are free, so memory falls after a peak (benchmarks/batch_growth.py measures both).
    """

    _scalars: dict[str, tuple[Any, Any]]
    _size: int
    # room reallocated this many times larger (1.0: the exact size, as before #25, which
    # benchmarks/batch_growth.py runs as its reference)
    _growth = 1.5

    def _start_slots(self) -> None:
        """Before any `_per_slot`: no slots, no room."""
        self._size = 0
        self._room = 0
        self._layout: dict[str, tuple[tuple[int | None, ...], Any, Any]] = {}
        self._buffers: dict[str, Any] = {}
        self.reallocations = 0  # times the buffers were reallocated larger (the tests count)

    def _per_slot(self, name: str, dtype: Any, fresh: Any,
                  shape: tuple[int | None, ...] = (None,)) -> None:
        """Declare the per-slot array `name`: `shape` with None on the slot axis, `fresh` the
        value of a new slot."""
        import numpy as np

        self._layout[name] = (shape, dtype, fresh)
        self._buffers[name] = buffer = np.empty(_sized(shape, self._room), dtype=dtype)
        setattr(self, name, buffer[_upto(shape, self._size)])

    def _grow(self, size: int) -> None:
        import numpy as np

        old = self._size
        if size <= old:
            return
        if size > self._room:
            room = max(size, int(self._room * self._growth))
            for name, (shape, dtype, _) in self._layout.items():
                buffer = np.empty(_sized(shape, room), dtype=dtype)
                buffer[_upto(shape, old)] = self._buffers[name][_upto(shape, old)]
                self._buffers[name] = buffer
            self._room = room
            self.reallocations += 1
        joining = slice(old, size)
        for name, (shape, _, fresh) in self._layout.items():
            buffer = self._buffers[name]
            buffer[tuple(joining if n is None else slice(None) for n in shape)] = fresh
            setattr(self, name, buffer[_upto(shape, size)])
        self._size = size
        self._views()

    def _take(self, keep: Any) -> None:
        """Slots `keep` (sorted, distinct, below `_size`) become slots 0, 1, ...; the others are
        forgotten, and the buffers hold exactly these."""
        import numpy as np

        keep = np.asarray(keep, dtype=np.int64)
        for name, (shape, _, _) in self._layout.items():
            buffer = np.take(getattr(self, name), keep, axis=shape.index(None))
            self._buffers[name] = buffer
            setattr(self, name, buffer)
        self._size = self._room = len(keep)
        self._views()

    def _views(self) -> None:
        """Views of the per-slot arrays, made again when they change."""

    def __getstate__(self) -> dict[str, Any]:
        # pickle and deepcopy copy a view apart from its buffer: keep the slots in use as the
        # buffers (no room), and make the views again on the way back
        state = self.__dict__.copy()
        state["_buffers"] = {name: getattr(self, name) for name in self._layout}
        state["_room"] = self._size
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        for name in self._layout:
            setattr(self, name, self._buffers[name])
        self._views()

    def nbytes(self) -> int:
        """Memory of the per-slot buffers, room for more slots included."""
        return sum(buffer.nbytes for buffer in self._buffers.values())

    def update(self, values: Any, time_ns: int = 0) -> BatchVerdicts:
        import numpy as np

        # values near the float limit overflow to inf here as the per-series detector's
        # Python floats do, silently: numpy's warnings would only be noise in the agent's log
        with np.errstate(over="ignore", invalid="ignore"):
            return self._update(values, time_ns)

    def _update(self, values: Any, time_ns: int) -> BatchVerdicts:
        raise NotImplementedError


def _sized(shape: tuple[int | None, ...], slots: int) -> tuple[int, ...]:
    return tuple(slots if n is None else n for n in shape)


def _upto(shape: tuple[int | None, ...], slots: int) -> tuple[slice, ...]:
    return tuple(slice(0, slots) if n is None else slice(None) for n in shape)


class AnomalyLikelihoodBatch(SlotArrays):
    """The `anomaly_likelihood` detector over many series at once, on numpy arrays (the
    engine's batch path): the same verdicts, slot for slot, as one AnomalyLikelihood per series
    (tests/test_anomaly_likelihood_batch.py runs both side by side).

    Each slot's histogram is a dense row of 4 x `bins` + 1 bins from a per-slot offset (the
    per-series detector's dict keeps at most that many bins), with 2 x `radius` + 1 empty bins
    either side, so the share near a value is 2 x `radius` + 1 gathers and learning one value
    one scatter, for every slot at once. The rare events run only over the slots concerned: the
    end of the warm-up, the rescale and pruning (every `memory` / 10 values), the width
    doubling, a value outside the row (the row moves), and the median for direction up or down.
    A slot whose remembered bins span more than a row (a far spike not yet forgotten) keeps
    them in a dict, as the per-series detector does and at its cost, until pruning brings them
    back within a row.

    The tail (erfc, or stdtr for the Student-t: most of a quiet tick) is computed only where a
    verdict needs it. A slot whose deviation is below the one where its tail would be red or its
    score not recovered (`_quiet`, bounds found once per tail) is not crossed, recovered and
    out of the red zone whatever its tail; its score (DeferredScores) and level (`level`) are
    computed when read, the engine reading only the slots it shows, bit for bit what computing
    them at once gives (tests/test_quiet_tail.py).

    The arithmetic is the per-series detector's (river's EWMean and EWVar recurrences
    included), but for two sums that differ by a few units in the last place: the recent raw
    scores are summed in ring order rather than oldest first, afresh once a ring (and every
    tick for the slots of a block not all at the same place in their rings) and as a running
    sum in between (less the score leaving the ring, plus the new one: its rounding is
    forgotten at the next fresh sum), and the total weight after a pruning in bin order rather
    than in the dict's order.

    Memory: 8 x (4 x `bins` + 4 x `radius` + 3 + `average`) + 130 bytes per slot, and 8 x
    `warmup` more when the warm-up is longer than a row (else its values live in the bin row
    until the bin width is set): 1,866 bytes with the defaults, plus a dict of at most
    4 x `bins` + 1 bins for a slot spread too far for its row; the buffers keep room for up
    to half as many slots again (SlotArrays), address space until used, and are cut back to
    the slots in use by `compact`. Cost per tick:
    benchmarks/detector_throughput.py, which chose how it is written: blocks of `_BLOCK` slots
    (whole-array temporaries cost page faults), slices rather than gathers where a block's
    slots all have values, padding rather than bounds checks, the bin read once for the share
    and the learning, pruning in blocks that stay in the cache.
    """

    # the quiet slots' tail only when read (False: every slot's every tick, as before; what
    # tests/test_quiet_tail.py compares it with)
    _defer = True

    def __init__(self, params: dict[str, Any]) -> None:
        import numpy as np

        probe = AnomalyLikelihood(params)  # the same parameters, validated the same way
        self.threshold, self.recover_threshold = probe.threshold, probe.recover_threshold
        self.warmup, self.bins, self.resolution = probe.warmup, probe.bins, probe.resolution
        self.radius, self.rarity, self.memory = probe.radius, probe.rarity, probe.memory
        self.average, self.tolerance = probe.average, probe.tolerance
        self.novelty_span, self.independence = probe.novelty_span, probe.independence
        self.direction = probe.direction
        self._fading = probe._mean.fading_factor
        self._stdtr = probe._stdtr
        self._decay, self._horizon = probe._decay, probe._horizon
        self._period = max(self.memory // 10, 1)
        self._row = 4 * self.bins + 1  # bins a slot's dense row holds
        self._pad = 2 * self.radius + 1  # empty bins either side: a far key reads only those
        self._stride = self._row + 2 * self._pad
        self._start_slots()
        self._scalars = {  # per slot: name -> (dtype, value of a fresh slot)
            "_seen": (np.int64, 0), "_width": (float, 0.0), "_offset": (np.int64, 0),
            "_low": (float, math.inf), "_high": (float, -math.inf),
            "_distinct": (np.int64, 0), "_total": (float, 0.0), "_scale": (float, 1.0),
            "_learned": (np.int64, 0), "_raws": (np.int64, 0), "_sum": (float, 0.0),
            "_mean": (float, 0.0),
            "_square": (float, 0.0), "_judged": (np.int64, 0), "_red": (bool, False),
            "_level": (float, 0.0), "_dense": (bool, True),
            "_pending": (float, math.nan),  # a quiet slot's deviation: its level, when read
        }
        for name, (dtype, fresh) in self._scalars.items():
            self._per_slot(name, dtype, fresh)
        # the warm-up values share the bin row when they fit (the row is empty until then)
        self._own_first = self.warmup > self._row
        if self._own_first:
            self._per_slot("_first", float, 0.0, (None, self.warmup))
        self._per_slot("_store", float, 0.0, (None, self._stride))
        self._per_slot("_raw", float, 0.0, (self.average, None))  # ring of raw scores
        self._sparse: dict[int, dict[int, float]] = {}  # slot -> bins, spread too far for a row
        self._bound_cache: dict[float | None, tuple[float, float, float]] = {}
        self._bases = np.zeros(0, dtype=np.int64)
        self._views()

    def _views(self) -> None:
        import numpy as np

        self._counts = self._store[:, self._pad:self._pad + self._row]  # the rows, a view
        self._flat = self._store.reshape(-1)
        if len(self._bases) != self._room:  # where each slot's row starts in _flat
            self._bases = np.arange(self._room, dtype=np.int64) * self._stride + self._pad
        self._base = self._bases[:self._size]
        if not self._own_first:
            self._first = self._counts

    def __getstate__(self) -> dict[str, Any]:
        # the views of _store (and _bases) are made again on the way back: pickled, each was a
        # copy of the whole store (a pickle 2.8 times the batch's arrays)
        state = super().__getstate__()
        for name in ("_counts", "_flat", "_base") + (() if self._own_first else ("_first",)):
            del state[name]
        return state

    def bytes_per_slot(self) -> float:
        """Memory of the arrays per slot in use (the dicts of far-spread slots not counted;
        room for more slots apart: nbytes)."""
        return sum(getattr(self, name).nbytes for name in self._layout) / max(self._size, 1)

    def compact(self, keep: Any) -> None:
        """Slots `keep` (sorted, distinct) become slots 0, 1, ... with what they learned; the
        others are forgotten and their memory given back (the batch contract's `compact`)."""
        keep = [int(slot) for slot in keep]
        self._take(keep)
        sparse = self._sparse
        self._sparse = {new: sparse[old] for new, old in enumerate(keep) if old in sparse}

    def reset(self, slots: Any) -> None:
        import numpy as np

        slots = np.asarray(slots, dtype=np.int64)
        if not len(slots):
            return
        self._grow(int(slots.max()) + 1)
        for name, (_, fresh) in self._scalars.items():
            getattr(self, name)[slots] = fresh
        self._store[slots] = 0.0
        if self._own_first:
            self._first[slots] = 0.0
        self._raw[:, slots] = 0.0
        for slot in slots.tolist():
            self._sparse.pop(slot, None)

    def _every(self, slots: Any) -> Any:
        """`slots` (sorted, distinct) as an index: a slice, so a view, when they are a run."""
        if len(slots) and int(slots[-1]) - int(slots[0]) + 1 == len(slots):
            return slice(int(slots[0]), int(slots[-1]) + 1)
        return slots

    def _update(self, values: Any, time_ns: int) -> BatchVerdicts:
        import numpy as np

        x = np.asarray(values, dtype=float)
        self._grow(len(x))
        size = self._size
        if len(x) < size:  # slots this call does not mention have no data
            x = np.concatenate([x, np.full(size - len(x), np.nan)])
        valid = np.isfinite(x)  # NaN is no data; an infinity has no bin either
        warm = self._seen >= self.warmup
        filling = np.flatnonzero(valid & ~warm)  # the first warm-up: values kept for the width
        seen = self._seen[filling]
        if len(filling):
            self._first[filling, seen] = x[filling]
            self._seen[filling] = seen = seen + 1
            if (seen >= self.warmup).any():
                self._start(filling[seen >= self.warmup])
        judged = np.flatnonzero(valid & warm)
        out = (np.zeros(size, dtype=bool), np.ones(size, dtype=bool), np.full(size, np.nan),
               np.zeros(size), np.full(size, np.nan))
        # A block at a time: its temporaries stay small, so they are reused from the heap and
        # stay in the cache (whole-array temporaries cost a page fault per 4 KiB each time).
        parts = []
        ends = np.searchsorted(judged, np.arange(_BLOCK, size + _BLOCK, _BLOCK))
        start = 0
        for end in ends.tolist():
            if end > start:
                slots = judged[start:end]
                parts.append((int(slots[-1]), slots, self._judge(slots, x, out)))
            start = end
        crossed, recovered, threshold, score, deferred = out
        counts = None if self._stdtr is None else self._judged.copy()
        scores = DeferredScores(score, deferred, counts, self._likely)
        return BatchVerdicts(crossed, recovered, threshold, scores,
                             self._noter(x, filling, seen, parts))

    def _judge(self, slots: Any, x: Any, out: tuple[Any, Any, Any, Any, Any]) -> tuple:
        """AnomalyLikelihood.update after its warm-up, for these slots; the verdicts go to
        `out` (crossed, recovered, threshold, score, and the deviation of the slots whose score
        waits until read), what a note shows is returned."""
        import numpy as np

        every = self._every(slots)
        xs = x[every]
        width = self._width[every]
        low = self._low[every] * width
        high = (self._high[every] + 1) * width
        spread = high - low
        margin = self.tolerance * spread
        above, below = high + margin, low - margin
        novel = (high > low) & ((xs >= above) | (xs < below))
        anything_novel = bool(novel.any())
        novelty: Any = 1.0
        if self.novelty_span > 0 and anything_novel:
            with np.errstate(divide="ignore", invalid="ignore"):
                excess = np.maximum(xs - high, low - xs) / spread - self.tolerance
                novelty = np.where(novel, np.minimum(1.0, self.threshold
                                                     + excess / self.novelty_span), 1.0)
        keys = self._keys(xs, width)
        near, here, at = self._near(slots, keys)
        share = near / self._total[every]
        self._learn(slots, keys, here, at)
        raw = np.maximum(0.0, 1.0 - share / self.rarity)
        ring = self._raws[every]
        together = bool((ring == ring[0]).all())  # the usual case: every slot at the same place
        place = int(ring[0]) % self.average
        if together and place:
            # a running sum between the ring's wraps: it reads the leaving row and the sum where
            # the sum afresh reads all `average` rows (benchmarks/detector_throughput.py's
            # batch, old and new alternated: 0.96x a tick at 100,000 series)
            total = self._sum[every] - self._raw[place, every]
            total += raw
            self._raw[place, every] = raw
        else:  # the sum afresh, in ring order, once a ring (or slots at different places)
            if together:
                self._raw[place, every] = raw
            else:
                self._raw[ring % self.average, slots] = raw
            kept = self._raw[:, every]
            total = kept[0].copy()
            for row in kept[1:]:
                total += row
        self._sum[every] = total
        self._raws[every] = ring = ring + 1
        if together and ring[0] >= self.average:
            recent = total / self.average
        else:
            recent = total / np.minimum(ring, self.average)
        before = self._judged[every]
        fresh = before == 0  # river's EWMean: the first value is the mean
        f = self._fading
        square = recent * recent
        mean = f * recent + (1 - f) * self._mean[every]
        square_mean = f * square + (1 - f) * self._square[every]
        if fresh.any():
            mean[fresh], square_mean[fresh] = recent[fresh], square[fresh]
        self._mean[every], self._square[every] = mean, square_mean
        count = before + 1
        self._judged[every] = count
        ready = count >= self.warmup
        everyone_ready = bool(ready.all())

        deviation, n = self._deviation(recent, mean, square_mean - mean * mean, count)
        quiet, positive = self._quiet(deviation, n, ready, novel if anything_novel else None)
        skipped = quiet  # and the slots still warming up: score 0, red state kept, no tail
        if self._defer and not everyone_ready:
            skipped = ~ready if quiet is None else quiet | ~ready
        if skipped is None:  # every slot's tail
            tail = self._tail_of(deviation, n)
            likely = _log_scores(tail)
            red = tail <= _RED_TAIL  # one event, one high score: a red run reports yellow after
        else:  # the quiet slots' likelihood waits until read (-inf meanwhile: below any bound)
            some = np.flatnonzero(~skipped)
            tail = np.full(len(deviation), np.nan)
            likely = np.full(len(deviation), -np.inf)
            red = np.zeros(len(deviation), dtype=bool)
            if len(some):
                part = self._tail_of(deviation[some], None if n is None else n[some])
                tail[some] = part
                likely[some] = _log_scores(part)
                red[some] = part <= _RED_TAIL
        pending = quiet
        was_red = self._red[every]
        damped = red & was_red
        self._red[every] = red if everyone_ready else np.where(ready, red, was_red)
        marks = likely
        if damped.any():
            marks = np.where(damped, _log_score(_YELLOW_TAIL), likely)
        level = likely
        if anything_novel:
            level = np.where(novel, np.maximum(novelty, likely), likely)
            marks = np.where(novel, np.maximum(novelty, marks), marks)
        if self.direction != "both":
            # a quiet slot's score is above 0 (`positive`) or not (not asked) for sure
            asked = np.flatnonzero(ready & ((level > 0) | (marks > 0) | positive))
            if len(asked):
                level, marks = level.copy(), marks.copy()
                higher = xs[asked] > self._median(slots[asked])
                harmless = asked[higher != (self.direction == "up")]
                level[harmless] = marks[harmless] = 0.0  # the harmless side of the usual level
                if quiet is not None:
                    pending = quiet.copy()
                    pending[harmless] = False  # known: 0
        if self.direction == "both":
            bound = np.where(xs < (low + high) / 2, below, above)
        else:
            bound = below if self.direction == "down" else above
        if not everyone_ready:
            level = np.where(ready, level, 0.0)
        self._level[every] = level
        crossed, recovered, threshold, score, deferred = out
        crossed[every] = level >= self.threshold
        recovered[every] = level < self.recover_threshold
        threshold[every] = bound
        score[every] = marks
        waits = np.nan if pending is None else np.where(pending, deviation, np.nan)
        deferred[every] = waits
        self._pending[every] = waits
        if not everyone_ready:
            waiting = slots[~ready]
            crossed[waiting], recovered[waiting] = False, True
            threshold[waiting], score[waiting] = np.nan, 0.0
        return novel, low, high, share, tail, count, deviation

    def _noter(self, x: Any, filling: Any, seen: Any, parts: list) -> Any:
        import bisect

        import numpy as np

        warmup = self.warmup
        lasts = [last for last, _, _ in parts]

        def note(slot: int) -> str:
            if not math.isfinite(x[slot]):
                return "no data"
            at = int(np.searchsorted(filling, slot))
            if at < len(filling) and filling[at] == slot:
                return f"warming up ({int(seen[at])}/{2 * warmup})"
            _, slots, shown = parts[bisect.bisect_left(lasts, slot)]
            at = int(np.searchsorted(slots, slot))
            novel, low, high, share, tail, count, deviation = shown
            if count[at] < warmup:
                return f"warming up ({warmup + int(count[at])}/{2 * warmup})"
            if novel[at]:
                return f"outside the recent range {float(low[at]):.4g}..{float(high[at]):.4g}"
            its = tail[at:at + 1]
            if math.isnan(its[0]) and not math.isnan(deviation[at]):  # a quiet slot's tail
                n = None if self._stdtr is None else self._n(count[at:at + 1])
                its = self._tail_of(deviation[at:at + 1], n)
            return (f"{100 * float(share[at]):.2g}% of recent values near it, tail "
                    f"{float(its[0]):.1e}")

        return note

    def _deviation(self, recent: Any, mean: Any, var: Any, count: Any) -> tuple[Any, Any]:
        """AnomalyLikelihood._tail over arrays up to its last step: the standardised deviation
        the tail decreases with, and the Student-t's samples n (None: the Gaussian tail)."""
        import numpy as np

        mean = np.maximum(mean, _MIN_MEAN)
        std = np.maximum(var, _MIN_VAR)
        np.sqrt(std, out=std)
        if self._stdtr is None:
            std *= math.sqrt(2)
            deviation = recent - mean
            deviation /= std
            return deviation, None
        n = self._n(count)
        return (recent - mean) / (std * np.sqrt(1 + 1 / n)), n

    def _n(self, count: Any) -> Any:
        import numpy as np

        return np.maximum(self.independence * np.minimum(count, self._horizon), 1.0)

    def _tail_of(self, deviation: Any, n: Any) -> Any:
        """AnomalyLikelihood._tail's last step: the tail probability of these deviations."""
        if self._stdtr is None:
            from scipy.special import erfc  # scipy comes with river

            tail = erfc(deviation)
            tail *= 0.5
            return tail
        import numpy as np

        return self._stdtr(np.maximum(n - 1.0, 1.0), -deviation)

    def _likely(self, deviation: Any, count: Any) -> Any:
        """The score (undamped) of quiet slots, from what `_judge` kept of them: their
        deviation and, for the Student-t tail, the averages they had judged."""
        return _log_scores(self._tail_of(deviation, None if count is None else self._n(count)))

    @property
    def level(self) -> Any:
        """Each slot's last undamped score (AnomalyLikelihood.level); the quiet slots' is
        computed here, when read, rather than every tick."""
        import numpy as np

        waiting = np.flatnonzero(~np.isnan(self._pending))
        if len(waiting):
            counts = None if self._stdtr is None else self._judged[waiting]
            self._level[waiting] = self._likely(self._pending[waiting], counts)
            self._pending[waiting] = np.nan
        return self._level

    def _quiet(self, deviation: Any, n: Any, ready: Any, novel: Any) -> tuple[Any, Any]:
        """The slots whose verdict is known without their tail: ready, not novel, their
        deviation below the one whose tail would be red or not recovered (so: not crossed,
        recovered, not red, no damping); for direction up or down, also surely on one side of
        a score of 0 (whether the median is asked), and `positive` those above it. (None, False)
        when there are none. For the Student-t tail the bounds are those of the block's largest
        n (every slot's past `1 / fading_factor` averages): at a deviation t the tail P(T > t)
        lies between those of the block's smallest and largest n (it falls as the degrees of
        freedom rise for t > 0, and rises for t < 0). So a calm bound of the largest n at or
        above 0 holds for every smaller n, a negative one (a recover threshold under 0.0301,
        the score of a tail of 0.5) only with the smallest n's taken as well; the positive
        bound (below 0: a score turns positive a hair under a tail of 1) holds for every
        smaller n; the bound under which a score is surely <= 0 for slots with that n only.
        Why: the tail (scipy's erfc, or stdtr for the Student-t) was most of a quiet tick;
        benchmarks/detector_throughput.py and benchmarks/quiet_tail.py (old and new alternated:
        see docs/performance.md)."""
        if not self._defer:
            return None, False
        key = None if n is None else float(n.max())
        calm, below_zero, above_zero = self._bounds(key)
        if n is not None and calm < 0 and float(n.min()) != key:
            # below 0 it is the other way round: the smallest n has the smaller tail (the
            # higher score), and the tail at a deviation lies between those of the block's
            # smallest and largest n (tests/test_quiet_tail.py, a mixed-n block)
            calm = min(calm, self._bounds(float(n.min()))[0])
        quiet = deviation < calm
        quiet &= ready
        if novel is not None:
            quiet &= ~novel
        positive: Any = False
        if self.direction != "both":
            positive = quiet & (deviation > above_zero)
            surely_not = deviation < below_zero
            if n is not None and float(n.min()) != key:
                surely_not &= n == key  # a heavier tail may be above 0 further down
            quiet &= surely_not | positive
        if not quiet.any():
            return None, False
        return quiet, positive

    def _bounds(self, n: float | None) -> tuple[float, float, float]:
        """For the tail with n samples (None: Gaussian): the deviation under which a tail is
        neither red nor above the recover threshold's score, and the two around the one where
        the score turns positive (under the first it is <= 0, above the second > 0). Found on
        the computed tail and score, then widened by `_MARGIN`: the tail is monotone in the
        deviation, and erfc and stdtr are accurate to far less than that margin moves it."""
        import numpy as np

        found = self._bound_cache.get(n)
        if found is not None:
            return found
        if len(self._bound_cache) > 256:
            self._bound_cache.clear()

        def tails(deviation: Any) -> Any:
            return self._tail_of(deviation, None if n is None else np.full(len(deviation), n))

        def calm(deviation: Any) -> Any:
            tail = tails(deviation)
            return (_log_scores(tail) < self.recover_threshold) & (tail > _RED_TAIL)

        calm_below, _ = _flip(calm)
        below_zero, above_zero = -math.inf, math.inf
        if self.direction != "both":
            below_zero, above_zero = _flip(lambda deviation: ~(_log_scores(tails(deviation)) > 0))
        found = self._bound_cache[n] = (calm_below, below_zero, above_zero)
        return found

    def _keys(self, xs: Any, width: Any) -> Any:
        """AnomalyLikelihood._bin over arrays, as floats (exact: a float's floor is one)."""
        import numpy as np

        with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
            position = xs / width
        far = ~np.isfinite(position)
        if far.any():  # near the float limit: the outermost bin there is
            position[far] = np.copysign(1e300, position[far])
        return np.floor(position)

    def _start(self, slots: Any) -> None:
        """AnomalyLikelihood._start for the slots whose warm-up just ended, a thousand or so
        at a time: their warm-up values and rows then stay in the cache."""
        step = max(_BLOCK // 8, 1)
        for start in range(0, len(slots), step):
            self._start_some(slots[start:start + step])

    def _start_some(self, slots: Any) -> None:
        import numpy as np

        first = self._first[slots, :self.warmup].copy()
        if not self._own_first:
            self._counts[slots] = 0.0
        spread = first.max(axis=1) - first.min(axis=1)
        level = np.maximum(np.abs(first).max(axis=1), 1.0)
        with np.errstate(over="ignore", invalid="ignore"):
            width = np.where(spread > 0, np.maximum(np.maximum(spread / self.bins,
                                                               self.resolution), level * 1e-12),
                             np.maximum(level / self.bins, self.resolution))
        self._width[slots] = width
        keys = self._keys(first, width[:, None])
        low, high = keys.min(axis=1), keys.max(axis=1)
        fits = (high - low < self._row) & (np.abs(low) < _EXACT_KEY) & (
            np.abs(high) < _EXACT_KEY)
        offset = (low - (self._row - (high - low) - 1) // 2)[fits].astype(np.int64)
        self._offset[slots[fits]] = offset
        for slot in slots[~fits].tolist():
            self._dense[slot] = False
            self._sparse[slot] = {}
        self._low[slots], self._high[slots] = low, high
        scales, scale = [], 1.0
        for _ in range(self.warmup):
            scale /= self._decay
            scales.append(scale)
        if self.warmup >= self._period or scale > 1e30:  # pruned during the warm-up
            for column in range(self.warmup):  # the warm-up values, learnt in their order
                self._learn(slots, keys[:, column])
            return
        # No pruning and no doubling (the warm-up spans at most bins + 2 bins) before the end:
        # every slot learns the same weights in the same order, so they go in a column at a
        # time, each bin's weights summed in the per-series detector's order.
        rows, bins = slots[fits], keys[fits] - offset[:, None]
        at = (self._base[rows][:, None] + bins.astype(np.int64)).T.copy()
        for column in range(self.warmup):
            self._flat[at[column]] += scales[column]
        total = 0.0
        for scale in scales:
            total += scale
        self._scale[rows], self._total[rows], self._learned[rows] = scale, total, self.warmup
        self._distinct[rows] = np.count_nonzero(self._counts[rows], axis=1)
        far = slots[~fits]
        for column in range(self.warmup):
            if len(far):
                self._learn(far, keys[~fits, column])

    def _near(self, slots: Any, keys: Any) -> tuple[Any, Any, Any]:
        """Weight within `radius` bins of each key (AnomalyLikelihood._share's sum), and in
        the key's own bin (what learning it adds to, read once); and where in `_flat` that
        bin is when every slot is dense and every key inside its row (else None), so that
        learning need not check and find it again."""
        import numpy as np

        every = self._every(slots)
        column = keys - self._offset[every]
        dense = self._dense[every]
        everyone = bool(dense.all())
        inside = everyone and column.min() >= 0 and column.max() < self._row
        if not inside:
            # beyond these a key's neighbours are all padding (a dict slot's row is empty)
            np.maximum(column, -self.radius - 1, out=column)
            np.minimum(column, self._row + self.radius, out=column)
        at = self._base[every] + column.astype(np.int64)
        flat = self._flat
        here = flat[at]
        if self.radius:
            near = flat[at - self.radius]
            for step in range(1 - self.radius, self.radius + 1):
                near += here if step == 0 else flat[at + step]
        else:
            near = here.copy()
        if not everyone:
            for i in np.flatnonzero(~dense).tolist():
                counts, k = self._sparse[int(slots[i])], int(keys[i])
                near[i] = sum(counts.get(j, 0.0)
                              for j in range(k - self.radius, k + self.radius + 1))
        return near, here, at if inside else None

    def _learn(self, slots: Any, keys: Any, here: Any = None, at: Any = None) -> None:
        """AnomalyLikelihood._learn of one value (its bin `keys`) for each of `slots`;
        `here`, when given, is the weight of each key's bin, as _near read it, and `at`,
        when given, where that bin is in `_flat` (every slot dense, every key in its row)."""
        import numpy as np

        every = self._every(slots)
        scale = self._scale[every] / self._decay
        self._scale[every] = scale
        self._total[every] += scale
        learned = self._learned[every] + 1
        self._learned[every] = learned
        flat = self._flat
        if at is None:
            column = keys - self._offset[every]
            dense = self._dense[every]
            outside = dense & ((column < 0) | (column >= self._row))
            if outside.any():
                self._move(slots[outside], keys[outside])
                column = keys - self._offset[every]
                dense = self._dense[every]
                here = None
            everyone = bool(dense.all())
            if everyone:
                at = self._base[every] + column.astype(np.int64)
                added = scale
            else:
                at = self._base[slots[dense]] + column[dense].astype(np.int64)
                added = scale[dense]
            weight = here if everyone and here is not None else flat[at]
        else:
            everyone, added, weight = True, scale, here
        flat[at] = weight + added
        if everyone:
            self._distinct[every] += weight == 0
        else:
            self._distinct[slots[dense]] += weight == 0
            for i in np.flatnonzero(~dense).tolist():
                slot, k = int(slots[i]), int(keys[i])
                counts = self._sparse[slot]
                counts[k] = counts.get(k, 0.0) + float(scale[i])
                self._distinct[slot] = len(counts)
        self._low[every] = np.minimum(self._low[every], keys)
        self._high[every] = np.maximum(self._high[every], keys)
        due = learned % self._period == 0
        due |= scale > 1e30
        if due.any():
            self._prune(slots[due])
        crowded = self._distinct[every] > 4 * self.bins
        if crowded.any():  # spread far beyond the warm-up range: coarser
            self._double(slots[crowded])

    def _move(self, slots: Any, keys: Any) -> None:
        """Slots whose new bin is outside their row: the row moves to hold it, or, spread
        wider than a row, the slot's bins go to a dict."""
        import numpy as np

        low = np.minimum(self._low[slots], keys)
        high = np.maximum(self._high[slots], keys)
        fits = (high - low < self._row) & (np.abs(low) < _EXACT_KEY) & (
            np.abs(high) < _EXACT_KEY)
        moving = slots[fits]
        if len(moving):
            offset = (low[fits] - (self._row - (high - low)[fits] - 1) // 2).astype(np.int64)
            source = np.arange(self._row) + (offset - self._offset[moving])[:, None]
            inside = (source >= 0) & (source < self._row)
            rows = np.take_along_axis(self._counts[moving], np.where(inside, source, 0), 1)
            self._counts[moving] = np.where(inside, rows, 0.0)
            self._offset[moving] = offset
        for slot in slots[~fits].tolist():
            row = self._counts[slot]
            base = int(self._offset[slot])
            self._sparse[slot] = {base + j: float(row[j]) for j in np.flatnonzero(row).tolist()}
            self._counts[slot] = 0.0
            self._dense[slot] = False

    def _prune(self, slots: Any) -> None:
        """Rescale to 1 and forget the faded bins (AnomalyLikelihood._learn's pruning)."""
        import numpy as np

        dense = self._dense[slots]
        where = slots[dense]
        block = 1024  # rows at a time: a block stays in the cache through its passes
        for start in range(0, len(where), block):
            part = where[start:start + block]
            scale = self._scale[part][:, None]
            rows = self._counts[part]
            kept = rows >= _PRUNE * scale
            rows = np.where(kept, rows / scale, 0.0)
            self._counts[part] = rows
            self._total[part] = rows.sum(axis=1)
            self._distinct[part] = kept.sum(axis=1)
            offset = self._offset[part]
            self._low[part] = offset + kept.argmax(axis=1)
            self._high[part] = offset + self._row - 1 - kept[:, ::-1].argmax(axis=1)
            self._scale[part] = 1.0
        for slot in slots[~dense].tolist():
            scale = float(self._scale[slot])
            floor = _PRUNE * scale
            counts = {j: w / scale for j, w in self._sparse[slot].items() if w >= floor}
            self._total[slot] = sum(counts.values())
            self._scale[slot] = 1.0
            self._settle(slot, counts)

    def _double(self, slots: Any) -> None:
        """Twice as wide bins, neighbours merged (AnomalyLikelihood._learn's doubling)."""
        import numpy as np

        self._width[slots] *= 2
        dense = self._dense[slots]
        where = slots[dense]
        if len(where):
            offset = self._offset[where]
            merged_offset = offset // 2
            target = (offset[:, None] + np.arange(self._row)) // 2 - merged_offset[:, None]
            merged = np.zeros((len(where), self._row))
            np.add.at(merged, (np.arange(len(where))[:, None], target), self._counts[where])
            self._counts[where] = merged
            self._offset[where] = merged_offset
            self._distinct[where] = np.count_nonzero(merged, axis=1)
            self._low[where] = np.floor(self._low[where] / 2)
            self._high[where] = np.floor(self._high[where] / 2)
        for slot in slots[~dense].tolist():
            halved: dict[int, float] = {}
            for j, w in self._sparse[slot].items():
                halved[j // 2] = halved.get(j // 2, 0.0) + w
            self._settle(slot, halved)

    def _settle(self, slot: int, counts: dict[int, float]) -> None:
        """A dict slot's new bins: back into a row when they fit in one again."""
        low, high = min(counts), max(counts)
        self._low[slot], self._high[slot] = float(low), float(high)
        self._distinct[slot] = len(counts)
        if high - low < self._row and max(abs(low), abs(high)) < _EXACT_KEY:
            offset = low - (self._row - (high - low) - 1) // 2
            for j, w in counts.items():
                self._counts[slot, j - offset] = w
            self._offset[slot] = offset
            self._dense[slot] = True
            del self._sparse[slot]
        else:
            self._sparse[slot] = counts

    def _median(self, slots: Any) -> Any:
        """AnomalyLikelihood._median of each slot (after this value was learnt)."""
        import numpy as np

        median = np.full(len(slots), np.nan)
        dense = self._dense[slots]
        where = slots[dense]
        if len(where):
            seen = np.cumsum(self._counts[where], axis=1)
            reached = seen >= (self._total[where] / 2)[:, None]
            first = reached.argmax(axis=1)
            middle = ((self._offset[where] + first).astype(float) + 0.5) * self._width[where]
            median[dense] = np.where(reached.any(axis=1), middle, np.nan)
        for i in np.flatnonzero(~dense).tolist():
            slot = int(slots[i])
            half, seen_one, counts = self._total[slot] / 2, 0.0, self._sparse[slot]
            for k in sorted(counts):
                seen_one += counts[k]
                if seen_one >= half:
                    median[i] = (k + 0.5) * self._width[slot]
                    break
        return median


def _flip(holds: Any) -> tuple[float, float]:
    """Where a predicate of the deviation, true for low ones and false for high ones, turns:
    (it holds below the first, not above the second) over +-`_REACH`, each `_MARGIN` (or that
    share of it) from the turn found; (-inf, inf) if it is not monotone on a coarse grid."""
    import numpy as np

    grid = np.linspace(-_REACH, _REACH, 129)
    held = holds(grid)
    turns = np.flatnonzero(held[:-1] != held[1:])
    if len(turns) > 1:
        return -math.inf, math.inf
    if not len(turns):
        if held[0]:  # holds over the whole reach
            return _REACH - _MARGIN * _REACH, math.inf
        return -math.inf, -_REACH + _MARGIN * _REACH
    for _ in range(3):  # 128 times finer each time
        at = int(turns[0])
        grid = np.linspace(grid[at], grid[at + 1], 129)
        held = holds(grid)
        turns = np.flatnonzero(held[:-1] != held[1:])
        if len(turns) != 1:
            return -math.inf, math.inf
    at = int(turns[0])
    margin = _MARGIN * max(1.0, abs(float(grid[at])))
    return float(grid[at]) - margin, float(grid[at + 1]) + margin


class SlotsWhenRead:
    """Per-slot values computed when read: `take(slots)` for an integer array of slots,
    `[slot]` for one (as the engine reads the slots it shows), the whole through numpy
    (np.asarray), computed once. A subclass gives `take` and `__len__`."""

    _whole: Any = None

    def __len__(self) -> int:
        raise NotImplementedError

    def take(self, slots: Any) -> Any:
        raise NotImplementedError

    def __getitem__(self, slot: Any) -> Any:
        import numpy as np

        if isinstance(slot, int | np.integer):
            return self.take(np.array([slot]))[0]
        return np.asarray(self)[slot]

    def __array__(self, dtype: Any = None, copy: Any = None) -> Any:
        import numpy as np

        if self._whole is None:
            self._whole = self.take(np.arange(len(self)))
        whole = self._whole if dtype is None else self._whole.astype(dtype)
        return whole.copy() if copy and whole is self._whole else whole


class DeferredScores(SlotsWhenRead):
    """A tick's scores (BatchVerdicts.score) whose quiet slots' score is computed when read:
    the engine reads a few slots' (those it shows), so the tail of the others is never
    computed. Bit for bit what the eager computation gives (the same ufuncs, element by
    element). `take` reads several; numpy reads it whole (np.asarray)."""

    def __init__(self, values: Any, deferred: Any, counts: Any, likely: Any) -> None:
        self._values = values  # -inf where deferred
        self._deferred = deferred  # the deviation of a quiet slot, NaN elsewhere
        self._counts = counts
        self._likely = likely
        self._whole: Any = None

    def __len__(self) -> int:
        return len(self._values)

    def take(self, slots: Any) -> Any:
        """The scores of `slots` (an integer array), as an array."""
        import numpy as np

        if self._whole is not None:
            return self._whole[slots]
        values = self._values[slots]
        deviation = self._deferred[slots]
        waiting = np.flatnonzero(~np.isnan(deviation))
        if len(waiting):
            counts = None if self._counts is None else self._counts[slots][waiting]
            values[waiting] = self._likely(deviation[waiting], counts)
        return values


def _log_scores(tail: Any) -> Any:
    """_log_score over an array."""
    import numpy as np

    score = tail + 1e-10
    np.log(score, out=score)
    score /= _LOG_EPSILON
    return score


AnomalyLikelihood.batch = AnomalyLikelihoodBatch
