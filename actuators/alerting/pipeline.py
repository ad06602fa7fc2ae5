"""The alert pipeline as the agent holds it: fed every tick, the ladder's notifier.

Every firing or resolved incident is an alert fed to the pipeline each tick, and the pipeline
diffs state (Alertmanager's model): an incident without an escalation policy enters when it
fires; one with a policy enters when its ladder reaches the `notify` rung (`notify()` records
the hand-over, on disk), and from then on its updates (new actions, escalation, resolve) flow.

The tick stays off the loop's critical path: it matches, groups and decides in memory, and
writes to SQLite only when a group changes or flushes (the notification log and the messages
it decided on in one transaction). Delivery happens on the senders' threads.

Receivers of kind `alertmanager` are not grouped here: the alerts routed to them go to the
spool (am_spool.py) when they fire, change or resolve, and Alertmanager groups, silences,
inhibits and notifies. This agent's silences and inhibition rules mute its own Slack receivers
only (an alert muted before Alertmanager would look resolved to it).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from sloguard.actuators.alerting.alertmanager import AlertmanagerSender
from sloguard.actuators.alerting.alerts import Alert, alert_labels, digest
from sloguard.actuators.alerting.am_alert import am_alert, resolved_copy
from sloguard.actuators.alerting.am_spool import Spool, alert_id
from sloguard.actuators.alerting.blocks import Renderer
from sloguard.actuators.alerting.config import AlertingConfig, RouteConfig
from sloguard.actuators.alerting.db import AlertDB
from sloguard.actuators.alerting.grouping import (
    REPEAT,
    RESOLVED,
    Dispatcher,
    Flush,
    load_groups,
)
from sloguard.actuators.alerting.inhibition import Inhibitor
from sloguard.actuators.alerting.outbox import POST, REPLY, UPDATE, WEBHOOK, Outbox, enqueue
from sloguard.actuators.alerting.routing import build_route
from sloguard.actuators.alerting.silences import ACTIVE, SilenceStore
from sloguard.actuators.alerting.slack import SlackSender
from sloguard.core.health import ComponentStatus
from sloguard.core.incidents import FIRING, Incident
from sloguard.core.incidents import RESOLVED as INCIDENT_RESOLVED
from sloguard.core.selfmetrics import alerting_metrics

log = logging.getLogger(__name__)

GC_S = 3600.0


class Alerting:
    """Silences, routing, inhibition, grouping, the outbox and the senders of one agent."""

    def __init__(
        self,
        config: AlertingConfig,
        db: AlertDB,
        incidents: Any,
        node: str,
        external_url: str,
        policy_known: Callable[[str], bool] = lambda name: False,
        planned: Callable[[Incident], list[str]] = lambda incident: [],
        registry: Any = None,
        backoff_s: tuple[float, float] = (1.0, 300.0),
    ) -> None:
        self.config = config
        self.db = db
        self.incidents = incidents
        self.node = node
        self.policy_known = policy_known
        self.send_in_dry_run = config.send_in_dry_run
        self.silences = SilenceStore(db)
        self.outbox = Outbox(db)
        self.inhibitor = Inhibitor(config.inhibit_rules)
        self.root = build_route(config.route or RouteConfig(receiver="-"))
        self.receivers = {r.name: r for r in config.receivers}
        self.renderer = Renderer(external_url, planned)
        self.external_url = external_url
        self._messages = None
        if registry is not None:
            self._messages = alerting_metrics(registry, self.pending)
        self.senders: dict[str, Any] = {
            r.name: SlackSender(r.name, r.slack, self.outbox, self._counter(r.name), backoff_s)
            for r in config.receivers if r.slack is not None}
        # alertmanager receivers: name -> URLs; their alerts go to the spool, not to groups
        self.forwarded: dict[str, list[str]] = {}
        self._extra_labels: dict[str, dict[str, str]] = {}
        self.spool = Spool(db)
        for r in config.receivers:
            if r.alertmanager is not None:
                self.forwarded[r.name] = list(r.alertmanager.urls)
                self._extra_labels[r.name] = dict(r.alertmanager.labels)
                self.senders[r.name] = AlertmanagerSender(
                    r.name, r.alertmanager, self.spool, self._counter(r.name), backoff_s)
        self.spool.gc(self.forwarded, time.time_ns())
        self._posted = self.spool.firing()  # (receiver, incident) -> (alert, digest)
        self.dispatcher = self._load()
        self.handed = {row[0] for row in db.rows("SELECT incident FROM handed")}
        self._seen: dict[str, Incident] = {}
        self._next_gc = time.monotonic() + 60.0
        self.error = ""
        self.forward_error = ""

    @property
    def enabled(self) -> bool:
        return bool(self.config.receivers)

    def _load(self) -> Dispatcher:
        return Dispatcher(self.root, load_groups(self.db.rows("SELECT key, doc FROM groups")),
                          ungrouped=frozenset(self.forwarded))

    def pending(self) -> dict[str, float]:
        """Per receiver: Slack messages waiting in the outbox; for an Alertmanager, alerts some
        URL has not accepted in their latest version."""
        out: dict[str, float] = {name: 0 for name in self.senders}
        out.update(self.outbox.pending())
        out.update(self.spool.pending(self.forwarded))
        return out

    def _counter(self, receiver: str) -> Callable[[str, str], None]:
        def count(kind: str, result: str) -> None:
            if self._messages is not None:
                self._messages.labels(receiver, kind, result).inc()
        return count

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        for sender in self.senders.values():
            sender.start()

    def stop(self) -> None:
        for sender in self.senders.values():
            sender.stop(timeout=0.0)
        for sender in self.senders.values():
            sender.stop(timeout=max(2.0, sender.config.timeout + 1))

    # -- the ladder's notifier ---------------------------------------------------------------

    def notify(self, incident_id: str, now_ns: int) -> None:
        """The ladder reached the notify rung: from now on this incident is an alert."""
        if incident_id in self.handed:
            return
        self.db.execute("INSERT OR IGNORE INTO handed VALUES (?, ?)", (incident_id, now_ns))
        self.handed.add(incident_id)

    # -- one tick ----------------------------------------------------------------------------

    def tick(self, now_ns: int, firing: list[Incident], mono_ns: int | None = None) -> None:
        """One tick: `now_ns` (wall) stamps messages and matches silences, which are written
        in wall time; `mono_ns` (monotonic) runs the group timers (grouping.Dispatcher)."""
        mono = time.monotonic()
        current = {i.id: i for i in firing if i.state == FIRING}  # the agent's events included
        alerts = {key: Alert(i, alert_labels(i)) for key, i in current.items()
                  if self._eligible(i)}
        for key in self.dispatcher.tracked() - alerts.keys():
            incident = self._lookup(key)
            if incident is not None:
                alerts[key] = Alert(incident, alert_labels(incident))
        self._seen = {key: alert.incident for key, alert in alerts.items()}
        if self.forwarded and self._forward(now_ns, alerts, firing):
            for name in self.forwarded:
                self.senders[name].wake()
        sources = [(key, alert_labels(i)) for key, i in current.items()]
        muted = {a.key for a in alerts.values() if a.firing and (
            self.silences.silencing(a.labels, now_ns)
            or self.inhibitor.inhibited_by(a.key, a.labels, sources))}
        self.dispatcher.assign(list(alerts.values()), now_ns, mono_ns)
        due = self.dispatcher.due(now_ns, mono_ns)
        gc = mono >= self._next_gc
        if not (due or self.dispatcher.dirty or self.dispatcher.deleted or gc):
            return
        queued = False
        try:
            with self.db.transaction() as conn:
                for group in due:
                    flush = self.dispatcher.flush(group, alerts, muted, now_ns, mono_ns)
                    if flush is not None:
                        queued = self._enqueue(conn, flush, now_ns) or queued
                self.dispatcher.save(conn)
                if gc:
                    self._gc(conn, set(current))
        except Exception as exc:
            # nothing was recorded: forget this tick's decisions, they are taken again
            self.dispatcher = self._load()
            self.error = f"cannot record notifications: {exc}"
            log.error("alerting: %s", self.error)
            return
        self.error = ""
        if gc:
            self._next_gc = mono + GC_S
            self.outbox.gc(now_ns)
            self.silences.gc(now_ns)
            self.spool.gc(self.forwarded, now_ns)
        if queued:
            for sender in self.senders.values():
                sender.wake()

    def _forward(self, now_ns: int, alerts: dict[str, Alert], given: list[Incident]) -> bool:
        """The alerts routed to Alertmanager receivers into the spool, when they fire, change
        (severity, an action) or end; True when something was written."""
        want: dict[tuple[str, str], Alert] = {}
        for key, alert in alerts.items():
            if alert.firing:
                for route in self.root.match(alert.labels):
                    if route.receiver in self.forwarded:
                        want[(route.receiver, key)] = alert
        writes: list[tuple[str, str, str, str, dict[str, Any], int]] = []
        posted = dict(self._posted)
        for (receiver, key), alert in want.items():
            before = posted.get((receiver, key))
            change = digest(alert.incident)
            if before is not None and before[1] == change:
                continue
            doc = am_alert(alert.incident, self._extra_labels[receiver], self.external_url)
            alert_key = alert_id(key, doc)
            if before is not None and before[0] != alert_key:  # its labels changed
                old = self.spool.doc(receiver, before[0])
                if old is not None:
                    writes.append((receiver, key, before[0], before[1],
                                   resolved_copy(old, now_ns), now_ns))
            writes.append((receiver, key, alert_key, change, doc, 0))
            posted[(receiver, key)] = (alert_key, change)
        by_id = {i.id: i for i in given}
        for receiver, key in self._posted.keys() - want.keys():
            alert_key, change = self._posted[(receiver, key)]
            try:
                incident = by_id.get(key) or self.incidents.get(key)
            except Exception:  # the incident store is briefly unavailable: next tick
                continue
            if incident is not None:  # resolved, or firing but no longer routed here
                ended = incident.resolved_ns if incident.state == INCIDENT_RESOLVED else None
                doc = am_alert(incident, self._extra_labels[receiver], self.external_url,
                               ended or now_ns)
                if alert_id(key, doc) != alert_key:
                    incident = None
            if incident is None:  # gone from the store: end what was posted
                old = self.spool.doc(receiver, alert_key)
                if old is None:
                    posted.pop((receiver, key), None)
                    continue
                doc = resolved_copy(old, now_ns)
            writes.append((receiver, key, alert_key, change, doc, now_ns))
            posted.pop((receiver, key), None)
        if not writes:
            return False
        try:
            with self.db.transaction() as conn:
                for receiver, key, alert_key, change, doc, ended_ns in writes:
                    self.spool.put(conn, receiver, key, alert_key, change, doc, ended_ns,
                                   now_ns)
        except Exception as exc:  # nothing was recorded: decided again next tick
            if not self.forward_error:
                log.error("alerting: cannot record alerts for Alertmanager: %s", exc)
            self.forward_error = f"cannot record alerts for Alertmanager: {exc}"
            return False
        self.forward_error = ""
        self._posted = posted
        return True

    def _eligible(self, incident: Incident) -> bool:
        """Incidents without a (loaded) policy alert when they fire; the others once their
        ladder has handed them over."""
        if not incident.policy or not self.policy_known(incident.policy):
            return True
        return incident.id in self.handed

    def _lookup(self, key: str) -> Incident | None:
        """A tracked incident that no longer fires here: resolved, usually."""
        seen = self._seen.get(key)
        if seen is not None and seen.state == INCIDENT_RESOLVED:
            return seen
        try:
            stored = self.incidents.get(key)
        except Exception:  # the incident store is briefly unavailable: keep what we knew
            return seen
        if stored is None and seen is not None:  # gone from the store: it is over
            seen.state, seen.resolved_ns = INCIDENT_RESOLVED, seen.resolved_ns or time.time_ns()
            return seen
        return stored

    def _enqueue(self, conn: Any, flush: Flush, now_ns: int) -> bool:
        receiver = self.receivers.get(flush.group.receiver)
        if receiver is None or receiver.slack is None:
            return False  # a receiver without Slack drops (Alertmanager's "null" receiver)
        sender = self.senders[receiver.name]
        assert isinstance(sender, SlackSender)
        send_resolved = receiver.slack.send_resolved
        group = flush.group
        message = self.renderer.group(flush, now_ns)
        if sender.mode == WEBHOOK:
            if flush.reason == RESOLVED and not send_resolved:
                return False
            enqueue(conn, receiver.name, WEBHOOK, group.thread, message, now_ns)
            return True
        if not group.posted:
            group.posted = True
            enqueue(conn, receiver.name, POST, group.thread, message, now_ns)
            return True
        # the group's message shows the group as it is now; the thread tells what happened
        enqueue(conn, receiver.name, UPDATE, group.thread, message, now_ns)
        if flush.reason != RESOLVED or send_resolved:
            timeline = self.renderer.timeline(flush, now_ns)
            timeline["broadcast"] = flush.reason == REPEAT  # a repeat must reach the channel
            enqueue(conn, receiver.name, REPLY, group.thread, timeline, now_ns)
        return True

    def _gc(self, conn: Any, firing: set[str]) -> None:
        tracked = self.dispatcher.tracked()
        done = [key for key in self.handed if key not in tracked and key not in firing]
        for key in done:
            incident = self.incidents.get(key)
            if incident is None or incident.state == INCIDENT_RESOLVED:
                conn.execute("DELETE FROM handed WHERE incident = ?", (key,))
                self.handed.discard(key)

    # -- health ------------------------------------------------------------------------------

    def status(self) -> ComponentStatus:
        pending = self.pending()
        problems = [f"receiver {name}: {s.problem}" for name, s in self.senders.items()
                    if s.problem]
        for error in (self.forward_error, self.error):
            if error:
                problems.insert(0, error)
        receivers = {}
        for name in self.receivers:
            sender = self.senders.get(name)
            info = sender.status() if sender else {"mode": "none (drops)"}
            info["pending"] = pending.get(name, 0)
            receivers[name] = info
        return ComponentStatus(
            "alerting", ok=not problems, reason="; ".join(problems)[:2000],
            details={"receivers": receivers, "groups": len(self.dispatcher.groups),
                     "silences_active": len(self.silences.list(ACTIVE)),
                     "send_in_dry_run": self.send_in_dry_run})


def ladder_plan(policies: Any, ledger: Any) -> Callable[[Incident], list[str]]:
    """What the incident's policy will do next if interference persists (for the message)."""
    from sloguard.core.units import format_duration

    def planned(incident: Incident) -> list[str]:
        policy = policies.get(incident.policy) if incident.policy else None
        if policy is None or incident.state != FIRING:
            return []
        in_force = [row.rung for row in ledger.rungs(policy.name)]
        top = max(in_force, default=-1)
        out = []
        for rung in policy.rungs(ledger.episode(policy.name))[top + 1:top + 4]:
            after = f" after {format_duration(rung.spec.after)} more" if rung.spec.after else ""
            dry = " (dry-run)" if rung.spec.dry_run else ""
            out.append(f"{rung.spec.step}{after}{dry}")
        return out

    return planned
