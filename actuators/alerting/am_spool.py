"""What each Alertmanager has been told: the alerts routed to an `alertmanager` receiver, and
per URL the version of each it last accepted. On disk (alerting.db), so a resolve decided
while an Alertmanager is down, or just before the agent restarts, still reaches it.

Why not the outbox: the outbox is an ordered log of messages, each sent once, with checks
against the uncertain second post a Slack channel would show twice. Alertmanager's API is
state, not messages: posting the same alert again only refreshes it, and it must be posted
again (Prometheus re-sends every firing alert each minute) or it ends. So the spool keeps the
current document of each alert, and each URL's sender posts what changed since that URL last
accepted it, and everything at each resend; one URL down leaves the others' marks alone.

An alert is one label set: if an incident's labels change (a new severity), the old label set
is ended and a new alert starts, as Alertmanager identifies alerts by their labels. A resolved
alert is posted with its `endsAt` until every URL has accepted it, and re-posted with each
resend for 15 minutes (Prometheus' rule: an Alertmanager that restarted meanwhile learns the
end too); after a day it is dropped even if a URL never came back (that Alertmanager has long
ended it itself: every post was valid for four resend intervals only).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from sloguard.actuators.alerting.db import AlertDB

SCHEMA = """
CREATE TABLE IF NOT EXISTS am_alerts (
    receiver TEXT NOT NULL,
    alert TEXT NOT NULL,
    incident TEXT NOT NULL,
    version INTEGER NOT NULL,
    digest TEXT NOT NULL,
    doc TEXT NOT NULL,
    resolved_ns INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (receiver, alert)
);
CREATE TABLE IF NOT EXISTS am_told (
    receiver TEXT NOT NULL,
    url TEXT NOT NULL,
    alert TEXT NOT NULL,
    version INTEGER NOT NULL,
    told_ns INTEGER NOT NULL,
    PRIMARY KEY (receiver, url, alert)
);
"""

RESEND_RESOLVED_NS = 15 * 60 * 10**9
KEEP_NS = 86400 * 10**9


def alert_id(incident: str, doc: dict[str, Any]) -> str:
    """The incident and its label set: Alertmanager's identity of an alert is its labels."""
    text = json.dumps(sorted(doc.get("labels", {}).items()))
    return f"{incident}:{hashlib.sha1(text.encode()).hexdigest()[:12]}"


@dataclass
class Item:
    alert: str
    version: int
    doc: dict[str, Any]
    resolved_ns: int


class Spool:
    def __init__(self, db: AlertDB) -> None:
        self.db = db

    def firing(self) -> dict[tuple[str, str], tuple[str, str]]:
        """(receiver, incident) -> (alert, digest) of the alerts not yet ended."""
        return {(r, i): (a, d) for r, i, a, d in self.db.rows(
            "SELECT receiver, incident, alert, digest FROM am_alerts WHERE resolved_ns = 0")}

    def doc(self, receiver: str, alert: str) -> dict[str, Any] | None:
        rows = self.db.rows("SELECT doc FROM am_alerts WHERE receiver = ? AND alert = ?",
                            (receiver, alert))
        return json.loads(rows[0][0]) if rows else None

    @staticmethod
    def put(conn: Any, receiver: str, incident: str, alert: str, digest: str,
            doc: dict[str, Any], resolved_ns: int, now_ns: int) -> None:
        """Within the caller's transaction. The version only grows (a later post wins)."""
        conn.execute(
            "INSERT INTO am_alerts VALUES (?,?,?,?,?,?,?) ON CONFLICT (receiver, alert) DO "
            "UPDATE SET version = MAX(version + 1, excluded.version), digest = "
            "excluded.digest, doc = excluded.doc, resolved_ns = excluded.resolved_ns",
            (receiver, alert, incident, now_ns, digest, json.dumps(doc), resolved_ns))

    def due(self, receiver: str, url: str, everything: bool, now_ns: int) -> list[Item]:
        """What this URL must be posted: the alerts changed since it last accepted them, and
        with `everything` (a resend) also every firing alert and the recently resolved."""
        rows = self.db.rows(
            "SELECT a.alert, a.version, a.doc, a.resolved_ns, t.version FROM am_alerts a "
            "LEFT JOIN am_told t ON t.receiver = a.receiver AND t.alert = a.alert AND "
            "t.url = ? WHERE a.receiver = ? ORDER BY a.resolved_ns != 0, a.version",
            (url, receiver))
        out = []
        for alert, version, doc, resolved_ns, told in rows:
            changed = told is None or told < version
            recent = not resolved_ns or resolved_ns >= now_ns - RESEND_RESOLVED_NS
            if changed or (everything and recent):
                out.append(Item(alert, version, json.loads(doc), resolved_ns))
        return out

    def told(self, receiver: str, url: str, items: list[Item], now_ns: int) -> None:
        """This URL accepted these versions (a version changed meanwhile stays due)."""
        with self.db.transaction() as conn:
            conn.executemany(
                "INSERT INTO am_told VALUES (?,?,?,?,?) ON CONFLICT (receiver, url, alert) DO "
                "UPDATE SET version = MAX(version, excluded.version), told_ns = "
                "excluded.told_ns", [(receiver, url, i.alert, i.version, now_ns) for i in items])

    def pending(self, receivers: dict[str, list[str]]) -> dict[str, int]:
        """Per receiver, the alerts some URL has not accepted in their latest version."""
        out = {}
        for receiver, urls in receivers.items():
            rows = self.db.rows(
                "SELECT a.alert, COUNT(t.url) FROM am_alerts a LEFT JOIN am_told t ON "
                "t.receiver = a.receiver AND t.alert = a.alert AND t.version >= a.version "
                "WHERE a.receiver = ? GROUP BY a.alert", (receiver,))
            out[receiver] = sum(1 for _, told in rows if told < len(urls))
        return out

    def gc(self, receivers: dict[str, list[str]], now_ns: int) -> None:
        """Forget what no receiver needs: receivers and URLs no longer configured, resolved
        alerts every URL accepted and past their re-posting, and any resolved after a day."""
        names = list(receivers)
        marks = ",".join("?" * len(names)) or "''"
        with self.db.transaction() as conn:
            conn.execute(f"DELETE FROM am_alerts WHERE receiver NOT IN ({marks})", names)
            conn.execute("DELETE FROM am_alerts WHERE resolved_ns != 0 AND resolved_ns < ?",
                         (now_ns - KEEP_NS,))
            for receiver, urls in receivers.items():
                conn.execute(f"DELETE FROM am_told WHERE receiver = ? AND url NOT IN "
                             f"({','.join('?' * len(urls))})", (receiver, *urls))
                done = [row[0] for row in conn.execute(
                    "SELECT a.alert FROM am_alerts a JOIN am_told t ON t.receiver = a.receiver "
                    "AND t.alert = a.alert AND t.version >= a.version WHERE a.receiver = ? "
                    "AND a.resolved_ns != 0 AND a.resolved_ns < ? GROUP BY a.alert "
                    "HAVING COUNT(t.url) >= ?",
                    (receiver, now_ns - RESEND_RESOLVED_NS, len(urls)))]
                conn.executemany("DELETE FROM am_alerts WHERE receiver = ? AND alert = ?",
                                 [(receiver, alert) for alert in done])
            conn.execute("DELETE FROM am_told WHERE NOT EXISTS (SELECT 1 FROM am_alerts a "
                         "WHERE a.receiver = am_told.receiver AND a.alert = am_told.alert)")
