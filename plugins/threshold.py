"""The threshold detector (a built-in plugin): static bounds with hysteresis.

A separate recover threshold keeps a value that hovers at the bound from flapping the incident
open and closed (and, later, the actuators on and off).
"""

from __future__ import annotations

import math
from typing import Any

from sloguard.detector.api import BatchVerdicts, Verdict, hookimpl, reject_unknown


class Threshold:
    """`above: X` (or `below: X`), optional `recover_below` (or `recover_above`)."""

    name = "threshold"
    per_value = True  # its hysteresis sees the same value twice the same way (`on_arrival`)

    def __init__(self, params: dict[str, Any]) -> None:
        reject_unknown(params, {"above", "below", "recover_below", "recover_above"}, self.name)
        if ("above" in params) == ("below" in params):
            raise ValueError("threshold needs exactly one of `above` or `below`")
        self.upward = "above" in params
        try:
            self.bound = float(params["above" if self.upward else "below"])
            recover_key = "recover_below" if self.upward else "recover_above"
            self.recover = float(params.get(recover_key, self.bound))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"threshold values must be numbers: {exc}") from exc
        if self.upward and self.recover > self.bound:
            raise ValueError("recover_below must not be above `above`")
        if not self.upward and self.recover < self.bound:
            raise ValueError("recover_above must not be below `below`")
        if ("recover_above" in params and self.upward) or ("recover_below" in params and not (
            self.upward
        )):
            raise ValueError("use recover_below with above, recover_above with below")

    def update(self, value: float, time_ns: int = 0) -> Verdict:
        """Missing data (NaN) never crosses; it counts as recovered (the series went away)."""
        if value is None or math.isnan(value):
            return Verdict(False, True, self.bound)
        if self.upward:
            return Verdict(value > self.bound, value <= self.recover, self.bound)
        return Verdict(value < self.bound, value >= self.recover, self.bound)


class ThresholdBatch:
    """The same bounds over every series of a rule in one numpy comparison (no state)."""

    def __init__(self, params: dict[str, Any]) -> None:
        probe = Threshold(params)
        self.upward, self.bound, self.recover = probe.upward, probe.bound, probe.recover

    def reset(self, slots: Any) -> None:
        pass  # stateless

    def compact(self, keep: Any) -> None:
        pass  # stateless: the engine's slots move, nothing here does

    def update(self, values: Any, time_ns: int = 0) -> BatchVerdicts:
        import numpy as np

        values = np.asarray(values, dtype=float)
        missing = np.isnan(values)
        with np.errstate(invalid="ignore"):
            if self.upward:
                crossed, recovered = values > self.bound, values <= self.recover
            else:
                crossed, recovered = values < self.bound, values >= self.recover
        return BatchVerdicts(crossed & ~missing, recovered | missing, self.bound)


Threshold.batch = ThresholdBatch


@hookimpl
def sloguard_detectors() -> list[type]:
    return [Threshold]
