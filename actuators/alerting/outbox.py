"""The outbox: every message the pipeline decided to send, on disk until Slack has it.

The agent loop appends (in the transaction that updates the notification log, so a decision
and its messages are never half-recorded); one sender per receiver takes the oldest entry of
its receiver, so each channel sees its messages in the order they were decided.

An entry's states: `queued` -> `sending` (committed before the request leaves) -> `done`
(committed together with the Slack message's ts, before anything else happens). An entry
found in `sending` means the previous attempt's outcome is unknown (the agent died mid-send,
or the request timed out after it left): the sender checks Slack before sending it again.
`failed` is a message Slack refuses for good (logged and skipped, so it cannot block the
queue); `superseded` an update overtaken by a later update of the same message.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

from sloguard.actuators.alerting.db import AlertDB

SCHEMA = """
CREATE TABLE IF NOT EXISTS outbox (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    receiver TEXT NOT NULL,
    kind TEXT NOT NULL,
    thread TEXT NOT NULL,
    payload TEXT NOT NULL,
    post_key TEXT NOT NULL,
    state TEXT NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    not_before_ns INTEGER NOT NULL DEFAULT 0,
    first_attempt_ns INTEGER NOT NULL DEFAULT 0,
    created_ns INTEGER NOT NULL,
    done_ns INTEGER NOT NULL DEFAULT 0,
    error TEXT NOT NULL DEFAULT '',
    result TEXT NOT NULL DEFAULT ''
);
CREATE INDEX IF NOT EXISTS outbox_head ON outbox (receiver, state, id);
CREATE TABLE IF NOT EXISTS threads (
    receiver TEXT NOT NULL,
    thread TEXT NOT NULL,
    channel TEXT NOT NULL,
    ts TEXT NOT NULL,
    PRIMARY KEY (receiver, thread)
);
CREATE TABLE IF NOT EXISTS receivers (
    receiver TEXT PRIMARY KEY,
    channel_id TEXT NOT NULL
);
"""

# kinds
WEBHOOK = "webhook"  # an incoming-webhook message
POST = "post"  # chat.postMessage: the group's message
UPDATE = "update"  # chat.update of the group's message
REPLY = "reply"  # chat.postMessage into the group message's thread (the timeline)

QUEUED, SENDING, DONE, FAILED, SUPERSEDED = "queued", "sending", "done", "failed", "superseded"
PENDING_STATES = (QUEUED, SENDING)
KEEP_DONE_NS = 86400 * 10**9


@dataclass
class Entry:
    id: int
    receiver: str
    kind: str
    thread: str
    payload: dict[str, Any]
    post_key: str
    state: str
    attempts: int
    not_before_ns: int
    first_attempt_ns: int
    created_ns: int
    error: str = ""


def enqueue(conn: Any, receiver: str, kind: str, thread: str, payload: dict[str, Any],
            now_ns: int) -> None:
    """Append within the caller's transaction (see grouping: decision and messages together)."""
    conn.execute(
        "INSERT INTO outbox (receiver, kind, thread, payload, post_key, state, created_ns) "
        "VALUES (?,?,?,?,?,?,?)",
        (receiver, kind, thread, json.dumps(payload), uuid.uuid4().hex, QUEUED, now_ns))


