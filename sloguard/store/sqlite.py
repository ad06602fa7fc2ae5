"""Opening the project's small SQLite databases the one way they all need: WAL (readers on the
API's threads never block the loop's writes), a busy timeout, the schema, and columns added to
databases written by an older version."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path

from sloguard.store import StoreError


def open_db(path: Path, schema: str | tuple[str, ...], what: str, busy_ms: int = 5000,
            synchronous: str | None = None,
            migrate: Callable[[sqlite3.Connection], None] | None = None) -> sqlite3.Connection:
    """A connection shared across threads (callers hold their own lock); StoreError naming the
    file and `what` it is when it cannot be opened or `migrate` (older files) fails."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        if synchronous:
            conn.execute(f"PRAGMA synchronous={synchronous}")
        conn.execute(f"PRAGMA busy_timeout={int(busy_ms)}")
        for script in (schema,) if isinstance(schema, str) else schema:
            conn.executescript(script)
        if migrate is not None:
            migrate(conn)
    except (OSError, sqlite3.Error) as exc:
        raise StoreError(f"{path}: cannot open {what}: {exc}") from exc
    return conn


def add_column(conn: sqlite3.Connection, table: str, column: str, definition: str) -> None:
    """Add `column` to a table made by an older version, if it is missing."""
    if column not in {row[1] for row in conn.execute(f"PRAGMA table_info({table})")}:
        conn.execute(f"ALTER TABLE {table} ADD COLUMN {column} {definition}")
