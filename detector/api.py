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

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

from sloguard.detector.hookspecs import hookimpl

__all__ = ["BatchDetector", "BatchVerdicts", "Detector", "Verdict", "hookimpl", "reject_unknown"]


@dataclass(frozen=True, slots=True)
class Verdict:
    """What one value means for an alert.

    `crossed`: past the firing bound (starts pending, keeps pending). `recovered`: past the
    recover bound (counts toward `recover_for` of a firing alert). Between the two, a firing
    alert stays firing and a pending one is cancelled: the hysteresis band. `threshold` is the
    bound shown as evidence next to the value; `note` says why, in a few words. `score`, when
    a detector has one, grades how anomalous the value is (used by `sloguard score nab`).
    `change_ns`, from a change-point detector, says when the change began: the incident page
    marks it on the chart.
    """

    crossed: bool
    recovered: bool
    threshold: float | None = None
    note: str = ""
    score: float | None = None  # optional anomaly score in [0, 1], for benchmarks and charts
    change_ns: int | None = None  # when the level changed (change-point detectors): charted


@dataclass(frozen=True, slots=True)
class BatchVerdicts:
    """The verdicts of every slot of a batch detector at once, as numpy arrays.

    `crossed` and `recovered` are boolean arrays, one entry per slot; `threshold` and `score`
    float arrays (or None). `note(slot)` is called only for the few slots the engine shows as
    evidence, so a batch detector never formats 100,000 strings it does not need; `score` may
    likewise be any sequence of floats that numpy can read (`score[slot]`, `len`,
    `np.asarray`) whose entries are computed when read (the anomaly batches' DeferredScores).
    """

    crossed: Any
    recovered: Any
    threshold: Any = None
    score: Any = None
    note: Callable[[int], str] | None = None


def reject_unknown(params: dict[str, Any], allowed: set[str], detector: str) -> None:
    """Refuse misspelt parameters: a typo must fail the rule file, not silently use a default."""
    unknown = set(params) - allowed
    if unknown:
        raise ValueError(f"unknown {detector} parameter(s): {', '.join(sorted(unknown))}")


class Detector(Protocol):
    name: ClassVar[str]

    def __init__(self, params: dict[str, Any]) -> None: ...

    def update(self, value: float, time_ns: int) -> Verdict: ...


class BatchDetector(Protocol):
    """The same detector over many series at once: one numpy call per evaluation instead of one
    Python call per series (benchmarks/detector_throughput.py: 100,000 series in ~2 ms).

    Optional. A detector type offers it as the class attribute `batch`; the engine then keeps
    one batch per rule and gives each series a slot. It must give, slot for slot, the verdicts
    the per-series detector gives (the project tests its own against theirs).
    """

    def __init__(self, params: dict[str, Any]) -> None: ...

    def reset(self, slots: Any) -> None:
        """Forget what these slots learned: a new series took them over."""

    def update(self, values: Any, time_ns: int) -> BatchVerdicts:
        """One evaluation of every slot; `values` is a float array, NaN where there is no data
        (an unused slot or a series without data: neither learns nor crosses). Slots beyond
        what the batch has seen so far are new and start fresh."""

    # Optional, looked up with getattr (a batch without it never shrinks after a peak):
    # def compact(self, keep) -> None:
    #     """Slots `keep` (sorted, distinct int64 array) become slots 0, 1, ... with what they
    #     learned; every other slot is forgotten and its memory may be given back. The engine
    #     calls it when most of a batch's slots have been free for a few evaluations in a row,
    #     then passes len(keep) values."""
