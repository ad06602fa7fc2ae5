"""Rule evaluation and the incident lifecycle: evaluate -> pending -> firing -> resolved.

Each tick, every loaded rule takes its window from the recent in-memory windows (backfilled from
the store at start), reduces each matching series to one value, feeds the series' detector,
and moves the series' alert through the Prometheus-style states. Incidents are persisted on every
transition so a restarted agent continues the incidents it had instead of opening duplicates. A
rule that fails (bad data, a detector error) is recorded on that rule and the others go on.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import math
import re
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import Any, Protocol

from sloguard.detector.api import Verdict
from sloguard.detector.recent import RecentWindows
from sloguard.detector.registry import DetectorRegistry
from sloguard.detector.rules import LoadedRule, RuleSet
from sloguard.detector.worker import DetectorWorker
from sloguard.incidents import (
    FIRING,
    PENDING,
    RESOLVED,
    ActionRecord,
    Evidence,
    Incident,
    new_incident_id,
)
from sloguard.store import WindowQuery
from sloguard.store.incidents_db import IncidentStore

log = logging.getLogger(__name__)

AGENT_GROUP = "sloguard"  # incidents the agent raises about itself, not from rules
HUNG_BACKOFF_S = 60.0

SeriesKey = tuple[tuple[str, str], ...]


class IncidentActuator(Protocol):
    def on_firing(self, incident: Incident, now_ns: int) -> list[ActionRecord]: ...

    def on_resolved(self, incident: Incident, now_ns: int) -> list[ActionRecord]: ...


@dataclass
class AlertState:
    incident: Incident
    recover_since_ns: int | None = None


@dataclass
class RuleStatus:
    key: str
    source: str
    last_eval_ns: int = 0
    last_duration_s: float = 0.0
    series: int = 0
    error: str = ""
    evaluations: int = 0


@dataclass
class Engine:
    windows: RecentWindows
    incidents: IncidentStore
    rules: RuleSet
    node: str
    actuator: IncidentActuator
    registry: DetectorRegistry = field(default_factory=DetectorRegistry)
    timeout_s: float = 1.0
    inventory: Callable[[], list[dict[str, str]]] = lambda: []
    on_evaluation: Callable[[str, str], None] = lambda rule, result: None
    states: dict[tuple[str, SeriesKey], AlertState] = field(default_factory=dict)
    status: dict[str, RuleStatus] = field(default_factory=dict)
    _due: dict[str, int] = field(default_factory=dict)
    # (rule key, series) -> (the rule spec it was built from, detector)
    _detectors: dict[tuple[str, SeriesKey], tuple[Any, Any]] = field(default_factory=dict)
    _unsaved: dict[str, Incident] = field(default_factory=dict)
    # rule key -> (spec that ran over its deadline, when it may be tried again)
    _hung: dict[str, tuple[Any, int]] = field(default_factory=dict)
    # (rule key, series) -> whether each of the last M evaluations crossed (for_evaluations)
    _history: dict[tuple[str, SeriesKey], deque[bool]] = field(default_factory=dict)
    _worker: DetectorWorker | None = None
    _series_errors: dict[str, str] = field(default_factory=dict)  # rule key -> last failure
    _swept_keys: set[str] | None = None  # rule keys when stored incidents were last swept

    def restore(self) -> int:
        """Adopt this node's open incidents from before a restart, once their rule is loaded.

        Incidents whose rule is not loaded stay open untouched (a rule file may be broken right
        now); `evaluate` resolves them only when the rules loaded cleanly without that rule.
        Pending incidents are dropped: their `for` clock would span the downtime.
        """
        restored = 0
        by_key = {rule.key: rule for rule in self.rules.rules}
        adopted = {state.incident.id for state in self.states.values()}
        for incident in self.incidents.open_incidents():
            if incident.node != self.node or incident.id in adopted:
                continue
            key = f"{incident.group}/{incident.rule}"
            if key not in by_key:
                continue
            if incident.state == PENDING:
                self.incidents.delete(incident.id)
                continue
            series = tuple(sorted(incident.series.items()))
            self.states[(key, series)] = AlertState(incident)
            restored += 1
        return restored

    def evaluate(self, now_ns: int) -> None:
        self._retry_saves()
        active_rules = self.rules.rules
        keys = {rule.key for rule in active_rules}
        for rule in active_rules:
            status = self.status.setdefault(rule.key, RuleStatus(rule.key, rule.source))
            status.source = rule.source
            interval = int((rule.interval or 0) * 1e9)
            if interval and now_ns < self._due.get(rule.key, 0):
                continue
            hung = self._hung.get(rule.key)
            if hung is not None and hung[0] == rule.spec and now_ns < hung[1]:
                continue  # cut off recently: backing off before trying it again
            self._due[rule.key] = now_ns + interval
            started = time.perf_counter()
            try:
                values = self._values(rule, now_ns)
                self._step_rule(rule, values, now_ns)
            except Exception as exc:  # one broken rule must not stop the others
                status.error = f"{exc.__class__.__name__}: {exc}"
                log.warning("rule %s failed: %s", rule.key, status.error)
                self.on_evaluation(rule.key, "error")
            else:
                self._hung.pop(rule.key, None)
                status.error = self._series_errors.pop(rule.key, "")
                status.series = len(values)
                self.on_evaluation(rule.key, "error" if status.error else "ok")
            status.evaluations += 1
            status.last_eval_ns = now_ns
            status.last_duration_s = time.perf_counter() - started
        if not self.rules.errors:  # a rule gone from cleanly loaded files: end its incidents
            for (rule_key, series), state in list(self.states.items()):
                if rule_key not in keys:
                    del self.states[(rule_key, series)]
                    self._resolve(state.incident, now_ns, "rule no longer loaded")
            if keys != self._swept_keys:  # stored incidents of rules gone (once per change)
                for incident in self.incidents.open_incidents():
                    if incident.group == AGENT_GROUP:
                        continue  # the agent's own events (e.g. RulesInvalid) end themselves
                    if incident.node == self.node and (
                            f"{incident.group}/{incident.rule}" not in keys):
                        self._resolve(incident, now_ns, "rule no longer loaded")
                self._swept_keys = keys
        for key in list(self.status):
            if key not in keys:
                del self.status[key]
        for key in [k for k in self._detectors if k[0].split("#", 1)[0] not in keys]:
            del self._detectors[key]
            self._history.pop(key, None)

    def _values(self, rule: LoadedRule, now_ns: int, spec: Any = None) -> dict[SeriesKey, float]:
        """One aggregate per series of the rule's signal (or of one of its conditions)."""
        spec = spec or rule.spec
        subscription, _ = self.windows.subscribe(spec.selector, spec.field, spec.window)
        window = subscription.window(now_ns - int(spec.window * 1e9), now_ns + 1)
        return {key: aggregate(times, values, spec.aggregate)
                for key, (times, values) in window.items()}

    def sync_windows(self, store: Any, now_ns: int) -> int:
        """Subscribe the loaded rules to recent data; backfill new subscriptions from the store.

        Backfill is best effort: a store that cannot be read leaves the window to fill from
        live data. Returns the number of samples backfilled.
        """
        subscriptions, loaded = [], 0
        signals = [(rule, spec) for rule in self.rules.rules
                   for spec in (rule.spec, *rule.spec.and_)]
        for rule, spec in signals:
            subscription, new = self.windows.subscribe(spec.selector, spec.field, spec.window)
            subscriptions.append(subscription)
            if not new or store is None:
                continue
            try:
                samples = store.read_samples(WindowQuery(
                    spec.selector.measurement, now_ns - int(spec.window * 1e9), now_ns + 1,
                    fields=(spec.field,), matchers=spec.selector.matchers))
            except Exception as exc:
                log.warning("backfill of %s from the store failed: %s", rule.key, exc)
                continue
            self.windows.add(samples, only=subscription)
            loaded += len(samples)
        self.windows.retain(subscriptions)
        return loaded

    def _step_rule(self, rule: LoadedRule, values: dict[SeriesKey, float], now_ns: int) -> None:
        open_series = {s for (k, s) in self.states if k == rule.key}
        series_now = set(values) | open_series
        jobs = [(rule.key, rule.spec, {s: values.get(s, math.nan) for s in series_now})]
        for index, condition in enumerate(rule.spec.and_):  # compound rules: other signals
            jobs.append((f"{rule.key}#and{index}", condition,
                         self._values(rule, now_ns, condition)))
        # Plugin code (constructors included) runs on the worker, under the deadline; the
        # detectors it builds are kept only once the run has succeeded.
        known = [{s: self._detectors.get((key, s)) for s in inputs} for key, _, inputs in jobs]
        build = [{s for s, entry in found.items() if entry is None or entry[0] != spec}
                 for found, (_, spec, _) in zip(known, jobs, strict=True)]

        def run() -> tuple[list[dict], list[dict], list[str]]:
            built, judged_all, failures = [], [], []
            for found, fresh, (_, spec, inputs) in zip(known, build, jobs, strict=True):
                made = {s: self.registry.make(spec.detector, spec.params) for s in fresh}
                judged = {}
                for s, value in inputs.items():
                    detector = made[s] if s in made else found[s][1]
                    try:
                        judged[s] = detector.update(value, now_ns)
                    except Exception as exc:  # one bad series must not fail the others
                        failures.append(f"{dict(s)}: {exc.__class__.__name__}: {exc}")
                        judged[s] = Verdict(False, False, None, "detector error")
                built.append(made)
                judged_all.append(judged)
            return built, judged_all, failures

        built, verdicts, failures = self._guarded(rule, run, now_ns)
        for made, (key, spec, _) in zip(built, jobs, strict=True):
            for s, detector in made.items():
                self._detectors[(key, s)] = (spec, detector)
        if failures:
            self._series_errors[rule.key] = (f"{len(failures)} series failed, e.g. "
                                             f"{failures[0]}")[:500]
        for (key, _, inputs), judged in zip(jobs, verdicts, strict=True):
            for series, value in inputs.items():
                if math.isnan(value) and judged[series].crossed:  # no data never fires,
                    judged[series] = Verdict(False, True, judged[series].threshold, "no data")
            for stale in [k for k in self._detectors if k[0] == key and k[1] not in inputs]:
                del self._detectors[stale]  # the series went away: forget its detector
                self._history.pop(stale, None)
        holds, notes = True, []
        for (_, condition, _), judged in zip(jobs[1:], verdicts[1:], strict=True):
            crossed = sum(v.crossed for v in judged.values())
            holds = holds and crossed > 0
            notes.append(f"{condition.expr} {condition.field}: {crossed} of {len(judged)} "
                         "series crossed")
        for series in series_now:
            verdict = verdicts[0][series]
            if jobs[1:]:
                verdict = Verdict(verdict.crossed and holds, verdict.recovered or not holds,
                                  verdict.threshold, "; ".join(filter(None, [verdict.note,
                                                                             *notes])))
            self._step(rule, series, jobs[0][2][series], verdict, now_ns)

    def _guarded(self, rule: LoadedRule, run: Callable[[], Any], now_ns: int) -> Any:
        """Run the rule's detector code on the worker, cut off after `timeout_s`.

        A rule cut off is backed off for HUNG_BACKOFF_S and then tried again (an agent starved
        of CPU once must not lose a rule for good); its worker is abandoned.
        """
        if self._worker is None:
            self._worker = DetectorWorker()
        try:
            return self._worker.run(run, self.timeout_s)
        except FutureTimeout:
            self._worker = None
            retry = now_ns + int(HUNG_BACKOFF_S * 1e9)
            self._hung[rule.key] = (rule.spec, retry)
            raise TimeoutError(
                f"detector {rule.spec.detector!r} took longer than {self.timeout_s:g}s; "
                f"rule skipped for {HUNG_BACKOFF_S:g}s, then tried again") from None

    def _step(self, rule: LoadedRule, series: SeriesKey, value: float, verdict: Verdict,
              now_ns: int) -> None:
        spec, key = rule.spec, (rule.key, series)
        shown = None if math.isnan(value) else float(value)
        state = self.states.get(key)
        counted = spec.for_evaluations
        history = None
        if counted is not None:
            history = self._history.get(key)
            if history is None or history.maxlen != counted.of:
                history = self._history[key] = deque(history or (), maxlen=counted.of)
            history.append(verdict.crossed)
        if state is None:
            if verdict.crossed:
                incident = self._open(rule, series, shown, verdict.threshold, now_ns,
                                      verdict.note)
                state = self.states[key] = AlertState(incident)
                self._maybe_fire(rule, state, shown, now_ns, history)
            return
        incident = state.incident
        if incident.state == PENDING:
            # Pending needs the condition to hold throughout `for`; with `for_evaluations`, it
            # lives as long as any of the last M evaluations crossed.
            if verdict.crossed or (history is not None and any(history)):
                incident.add_evidence(Evidence(now_ns, shown, verdict.threshold, verdict.note))
                self._maybe_fire(rule, state, shown, now_ns, history)
            else:
                del self.states[key]
                self._unsaved.pop(incident.id, None)
                self.incidents.delete(incident.id)
            return
        if not verdict.recovered:  # firing, or back above the recover bound: hold restarts
            state.recover_since_ns = None
            incident.add_evidence(Evidence(now_ns, shown, verdict.threshold, verdict.note))
            incident.updated_ns = now_ns
            self._save(incident)
            return
        if state.recover_since_ns is None:
            state.recover_since_ns = now_ns
        if now_ns - state.recover_since_ns >= spec.recover_for * 1e9:
            note = "no data" if shown is None else "recovered"
            incident.add_evidence(Evidence(now_ns, shown, verdict.threshold, note))
            del self.states[key]
            self._resolve(incident, now_ns, note)

    def _open(
        self, rule: LoadedRule, series: SeriesKey, value: float | None,
        threshold: float | None, now_ns: int, note: str = "",
    ) -> Incident:
        spec, tags = rule.spec, dict(series)
        incident = Incident(
            id=new_incident_id(now_ns),
            fingerprint=fingerprint(rule.key, series),
            rule=spec.alert,
            group=rule.group,
            severity=spec.severity,
            node=self.node,
            state=PENDING,
            series=tags,
            started_ns=now_ns,
            updated_ns=now_ns,
            labels={**tags, **spec.labels},
            affected=affected_workloads(tags, self.inventory()),
            evidence=[Evidence(now_ns, value, threshold,
                               f"crossed: {note}" if note else "crossed")],
        )
        _annotate(incident, rule, value, threshold)
        return incident

    def _maybe_fire(self, rule: LoadedRule, state: AlertState, value: float | None,
                    now_ns: int, history: deque[bool] | None) -> None:
        incident = state.incident
        incident.updated_ns = now_ns
        counted = rule.spec.for_evaluations
        enough = counted is None or (history is not None and sum(history) >= counted.crossed)
        if enough and now_ns - incident.started_ns >= rule.spec.for_ * 1e9:
            _annotate(incident, rule, value, incident.evidence[0].threshold)
            incident.state = FIRING
            incident.fired_ns = now_ns
            incident.actions.extend(self.actuator.on_firing(incident, now_ns))
            log.warning("incident %s firing: %s", incident.id, incident.summary)
        self._save(incident)

    def _resolve(self, incident: Incident, now_ns: int, note: str) -> None:
        incident.state = RESOLVED
        incident.resolved_ns = now_ns
        incident.updated_ns = now_ns
        if note != "recovered":
            incident.annotations["resolved_because"] = note
        incident.actions.extend(self.actuator.on_resolved(incident, now_ns))
        self._save(incident)
        log.info("incident %s resolved (%s)", incident.id, note)

    def _save(self, incident: Incident) -> None:
        """Persist, or keep the incident to retry next tick: a full disk must not lose it."""
        try:
            self.incidents.save(incident)
        except Exception as exc:
            if incident.id not in self._unsaved:
                log.error("saving incident %s failed, will retry: %s", incident.id, exc)
            self._unsaved[incident.id] = incident
        else:
            self._unsaved.pop(incident.id, None)

    def _retry_saves(self) -> None:
        for incident in list(self._unsaved.values()):
            self._save(incident)

    @property
    def unsaved(self) -> int:
        return len(self._unsaved)


