"""baseline_ratio: fire when a signal rises well above its own learned baseline.

Why: measured on the lab node, an LS process at rest already showed ~8 us of run-queue wait per
timeslice and ~3% cgroup CPU PSI, and each node and service has its own resting level. A fixed
threshold either misses interference on a quiet signal or fires all day on a busy one. This
detector learns each series' baseline (an exponentially weighted mean, updated only while the
series is not crossed, so an incident does not teach it that the incident is normal) and fires
when the value exceeds `factor` times that baseline and an absolute `floor`.

Parameters (rule `params`):
  factor:         how many times the baseline counts as interference (default 3)
  recover_factor: back below this multiple counts as recovered (default: factor / 1.5)
  floor:          never fire below this absolute value (default 0)
  half_life:      evaluations for the baseline to move halfway to a new level (default 60)
  warmup:         evaluations before it may fire (default 30)
"""

from __future__ import annotations

import math
from typing import Any

from sloguard.detector.api import Verdict, hookimpl, reject_unknown

_PARAMS = {"factor", "recover_factor", "floor", "half_life", "warmup"}


class BaselineRatio:
    name = "baseline_ratio"

    def __init__(self, params: dict[str, Any]) -> None:
        reject_unknown(params, _PARAMS, self.name)
        try:
            self.factor = float(params.get("factor", 3.0))
            self.recover_factor = float(params.get("recover_factor", self.factor / 1.5))
            self.floor = float(params.get("floor", 0.0))
            half_life = float(params.get("half_life", 60))
            self.warmup = int(params.get("warmup", 30))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"baseline_ratio parameters must be numbers: {exc}") from exc
        if self.factor <= 1 or not 1 <= self.recover_factor <= self.factor:
            raise ValueError("need factor > 1 and 1 <= recover_factor <= factor")
        if half_life <= 0 or self.warmup < 0:
            raise ValueError("half_life must be > 0 and warmup >= 0")
        self.alpha = 1 - 0.5 ** (1 / half_life)
        self.baseline: float | None = None
        self.seen = 0
        self.active = False

    def update(self, value: float, time_ns: int) -> Verdict:
        if math.isnan(value):
            return Verdict(False, True, None, "no data")
        self.seen += 1
        if self.baseline is None:
            self.baseline = value
        bound = max(self.factor * self.baseline, self.floor)
        recover = max(self.recover_factor * self.baseline, self.floor)
        crossed = self.seen > self.warmup and value > bound
        recovered = value <= recover
        self.active = crossed or (self.active and not recovered)
        if not self.active:  # learn only from what is not an incident
            self.baseline += self.alpha * (value - self.baseline)
        return Verdict(crossed, recovered, bound,
                       f"{value / self.baseline:.1f}x baseline" if self.baseline else "")


@hookimpl
def sloguard_detectors() -> list[type]:
    return [BaselineRatio]