class Outbox:
    def __init__(self, db: AlertDB) -> None:
        self.db = db

    def head(self, receiver: str) -> Entry | None:
        rows = self.db.rows(
            "SELECT id, receiver, kind, thread, payload, post_key, state, attempts, "
            "not_before_ns, first_attempt_ns, created_ns, error FROM outbox "
            "WHERE receiver = ? AND state IN (?, ?) ORDER BY id LIMIT 1",
            (receiver, *PENDING_STATES))
        if not rows:
            return None
        r = rows[0]
        return Entry(r[0], r[1], r[2], r[3], json.loads(r[4]), r[5], r[6], r[7], r[8], r[9],
                     r[10], r[11])

    def pending(self) -> dict[str, int]:
        return dict(self.db.rows(
            "SELECT receiver, COUNT(*) FROM outbox WHERE state IN (?, ?) GROUP BY receiver",
            PENDING_STATES))

    def sending(self, entry: Entry, now_ns: int) -> None:
        """Mark the attempt before the request leaves (on disk: see AlertDB)."""
        first = entry.first_attempt_ns or now_ns
        self.db.execute("UPDATE outbox SET state = ?, attempts = attempts + 1, "
                        "first_attempt_ns = ? WHERE id = ?", (SENDING, first, entry.id))
        entry.state, entry.attempts, entry.first_attempt_ns = SENDING, entry.attempts + 1, first

    def attempted(self, entry: Entry) -> None:
        """Count an attempt that sent nothing (a check for an earlier one): backoff grows."""
        self.db.execute("UPDATE outbox SET attempts = attempts + 1 WHERE id = ?", (entry.id,))
        entry.attempts += 1

    def done(self, entry: Entry, now_ns: int, channel: str = "", ts: str = "",
             new_thread: bool = False) -> None:
        """Sent: recorded with the message's ts (and the thread it starts) in one commit."""
        with self.db.transaction() as conn:
            conn.execute("UPDATE outbox SET state = ?, done_ns = ?, result = ?, error = '' "
                         "WHERE id = ?", (DONE, now_ns, ts, entry.id))
            if new_thread and ts:
                conn.execute("INSERT OR REPLACE INTO threads VALUES (?,?,?,?)",
                             (entry.receiver, entry.thread, channel, ts))
            if channel:
                conn.execute("INSERT OR REPLACE INTO receivers VALUES (?, ?)",
                             (entry.receiver, channel))

    def retry(self, entry: Entry, not_before_ns: int, error: str, unknown: bool) -> None:
        """Try again later. `unknown`: the request may have reached Slack (stays `sending`, so
        the next attempt checks first); else it certainly did not (back to `queued`)."""
        state = SENDING if unknown else QUEUED
        self.db.execute("UPDATE outbox SET state = ?, not_before_ns = ?, error = ? WHERE id = ?",
                        (state, not_before_ns, error[:1000], entry.id))
        entry.state, entry.not_before_ns, entry.error = state, not_before_ns, error

    def fail(self, entry: Entry, now_ns: int, error: str) -> None:
        self.db.execute("UPDATE outbox SET state = ?, done_ns = ?, error = ? WHERE id = ?",
                        (FAILED, now_ns, error[:1000], entry.id))

    def supersede_older_updates(self, entry: Entry, now_ns: int) -> bool:
        """True when a later update of the same message is queued: this one need not go."""
        rows = self.db.rows("SELECT 1 FROM outbox WHERE receiver = ? AND thread = ? AND "
                            "kind = ? AND state = ? AND id > ? LIMIT 1",
                            (entry.receiver, entry.thread, UPDATE, QUEUED, entry.id))
        if rows:
            self.db.execute("UPDATE outbox SET state = ?, done_ns = ? WHERE id = ?",
                            (SUPERSEDED, now_ns, entry.id))
        return bool(rows)

    def thread(self, receiver: str, thread: str) -> tuple[str, str] | None:
        """(channel id, ts) of the message that holds this group episode, once posted."""
        rows = self.db.rows("SELECT channel, ts FROM threads WHERE receiver = ? AND thread = ?",
                            (receiver, thread))
        return (rows[0][0], rows[0][1]) if rows else None

    def channel_id(self, receiver: str) -> str | None:
        rows = self.db.rows("SELECT channel_id FROM receivers WHERE receiver = ?", (receiver,))
        return rows[0][0] if rows else None

    def gc(self, now_ns: int) -> None:
        """Forget delivered entries after a day (threads stay while a group may update)."""
        self.db.execute("DELETE FROM outbox WHERE state NOT IN (?, ?) AND done_ns < ?",
                        (*PENDING_STATES, now_ns - KEEP_DONE_NS))
        self.db.execute("DELETE FROM threads WHERE thread NOT IN (SELECT thread FROM outbox) "
                        "AND receiver || ':' || thread NOT IN (SELECT receiver || ':' || "
                        "key || ':' || json_extract(doc, '$.episode') FROM groups)")