def aggregate(times: list[int], values: list[float], how: str) -> float:
    """The rule's aggregate over one series' window; NaN when it cannot be computed."""
    if any(math.isnan(v) for v in values):
        pairs = [(t, v) for t, v in zip(times, values, strict=True) if not math.isnan(v)]
        times, values = [t for t, _ in pairs], [v for _, v in pairs]
    if not values:
        return math.nan
    if how == "rate":  # per-second increase of a counter, across resets (as Prometheus does)
        if len(values) < 2 or times[-1] <= times[0]:
            return math.nan
        increase = 0.0
        for before, after in itertools.pairwise(values):
            increase += after - before if after >= before else after  # a drop is a reset
        return increase / ((times[-1] - times[0]) / 1e9)
    if how == "mean":
        return math.fsum(values) / len(values)
    if how in ("min", "max"):
        return min(values) if how == "min" else max(values)
    if how == "sum":
        return math.fsum(values)
    if how == "count":
        return float(len(values))
    if how in ("first", "last"):
        return values[0] if how == "first" else values[-1]
    q = 0.5 if how == "median" else float(how[1:]) / 100
    ordered = sorted(values)  # linear interpolation, as numpy's and pandas' default
    pos = (len(ordered) - 1) * q
    low = math.floor(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def _annotate(incident: Incident, rule: LoadedRule, value: float | None,
              threshold: float | None) -> None:
    """Render annotations with the current value (Prometheus re-renders them on evaluation)."""
    spec = rule.spec
    incident.annotations.update(
        {k: render(v, incident.series, value) for k, v in spec.annotations.items()})
    incident.summary = incident.annotations.get("summary") or (
        f"{spec.alert}: {spec.field} of {spec.expr} = {value} against {threshold}"
    )


def fingerprint(rule_key: str, series: SeriesKey) -> str:
    raw = json.dumps([rule_key, list(series)], separators=(",", ":"))
    return hashlib.sha1(raw.encode()).hexdigest()[:16]


_LABEL = re.compile(r"\{\{\s*\$labels\.([A-Za-z_][A-Za-z0-9_]*)\s*\}\}")
_VALUE = re.compile(r"\{\{\s*\$value\s*\}\}")


def render(template: str, labels: dict[str, str], value: float | None) -> str:
    """Prometheus-style `{{ $labels.x }}` and `{{ $value }}` substitution (no other logic)."""
    text = _LABEL.sub(lambda m: labels.get(m.group(1), ""), template)
    return _VALUE.sub("n/a" if value is None else f"{value:.4g}", text)


def affected_workloads(
    series: dict[str, str], inventory: list[dict[str, str]]
) -> list[dict[str, str]]:
    """The LS workloads an incident concerns: the series' own if it is LS, else all LS here."""
    if series.get("class") == "LS":
        keys = ("cgroup", "pod", "namespace", "pod_uid", "workload", "container")
        return [{k: series[k] for k in keys if k in series}]
    return [w for w in inventory if w.get("class") == "LS"]
