"""The alerting database: silences, groups, the notification log, the outbox and what each
Alertmanager was told in one SQLite file, so that the notification log and the messages it
decided to send commit together."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sloguard.store.sqlite import open_db


class AlertDB:
    """One connection shared by the agent loop, the senders and the API, under a lock.

    Every statement is short; the network is never touched while the lock is held.
    `synchronous=FULL`: a row that says "sent" or "sending" is on disk before the next step,
    which is what makes a restart in the middle of a send safe.
    """

    def __init__(self, path: Path) -> None:
        from sloguard.actuators.alerting import am_spool, grouping, outbox, silences

        self.path = Path(path)
        self.lock = threading.RLock()
        schemas = (silences.SCHEMA, grouping.SCHEMA, outbox.SCHEMA, am_spool.SCHEMA)
        self.conn = open_db(self.path, schemas, "the alerting database", busy_ms=10000,
                            synchronous="FULL")

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        with self.lock:
            self.conn.execute("BEGIN IMMEDIATE")
            try:
                yield self.conn
            except BaseException:
                self.conn.execute("ROLLBACK")
                raise
            self.conn.execute("COMMIT")

    def rows(self, sql: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        with self.lock:
            return self.conn.execute(sql, args).fetchall()

    def execute(self, sql: str, args: tuple[Any, ...] = ()) -> int:
        with self.lock:
            return self.conn.execute(sql, args).rowcount

    def version(self) -> int:
        """Changes when another connection (another process) commits."""
        with self.lock:
            return int(self.conn.execute("PRAGMA data_version").fetchone()[0])

    def close(self) -> None:
        with self.lock:
            self.conn.close()
