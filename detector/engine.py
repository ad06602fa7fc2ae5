"""Rule evaluation and the incident lifecycle: evaluate -> pending -> firing -> resolved.

Each tick, every loaded rule reads its window from the store, reduces each matching series to one
value, feeds the series' detector, and moves the series' alert through the Prometheus-style
states. Incidents are persisted on every transition so a restarted agent continues the incidents
it had instead of opening duplicates. A rule that fails (bad data, a detector error) is recorded
on that rule and the others go on.
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

import pandas as pd

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
    store: Any
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
        selector = spec.selector
        frame = self.store.read(
            WindowQuery(
                measurement=selector.measurement,
                start_ns=now_ns - int(spec.window * 1e9),
                end_ns=now_ns + 1,
                fields=(spec.field,),
                matchers=selector.matchers,
            )
        )
        return reduce_window(frame, spec.field, spec.aggregate)

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


def reduce_window(frame: pd.DataFrame, field_name: str, aggregate: str) -> dict[SeriesKey, float]:
    """One value per series: the rule's aggregate over the window (NaN rows ignored)."""
    if frame.empty or field_name not in frame.columns:
        return {}
    tag_cols = [c for c in frame.columns if c not in ("time", field_name)]
    data = frame.dropna(subset=[field_name])
    out: dict[SeriesKey, float] = {}
    if not tag_cols:
        return {(): _aggregate(data[field_name].astype(float), data["time"], aggregate)}
    for tag_values, group in data.groupby(tag_cols, sort=False, dropna=False):
        if not isinstance(tag_values, tuple):
            tag_values = (tag_values,)
        tags = tuple(sorted((k, v) for k, v in zip(tag_cols, tag_values, strict=True) if v != ""))
        series = group[field_name].astype(float)
        out[tags] = _aggregate(series, group["time"], aggregate)
    return out


def _aggregate(values: pd.Series, times: pd.Series, aggregate: str) -> float:
    if values.empty:
        return math.nan
    if aggregate == "rate":
        if len(values) < 2:
            return math.nan
        seconds = (times.iloc[-1] - times.iloc[0]).total_seconds()
        delta = values.iloc[-1] - values.iloc[0]
        return delta / seconds if seconds > 0 and delta >= 0 else math.nan
    if aggregate in ("mean", "min", "max", "sum", "count", "median"):
        return float(getattr(values, aggregate)())
    if aggregate == "first":
        return float(values.iloc[0])
    if aggregate == "last":
        return float(values.iloc[-1])
    return float(values.quantile(float(aggregate[1:]) / 100))


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
