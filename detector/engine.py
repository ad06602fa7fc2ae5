"""Rule evaluation and the incident lifecycle: evaluate -> pending -> firing -> resolved.

Each tick, every loaded rule takes its window from the recent in-memory windows (backfilled from
the store at start), reduces each matching series to one value, feeds the series' detector,
and moves the series' alert through the Prometheus-style states. Incidents are persisted on every
transition so a restarted agent continues the incidents it had instead of opening duplicates. A
rule that fails (bad data, a detector error) is recorded on that rule and the others go on.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from sloguard.detector.recent import RecentWindows
from sloguard.detector.rules import LoadedRule, RuleSet
from sloguard.detector.threshold import make_detector
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

SeriesKey = tuple[tuple[str, str], ...]


class IncidentActuator(Protocol):
    def on_firing(self, incident: Incident, now_ns: int) -> list[ActionRecord]: ...

    def on_resolved(self, incident: Incident, now_ns: int) -> list[ActionRecord]: ...


@dataclass
class AlertState:
    incident: Incident
    detector: Any
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
    inventory: Callable[[], list[dict[str, str]]] = lambda: []
    on_evaluation: Callable[[str, str], None] = lambda rule, result: None
    states: dict[tuple[str, SeriesKey], AlertState] = field(default_factory=dict)
    status: dict[str, RuleStatus] = field(default_factory=dict)
    _due: dict[str, int] = field(default_factory=dict)

    def restore(self) -> int:
        """Adopt this node's open incidents from before a restart."""
        restored = 0
        by_key = {rule.key: rule for rule in self.rules.rules}
        for incident in self.incidents.open_incidents():
            if incident.node != self.node:
                continue
            key = f"{incident.group}/{incident.rule}"
            rule = by_key.get(key)
            if rule is None:
                self._resolve(incident, time.time_ns(), "rule no longer loaded")
                continue
            detector = make_detector(rule.spec.detector, rule.spec.params)
            if incident.state == FIRING:
                detector.active = True
            series = tuple(sorted(incident.series.items()))
            self.states[(key, series)] = AlertState(incident, detector)
            restored += 1
        return restored

    def evaluate(self, now_ns: int) -> None:
        active_rules = self.rules.rules
        keys = {rule.key for rule in active_rules}
        for rule in active_rules:
            status = self.status.setdefault(rule.key, RuleStatus(rule.key, rule.source))
            status.source = rule.source
            interval = self._group_interval(rule)
            if interval and now_ns < self._due.get(rule.key, 0):
                continue
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
                status.error = ""
                status.series = len(values)
                self.on_evaluation(rule.key, "ok")
            status.evaluations += 1
            status.last_eval_ns = now_ns
            status.last_duration_s = time.perf_counter() - started
        for (rule_key, series), state in list(self.states.items()):
            if rule_key not in keys:
                self._resolve(state.incident, now_ns, "rule no longer loaded")
                del self.states[(rule_key, series)]
        for key in list(self.status):
            if key not in keys:
                del self.status[key]

    @staticmethod
    def _group_interval(rule: LoadedRule) -> int:
        return int((rule.interval or 0) * 1e9)

    def _values(self, rule: LoadedRule, now_ns: int) -> dict[SeriesKey, float]:
        spec = rule.spec
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
        for rule in self.rules.rules:
            spec = rule.spec
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
        for series in set(values) | {s for (k, s) in self.states if k == rule.key}:
            self._step(rule, series, values.get(series, math.nan), now_ns)

    def _step(self, rule: LoadedRule, series: SeriesKey, value: float, now_ns: int) -> None:
        spec, key = rule.spec, (rule.key, series)
        state = self.states.get(key)
        detector = state.detector if state else make_detector(spec.detector, spec.params)
        verdict = detector.update(value)
        shown = None if math.isnan(value) else float(value)
        if state is None:
            if verdict.active:
                incident = self._open(rule, series, shown, verdict.threshold, now_ns)
                state = self.states[key] = AlertState(incident, detector)
                self._maybe_fire(rule, state, shown, now_ns)
            return
        incident = state.incident
        if incident.state == PENDING:
            if verdict.active:
                incident.add_evidence(Evidence(now_ns, shown, verdict.threshold))
                self._maybe_fire(rule, state, shown, now_ns)
            else:
                self.incidents.delete(incident.id)
                del self.states[key]
            return
        if verdict.active:
            state.recover_since_ns = None
            incident.add_evidence(Evidence(now_ns, shown, verdict.threshold))
            incident.updated_ns = now_ns
            self.incidents.save(incident)
            return
        if state.recover_since_ns is None:
            state.recover_since_ns = now_ns
        if now_ns - state.recover_since_ns >= spec.recover_for * 1e9:
            note = "no data" if shown is None else "recovered"
            incident.add_evidence(Evidence(now_ns, shown, verdict.threshold, note))
            self._resolve(incident, now_ns, note)
            del self.states[key]

    def _open(
        self, rule: LoadedRule, series: SeriesKey, value: float | None,
        threshold: float | None, now_ns: int,
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
            evidence=[Evidence(now_ns, value, threshold, "crossed")],
        )
        _annotate(incident, rule, value, threshold)
        return incident

    def _maybe_fire(self, rule: LoadedRule, state: AlertState, value: float | None,
                    now_ns: int) -> None:
        incident = state.incident
        incident.updated_ns = now_ns
        if now_ns - incident.started_ns >= rule.spec.for_ * 1e9:
            _annotate(incident, rule, value, incident.evidence[0].threshold)
            incident.state = FIRING
            incident.fired_ns = now_ns
            incident.actions.extend(self.actuator.on_firing(incident, now_ns))
            log.warning("incident %s firing: %s", incident.id, incident.summary)
        self.incidents.save(incident)

    def _resolve(self, incident: Incident, now_ns: int, note: str) -> None:
        incident.state = RESOLVED
        incident.resolved_ns = now_ns
        incident.updated_ns = now_ns
        if note != "recovered":
            incident.annotations["resolved_because"] = note
        incident.actions.extend(self.actuator.on_resolved(incident, now_ns))
        self.incidents.save(incident)
        log.info("incident %s resolved (%s)", incident.id, note)


def aggregate(times: list[int], values: list[float], how: str) -> float:
    """The rule's aggregate over one series' window; NaN when it cannot be computed."""
    values = [v for v in values if not math.isnan(v)]
    if not values:
        return math.nan
    if how == "rate":  # per-second increase of a counter; a reset gives no value
        if len(values) < 2 or values[-1] < values[0]:
            return math.nan
        return (values[-1] - values[0]) / ((times[-1] - times[0]) / 1e9)
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
