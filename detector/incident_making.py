"""Incidents as they are made: from a rule's series crossing (with the rule's labels, its
rendered annotations and the LS workloads it concerns), and the agent's own events (a rule
file rejected), which the engine keeps, saves and ends alongside the rules' incidents so that
everything reading incidents (the ladder, alerting, the UI, the forwarder) sees both alike.
"""

from __future__ import annotations

import hashlib
import json
import re

from sloguard.core.incidents import (
    AGENT_GROUP,
    FIRING,
    PENDING,
    Evidence,
    Incident,
    new_incident_id,
)
from sloguard.detector.rules import LoadedRule
from sloguard.detector.signals import SeriesKey


def from_rule(rule: LoadedRule, series: SeriesKey, node: str, value: float | None,
              threshold: float | None, now_ns: int, inventory: list[dict[str, str]],
              note: str = "", change_ns: int | None = None) -> Incident:
    """A new pending incident of a rule's series that crossed."""
    spec, tags = rule.spec, dict(series)
    incident = Incident(
        id=new_incident_id(now_ns),
        fingerprint=fingerprint(rule.key, series),
        rule=spec.alert,
        group=rule.group,
        severity=spec.severity,
        node=node,
        state=PENDING,
        series=tags,
        started_ns=now_ns,
        updated_ns=now_ns,
        labels={**tags, **spec.labels},
        affected=affected_workloads(tags, inventory),
        policy=spec.policy or "",
        signal={"measurement": spec.selector.measurement, "field": spec.field,
                "expr": spec.expr, "aggregate": spec.aggregate,
                "window": f"{spec.window:g}s"},
        evidence=[Evidence(now_ns, value, threshold,
                           f"crossed: {note}" if note else "crossed", change_ns)],
    )
    annotate(incident, rule, value, threshold)
    return incident


def annotate(incident: Incident, rule: LoadedRule, value: float | None,
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


def agent_event(node: str, name: str, now_ns: int, severity: str = "warning") -> Incident:
    """A new firing incident of the agent itself (group `sloguard`), e.g. RulesInvalid."""
    return Incident(
        id=new_incident_id(now_ns), fingerprint=f"{node}/{name}", rule=name, group=AGENT_GROUP,
        severity=severity, node=node, state=FIRING, series={"node": node}, started_ns=now_ns,
        updated_ns=now_ns, fired_ns=now_ns)
