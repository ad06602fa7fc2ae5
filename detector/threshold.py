"""Static thresholds with hysteresis.

A separate recover threshold keeps a value that hovers at the bound from flapping the incident
open and closed (and, later, the actuators on and off).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Verdict:
    active: bool
    threshold: float | None


class Threshold:
    """`above: X` (or `below: X`), optional `recover_below` (or `recover_above`)."""

    def __init__(self, params: dict[str, Any]) -> None:
        unknown = set(params) - {"above", "below", "recover_below", "recover_above"}
        if unknown:
            raise ValueError(f"unknown threshold parameter(s): {', '.join(sorted(unknown))}")
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
        self.active = False

    def update(self, value: float) -> Verdict:
        """Missing data (NaN) never activates; it counts as recovered for an active one."""
        if value is None or math.isnan(value):
            self.active = False
        elif self.upward:
            self.active = value > self.bound if not self.active else value > self.recover
        else:
            self.active = value < self.bound if not self.active else value < self.recover
        return Verdict(self.active, self.bound)


DETECTORS = {"threshold": Threshold}


def make_detector(kind: str, params: dict[str, Any]) -> Threshold:
    try:
        factory = DETECTORS[kind]
    except KeyError:
        raise ValueError(f"unknown detector {kind!r} (available: {', '.join(DETECTORS)})") from None
    return factory(params)
