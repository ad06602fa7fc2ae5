"""What a suspect-scorer plugin imports: the hook marker, the case it scores, the clue it gives.

    from sloguard.detector.attribution.api import Clue, hookimpl

    class CpiScorer:
        name = "cpi"

        def __init__(self, params):
            reject_unknown(params, {"floor"}, self.name)
            self.floor = float(params.get("floor", 1.2))

        def score(self, case):
            cpi = case.per_workload("container_cpi", "cpi")   # cgroup -> one value a second
            ...
            return {cgroup: Clue(self.name, grade, "cache", f"CPI {x:.2f} ...")}

    @hookimpl
    def sloguard_suspect_scorers():
        return [CpiScorer]

See docs/plugins.md ("Suspect scorers").
"""

from __future__ import annotations

from typing import Any, ClassVar, Protocol

from sloguard.core.suspects import RESOURCES, Clue
from sloguard.detector.api import reject_unknown
from sloguard.detector.attribution.case import STEP_NS, Case, correlation, mean_of
from sloguard.detector.attribution.hookspecs import hookimpl

__all__ = [
    "RESOURCES",
    "STEP_NS",
    "Case",
    "Clue",
    "Scorer",
    "correlation",
    "hookimpl",
    "mean_of",
    "reject_unknown",
]


class Scorer(Protocol):
    name: ClassVar[str]

    def __init__(self, params: dict[str, Any]) -> None: ...

    def score(self, case: Case) -> dict[str, Clue]:
        """Each implicated candidate's clue, by its cgroup; empty to abstain."""
        ...
