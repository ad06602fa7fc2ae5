"""The Page-Hinkley detector (a built-in plugin): streaming change detection, O(1) per value.

The change-point detector segments a window on every evaluation; Page-Hinkley (river's
`drift.PageHinkley`) keeps a cumulative deviation instead and costs almost nothing per value,
for rules over many series. It fires when a sustained shift accumulates past `threshold`, and,
like the change-point detector, then holds the level from before the shift and recovers when the
recent values have come back more than half way to it.

Parameters (rule `params`), as river's:
  threshold      cumulative deviation that counts as a change, in the signal's unit (default 50)
  delta          tolerated magnitude of change (default 0.005)
  alpha          forgetting factor of the cumulative sum (default 0.9999)
  min_instances  values before it may fire (default 30)
  direction      up, down or both (default up)
  recent         values averaged to judge recovery (default 5)
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any

from sloguard.detector.api import Verdict, hookimpl, reject_unknown

_PARAMS = {"threshold", "delta", "alpha", "min_instances", "direction", "recent"}
_MODE = {"up": "up", "down": "down", "both": "both"}


class PageHinkley:
    name = "page_hinkley"

    def __init__(self, params: dict[str, Any]) -> None:
        reject_unknown(params, _PARAMS, self.name)
        direction = params.get("direction", "up")
        if direction not in _MODE:
            raise ValueError("direction must be up, down or both")
        try:
            self.threshold = float(params.get("threshold", 50.0))
            delta = float(params.get("delta", 0.005))
            alpha = float(params.get("alpha", 0.9999))
            min_instances = int(params.get("min_instances", 30))
            recent = int(params.get("recent", 5))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"page_hinkley parameters must be numbers: {exc}") from exc
        if self.threshold <= 0 or delta < 0 or not 0 < alpha <= 1 or min_instances < 1 or (
                recent < 1):
            raise ValueError("need threshold > 0, delta >= 0, 0 < alpha <= 1, "
                             "min_instances >= 1, recent >= 1")
        from river import drift, stats  # only nodes with Page-Hinkley rules pay for river

        self._make = lambda: drift.PageHinkley(min_instances=min_instances, delta=delta,
                                               threshold=self.threshold, alpha=alpha,
                                               mode=_MODE[direction])
        self._ph = self._make()
        self._level = stats.Mean()  # the current regime's level, learnt while quiet
        self._recent: deque[float] = deque(maxlen=recent)
        self.before: float | None = None  # the level before the drift that fired
        self._shift = 0.0

    def update(self, value: float, time_ns: int) -> Verdict:
        if math.isnan(value):
            return Verdict(False, True, None, "no data")
        self._recent.append(value)
        if self.before is not None:
            now = sum(self._recent) / len(self._recent)
            if self._shift and (now - self.before) / self._shift > 1:
                self._shift = now - self.before  # the window now holds only the new level
            shift = self._shift
            if shift and (now - self.before) / shift > 0.5:
                return Verdict(True, False, self.before, f"{now - self.before:+.3g} from before")
            self.before = None
            self._ph, self._level = self._make(), type(self._level)()
            return Verdict(False, True, None, "back to the level before the change")
        level = self._level.get() if self._level.n else value
        self._ph.update(value)
        if self._ph.drift_detected and self._level.n:
            self.before = level
            self._shift = sum(self._recent) / len(self._recent) - level or 1e-12
            return Verdict(True, False, level, f"drift from {level:.3g}")
        self._level.update(value)
        return Verdict(False, True, None)


@hookimpl
def sloguard_detectors() -> list[type]:
    return [PageHinkley]
