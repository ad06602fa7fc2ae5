"""When suspects are ranked: at firing, then every `attribution.every`, for every firing
incident under a policy, before the ladder's turn in the same tick (so a `target: suspects`
rung that acts at firing already knows whom).

The ranking of one incident runs on a worker thread with a deadline (`attribution.timeout`,
store reads included): a slow store or a scorer that hangs must not stall the agent's loop; the
incident then keeps its previous suspects, and /readyz says why. A scorer that raises is left
out of that ranking and named in /readyz; the others still rank.
"""

from __future__ import annotations

import logging
import time
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np

from sloguard.core.health import ComponentStatus
from sloguard.core.incidents import AGENT_GROUP, Incident
from sloguard.core.selectors import Matcher, parse_selector
from sloguard.core.suspects import Clue, Suspect
from sloguard.detector.attribution.case import STEP_NS, Case, Reader
from sloguard.detector.attribution.ranking import rank
from sloguard.detector.attribution.registry import ScorerRegistry
from sloguard.detector.config import AttributionConfig
from sloguard.detector.worker import DetectorWorker

log = logging.getLogger(__name__)
WINDOW_LOOKBACKS = 4  # the longest window ranked, in lookbacks


class Attributor:
    def __init__(self, config: AttributionConfig, read: Reader,
                 inventory: Callable[[], list[dict[str, str]]],
                 save: Callable[[Incident], None],
                 registry: ScorerRegistry | None = None) -> None:
        self.config = config
        self.read = read
        self.inventory = inventory
        self.save = save
        self.errors: dict[str, str] = {}  # scorer (or "ranking") -> why it was left out
        self.scorers: dict[str, Any] = {}
        self.weights: dict[str, float] = {}
        self.ranked = 0
        self.last_seconds = 0.0
        self._worker: DetectorWorker | None = None
        if not config.enabled:
            return
        registry = registry or ScorerRegistry(config.plugins,
                                              use_entry_points=config.entry_points)
        for name, scorer in config.scorers.items():
            if scorer.weight <= 0:
                continue
            try:
                self.scorers[name] = registry.make(name, scorer.params)
            except ValueError as exc:
                self.errors[name] = f"attribution.scorers.{name}: {exc}"
                log.error("%s", self.errors[name])
                continue
            self.weights[name] = scorer.weight

    def tick(self, now_ns: int, firing: list[Incident]) -> None:
        if not self.scorers:
            return
        every_ns = int(self.config.every * 1e9)
        settled_ns = int((WINDOW_LOOKBACKS - 1) * self.config.lookback * 1e9)
        for incident in firing:
            if not incident.policy or incident.group == AGENT_GROUP:
                continue
            # an incident firing past 3 x lookback is ranked on the longest window, half as
            # often: its ranking has settled, and its cost stays that of a young one's
            due = every_ns * (2 if now_ns - incident.started_ns > settled_ns else 1)
            if incident.suspects_ns is not None and now_ns - incident.suspects_ns < due:
                continue
            suspects = self.attribute(incident, now_ns)
            if suspects is None:
                continue
            incident.suspects = [s.to_dict() for s in suspects]
            incident.suspects_ns = now_ns
            self.save(incident)

    def attribute(self, incident: Incident, now_ns: int) -> list[Suspect] | None:
        """The incident's suspects now; None when the ranking could not finish in time."""
        if self._worker is None:
            self._worker = DetectorWorker()
        started = time.perf_counter()
        try:
            suspects = self._worker.run(lambda: self._rank(incident, now_ns),
                                        self.config.timeout)
        except TimeoutError:  # the worker abandoned itself (DetectorWorker.run)
            self._worker = None
            self.errors["ranking"] = (f"ranking incident {incident.id} took over "
                                      f"{self.config.timeout:g}s; its suspects were kept")
            log.warning("attribution: %s", self.errors["ranking"])
            return None
        except Exception as exc:  # the case could not be built: a store that fails reads
            self.errors["ranking"] = f"{exc.__class__.__name__}: {exc}"[:500]
            log.warning("attribution of %s failed: %s", incident.id, exc)
            return None
        self.errors.pop("ranking", None)
        self.last_seconds = time.perf_counter() - started
        self.ranked += 1
        return suspects

    def _rank(self, incident: Incident, now_ns: int) -> list[Suspect]:
        case = self.case(incident, now_ns)
        if not case.candidates:
            return []
        try:
            return self._score(case)
        finally:  # a read that was cut is said in /readyz, not dropped
            if case.notes:
                self.errors["reads"] = "; ".join(case.notes)[:500]
            else:
                self.errors.pop("reads", None)

    def _score(self, case: Case) -> list[Suspect]:
        clues: dict[str, dict[str, Clue]] = {}
        known = {c["cgroup"] for c in case.candidates}
        for name, scorer in self.scorers.items():
            try:
                given = scorer.score(case) or {}
            except Exception as exc:  # one scorer's bug costs its vote, not the ranking
                self.errors[name] = f"{exc.__class__.__name__}: {exc}"[:500]
                log.warning("suspect scorer %s failed on %s: %s", name, case.incident_id, exc)
                continue
            self.errors.pop(name, None)
            clues[name] = {cgroup: clue for cgroup, clue in given.items()
                           if cgroup in known and isinstance(clue, Clue)}
        return rank(case.candidates, clues, self.weights)

    def case(self, incident: Incident, now_ns: int) -> Case:
        """What the scorers see for one incident (its LS signal read from the store)."""
        onset = incident.started_ns
        lookback_ns = int(self.config.lookback * 1e9)
        # from `lookback` before the onset; an incident firing for longer than 3 x lookback
        # is ranked on the latest 4 x lookback, so a ranking's cost stays bounded
        start = max(onset - lookback_ns, now_ns - WINDOW_LOOKBACKS * lookback_ns)
        start -= start % STEP_NS
        candidates = [w for w in self.inventory()
                      if w.get("class") == "BE" and w.get("cgroup")]
        case = Case(incident.id, incident.labels.get("resource", ""),
                    [dict(w) for w in incident.affected], candidates, onset, start,
                    max(now_ns, start + STEP_NS), self.read)
        case.ls = ls_signal(case, incident)
        return case

    def status(self) -> ComponentStatus:
        details: dict[str, object] = {"scorers": sorted(self.scorers),
                                      "ranked_total": self.ranked,
                                      "last_ranking_seconds": round(self.last_seconds, 4)}
        if not self.config.enabled:
            return ComponentStatus("attribution", True, "attribution disabled by "
                                   "attribution.enabled", details)
        reason = "; ".join(f"{name}: {why}" for name, why in sorted(self.errors.items()))
        return ComponentStatus("attribution", not reason, reason, details)

    def close(self) -> None:
        if self._worker is not None:
            self._worker.abandon()
            self._worker = None


def ls_signal(case: Case, incident: Incident) -> np.ndarray:
    """The incident's own signal on the case's grid: the mean of its samples each second."""
    signal = incident.signal
    measurement, field = signal.get("measurement", ""), signal.get("field", "")
    if not measurement or not field:
        return np.full(len(case.grid), np.nan)
    try:
        matchers = parse_selector(signal.get("expr") or measurement).matchers
    except ValueError:
        matchers = ()
    matchers = (*matchers, *(Matcher(k, "=", v) for k, v in incident.series.items()))
    found = case.series(measurement, field, matchers)
    if not found:
        return np.full(len(case.grid), np.nan)
    return _mean_of_series(case, found)


def _mean_of_series(case: Case, found: list) -> np.ndarray:
    """The mean over the series (one, for an incident's own series) of each second."""
    grids = np.vstack([case.on_grid(times, values) for _, times, values in found])
    with np.errstate(invalid="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a second no series has: NaN
        return np.nanmean(grids, axis=0)
