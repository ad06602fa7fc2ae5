"""What a detector plugin imports: the hook marker, the verdict, the detector protocol.

    from sloguard.detector.api import Verdict, hookimpl

    class PsiStall:
        name = "psi_stall"

        def __init__(self, params):
            self.limit = float(params.get("limit", 20))

        def update(self, value, time_ns):
            return Verdict(crossed=value > self.limit, recovered=value <= self.limit,
                           threshold=self.limit)

    @hookimpl
    def sloguard_detectors():
        return [PsiStall]

See docs/plugins.md for the whole guide.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

from sloguard.detector.hookspecs import hookimpl

__all__ = ["Detector", "Verdict", "hookimpl", "reject_unknown"]


@dataclass(frozen=True, slots=True)
class Verdict:
    """What one value means for an alert.

    `crossed`: past the firing bound (starts pending, keeps pending). `recovered`: past the
    recover bound (counts toward `recover_for` of a firing alert). Between the two, a firing
    alert stays firing and a pending one is cancelled: the hysteresis band. `threshold` is the
    bound shown as evidence next to the value; `note` says why, in a few words. `score`, when
    a detector has one, grades how anomalous the value is (used by `sloguard score nab`).
    """

    crossed: bool
    recovered: bool
    threshold: float | None = None
    note: str = ""
    score: float | None = None  # optional anomaly score in [0, 1], for benchmarks and charts


def reject_unknown(params: dict[str, Any], allowed: set[str], detector: str) -> None:
    """Refuse misspelt parameters: a typo must fail the rule file, not silently use a default."""
    unknown = set(params) - allowed
    if unknown:
        raise ValueError(f"unknown {detector} parameter(s): {', '.join(sorted(unknown))}")


class Detector(Protocol):
    name: ClassVar[str]

    def __init__(self, params: dict[str, Any]) -> None: ...

    def update(self, value: float, time_ns: int) -> Verdict: ...
