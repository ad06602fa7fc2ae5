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

from sloguard.detector.api import Verdict, hookimpl, reject_unknown

PARAMS = {"threshold", "recover_threshold", "direction", "warmup", "bins", "resolution",
           "radius", "rarity", "memory", "average", "fading_factor", "tolerance",
           "novelty_span", "independence"}
_LOG_EPSILON = math.log(1e-10)  # score 1.0: a tail probability of 1e-10
_RED_TAIL, _YELLOW_TAIL = 1e-5, 1e-3  # Numenta's red and yellow zones
_MIN_MEAN, _MIN_VAR = 0.03, 0.0003  # Numenta's floors of the raw scores' statistics
_PRUNE = 0.01  # a bin whose weight decayed under 1% of one fresh value is forgotten


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
