"""Aggregation groups and the notification log, as in Alertmanager's dispatcher and dedup
stage.

Alerts a route takes are grouped by the values of its `group_by` labels. A new group waits
`group_wait` to gather the alerts that come together (one message for ten pods hit by the same
noisy neighbour), then is flushed every `group_interval`. At a flush the group notifies when
the reader would learn something: an alert they were not told fires, one they were told about
changed (severity, a new action, an escalation), or resolved; with nothing new, it repeats
after `repeat_interval`. The notification log (what the receiver was last told) is kept with
the group in SQLite, and written in the same transaction as the messages it decided to send.

Two deliberate departures, for a Slack message that is updated in place:
- muting only hides firing alerts: a reader who was told an alert fires is told it resolved,
  even if it was silenced in between;
- a changed alert (new action, escalation) notifies at the next flush, not only a new one.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from typing import Any

from sloguard.actuators.alerting.alerts import Alert, digest, news, shown_actions
from sloguard.actuators.alerting.routing import Route
from sloguard.core.incidents import ActionRecord

SCHEMA = """
CREATE TABLE IF NOT EXISTS groups (
    key TEXT PRIMARY KEY,
    doc TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS handed (
    incident TEXT PRIMARY KEY,
    handed_ns INTEGER NOT NULL
);
"""

FIRST, NEW, CHANGED, RESOLVED, REPEAT = "first", "new", "changed", "resolved", "repeat"


@dataclass
class Group:
    key: str
    route: str
    receiver: str
    labels: dict[str, str]
    episode: str  # from the first alert until the group empties: one Slack message
    created_ns: int
    next_flush_ns: int
    members: list[str] = field(default_factory=list)  # alert keys (incident ids)
    # the notification log: alert key -> {"digest", "news"} of the firing alerts the receiver
    # was last told about; None until the first notification of the episode
    notified: dict[str, dict[str, Any]] | None = None
    notified_ns: int = 0
    posted: bool = False  # the episode's message is queued (bot receivers update it)

    @property
    def thread(self) -> str:
        return f"{self.key}:{self.episode}"


@dataclass
class Change:
    kind: str  # fired | action | updated | resolved
    alert: Alert
    action: ActionRecord | None = None


@dataclass
class Flush:
    reason: str  # first | new | changed | resolved | repeat
    group: Group
    firing: list[Alert]
    resolved: list[Alert]  # resolved since the last notification, which told they fired
    muted: int  # firing alerts hidden by silences or inhibition
    changes: list[Change]
    previous_ns: int = 0  # when the receiver was last notified before this flush


def group_key(route: Route, labels: dict[str, str]) -> str:
    text = json.dumps([route.id, route.receiver, sorted(labels.items())])
    return hashlib.sha1(text.encode()).hexdigest()[:16]


class Dispatcher:
    """Groups and their timers. `group_wait`, `group_interval` and `repeat_interval` run on the
    monotonic clock (`mono_ns`); the wall times kept on each group (`next_flush_ns`,
    `notified_ns`) are labels, saved so that a restarted agent can take the timers up again:
    then, the time left is read from them, bounded by the interval itself, so a wall clock
    stepped while the agent was down delays a flush by at most one interval. Without `mono_ns`
    (tests stepping simulated time) the wall time given is the only clock."""

    def __init__(self, root: Route, groups: list[Group],
                 ungrouped: frozenset[str] = frozenset()) -> None:
        self.root = root
        self.routes = {route.id: route for route in root.walk()}
        # receivers that group by themselves (Alertmanager): their routes make no groups here
        self.ungrouped = ungrouped
        # groups of a route that is gone (the config changed) or now sends elsewhere are dropped
        self.groups = {g.key: g for g in groups
                       if g.route in self.routes and self.routes[g.route].receiver == g.receiver
                       and g.receiver not in ungrouped}
        self.dirty: set[str] = set()
        self.deleted: set[str] = {g.key for g in groups} - set(self.groups)
        self._flush_at: dict[str, int] = {}  # group key -> monotonic time of its next flush
        self._told_at: dict[str, int] = {}  # group key -> monotonic time of its last notice

    def _timers(self, group: Group, now_ns: int, mono_ns: int) -> tuple[int, int | None]:
        """The group's next flush and last notification on the monotonic clock."""
        flush_at = self._flush_at.get(group.key)
        if flush_at is None:
            route = self.routes[group.route]
            longest = int(max(route.group_wait, route.group_interval) * 1e9)
            left = min(max(group.next_flush_ns - now_ns, 0), longest)
            flush_at = self._flush_at[group.key] = mono_ns + left
        told_at = self._told_at.get(group.key)
        if told_at is None and group.notified is not None:
            route = self.routes[group.route]
            ago = min(max(now_ns - group.notified_ns, 0), int(route.repeat_interval * 1e9))
            told_at = self._told_at[group.key] = mono_ns - ago
        return flush_at, told_at

    def tracked(self) -> set[str]:
        return {key for group in self.groups.values() for key in group.members}

    def assign(self, alerts: list[Alert], now_ns: int, mono_ns: int | None = None) -> None:
        """Put each firing alert in the groups of the routes that take it."""
        mono = now_ns if mono_ns is None else mono_ns
        for alert in alerts:
            if not alert.firing:
                continue  # a resolved alert stays only in the groups it fired in
            for route in self.root.match(alert.labels):
                if route.receiver in self.ungrouped:
                    continue
                labels = route.group_labels(alert.labels)
                key = group_key(route, labels)
                group = self.groups.get(key)
                if group is None:
                    group = self.groups[key] = Group(
                        key, route.id, route.receiver, labels, f"{now_ns:x}", now_ns,
                        now_ns + int(route.group_wait * 1e9))
                    self._flush_at[key] = mono + int(route.group_wait * 1e9)
                    self._told_at.pop(key, None)
                    self.deleted.discard(key)
                if alert.key not in group.members:
                    group.members.append(alert.key)
                    self.dirty.add(key)

    def due(self, now_ns: int, mono_ns: int | None = None) -> list[Group]:
        mono = now_ns if mono_ns is None else mono_ns
        timed = [(self._timers(g, now_ns, mono)[0], g) for g in self.groups.values()]
        return [g for at, g in sorted((t for t in timed if mono >= t[0]),
                                      key=lambda t: (t[0], t[1].key))]

    def flush(self, group: Group, alerts: dict[str, Alert], muted: set[str],
              now_ns: int, mono_ns: int | None = None) -> Flush | None:
        """Decide whether this flush notifies; update the notification log if it does."""
        mono = now_ns if mono_ns is None else mono_ns
        route = self.routes[group.route]
        _, told_at = self._timers(group, now_ns, mono)
        group.next_flush_ns = now_ns + int(route.group_interval * 1e9)
        self._flush_at[group.key] = mono + int(route.group_interval * 1e9)
        self.dirty.add(group.key)
        members = [alerts[k] for k in group.members if k in alerts]
        firing = [a for a in members if a.firing and a.key not in muted]
        hidden = sum(1 for a in members if a.firing and a.key in muted)
        notified = group.notified
        told = notified or {}
        resolved = [a for a in members if not a.firing and a.key in told]
        reason = self._reason(group, firing, resolved, route, mono, told_at)
        flush = None
        if reason is not None:
            flush = Flush(reason, group, firing, resolved, hidden,
                          _changes(told, firing, resolved), group.notified_ns)
            group.notified = {a.key: {"digest": digest(a.incident),
                                      "news": len(news(a.incident))} for a in firing}
            group.notified_ns = now_ns
            self._told_at[group.key] = mono
        # resolved alerts leave the group once the flush that could tell about them is done
        group.members = [a.key for a in members if a.firing]
        if group.notified is not None:
            group.notified = {k: v for k, v in group.notified.items() if k in group.members}
        if not group.members:
            del self.groups[group.key]
            self._flush_at.pop(group.key, None)
            self._told_at.pop(group.key, None)
            self.deleted.add(group.key)
            self.dirty.discard(group.key)
        return flush

    @staticmethod
    def _reason(group: Group, firing: list[Alert], resolved: list[Alert], route: Route,
                mono_ns: int, told_at: int | None) -> str | None:
        told = group.notified
        if told is None:
            return FIRST if firing else None
        if any(a.key not in told for a in firing):
            return NEW
        if any(told[a.key]["digest"] != digest(a.incident) for a in firing):
            return CHANGED
        if resolved:
            return RESOLVED
        if firing and told_at is not None and (
                mono_ns - told_at >= int(route.repeat_interval * 1e9)):
            return REPEAT
        return None

    # -- persistence ---------------------------------------------------------------------------

    def save(self, conn: Any) -> None:
        for key in self.deleted:
            conn.execute("DELETE FROM groups WHERE key = ?", (key,))
        for key in self.dirty:
            conn.execute("INSERT OR REPLACE INTO groups VALUES (?, ?)",
                         (key, json.dumps(asdict(self.groups[key]))))
        self.deleted.clear()
        self.dirty.clear()


def load_groups(rows: list[tuple[Any, ...]]) -> list[Group]:
    return [Group(**json.loads(doc)) for _, doc in rows]


def _changes(told: dict[str, dict[str, Any]], firing: list[Alert],
             resolved: list[Alert]) -> list[Change]:
    """What happened since the last notification: the timeline entries of this one."""
    out: list[Change] = []
    for alert in firing:
        before = told.get(alert.key)
        if before is None:
            out.append(Change("fired", alert))
            continue
        actions = shown_actions(alert.incident)[before["news"]:]
        out.extend(Change("action", alert, action) for action in actions)
        if not actions and before["digest"] != digest(alert.incident):
            out.append(Change("updated", alert))
    out.extend(Change("resolved", alert) for alert in resolved)
    return out
