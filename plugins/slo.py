"""SLO detectors (built-in plugins): a latency percentile against its target, and error-budget
burn rate.

Interference matters only as far as LS services feel it (../shared/notes/colocation-lab.md:
under a cache antagonist no node or cgroup signal moved, only LS p99 did), so these are what
escalations should be anchored to.

slo_latency: the rule's value is a latency percentile (e.g. `aggregate: p99` of a latency
  field); fires above `target`, recovers at or under `target x recover_ratio`.
  params: target (required, in the field's unit), recover_ratio (default 0.9)

burn_rate: the rule's value is the error ratio of the evaluation (bad / total, 0..1). With an
  objective of 99.9% the error budget is 0.1%; burning it `factor` times too fast over both a
  long and a short window fires (the multiwindow burn-rate alert of Google's SRE workbook: the
  long window for significance, the short one so it resets quickly once the burn stops).
  params: objective (default 0.999), factor (default 14.4: 2% of a 30-day budget in 1 hour),
  long (evaluations, default 60), short (evaluations, default 5), input (default `ratio`).
  With `input: burn` the value is already the burn rate (the error ratio divided by the
  allowed one: 1.0 spends the budget exactly as fast as allowed), as in the `burn_rate` field
  of `app_slo` samples, where each service brings its own objective; `objective` is then not
  given.

Per-service objectives: rules have one set of parameters, so the application-latency collector
writes values relative to each service's objective (`app_slo`: `latency_ratio` = the percentile
over its target, `burn_rate`); one rule with `target: 1` then guards every service
(rules/ls-latency-slo.yaml, docs/app-latency.md).
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any

from sloguard.detector.api import Verdict, hookimpl, reject_unknown


class SloLatency:
    name = "slo_latency"
    # judges each value on its own: evaluating it again on new data (a rule's `on_arrival`)
    # teaches it nothing twice
    per_value = True

    def __init__(self, params: dict[str, Any]) -> None:
        reject_unknown(params, {"target", "recover_ratio"}, self.name)
        if "target" not in params:
            raise ValueError("slo_latency needs `target` (the latency objective)")
        try:
            self.target = float(params["target"])
            self.recover = self.target * float(params.get("recover_ratio", 0.9))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"slo_latency parameters must be numbers: {exc}") from exc
        if self.target <= 0 or not 0 < self.recover <= self.target:
            raise ValueError("need target > 0 and 0 < recover_ratio <= 1")

    def update(self, value: float, time_ns: int) -> Verdict:
        if math.isnan(value):
            return Verdict(False, True, None, "no data")
        return Verdict(value > self.target, value <= self.recover, self.target,
                       f"{value / self.target:.2f}x the target")


class BurnRate:
    name = "burn_rate"

    def __init__(self, params: dict[str, Any]) -> None:
        reject_unknown(params, {"objective", "factor", "long", "short", "input"}, self.name)
        self.input = params.get("input", "ratio")
        if self.input not in ("ratio", "burn"):
            raise ValueError(f"burn_rate input must be `ratio` or `burn`, got {self.input!r}")
        if self.input == "burn" and "objective" in params:
            raise ValueError("burn_rate with input: burn takes no objective (the value is "
                             "already relative to it)")
        try:
            objective = float(params.get("objective", 0.999))
            self.factor = float(params.get("factor", 14.4))
            long, short = int(params.get("long", 60)), int(params.get("short", 5))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"burn_rate parameters must be numbers: {exc}") from exc
        if not 0 < objective < 1 or self.factor <= 0 or not 1 <= short <= long:
            raise ValueError("need 0 < objective < 1, factor > 0 and 1 <= short <= long")
        self.budget = 1.0 if self.input == "burn" else 1 - objective
        self.long: deque[float] = deque(maxlen=long)
        self.short: deque[float] = deque(maxlen=short)

    def update(self, value: float, time_ns: int) -> Verdict:
        if math.isnan(value):
            return Verdict(False, True, None, "no data")
        if self.input == "burn" and value < 0:
            raise ValueError(f"burn_rate expects a burn rate >= 0, got {value}")
        if self.input == "ratio" and not 0 <= value <= 1:
            raise ValueError(f"burn_rate expects an error ratio in [0, 1], got {value}")
        self.long.append(value)
        self.short.append(value)
        long_burn = sum(self.long) / len(self.long) / self.budget
        short_burn = sum(self.short) / len(self.short) / self.budget
        full = len(self.long) == self.long.maxlen
        return Verdict(full and long_burn > self.factor and short_burn > self.factor,
                       short_burn <= self.factor, self.factor,
                       f"burning {long_burn:.1f}x (long) {short_burn:.1f}x (short)")


@hookimpl
def sloguard_detectors() -> list[type]:
    return [SloLatency, BurnRate]
