"""The EWMA detector (a built-in plugin): how far a value is from the series' own recent normal.

Measured on the lab node, each signal has its own resting level and noise (an idle LS process
already showed ~8 us run-queue wait per timeslice), so fixed thresholds are either deaf or
noisy. This detector keeps an exponentially weighted mean and variance per series with river's
streaming statistics and fires when the z-score leaves a band, after a warm-up. It stops
learning while an alert is active, so an incident never teaches it that the incident is normal.

Parameters (rule `params`):
  fading_factor  weight of the newest value in the mean and variance, 0 < f <= 1 (default 0.1)
  band           z-score that counts as crossed (default 3)
  recover_band   z-score at or under which it counts as recovered (default 1)
  direction      up, down or both (default up: interference raises latency and stalls)
  warmup         evaluations to learn from before it may fire (default 30)
  min_std        floor of the standard deviation, in the signal's unit (default 0)
  freeze         stop learning while an alert is active (default true); false keeps adapting,
                 so a lasting new level becomes the normal (anomaly scoring rather than alerting)
  refractory     after a crossing, hold the anomaly score (not the alert) at 0 for this many
                 evaluations (default 0): benchmarks such as NAB count every flagged row
"""

from __future__ import annotations

import math
from typing import Any

from sloguard.detector.api import BatchVerdicts, Verdict, hookimpl, reject_unknown

_PARAMS = {"fading_factor", "band", "recover_band", "direction", "warmup", "min_std", "freeze",
           "refractory"}


class EWMA:
    name = "ewma"

    def __init__(self, params: dict[str, Any]) -> None:
        reject_unknown(params, _PARAMS, self.name)
        try:
            fading = float(params.get("fading_factor", 0.1))
            self.band = float(params.get("band", 3.0))
            self.recover_band = float(params.get("recover_band", 1.0))
            self.warmup = int(params.get("warmup", 30))
            self.min_std = float(params.get("min_std", 0.0))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"ewma parameters must be numbers: {exc}") from exc
        try:
            self.refractory = int(params.get("refractory", 0))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"refractory must be a number of evaluations: {exc}") from exc
        if self.refractory < 0:
            raise ValueError("refractory must not be negative")
        self._quiet = 0
        self.freeze = params.get("freeze", True)
        if not isinstance(self.freeze, bool):
            raise ValueError("freeze must be true or false")
        self.direction = params.get("direction", "up")
        if self.direction not in ("up", "down", "both"):
            raise ValueError("direction must be up, down or both")
        if not 0 < fading <= 1:
            raise ValueError("fading_factor must be in (0, 1]")
        if self.band <= 0 or not 0 <= self.recover_band <= self.band:
            raise ValueError("need band > 0 and 0 <= recover_band <= band")
        if self.warmup < 0 or self.min_std < 0:
            raise ValueError("warmup and min_std must not be negative")
        from river import stats  # only nodes with EWMA rules pay for river

        self.mean = stats.EWMean(fading_factor=fading)
        self.var = stats.EWVar(fading_factor=fading)
        self.learned = 0
        self.active = False

    def zscore(self, value: float) -> float:
        std = max(math.sqrt(max(self.var.get(), 0.0)), self.min_std)
        delta = value - self.mean.get()
        if std == 0:
            return 0.0 if delta == 0 else math.copysign(math.inf, delta)
        return delta / std

    def update(self, value: float, time_ns: int) -> Verdict:
        if math.isnan(value):
            return Verdict(False, True, None, "no data")
        if self.learned < max(self.warmup, 2):  # too little history for a variance
            self._learn(value)
            return Verdict(False, True, None, f"warming up ({self.learned}/{self.warmup})")
        z = self.zscore(value)
        deviation = {"up": z, "down": -z, "both": abs(z)}[self.direction]
        crossed = deviation > self.band
        recovered = deviation <= self.recover_band
        self.active = crossed or (self.active and not recovered)
        std = max(math.sqrt(max(self.var.get(), 0.0)), self.min_std)
        sign = -1 if self.direction == "down" or (self.direction == "both" and z < 0) else 1
        threshold = self.mean.get() + sign * self.band * std
        if not (self.active and self.freeze):
            self._learn(value)
        grade = _grade(deviation, self.band)
        if self._quiet > 0:  # just reported: hold the score (not the alert) for a while
            self._quiet -= 1
            grade = 0.0
        elif crossed and self.refractory:
            self._quiet = self.refractory
        return Verdict(crossed, recovered, threshold, f"z={z:.1f}", score=grade)

    def _learn(self, value: float) -> None:
        self.mean.update(value)
        self.var.update(value)
        self.learned += 1


def _grade(deviation: float, band: float) -> float:
    """Anomaly score in [0, 1): 0.5 at the band. Unlike a normal tail probability it does not
    round to exactly 1 for large z, so a benchmark's threshold can still rank big deviations."""
    if deviation <= 0:
        return 0.0
    if math.isinf(deviation):
        return 1.0
    return deviation / (deviation + band)


