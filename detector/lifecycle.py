"""The alert lifecycle: pending -> firing -> resolved, by the rules' verdicts and by hand, and
incidents saved on every transition (a failed save is kept and retried each tick, so a full
disk loses nothing). The agent's own events (RulesInvalid) live here too, beside the rules'
alerts, so the ladder and alerting get both from `firing()`.

A part of the Engine (detector/engine.py), which schedules the rules and has their signals
judged; the state it shares is declared below.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from dataclasses import dataclass
from typing import Any

from sloguard.core.incidents import (
    AGENT_GROUP,
    FIRING,
    PENDING,
    RESOLVED,
    ActionRecord,
    Evidence,
    Incident,
)
from sloguard.detector.api import Verdict
from sloguard.detector.incident_making import agent_event, annotate, from_rule
from sloguard.detector.rules import LoadedRule
from sloguard.detector.signals import SeriesKey

log = logging.getLogger("sloguard.detector.engine")


@dataclass
class AlertState:
    """An open alert's timers, on the monotonic clock: the wall clock (the incident's
    `started_ns`, evidence times) is only a label, and a step of it (NTP, a VM resumed, an
    operator's `date -s`) must neither fire an alert early nor hold it an extra hour."""

    incident: Incident
    since_mono_ns: int = 0  # when the alert opened (its `for` counts from here)
    recover_since_mono_ns: int | None = None  # when it last started to recover (recover_for)


class AlertLifecycle:
    # the Engine's state this part uses
    node: str
    incidents: Any  # IncidentStore
    actuator: Any  # IncidentActuator
    inventory: Any
    states: dict[tuple[str, SeriesKey], AlertState]
    _history: dict[tuple[str, SeriesKey], deque[bool]]
    _unsaved: dict[str, Incident]
    _events: dict[str, Incident] | None
    _mono_ns: int
    save_error: str
    registry: Any  # DetectorRegistry
    confirm_firing: bool
    awaiting_fresh: set[str]
    _fresh: bool

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
            if history is not None and not any(history):
                del self._history[key]  # nothing to count: the same as no history at all
            if verdict.crossed:
                incident = self._open(rule, series, shown, verdict.threshold, now_ns,
                                      verdict.note, verdict.change_ns)
                state = self.states[key] = AlertState(incident, self._mono_ns)
                self._maybe_fire(rule, state, shown, now_ns, history, crossed=True)
            return
        incident = state.incident
        if incident.state == PENDING:
            # Pending needs the condition to hold throughout `for`; with `for_evaluations`, it
            # lives as long as any of the last M evaluations crossed.
            if verdict.crossed or (history is not None and any(history)):
                incident.add_evidence(Evidence(now_ns, shown, verdict.threshold, verdict.note,
                                               verdict.change_ns))
                self._maybe_fire(rule, state, shown, now_ns, history, crossed=verdict.crossed)
            else:
                del self.states[key]
                self._unsaved.pop(incident.id, None)
                self.incidents.delete(incident.id)
            return
        quieted = False
        if verdict.crossed:
            incident.quiet_since_ns = None
        elif incident.quiet_since_ns is None:  # the first evaluation in the band or recovering
            incident.quiet_since_ns = now_ns
            quieted = True
        if not verdict.recovered:  # firing, or back above the recover bound: hold restarts
            state.recover_since_mono_ns = None
            incident.add_evidence(Evidence(now_ns, shown, verdict.threshold, verdict.note,
                                           verdict.change_ns))
            incident.updated_ns = now_ns
            self._save(incident)
            return
        if state.recover_since_mono_ns is None:
            state.recover_since_mono_ns = self._mono_ns
        if self._mono_ns - state.recover_since_mono_ns >= spec.recover_for * 1e9:
            note = "no data" if shown is None else "recovered"
            incident.add_evidence(Evidence(now_ns, shown, verdict.threshold, note))
            del self.states[key]
            self._resolve(incident, now_ns, note)
        elif quieted:  # the ladder reads the live object, the UI and the forwarder the store
            incident.updated_ns = now_ns
            self._save(incident)

    def _open(self, rule: LoadedRule, series: SeriesKey, value: float | None,
              threshold: float | None, now_ns: int, note: str = "",
              change_ns: int | None = None) -> Incident:
        return from_rule(rule, series, self.node, value, threshold, now_ns, self.inventory(),
                         note, change_ns)

    def _maybe_fire(self, rule: LoadedRule, state: AlertState, value: float | None,
                    now_ns: int, history: deque[bool] | None, crossed: bool) -> None:
        """Fire once `for` (and `for_evaluations`) allow. With `for_evaluations` that can be on
        an evaluation that did not cross: the incident then fires already quiet."""
        incident = state.incident
        incident.updated_ns = now_ns
        counted = rule.spec.for_evaluations
        enough = counted is None or (history is not None and sum(history) >= counted.crossed)
        due = enough and self._mono_ns - state.since_mono_ns >= rule.spec.for_ * 1e9
        if due and self.confirm_firing and not self._fresh and self._judged_again(rule):
            due = False  # pending until the conditions hold on fresh samples (Engine docs)
            self.awaiting_fresh.add(rule.key)
        if due:
            annotate(incident, rule, value, incident.evidence[0].threshold)
            incident.state = FIRING
            incident.fired_ns = now_ns
            incident.quiet_since_ns = None if crossed else now_ns
            incident.actions.extend(self.actuator.on_firing(incident, now_ns))
            log.warning("incident %s firing: %s", incident.id, incident.summary)
        self._save(incident)

    def _judged_again(self, rule: LoadedRule) -> bool:
        """Whether a firing of this rule waits for its `and:` conditions on fresh samples: only
        where judging it once more changes nothing but the data (every detector of the rule
        judges each value on its own, as `on_arrival` asks; no count of evaluations), since
        the rule is then evaluated twice in one tick."""
        spec = rule.spec
        if not spec.and_ or spec.for_evaluations is not None:
            return False
        return all(getattr(self.registry.types.get(s.detector), "per_value", False)
                   for s in spec.signals)

    def _resolve(self, incident: Incident, now_ns: int, note: str) -> None:
        incident.state = RESOLVED
        incident.resolved_ns = now_ns
        incident.updated_ns = now_ns
        if note != "recovered":
            incident.annotations["resolved_because"] = note
        incident.actions.extend(self.actuator.on_resolved(incident, now_ns))
        self._save(incident)
        log.info("incident %s resolved (%s)", incident.id, note)

    def acknowledge(self, incident_id: str, by: str, comment: str, now_ns: int) -> Incident:
        """Someone is on it: recorded on the incident (and shown), nothing else changes."""
        incident = self._find(incident_id)
        incident.annotations["acknowledged_by"] = by
        incident.annotations["acknowledged_at"] = str(now_ns)
        if comment:
            incident.annotations["acknowledged_comment"] = comment
        incident.actions.append(ActionRecord(now_ns, "acknowledge", f"incident/{incident.id}",
                                             False, "done", f"by {by}: {comment}".rstrip(": ")))
        incident.updated_ns = now_ns
        self._save(incident)
        return incident

    def resolve_by_hand(self, incident_id: str, by: str, comment: str, now_ns: int) -> Incident:
        """End an incident now. If its condition still holds, the rule opens a new one after
        its `for` (as Alertmanager re-fires): resolving by hand is "I fixed it", not a mute."""
        incident = self._find(incident_id)
        if incident.state == RESOLVED:
            raise ValueError(f"incident {incident_id} is already resolved")
        for key, state in list(self.states.items()):
            if state.incident.id == incident_id:
                del self.states[key]
                self._history.pop(key, None)
        for name, event in list(self._open_events().items()):
            if event.id == incident_id:  # raised again by its next report if still true
                del self._open_events()[name]
        incident.annotations["resolved_by"] = by
        if comment:
            incident.annotations["resolved_comment"] = comment
        self._resolve(incident, now_ns, f"resolved by hand by {by}")
        return incident

    def _find(self, incident_id: str) -> Incident:
        for state in self.states.values():
            if state.incident.id == incident_id:
                return state.incident  # the live object: the next evaluation keeps the change
        for event in self._open_events().values():
            if event.id == incident_id:
                return event
        incident = self.incidents.get(incident_id)
        if incident is None:
            raise KeyError(incident_id)
        return incident

    def firing(self) -> list[Incident]:
        """The incidents firing now, the agent's own events included (the ladder escalates
        while they do; events have no policy), for the ladder and alerting alike."""
        return [*(state.incident for state in self.states.values()
                  if state.incident.state == FIRING),
                *(event for event in self._open_events().values() if event.state == FIRING)]

    def event(self, name: str, now_ns: int, problem: str = "", value: float = 0.0,
              summary: str = "", ended: str = "") -> Incident | None:
        """Raise or update (with a `problem`) or end (without) an incident the agent raises
        about itself; it is saved, retried and forwarded as the rules' incidents are."""
        events = self._open_events()
        current = events.get(name)
        if current is None and not problem:
            return None
        if current is None:
            current = events[name] = agent_event(self.node, name, now_ns)
        if problem:
            if not current.evidence or current.evidence[-1].note != problem[:2000]:
                current.add_evidence(Evidence(now_ns, value, None, problem[:2000]))
            current.summary = summary or problem[:300]
        else:
            current.state, current.resolved_ns = RESOLVED, now_ns
            current.add_evidence(Evidence(now_ns, 0.0, None, ended or "ended"))
            del events[name]
        current.updated_ns = now_ns
        self._save(current)
        return current

    def _open_events(self) -> dict[str, Incident]:
        if self._events is None:  # once: the events a previous run left open continue
            self._events = {i.rule: i for i in self.incidents.open_incidents()
                            if i.group == AGENT_GROUP and i.node == self.node}
        return self._events

    def save(self, incident: Incident) -> None:
        """Persist an incident another part changed (the ladder adds its actions)."""
        self._save(incident)

    def _save(self, incident: Incident) -> None:
        """Persist, or keep the incident to retry next tick: a full disk must not lose it."""
        try:
            self.incidents.save(incident)
        except Exception as exc:
            if incident.id not in self._unsaved:
                log.error("saving incident %s failed, will retry: %s", incident.id, exc)
            self._unsaved[incident.id] = incident
            self.save_error = f"{exc.__class__.__name__}: {exc}"[:500]
        else:
            self._unsaved.pop(incident.id, None)
            if not self._unsaved:
                self.save_error = ""

    def _retry_saves(self) -> None:
        for incident in list(self._unsaved.values()):
            self._save(incident)

    @property
    def unsaved(self) -> int:
        return len(self._unsaved)
