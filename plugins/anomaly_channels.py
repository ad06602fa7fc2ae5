"""The anomaly-channels detector (a built-in plugin): anomaly_likelihood on the value, on its
volatility and on the shape of its recent window, and the strongest of the three.

One anomaly_likelihood sees where a series is. Some anomalies leave the values where they
usually are and change how the series moves: a quiet metric that starts to oscillate inside
its usual band, spikes of the usual height that come more often, a daily peak that does not
come. Two derived channels see those, each judged by its own anomaly_likelihood (rarity in a
forgetting histogram, then the likelihood of that much rarity), so each is compared with its
own history:

- volatility: the mean absolute change over the last `volatility_span` values;
- shape: how far the last `segments` x `segment` values, as `segments` means scaled to the
  value channel's recent range, are from the nearest of at most `prototypes` shapes learnt so
  far (a fuzzy-ART-like memory, after ARTime, Hampton 2021: a window that matches a prototype
  within `vigilance`, a mean absolute difference in range units, moves it by `learning_rate`;
  one that does not becomes a new prototype, replacing the least used when the memory is full).
  It is updated once per `segment` values, so its cost per value stays small.

A derived channel counts `penalty` less than the value channel (its score minus `penalty`):
it needs a rarer deviation to fire, which keeps the false alarms of two more channels down.
The detector crosses when the strongest channel reaches `threshold` and recovers when all are
under `recover_threshold`. NaN (and an infinity) is missing data, as for anomaly_likelihood;
`direction` applies to the value channel. The state is bounded: three anomaly_likelihood
states, `volatility_span` changes, `segments` + 1 partial means and `prototypes` x `segments`
numbers.

Parameters (rule `params`): every anomaly_likelihood parameter, for all three channels (with
`novelty_span` 2 and `independence` 0.3 by default here), and:
  volatility_span    values whose mean absolute change is the volatility (default 30)
  segments           means in a shape (default 12)
  segment            values per mean (default 24: a shape spans 288 values, a day of 5-minute
                     samples)
  prototypes         shapes remembered (default 64)
  vigilance          mean absolute difference, in range units, within which a shape matches a
                     prototype (default 0.05)
  learning_rate      how far a matched prototype moves towards the shape (default 0.05)
  penalty            what a derived channel's score counts less (default 0.3)
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any

from sloguard.detector.api import BatchVerdicts, Verdict, hookimpl, reject_unknown
from sloguard.plugins.anomaly_likelihood import PARAMS as CHANNEL_PARAMS
from sloguard.plugins.anomaly_likelihood import (
    AnomalyLikelihood,
    AnomalyLikelihoodBatch,
    SlotArrays,
    SlotsWhenRead,
    whole_number,
)

_OWN = {"volatility_span", "segments", "segment", "prototypes", "vigilance", "learning_rate",
        "penalty"}
_CHANNEL_DEFAULTS = {"novelty_span": 2.0, "independence": 0.3}
_NO_NOVELTY = 1e12  # a range-novelty margin no distance reaches
_USE_DECAY = 0.999  # per shape: a prototype unused for a few thousand shapes can be replaced
_BLOCK_NUMBERS = 1 << 20  # prototype numbers a block of the batch's prototype step handles


def exact_sum(values: Any) -> float:
    """math.fsum, but inf where finite values add up past the float range (a 1e308
    "unknown" twice), as the running sum gives, instead of OverflowError."""
    try:
        return math.fsum(values)
    except OverflowError:
        return math.inf


class Volatility:
    """Mean absolute change over the last `span` values, in O(`span`) at worst per value: the
    running sum is recomputed exactly when a change larger than what remains leaves the window
    (a spike's rounding residue would otherwise outweigh the small changes after it), and once
    per `span` values."""

    def __init__(self, span: int) -> None:
        self._changes: deque[float] = deque(maxlen=span)
        self._sum = 0.0
        self._previous: float | None = None
        self._since_exact = 0

    def learn_one(self, value: float) -> float | None:
        """Learn a value; None for the first, which has no change yet."""
        previous, self._previous = self._previous, value
        if previous is None:
            return None
        change = abs(value - previous)
        leaving = 0.0
        if len(self._changes) == self._changes.maxlen:
            leaving = self._changes[0]
            self._sum -= leaving
        self._changes.append(change)
        self._sum += change
        self._since_exact += 1
        if (leaving > self._sum or self._since_exact >= len(self._changes)
                or not math.isfinite(self._sum)):
            self._sum = exact_sum(self._changes)
            self._since_exact = 0
        return max(self._sum, 0.0) / len(self._changes)


class WindowShape:
    """Distance of the recent window's shape to the nearest learnt prototype: ART-like."""

    def __init__(self, segments: int, segment: int, prototypes: int, vigilance: float,
                 learning_rate: float) -> None:
        import numpy as np

        self._np = np
        self.segment = segment
        self.vigilance = vigilance
        self.learning_rate = learning_rate
        self.capacity = prototypes
        self._partial = 0.0
        self._count = 0
        self._means: deque[float] = deque(maxlen=segments)
        self._prototypes = np.empty((0, segments))
        self._uses = np.empty(0)
        self.distance: float | None = None  # of the last complete shape; None before one

    def learn_one(self, value: float, low: float, high: float) -> float | None:
        """Learn a value; `low`..`high` is the range a shape is scaled to (none yet: equal)."""
        self._partial += value
        self._count += 1
        if self._count < self.segment:
            return self.distance
        self._means.append(self._partial / self._count)
        self._partial, self._count = 0.0, 0
        if len(self._means) < (self._means.maxlen or 0) or not high > low:
            return self.distance
        np = self._np
        with np.errstate(over="ignore", invalid="ignore"):
            shape = (np.fromiter(self._means, float, len(self._means)) - low) / (high - low)
        if not np.isfinite(shape).all():
            # values near the float limit (a 1e308 "unknown") overflowed a mean or the range:
            # such a shape is not learnt, or a NaN prototype would be every later best match
            return self.distance
        self._uses *= _USE_DECAY
        if len(self._prototypes):
            distances = np.abs(self._prototypes - shape).mean(axis=1)
            best = int(distances.argmin())
            self.distance = float(distances[best])
        else:
            best, self.distance = -1, math.inf
        if self.distance <= self.vigilance:  # resonance: the prototype learns the shape
            self._prototypes[best] += self.learning_rate * (shape - self._prototypes[best])
            self._uses[best] += 1.0
        elif len(self._prototypes) < self.capacity:
            self._prototypes = np.vstack([self._prototypes, shape])
            self._uses = np.append(self._uses, 1.0)
        else:
            replaced = int(self._uses.argmin())
            self._prototypes[replaced] = shape
            self._uses[replaced] = 1.0
        if not math.isfinite(self.distance):
            self.distance = None  # the first shape has nothing to be far from
        return self.distance


class AnomalyChannels:
    name = "anomaly_channels"

    def __init__(self, params: dict[str, Any]) -> None:
        reject_unknown(params, _OWN | CHANNEL_PARAMS, self.name)
        try:
            span = whole_number(params.get("volatility_span", 30))
            segments = whole_number(params.get("segments", 12))
            segment = whole_number(params.get("segment", 24))
            prototypes = whole_number(params.get("prototypes", 64))
            vigilance = float(params.get("vigilance", 0.05))
            learning_rate = float(params.get("learning_rate", 0.05))
            self.penalty = float(params.get("penalty", 0.3))
        except (TypeError, ValueError, OverflowError) as exc:
            raise ValueError(f"{self.name} parameters must be numbers: {exc}") from exc
        if span < 1 or segments < 2 or segment < 1 or prototypes < 1:
            raise ValueError("need volatility_span >= 1, segments >= 2, segment >= 1 and "
                             "prototypes >= 1")
        # A rule's detector is kept per series: its state must stay small whatever it says
        # (prototypes x segments numbers, volatility_span changes).
        if span > 100_000 or segments > 1000 or segment > 100_000 or prototypes > 1000:
            raise ValueError("need volatility_span <= 100000, segments <= 1000, segment <= "
                             "100000 and prototypes <= 1000")
        if not (math.isfinite(vigilance) and vigilance >= 0):
            raise ValueError("vigilance must be a finite number >= 0")
        if not 0 < learning_rate <= 1:
            raise ValueError("learning_rate must be in (0, 1]")
        if not 0 <= self.penalty <= 1:
            raise ValueError("penalty must be in [0, 1]")
        self.sizes = (span, segments, segment, prototypes, vigilance, learning_rate)
        value, derived, shape = channel_params(params, vigilance)
        self.value = AnomalyLikelihood(value)  # validates the shared parameters
        self.threshold = self.value.threshold
        self.recover_threshold = self.value.recover_threshold
        self.volatility = AnomalyLikelihood(derived)
        self.shape = AnomalyLikelihood(shape)
        self._volatility = Volatility(span)
        self._shape = WindowShape(segments, segment, prototypes, vigilance, learning_rate)

    def update(self, value: float, time_ns: int) -> Verdict:
        verdict = self.value.update(value, time_ns)
        if not math.isfinite(value):
            return verdict
        # (derived channel, level, score) of each channel with a value; derived ones count less
        channels = [(None, self.value.level, verdict.score or 0.0)]
        volatility = self._volatility.learn_one(value)
        if volatility is not None:
            wobble = self.volatility.update(volatility, time_ns)
            channels.append(("volatility", self.volatility.level - self.penalty,
                             (wobble.score or 0.0) - self.penalty))
        distance = self._shape.learn_one(
            value, *(self.value.recent_range() if self.value.warm else (0.0, 0.0)))
        if distance is not None:
            odd = self.shape.update(distance, time_ns)
            channels.append(("window shape", self.shape.level - self.penalty,
                             (odd.score or 0.0) - self.penalty))
        derived, _, score = max(channels, key=lambda channel: channel[2])
        note = verdict.note if derived is None else (
            f"{derived} unusual (score {score + self.penalty:.2f} - {self.penalty:g})")
        level = max(channel[1] for channel in channels)
        return Verdict(level >= self.threshold, level < self.recover_threshold,
                       verdict.threshold, note, score=max(0.0, score))


def channel_params(params: dict[str, Any], vigilance: float) -> tuple[dict, dict, dict]:
    """The anomaly_likelihood parameters of the value, volatility and shape channels."""
    channel = {**_CHANNEL_DEFAULTS, **{k: v for k, v in params.items() if k in CHANNEL_PARAMS}}
    derived = {**channel, "direction": "both"}
    # A shape's distance has no range to leave (rarity and likelihood only), and distances
    # closer than half the vigilance are the same match: the histogram's finest bin.
    shape = {**derived, "tolerance": _NO_NOVELTY, "resolution": vigilance / 2, "direction": "up"}
    return channel, derived, shape


class AnomalyChannelsBatch(SlotArrays):
    """The `anomaly_channels` detector over many series at once (the engine's batch path): the
    same verdicts, slot for slot, as one AnomalyChannels per series
    (tests/test_anomaly_channels_batch.py runs both side by side).

    Three AnomalyLikelihoodBatch, one per channel, fed the value, the volatility and the shape
    distance (NaN where a channel has none yet). The volatility's running sum is kept per slot
    with the same additions; its exact recomputation (math.fsum, once per `volatility_span`
    values and when a large change leaves) runs over the slots concerned only, in Python. Only
    slots at a segment boundary with a full window take the prototype step, vectorised over
    them (all of a rule's slots at once when its series started together) with the per-series
    detector's numpy operations element for element.

    Memory per slot: three AnomalyLikelihoodBatch slots (3 x 1,866 bytes with the defaults),
    8 x (`volatility_span` + `segments` + 9) bytes of volatility and window state (6,006 bytes
    in all with the defaults: bytes_per_slot), and the prototype memory (prototype_bytes): 8
    bytes per slot for its row in the store, and, for a slot once it has had a shape, a row of
    room for as many prototypes as the fullest row has needed (doubled when short, at most
    `prototypes`) x (`segments` + 1) numbers, plus its count: at most 64 x 13 x 8 + 8 = 6,664
    bytes with the defaults, what one WindowShape may hold. The store grows by a quarter of its
    rows at least (rows free for later slots), and the rows of reset slots are given again;
    `compact` keeps only the rows of the slots kept.
    Cost per tick: benchmarks/detector_throughput.py.
    """

    def __init__(self, params: dict[str, Any]) -> None:
        import numpy as np

        probe = AnomalyChannels(params)  # the same parameters, validated the same way
        (self.span, self.segments, self.segment, self.capacity, self.vigilance,
         self.learning_rate) = probe.sizes
        self.penalty = probe.penalty
        self.threshold, self.recover_threshold = probe.threshold, probe.recover_threshold
        value, derived, shape = channel_params(params, self.vigilance)
        self.value = AnomalyLikelihoodBatch(value)
        self.volatility = AnomalyLikelihoodBatch(derived)
        self.shape = AnomalyLikelihoodBatch(shape)
        self._start_slots()
        self._scalars = {  # per slot: name -> (dtype, value of a fresh slot)
            "_previous": (float, math.nan), "_changed": (np.int64, 0), "_next": (np.int64, 0),
            "_sum": (float, 0.0), "_since": (np.int64, 0), "_partial": (float, 0.0),
            "_count": (np.int64, 0), "_means_seen": (np.int64, 0),
            "_distance": (float, math.nan),
        }
        for name, (dtype, fresh) in self._scalars.items():
            self._per_slot(name, dtype, fresh)
        # rings of the last changes and of the last segment means, a column per slot
        self._per_slot("_changes", float, 0.0, (self.span, None))
        self._per_slot("_means", float, 0.0, (self.segments, None))
        # The prototype memory: a row of the store per slot that has had a shape (-1: none),
        # each with room for as many prototypes as the fullest row needs (doubling, at most
        # `prototypes`), their uses and their count; rows of reset slots are given again.
        self._per_slot("_row", np.int64, -1)
        self._store = np.zeros((0, 1, self.segments))
        self._store_uses = np.zeros((0, 1))
        self._store_count = np.zeros(0, dtype=np.int64)
        self._free: list[int] = []

    def bytes_per_slot(self) -> float:
        """Memory of the arrays per slot (the prototype memory apart: prototype_bytes)."""
        own = [getattr(self, name) for name in self._scalars] + [self._changes, self._means]
        return (sum(channel.bytes_per_slot() for channel in (self.value, self.volatility,
                                                              self.shape))
                + sum(a.nbytes for a in own) / max(self._size, 1))

    def prototype_bytes(self) -> int:
        """Memory of the prototype memory: its store, uses, counts and the slots' rows."""
        return sum(a.nbytes for a in (self._row, self._store, self._store_uses,
                                      self._store_count))

    def nbytes(self) -> int:
        """Memory of the per-slot buffers, room for more slots included, and of the
        prototype memory."""
        return (super().nbytes() + self.prototype_bytes() - self._row.nbytes
                + sum(channel.nbytes() for channel in (self.value, self.volatility,
                                                        self.shape)))

    def compact(self, keep: Any) -> None:
        """Slots `keep` (sorted, distinct) become slots 0, 1, ... with what they learned; the
        others are forgotten and their memory given back, prototype memory included (the
        batch contract's `compact`)."""
        import numpy as np

        keep = np.asarray(keep, dtype=np.int64)
        for channel in (self.value, self.volatility, self.shape):
            channel.compact(keep)
        self._take(keep)
        rows = self._row[self._row >= 0]  # the store's rows still owned, in slot order
        self._store, self._store_uses = self._store[rows], self._store_uses[rows]
        self._store_count = self._store_count[rows]
        self._row[self._row >= 0] = np.arange(len(rows))
        self._free = []

    def reset(self, slots: Any) -> None:
        import numpy as np

        slots = np.asarray(slots, dtype=np.int64)
        if not len(slots):
            return
        self._grow(int(slots.max()) + 1)
        for channel in (self.value, self.volatility, self.shape):
            channel.reset(slots)
        for name, (_, fresh) in self._scalars.items():
            getattr(self, name)[slots] = fresh
        self._changes[:, slots] = 0.0
        self._means[:, slots] = 0.0
        slots = np.unique(slots)
        freed = self._row[slots]
        self._free.extend(freed[freed >= 0].tolist())
        self._row[slots] = -1

    def _update(self, values: Any, time_ns: int) -> BatchVerdicts:
        import numpy as np

        x = np.asarray(values, dtype=float)
        self._grow(len(x))
        size = self._size
        if len(x) < size:
            x = np.concatenate([x, np.full(size - len(x), np.nan)])
        valid = np.isfinite(x)
        verdict = self.value.update(x, time_ns)
        slots = np.flatnonzero(valid)
        wobble = self.volatility.update(self._volatility_of(slots, x), time_ns)
        has_wobble = np.zeros(size, dtype=bool)
        has_wobble[slots] = self._changed[slots] > 0
        value = self.value
        warm = value._seen >= value.warmup
        with np.errstate(invalid="ignore"):  # a slot still in warm-up has no range: inf x 0
            low = np.where(warm, value._low * value._width, 0.0)
            high = np.where(warm, (value._high + 1) * value._width, 0.0)
        distance = self._distance_of(slots, x, low, high)
        odd = self.shape.update(distance, time_ns)
        has_shape = ~np.isnan(distance)

        penalty = self.penalty
        # A channel's quiet slots have their level computed only when read: -inf in `_level`
        # until then, and below the recover threshold, so the strongest level crosses and
        # recovers as with theirs (a derived one, less the penalty, stays below it too).
        level = self.value._level.copy()
        for channel, has in ((self.volatility, has_wobble), (self.shape, has_shape)):
            level = np.where(has, np.maximum(level, channel._level - penalty), level)
        crossed = valid & (level >= self.threshold)
        recovered = ~valid | (level < self.recover_threshold)
        score = StrongestScore((verdict.score, wobble.score, odd.score), has_wobble, has_shape,
                               valid, penalty)
        names = (None, "volatility", "window shape")

        def note(slot: int) -> str:
            best, chosen = score.strongest(np.array([slot]))
            if not valid[slot] or chosen[0] == 0:
                return verdict.note(slot) if verdict.note else ""
            return (f"{names[chosen[0]]} unusual (score {best[0] + penalty:.2f} - "
                    f"{penalty:g})")

        return BatchVerdicts(crossed, recovered, verdict.threshold, score, note)

    def _volatility_of(self, slots: Any, x: Any) -> Any:
        """Volatility.learn_one for the slots with a value; NaN where there is none yet."""
        import numpy as np

        out = np.full(self._size, np.nan)
        previous = self._previous[slots]
        self._previous[slots] = x[slots]
        later = slots[~np.isnan(previous)]
        if not len(later):
            return out
        change = np.abs(x[later] - previous[~np.isnan(previous)])
        place = self._next[later]
        filled = self._changed[later]
        leaving = np.where(filled == self.span, self._changes[place, later], 0.0)
        total = self._sum[later] - leaving
        self._changes[place, later] = change
        self._next[later] = (place + 1) % self.span
        self._changed[later] = filled = np.minimum(filled + 1, self.span)
        with np.errstate(invalid="ignore", over="ignore"):
            total = total + change
        since = self._since[later] + 1
        exact = (leaving > total) | (since >= filled) | ~np.isfinite(total)
        redone = np.flatnonzero(exact)  # the slots whose sum is recomputed exactly
        if len(redone):
            columns = self._changes[:, later[redone]].T.tolist()
            total[redone] = [exact_sum(changes) for changes in columns]
            since[redone] = 0
        self._sum[later], self._since[later] = total, since
        out[later] = np.maximum(total, 0.0) / filled
        return out

    def _distance_of(self, slots: Any, x: Any, low: Any, high: Any) -> Any:
        """WindowShape.learn_one for the slots with a value; NaN where there is no distance."""
        import numpy as np

        self._partial[slots] += x[slots]
        count = self._count[slots] + 1
        self._count[slots] = count
        ended = slots[count >= self.segment]
        if len(ended):
            seen = self._means_seen[ended]
            self._means[seen % self.segments, ended] = self._partial[ended] / self._count[ended]
            self._means_seen[ended] = seen = seen + 1
            self._partial[ended], self._count[ended] = 0.0, 0
            full = ended[(seen >= self.segments) & (high[ended] > low[ended])]
            if len(full):
                self._learn_shapes(full, low, high)
        out = np.full(self._size, np.nan)
        out[slots] = self._distance[slots]
        return out

    def _ensure_rows(self, slots: Any) -> None:
        """Give the slots without a prototype memory a row of the store (a freed one first)."""
        import numpy as np

        new = slots[self._row[slots] < 0]
        if not len(new):
            return
        reused = [self._free.pop() for _ in range(min(len(self._free), len(new)))]
        fresh = len(new) - len(reused)
        rows = self._store_count.size
        if fresh:  # grown by a quarter at least, so that slots joining one by one copy little
            extra = max(fresh, rows // 4)
            self._store = np.concatenate(
                [self._store, np.zeros((extra, *self._store.shape[1:]))])
            self._store_uses = np.concatenate(
                [self._store_uses, np.zeros((extra, self._store_uses.shape[1]))])
            self._store_count = np.concatenate([self._store_count,
                                                np.zeros(extra, dtype=np.int64)])
            self._free.extend(range(rows + extra - 1, rows + fresh - 1, -1))
        given = np.asarray(reused + list(range(rows, rows + fresh)), dtype=np.int64)
        self._row[new] = given
        self._store_count[given] = 0

    def _widen(self, count: int) -> None:
        """Make room for `count` prototypes a row (doubling, at most `prototypes`)."""
        import numpy as np

        held = self._store.shape[1]
        if count <= held:
            return
        wider = min(self.capacity, max(count, 2 * held))
        rows = len(self._store)
        self._store = np.concatenate(
            [self._store, np.zeros((rows, wider - held, self.segments))], axis=1)
        self._store_uses = np.concatenate([self._store_uses, np.zeros((rows, wider - held))],
                                          axis=1)

    def _learn_shapes(self, slots: Any, low: Any, high: Any) -> None:
        """WindowShape's prototype step for the slots at a boundary with a full window, a block
        of slots at a time with the per-series detector's numpy operations element for element
        (the distance's mean over the last, contiguous axis sums as that detector's does: bit
        for bit, tests/test_anomaly_channels_batch.py). Vectorised because, per slot in Python,
        a tick at a segment boundary took 2.8 s for 100,000 series that started together
        (benchmarks/detector_throughput.py)."""
        import numpy as np

        self._ensure_rows(slots)
        rows_of = self._row[slots]
        counts = self._store_count[rows_of]
        self._widen(int(min(self.capacity, counts.max() + 1)))
        segments, held = self.segments, self._store.shape[1]
        block = max(1, _BLOCK_NUMBERS // (held * segments))
        steps = np.arange(segments)
        for first in range(0, len(slots), block):
            slot = slots[first:first + block]
            row = rows_of[first:first + block]
            count = counts[first:first + block]
            start = self._means_seen[slot] % segments  # the oldest mean
            means = self._means[(start[:, None] + steps) % segments, slot[:, None]]
            with np.errstate(over="ignore", invalid="ignore"):
                shape = (means - low[slot, None]) / (high[slot] - low[slot])[:, None]
            finite = np.isfinite(shape).all(axis=1)
            if not finite.all():  # overflowed near the float limit: not learnt (WindowShape)
                slot, row, count, shape = slot[finite], row[finite], count[finite], shape[finite]
                if not len(slot):
                    continue
            uses = self._store_uses[row] * _USE_DECAY
            width = max(1, int(count.max()))  # the block's prototypes, no further
            distances = np.abs(self._store[row, :width] - shape[:, None, :]).mean(axis=2)
            distances[np.arange(width) >= count[:, None]] = math.inf  # no prototype there
            best = distances.argmin(axis=1)  # the first of equal distances, as per series
            here = np.arange(len(slot))
            distance = distances[here, best]  # inf for a slot without prototypes yet
            matched = distance <= self.vigilance  # resonance: the prototype learns the shape
            on, at = row[matched], best[matched]
            learnt = self._store[on, at]
            self._store[on, at] = learnt + self.learning_rate * (shape[matched] - learnt)
            uses[here[matched], at] += 1.0
            added = ~matched & (count < self.capacity)
            on, at = row[added], count[added]
            self._store[on, at] = shape[added]
            uses[here[added], at] = 1.0
            self._store_count[on] = at + 1
            replacing = ~matched & ~added  # the memory is full: the least used one goes
            at = uses[replacing].argmin(axis=1)
            self._store[row[replacing], at] = shape[replacing]
            uses[here[replacing], at] = 1.0
            self._store_uses[row] = uses
            # the first shape has nothing to be far from: no distance (WindowShape's None)
            self._distance[slot] = np.where(np.isfinite(distance), distance, math.nan)

    @property
    def _prototypes(self) -> dict[int, list[Any]]:
        """slot -> [prototypes, uses] of the slots with a prototype memory (views)."""
        import numpy as np

        out = {}
        for slot in np.flatnonzero(self._row >= 0).tolist():
            row = int(self._row[slot])
            count = int(self._store_count[row])
            out[slot] = [self._store[row, :count], self._store_uses[row, :count]]
        return out


class StrongestScore(SlotsWhenRead):
    """AnomalyChannelsBatch's scores, the strongest channel's, read a slot at a time as the
    engine does (its channels' DeferredScores compute a quiet slot's when read); numpy reads
    it whole (np.asarray)."""

    def __init__(self, scores: tuple[Any, Any, Any], has_wobble: Any, has_shape: Any,
                 valid: Any, penalty: float) -> None:
        self._scores, self._has = scores, (has_wobble, has_shape)
        self._valid, self._penalty = valid, penalty
        self._whole: Any = None

    def __len__(self) -> int:
        return len(self._valid)

    def strongest(self, slots: Any) -> tuple[Any, Any]:
        """The best score of `slots` (an integer array) and which channel gave it (0 the value,
        1 volatility, 2 window shape), as AnomalyChannels.update chooses."""
        import numpy as np

        value, wobble, odd = self._scores
        best = value.take(slots)
        chosen = np.zeros(len(slots), dtype=np.int8)
        for which, (result, has) in enumerate(zip((wobble, odd), self._has, strict=True), 1):
            marks = result.take(slots) - self._penalty
            higher = has[slots] & (marks > best)  # max() keeps the first of equal channels
            best = np.where(higher, marks, best)
            chosen[higher] = which
        return best, chosen

    def take(self, slots: Any) -> Any:
        import numpy as np

        best, _ = self.strongest(slots)
        return np.where(self._valid[slots], np.maximum(0.0, best), 0.0)


AnomalyChannels.batch = AnomalyChannelsBatch


@hookimpl
def sloguard_detectors() -> list[type]:
    return [AnomalyChannels]
