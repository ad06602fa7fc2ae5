"""An incident seen as an alert: the labels routes, silences and inhibition match on, and the
digest that says whether a reader must be told again."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from sloguard.core.incidents import FIRING, ActionRecord, Incident

NOTIFY_STEP = "notify"  # the ladder's hand-over to alerting; the message itself, not news


@dataclass
class Alert:
    incident: Incident
    labels: dict[str, str]

    @property
    def key(self) -> str:
        return self.incident.id

    @property
    def firing(self) -> bool:
        return self.incident.state == FIRING


def alert_labels(incident: Incident) -> dict[str, str]:
    """The series tags and rule labels, plus the names Alertmanager users expect.

    alertname, severity and node are always the incident's own (a series tag cannot hide
    them); `rulegroup` and `policy` are added when no label of that name exists.
    """
    labels = {str(k): str(v) for k, v in incident.labels.items()} or dict(incident.series)
    labels.update(alertname=incident.rule, severity=incident.severity, node=incident.node)
    labels.setdefault("rulegroup", incident.group)
    if incident.policy:
        labels.setdefault("policy", incident.policy)
    return labels


def shown_actions(incident: Incident) -> list[ActionRecord]:
    """The actions a reader is told about (the hand-over to alerting is the message itself)."""
    return [a for a in incident.actions if a.step != NOTIFY_STEP]


def news(incident: Incident) -> list[tuple[str, str, bool]]:
    return [(a.step, a.status, a.dry_run) for a in shown_actions(incident)]


def digest(incident: Incident) -> str:
    """Changes when something a reader must hear about changes: severity, state, an action.

    Evidence values are left out on purpose: they move every tick, and a message per tick is
    the spam that gets a channel muted.
    """
    text = json.dumps([incident.state, incident.severity, news(incident)])
    return hashlib.sha1(text.encode()).hexdigest()[:16]
