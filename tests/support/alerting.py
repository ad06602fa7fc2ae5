"""Building alert pipelines against the local Slack server, driven by synthetic incidents.

Group timers run on the `now_ns` the test passes to `tick` (the agent passes its tick time), so
group_wait and repeat_interval take no wall-clock time; delivery runs on the real sender
threads against the real HTTP server, with short backoffs.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from sloguard.actuators.alerting.config import AlertingConfig
from sloguard.actuators.alerting.db import AlertDB
from sloguard.actuators.alerting.pipeline import Alerting
from sloguard.core.incidents import FIRING, RESOLVED, ActionRecord, Evidence, Incident

S = 10**9
T0 = 1_800_000_000 * S  # a fixed "now" for the group timers


class Incidents:
    """The incident store's read side, in memory."""

    def __init__(self) -> None:
        self.by_id: dict[str, Incident] = {}

    def get(self, incident_id: str) -> Incident | None:
        return self.by_id.get(incident_id)

    def open_incidents(self) -> list[Incident]:
        return [i for i in self.by_id.values() if i.state != RESOLVED]

    def add(self, incident: Incident) -> Incident:
        self.by_id[incident.id] = incident
        return incident

    def firing(self) -> list[Incident]:
        return [i for i in self.by_id.values() if i.state == FIRING]


def incident(n: int, rule: str = "LSCpuStall", pod: str = "web-1", node: str = "worker-7",
             severity: str = "warning", at: int = T0, policy: str = "",
             **labels: str) -> Incident:
    series = {"node": node, "pod": pod, "class": "LS", "level": "pod", **labels}
    return Incident(
        id=f"inc-{n:03d}", fingerprint=f"fp-{n}", rule=rule, group="ls-protection",
        severity=severity, node=node, state=FIRING, series=series, labels=dict(series),
        started_ns=at - 10 * S, updated_ns=at, fired_ns=at, policy=policy,
        summary=f"LS {pod} waited for CPU 34.2% of the time",
        evidence=[Evidence(at - 10 * S, 25.0, 20.0, "crossed"), Evidence(at, 34.2, 20.0, "")])


def resolve(item: Incident, at: int) -> None:
    item.state, item.resolved_ns, item.updated_ns = RESOLVED, at, at
    item.evidence.append(Evidence(at, 3.0, 10.0, "recovered"))


def act(item: Incident, at: int, step: str = "cordon", status: str = "proposed") -> None:
    item.actions.append(ActionRecord(at, step, f"node/{item.node}", status == "proposed",
                                     status, f"would {step} node/{item.node}"))


def bot_receiver(server: Any, name: str = "sre", channel: str = "C0ALERTS01",
                 **slack: Any) -> dict[str, Any]:
    return {"name": name, "slack": {"bot_token": server.token, "channel": channel,
                                    "api_url": server.api_url, "min_interval": 0,
                                    "timeout": 2, **slack}}


def webhook_receiver(server: Any, name: str = "hook", channel: str = "C0HOOK0001",
                     path: str = "/services/T000/B000/XXXXSECRETXXXX",
                     **slack: Any) -> dict[str, Any]:
    server.add_channel(channel, name)
    url = server.add_webhook(channel, path)
    return {"name": name, "slack": {"webhook_url": url, "min_interval": 0, "timeout": 2,
                                    **slack}}


def alerting_dict(receivers: list[dict[str, Any]], route: dict[str, Any] | None = None,
                  **extra: Any) -> dict[str, Any]:
    route = dict(route or {"receiver": receivers[0]["name"]})
    route.setdefault("group_by", ["alertname", "node"])
    route.setdefault("group_wait", "10s")
    route.setdefault("group_interval", "1m")
    route.setdefault("repeat_interval", "4h")
    return {"receivers": receivers, "route": route, **extra}


def alerting_config(receivers: list[dict[str, Any]], route: dict[str, Any] | None = None,
                    **extra: Any) -> AlertingConfig:
    return AlertingConfig.model_validate(alerting_dict(receivers, route, **extra))


def make(config: AlertingConfig, data: Path, incidents: Incidents | None = None,
         **kwargs: Any) -> Alerting:
    kwargs.setdefault("backoff_s", (0.2, 1.0))
    return Alerting(config, AlertDB(data / "alerting.db"), incidents or Incidents(),
                    "worker-7", "https://sloguard.example", **kwargs)


def drained(alerting: Alerting, timeout: float = 20.0) -> None:
    """Wait until the outbox is empty: everything decided so far has been delivered."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not alerting.outbox.pending():
            return
        time.sleep(0.05)
    raise AssertionError(f"outbox not drained: {alerting.outbox.pending()}; "
                         f"{alerting.status().reason}")


def run(alerting: Alerting, incidents: Incidents, start: int, end: int,
        step: int = S) -> int:
    """Tick from `start` to `end` (inclusive) every `step`; returns `end`."""
    at = start
    while at <= end:
        alerting.tick(at, incidents.firing())
        at += step
    return end