@hookimpl
def sloguard_detectors() -> list[type]:
    return [EWMA]


class EWMABatch:
    """The `ewma` detector over many series at once, on numpy arrays (the engine's batch path).

    Same recurrences as river's EWMean and EWVar (mean_t = f x + (1 - f) mean_{t-1}, and the
    variance as the EW mean of x^2 minus the squared EW mean), the same warm-up, band, direction
    and freeze, checked value for value against the per-series detector in the tests. One
    update of 100,000 series is a handful of vector operations instead of 100,000 Python calls
    (benchmarks/detector_throughput.py). It gives no anomaly score (`refractory` only shapes
    scores, for benchmarks, which use the per-series detector).
    """

    def __init__(self, params: dict[str, Any]) -> None:
        import numpy as np

        probe = EWMA(params)  # the parameters are EWMA's, validated with the same messages
        self.fading = probe.mean.fading_factor
        self.band, self.recover_band = probe.band, probe.recover_band
        self.warmup, self.min_std = probe.warmup, probe.min_std
        self.direction, self.freeze = probe.direction, probe.freeze
        self.mean = np.zeros(0)
        self.square = np.zeros(0)
        self.learned = np.zeros(0, dtype=np.int64)
        self.active = np.zeros(0, dtype=bool)

    def _grow(self, size: int) -> None:
        import numpy as np

        extra = size - len(self.mean)
        if extra > 0:
            self.mean = np.concatenate([self.mean, np.zeros(extra)])
            self.square = np.concatenate([self.square, np.zeros(extra)])
            self.learned = np.concatenate([self.learned, np.zeros(extra, dtype=np.int64)])
            self.active = np.concatenate([self.active, np.zeros(extra, dtype=bool)])

    def reset(self, slots: Any) -> None:
        import numpy as np

        slots = np.asarray(slots, dtype=np.int64)
        if len(slots):
            self._grow(int(slots.max()) + 1)
            self.mean[slots] = self.square[slots] = 0.0
            self.learned[slots] = 0
            self.active[slots] = False

    def compact(self, keep: Any) -> None:
        """Slots `keep` (sorted, distinct) become slots 0, 1, ...; the others are forgotten
        (the batch contract's `compact`). Growth stays a copy (no room kept): each update
        makes its arrays anew anyway, so a copy on growth is a fraction of that tick."""
        import numpy as np

        keep = np.asarray(keep, dtype=np.int64)
        self.mean, self.square = self.mean[keep], self.square[keep]
        self.learned, self.active = self.learned[keep], self.active[keep]

    def update(self, values: Any, time_ns: int = 0) -> BatchVerdicts:
        import numpy as np

        values = np.asarray(values, dtype=float)
        self._grow(len(values))
        size = len(values)
        if size < len(self.mean):  # slots this call does not mention have no data
            values = np.concatenate([values, np.full(len(self.mean) - size, np.nan)])
        mean, square, learned = self.mean, self.square, self.learned
        valid = ~np.isnan(values)
        warm = learned < max(self.warmup, 2)
        std = np.maximum(np.sqrt(np.maximum(square - mean**2, 0.0)), self.min_std)
        x = np.where(valid, values, 0.0)
        delta = x - mean
        with np.errstate(divide="ignore", invalid="ignore"):
            z = delta / std
        flat = std == 0  # no spread yet: any move is infinitely unusual, none is nothing
        if flat.any():
            z[flat] = np.where(delta[flat] == 0, 0.0, np.copysign(np.inf, delta[flat]))
        deviation = {"up": z, "down": -z, "both": np.abs(z)}[self.direction]
        judged = valid & ~warm
        crossed = judged & (deviation > self.band)
        recovered = ~judged | (deviation <= self.recover_band)
        sign = -1.0 if self.direction == "down" else 1.0
        if self.direction == "both":
            sign = np.where(z < 0, -1.0, 1.0)
        threshold = mean + sign * self.band * std
        threshold[~judged] = np.nan
        self.active = active = np.where(judged, crossed | (self.active & ~recovered),
                                        self.active)
        learn = valid & (warm | ~(active & self.freeze)) if self.freeze else valid
        first = learn & (learned == 0)
        later = learn & ~first
        f = self.fading
        self.mean = np.where(first, x, np.where(later, f * x + (1 - f) * mean, mean))
        self.square = np.where(first, x * x, np.where(later, f * x * x + (1 - f) * square,
                                                      square))
        self.learned = learned = learned + learn
        counts = learned

        def note(slot: int) -> str:
            if not valid[slot]:
                return "no data"
            if warm[slot]:
                return f"warming up ({counts[slot]}/{self.warmup})"
            return f"z={z[slot]:.1f}"

        return BatchVerdicts(crossed, recovered, threshold, None, note)


EWMA.batch = EWMABatch
