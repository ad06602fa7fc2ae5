"""An incident as Alertmanager's API v2 takes an alert: labels, annotations, startsAt, endsAt,
generatorURL (POST /api/v2/alerts).

Labels are the ones routes match on here (alerts.alert_labels), so an Alertmanager route written
for sloguard matches the same names the built-in pipeline's routes do; the receiver's `labels`
are added under them (an alert's own label wins, as Prometheus' external_labels). Alertmanager
0.25 refuses a whole request for one invalid label name, so names are made valid (every
character outside [a-zA-Z0-9_] becomes `_`), and an empty value is dropped (for Alertmanager, as
for Prometheus, an empty label is no label).

Sizes are bounded, so one runaway value cannot make a request Alertmanager refuses or that
costs its peers memory: a label value at most 1 KiB, an annotation 4 KiB, the actions and
suspects the latest few. `batches` splits a request by count and by bytes.
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from typing import Any

from sloguard.actuators.alerting.alerts import alert_labels, shown_actions
from sloguard.actuators.alerting.blocks import incident_url
from sloguard.core.incidents import Incident
from sloguard.core.suspects import suspects_of

MAX_LABEL_VALUE = 1024
MAX_ANNOTATION = 4096
MAX_ANNOTATIONS = 32
SHOWN_ACTIONS = 6
SHOWN_SUSPECTS = 3
MAX_REQUEST_BYTES = 1 << 20  # one POST; a single alert is far below (bounded above)
_INVALID = re.compile(r"[^a-zA-Z0-9_]")


def label_name(name: str) -> str:
    """A name Alertmanager 0.25 takes: [a-zA-Z_][a-zA-Z0-9_]*."""
    out = _INVALID.sub("_", name) or "_"
    return f"_{out}" if out[0].isdigit() else out


def _bounded(value: str, limit: int) -> str:
    return value if len(value) <= limit else value[:limit - 1] + "…"


def _labels(incident: Incident, extra: dict[str, str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for name, value in alert_labels(incident).items():
        valid = label_name(name)
        if value and valid not in out:  # the first of two names made alike wins
            out[valid] = _bounded(value, MAX_LABEL_VALUE)
    for name, value in extra.items():
        out.setdefault(name, _bounded(value, MAX_LABEL_VALUE))
    return out


def _annotations(incident: Incident) -> dict[str, str]:
    out = {label_name(k): str(v) for k, v in list(incident.annotations.items())[:20] if v}
    if incident.summary:
        out.setdefault("summary", incident.summary)
    out["incident"] = incident.id
    actions = shown_actions(incident)[-SHOWN_ACTIONS:]
    if actions:
        out["actions"] = "; ".join(
            f"{a.step} {a.status}{' (dry-run)' if a.dry_run else ''} {a.target}"
            for a in actions)
    suspects = suspects_of(incident)[:SHOWN_SUSPECTS]
    if suspects:
        out["suspects"] = "; ".join(f"{s.rank}. {s.name} {s.score:.2f}" for s in suspects)
    return {k: _bounded(v, MAX_ANNOTATION) for k, v in list(out.items())[:MAX_ANNOTATIONS]}


def rfc3339(ns: int) -> str:
    return datetime.fromtimestamp(ns / 1e9, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def am_alert(incident: Incident, extra_labels: dict[str, str], external_url: str,
             resolved_ns: int | None = None) -> dict[str, Any]:
    """The alert without `endsAt` while it fires (the sender stamps how long each post is
    valid, `with_ends_at`); with it once resolved."""
    starts = incident.fired_ns or incident.started_ns
    doc: dict[str, Any] = {
        "labels": _labels(incident, extra_labels),
        "annotations": _annotations(incident),
        "startsAt": rfc3339(starts),
        "generatorURL": incident_url(external_url, incident.id),
    }
    if resolved_ns is not None:
        # Alertmanager refuses an end before the start
        doc["endsAt"] = rfc3339(max(resolved_ns, starts))
    return doc


def resolved_copy(doc: dict[str, Any], resolved_ns: int) -> dict[str, Any]:
    """A posted alert, ended: when the incident itself can no longer be read."""
    out = dict(doc)
    out["endsAt"] = max(rfc3339(resolved_ns), str(doc.get("startsAt", "")))
    return out


def with_ends_at(doc: dict[str, Any], now_ns: int, valid_s: float) -> dict[str, Any]:
    """A firing alert as posted now: valid for `valid_s` (Prometheus posts 4 resend intervals),
    so an agent that stops posting lets it resolve then, whatever Alertmanager's
    resolve_timeout is; a re-post before that extends it."""
    if "endsAt" in doc:
        return doc
    return {**doc, "endsAt": rfc3339(now_ns + int(valid_s * 1e9))}


def batches(docs: list[dict[str, Any]], max_count: int,
            max_bytes: int = MAX_REQUEST_BYTES) -> list[tuple[bytes, int]]:
    """JSON request bodies, in order, with how many alerts each holds: at most `max_count`
    alerts and `max_bytes` bytes each (an alert alone larger still goes, alone: its parts are
    bounded above)."""
    out: list[tuple[bytes, int]] = []
    current: list[bytes] = []
    size = 2
    for doc in docs:
        item = json.dumps(doc, separators=(",", ":")).encode()
        if current and (len(current) >= max_count or size + len(item) + 1 > max_bytes):
            out.append((b"[" + b",".join(current) + b"]", len(current)))
            current, size = [], 2
        current.append(item)
        size += len(item) + 1
    if current:
        out.append((b"[" + b",".join(current) + b"]", len(current)))
    return out
