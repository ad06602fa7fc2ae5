"""The embedded sample store: SQLite in WAL mode, in the agent's data directory.

Chosen over DuckDB after measuring both here (benchmarks/store_choice.py, figures in
docs/performance.md): DuckDB added ~57 MB RSS and locks its file against other processes; this
layout inserted faster than the DuckDB store did. Each measurement has its own table with one column
per field (added as fields appear), so a tick of 100 cgroups is ~500 rows, not ~3,600
single-value rows, and a window read returns the wide frame directly. WAL lets readers (the UI,
another process) read while the agent's loop writes.

Each measurement's table is indexed by (series, time) so that one series' window is a range
read; but each tick appends one row to every series, which then lands in as many index pages
as there are series, each written whole to the WAL and again at the checkpoint: ~5 MB of disk
writes a tick for 100 cgroups, and most of the store's CPU (benchmarks/store_write.py). So a
tick's rows go to an unindexed twin table (`<table>_recent`, appended in time order: a few
pages), and every `fold_every_s` (30 s) they are moved into the indexed table in one statement,
each series' 30 rows side by side. Every write is as durable as before (nothing waits in
memory), and reads take both tables in one statement, so a reader sees every row exactly once
whether or not a fold has happened since.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sqlite3
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from sloguard.core.health import ComponentStatus
from sloguard.core.percentiles import parse_percentile
from sloguard.core.samples import Sample
from sloguard.store import StoreError, WindowQuery, check_aggregation

if TYPE_CHECKING:
    import pandas as pd

log = logging.getLogger(__name__)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS series (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    measurement TEXT NOT NULL,
    tags TEXT NOT NULL,
    last_ns INTEGER NOT NULL DEFAULT 0,
    UNIQUE (measurement, tags)
);
CREATE TABLE IF NOT EXISTS measurements (id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE);
CREATE TABLE IF NOT EXISTS fields (
    measurement_id INTEGER NOT NULL,
    name TEXT NOT NULL,
    col TEXT NOT NULL,
    PRIMARY KEY (measurement_id, name)
);
"""
_SQL_AGG = {"mean": "AVG", "min": "MIN", "max": "MAX", "sum": "SUM", "count": "COUNT"}
_DELETE_BATCH = 50_000
FOLD_EVERY_S = 30.0  # benchmarks/store_write.py: disk writes and CPU per tick against 1 s
FOLD_ROWS = 100_000  # and sooner when this many rows wait: a read scans all of them
RECENT = "_recent"  # suffix of the unindexed twin of each measurement's table
FREE_SPACE_RESERVE = 256 * 1024**2  # or 5% of the filesystem, whichever is larger
MAX_FIELDS = 1000  # columns of one measurement's table (SQLite allows 2000 in all)
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
_STORABLE = (float, str, bool, type(None))
_UNBOUNDED = frozenset(_STORABLE)  # types SQLite binds whatever their value
# What retrying can fix (the database, not the sample): the agent keeps the batch for later.
_RETRYABLE = (sqlite3.OperationalError, sqlite3.DatabaseError, sqlite3.InternalError)


class _Unstorable(Exception):
    """A sample SQLite cannot take (a value or time out of range, a type it cannot bind)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def unstorable(sample: Sample) -> tuple[str, str] | None:
    """Why the store cannot take `sample` (reason, message), or None when it can.

    SQLite's bindings raise OverflowError or TypeError, not sqlite3.Error, for such values: the
    write used to leave its transaction open, and every later write failed with "cannot start a
    transaction within a transaction". Only a batch that failed is screened (sample by sample,
    as it is halved): checking every sample up front cost a fifth of a write.
    """
    time_ns = sample.time_ns
    if type(time_ns) is not int or not INT64_MIN <= time_ns <= INT64_MAX:
        return "timestamp", f"time {time_ns!r} is not a 64-bit integer of nanoseconds"
    if _UNBOUNDED.issuperset(map(type, sample.fields.values())):
        return None  # floats, strings, booleans: the common case, one pass in C
    for name, value in sample.fields.items():
        if type(value) is int:
            if not INT64_MIN <= value <= INT64_MAX:
                return "value", f"field {name!r}: {value} does not fit 64 bits"
        elif not isinstance(value, _STORABLE):
            return "value", f"field {name!r}: a {type(value).__name__} cannot be stored"
    return None


class _Catalog:
    """Series, measurement tables and field columns, mirrored in memory."""

    def __init__(self) -> None:
        self.series: dict[tuple[str, str], int] = {}
        self.series_by_id: dict[int, tuple[str, dict[str, str]]] = {}
        self.tables: dict[str, str] = {}  # measurement -> table
        self.columns: dict[str, dict[str, str]] = {}  # measurement -> field -> column

    def load(self, conn: sqlite3.Connection) -> None:
        """Add what `conn` sees that is not mirrored yet, from one snapshot: a reader outside a
        transaction read each table at its own moment, and a measurement committed between
        two of them left a field without its measurement (a KeyError in a reading thread)."""
        own = not conn.in_transaction
        if own:
            conn.execute("BEGIN")  # deferred: in WAL, a snapshot that never blocks the writer
        try:
            self._load(conn)
        finally:
            if own and conn.in_transaction:
                conn.execute("ROLLBACK")  # it only read: nothing to commit

    def _load(self, conn: sqlite3.Connection) -> None:
        known = max(self.series_by_id, default=0)
        for sid, measurement, tags in conn.execute(
            "SELECT id, measurement, tags FROM series WHERE id > ?", (known,)
        ):
            self.series[(measurement, tags)] = sid
            self.series_by_id[sid] = (measurement, json.loads(tags))
        names = {}
        for mid, name in conn.execute("SELECT id, name FROM measurements"):
            names[mid] = name
            self.tables[name] = f"m{mid}"
        for mid, name, col in conn.execute("SELECT measurement_id, name, col FROM fields"):
            self.columns.setdefault(names[mid], {})[name] = col

    def reset(self, conn: sqlite3.Connection) -> None:
        self.__init__()
        self.load(conn)


class EmbeddedStore:
    name = "embedded"

    def __init__(self, path: Path, retention_s: float, max_size: int,
                 fold_every_s: float = FOLD_EVERY_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """`clock` (seconds, monotonic) says when a fold is due: a benchmark that writes a
        simulated second per call passes its own."""
        if fold_every_s < 0:
            raise ValueError("fold_every_s must be >= 0 (0: every write goes to the index)")
        self.fold_every_s = fold_every_s
        self.clock = clock
        self.path = Path(path)
        self.retention_ns = int(retention_s * 1e9)
        self.max_size = max_size
        self._write_lock = threading.Lock()
        self._read_lock = threading.Lock()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"{self.path}: cannot create the data directory: {exc}") from exc
        self._writer = self._connect()
        self._writer.executescript(_SCHEMA)
        self._reader = self._connect()
        self._catalog = _Catalog()
        self._catalog.load(self._writer)
        self._waiting: set[str] = set()  # measurements with rows in their _recent table
        self._waiting_rows = 0
        self._folded_at = self.clock()
        try:  # a store written before the twins existed gets them; rows left waiting by a
            # stopped (or killed) agent are folded now. Looked at first, so that opening a store
            # with nothing to do takes no write lock (a backtest opening the agent's store
            # while it writes would wait for it)
            conn, stale, waiting = self._writer, [], set()
            for measurement, table in self._catalog.tables.items():
                if self._twin_missing(conn, measurement, table):
                    stale.append((measurement, table))  # a store from before the twins, or
                    # a twin one column short (written by such a version since)
                elif conn.execute(f"SELECT 1 FROM {table}{RECENT} LIMIT 1").fetchone():
                    waiting.add(measurement)
            if waiting or stale:
                with self._transaction():
                    for measurement, table in stale:
                        self._ensure_recent(conn, measurement, table)
                    self._waiting = waiting | {m for m, _ in stale}
                    self._fold(conn)
        except sqlite3.Error as exc:
            raise StoreError(f"{self.path}: cannot prepare the embedded store: {exc}") from exc
        self._read_catalog = _Catalog()
        self._generation = 0  # bumped when retention removes series: readers reload
        self._read_generation = 0
        self._last_seen: dict[int, int] = {}
        self._fast_ids: dict[tuple, int] = {}  # (measurement, tag items as given) -> series id
        self._last_error = ""
        self.rows_written = 0
        self.rejected: dict[str, int] = {}  # samples dropped by reason (timestamp, value, ...)

    def _connect(self) -> sqlite3.Connection:
        try:
            conn = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute("PRAGMA busy_timeout=5000")
        except sqlite3.Error as exc:
            raise StoreError(f"{self.path}: cannot open the embedded store: {exc}") from exc
        return conn

    # -- writing -------------------------------------------------------------------------

    def write(self, samples: list[Sample]) -> None:
        """Write a batch atomically; a sample SQLite cannot take (a time or integer past 64
        bits, a type it cannot bind, a field beyond MAX_FIELDS) is dropped and counted
        (`rejected`), never kept to poison the batches after it. StoreError (nothing written,
        the caller keeps the batch) only for what retrying can fix: a lock, a full disk."""
        if not samples:
            return
        with self._write_lock:
            self._write_isolating(samples)

    def _reject(self, reason: str, message: str, sample: Sample) -> None:
        first = reason not in self.rejected
        self.rejected[reason] = self.rejected.get(reason, 0) + 1
        (log.warning if first else log.debug)(
            "embedded store: dropped a %s sample (%s; counted in rejected[%s])",
            sample.measurement[:100], message[:300], reason)

    def _write_isolating(self, samples: list[Sample]) -> None:
        """Write `samples`; when one of them cannot be written, halve the batch until it is
        found (a few transactions per bad sample, not one per sample)."""
        if not samples:
            return
        try:
            self._write_batch(samples)
        except _Unstorable as exc:
            if len(samples) == 1:
                self._reject(*(unstorable(samples[0]) or (exc.reason, str(exc))), samples[0])
                return
            middle = len(samples) // 2
            self._write_isolating(samples[:middle])
            self._write_isolating(samples[middle:])

    def _write_batch(self, samples: list[Sample]) -> None:
        """One transaction, committed whole or rolled back whole: _Unstorable when a sample is
        to blame (the caller halves the batch), StoreError when the database is."""
        conn, catalog = self._writer, self._catalog
        # what waits to be folded, as it was: a rolled-back transaction leaves it so
        before = self._waiting, self._waiting_rows, self._folded_at
        try:
            conn.execute("BEGIN IMMEDIATE")
            # measurement -> field names (in order) -> rows
            groups: dict[str, dict[tuple[str, ...], list[tuple]]] = defaultdict(
                lambda: defaultdict(list))
            seen: dict[int, int] = {}
            for sample in samples:
                sid = self._series_id(conn, sample)
                # the newest, not the last: a late sample must not age the series out
                if sample.time_ns > seen.get(sid, INT64_MIN):
                    seen[sid] = sample.time_ns
                names = tuple(sample.fields)
                groups[sample.measurement][names].append(
                    (sid, sample.time_ns, *sample.fields.values()))
            rows = 0
            into = RECENT if self.fold_every_s else ""
            for measurement, by_fields in groups.items():
                table = self._table(conn, measurement)
                for names, values in by_fields.items():
                    cols = [self._column(conn, measurement, table, n) for n in names]
                    marks = ",".join("?" * (len(cols) + 2))
                    conn.executemany(
                        f"INSERT INTO {table}{into} "
                        f"(series_id, ts{''.join(',' + c for c in cols)}) VALUES ({marks})",
                        values,
                    )
                    rows += len(values)
            if into:
                self._waiting = self._waiting | set(groups)
                self._waiting_rows += rows
                if (self._waiting_rows >= FOLD_ROWS
                        or self.clock() - self._folded_at >= self.fold_every_s):
                    self._fold(conn)
            conn.execute("COMMIT")
        except BaseException as exc:
            # Whatever went wrong, the transaction must not outlive this call.
            if conn.in_transaction:
                try:
                    conn.execute("ROLLBACK")
                except sqlite3.Error as rollback:
                    log.error("embedded store: rollback failed: %s", rollback)
            catalog.reset(conn)  # entries created by the failed transaction are gone
            self._fast_ids.clear()
            self._waiting, self._waiting_rows, self._folded_at = before
            if isinstance(exc, _Unstorable) or not isinstance(exc, Exception):
                raise
            if type(exc) in _RETRYABLE or (  # locked, busy, disk full or I/O: keep the batch
                    isinstance(exc, sqlite3.ProgrammingError) and "closed" in str(exc)):
                self._last_error = f"write failed: {exc}"
                raise StoreError(f"{self.path}: {exc}") from exc
            # a value SQLite cannot bind (OverflowError, TypeError, UnicodeEncodeError,
            # sqlite3.ProgrammingError...), found the hard way: find the sample, drop it
            raise _Unstorable("value", f"{exc.__class__.__name__}: {exc}") from exc
        last = self._last_seen
        for sid, ts in seen.items():
            if ts > last.get(sid, INT64_MIN):
                last[sid] = ts
        self.rows_written += rows
        self._last_error = ""

    def _series_id(self, conn: sqlite3.Connection, sample: Sample) -> int:
        fast = (sample.measurement, *sample.tags.items())
        sid = self._fast_ids.get(fast)
        if sid is not None:
            return sid
        key = (sample.measurement, json.dumps(sample.tags, sort_keys=True, separators=(",", ":")))
        sid = self._catalog.series.get(key)
        if sid is None:
            sid = int(conn.execute(
                "INSERT INTO series (measurement, tags) VALUES (?, ?)", key).lastrowid)
            self._catalog.series[key] = sid
            self._catalog.series_by_id[sid] = (sample.measurement, dict(sample.tags))
        if len(self._fast_ids) > 100_000:
            self._fast_ids.clear()
        self._fast_ids[fast] = sid
        return sid

    def _table(self, conn: sqlite3.Connection, measurement: str) -> str:
        table = self._catalog.tables.get(measurement)
        if table is None:
            mid = conn.execute("INSERT INTO measurements (name) VALUES (?)",
                               (measurement,)).lastrowid
            table = f"m{mid}"
            conn.execute(f"CREATE TABLE {table} (series_id INTEGER NOT NULL, ts INTEGER NOT NULL)")
            conn.execute(f"CREATE INDEX {table}_by_series ON {table} (series_id, ts)")
            self._catalog.tables[measurement] = table
            self._catalog.columns[measurement] = {}
            self._ensure_recent(conn, measurement, table)
        return table

    def _twin_missing(self, conn: sqlite3.Connection, measurement: str,
                      table: str) -> list[str]:
        """The columns `table`'s twin lacks (all of them, with series_id and ts, when there is
        no twin)."""
        has = {row[1] for row in conn.execute(f"PRAGMA table_info({table}{RECENT})")}
        wanted = ["series_id", "ts", *self._catalog.columns.get(measurement, {}).values()]
        return [col for col in wanted if col not in has]

    def _ensure_recent(self, conn: sqlite3.Connection, measurement: str, table: str) -> None:
        """The unindexed twin of `table`, with its columns (a store written before the twins,
        or by a version that added a column to the table alone, is brought up to date)."""
        conn.execute(f"CREATE TABLE IF NOT EXISTS {table}{RECENT} "
                     "(series_id INTEGER NOT NULL, ts INTEGER NOT NULL)")
        for col in self._twin_missing(conn, measurement, table):
            conn.execute(f"ALTER TABLE {table}{RECENT} ADD COLUMN {col}")

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[None]:
        """BEGIN IMMEDIATE on the writer; COMMIT, or ROLLBACK on any error."""
        conn = self._writer
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise

    def _fold(self, conn: sqlite3.Connection) -> None:
        """Move the waiting rows into the indexed tables, in time order (inside the caller's
        transaction: a reader sees them in one table or the other, never both or neither)."""
        for measurement in self._waiting:
            table = self._catalog.tables.get(measurement)
            if table is None:
                continue
            cols = "series_id, ts" + "".join(
                f", {c}" for c in self._catalog.columns.get(measurement, {}).values())
            conn.execute(f"INSERT INTO {table} ({cols}) SELECT {cols} FROM {table}{RECENT} "
                         "ORDER BY rowid")
            conn.execute(f"DELETE FROM {table}{RECENT}")
        self._waiting, self._waiting_rows = set(), 0
        self._folded_at = self.clock()

    def _column(self, conn: sqlite3.Connection, measurement: str, table: str, name: str) -> str:
        columns = self._catalog.columns[measurement]
        col = columns.get(name)
        if col is None:
            if len(columns) >= MAX_FIELDS:
                raise _Unstorable("fields", f"{measurement!r} has {MAX_FIELDS} fields already; "
                                  f"a new one ({name[:100]!r}) would not fit")
            col = f"f{len(columns) + 1}"
            conn.execute(f"ALTER TABLE {table} ADD COLUMN {col}")
            conn.execute(f"ALTER TABLE {table}{RECENT} ADD COLUMN {col}")
            conn.execute("INSERT INTO fields VALUES (?, ?, ?)",
                         (int(table[1:]), name, col))
            columns[name] = col
        return col

    # -- reading -------------------------------------------------------------------------

    def _rows(self, query: WindowQuery, agg: str) -> tuple[list, dict, list[str]]:
        """Rows (series_id, ts, *fields) of the window, the matching series, the fields."""
        with self._read_lock:
            catalog = self._read_catalog
            try:
                if self._read_generation != self._generation:
                    self._read_generation = self._generation
                    catalog.reset(self._reader)
                else:
                    catalog.load(self._reader)
            except sqlite3.Error as exc:
                raise StoreError(f"{self.path}: {exc}") from exc
            series = {
                sid: tags for sid, (measurement, tags) in catalog.series_by_id.items()
                if measurement == query.measurement
                and all(m.matches(tags) for m in query.matchers)
            }
            columns = catalog.columns.get(query.measurement, {})
            wanted = list(query.fields) if query.fields else sorted(columns)
            present = [f for f in wanted if f in columns]
            if not series or not present:
                return [], series, present
            cols = [columns[f] for f in present]
            bucketed = bool(query.every_ns and agg in _SQL_AGG)
            rows, params = _both_tables(catalog.tables[query.measurement], list(series),
                                        query.start_ns, query.end_ns, cols,
                                        first=2 if bucketed else 1)
            if bucketed:
                fn = _SQL_AGG[agg]
                select = ", ".join(f"{fn}({c})" for c in cols)
                sql = (f"SELECT series_id, (ts / ?1) * ?1 AS bucket, {select} FROM {rows} "
                       "GROUP BY series_id, bucket")
                params = [query.every_ns, *params]
            else:
                sql = f"SELECT series_id, ts, {', '.join(cols)} FROM {rows}"
            try:
                return self._reader.execute(sql, params).fetchall(), series, present
            except sqlite3.Error as exc:
                raise StoreError(f"{self.path}: {exc}") from exc

    def read(self, query: WindowQuery) -> pd.DataFrame:
        import pandas as pd  # only readers pay for pandas; the agent's loop does not need it

        agg = check_aggregation(query.agg)
        rows, series, present = self._rows(query, agg)
        raw = pd.DataFrame(rows, columns=["series_id", "ts", *present])
        for name in present:
            raw[name] = pd.to_numeric(raw[name], errors="coerce")
        if query.every_ns and agg not in _SQL_AGG:
            raw = _bucket_in_pandas(raw, query.every_ns, agg, present)
        wanted = list(query.fields) if query.fields else [
            f for f in present if raw[f].notna().any()]  # the fields these series have
        return _frame(raw, series, wanted)

    def read_samples(self, query: WindowQuery) -> list[Sample]:
        """The raw window as samples, oldest first, without pandas (for streaming consumers)."""
        if query.every_ns:
            raise ValueError("read_samples returns raw samples; use read() to aggregate")
        rows, series, present = self._rows(query, "mean")
        out = []
        for sid, ts, *values in sorted(rows, key=lambda row: row[1]):
            fields = {name: value for name, value in zip(present, values, strict=True)
                      if value is not None}
            if fields:
                out.append(Sample(query.measurement, dict(series[sid]), fields, ts))
        return out

    def read_series(self, query: WindowQuery) -> list[tuple[dict[str, str], list[int],
                                                         list[float]]]:
        """One field's window per series (store/__init__.py's `read_series`): the rows
        grouped, with no per-point objects."""
        rows, series, _ = self._rows(query, "mean")
        grouped: dict[int, tuple[dict[str, str], list[int], list[float]]] = {}
        for sid, ts, *values in sorted(rows, key=lambda row: row[1]):
            value = values[0] if values else None
            if not isinstance(value, int | float) or isinstance(value, bool):
                continue
            found = grouped.get(sid)
            if found is None:
                found = grouped[sid] = (dict(series[sid]), [], [])
            found[1].append(ts)
            found[2].append(float(value))
        return list(grouped.values())

    def read_totals(self, query: WindowQuery) -> list[tuple[dict[str, str], float, int]]:
        """One field's sum and count per series over the window (store/__init__.py's
        `read_totals`), summed by SQLite."""
        if len(query.fields or ()) != 1:
            raise ValueError("read_totals reads one field")
        # the matching series and the column (an empty window: no rows are read)
        _, series, present = self._rows(WindowQuery(query.measurement, 0, 0, query.fields,
                                                    query.matchers), "mean")
        if not series or not present:
            return []
        with self._read_lock:
            catalog = self._read_catalog
            column = catalog.columns[query.measurement][present[0]]
            both, params = _both_tables(catalog.tables[query.measurement], list(series),
                                        query.start_ns, query.end_ns, [column])
            sql = f"SELECT series_id, SUM({column}), COUNT({column}) FROM {both} GROUP BY series_id"
            try:
                rows = self._reader.execute(sql, params).fetchall()
            except sqlite3.Error as exc:
                raise StoreError(f"{self.path}: {exc}") from exc
        return [(dict(series[sid]), float(total or 0.0), int(count)) for sid, total, count
                in rows if count]

    # -- retention -----------------------------------------------------------------------

    def maintain(self, now_ns: int) -> None:
        """Drop samples older than the retention, then the oldest ones above the size bound."""
        with self._write_lock:
            try:
                self._flush_last_seen()
                if self._waiting:  # retention and the size bound work on the indexed tables
                    with self._transaction():
                        self._fold(self._writer)
                cutoff = now_ns - self.retention_ns
                for table in self._catalog.tables.values():
                    # Rows go in write order, up to the first one still inside the retention:
                    # never one stamped after the cutoff, whatever the clock did. A row stamped
                    # far ahead (the wall clock stepped forward, then back) therefore keeps the
                    # rows written after it until the clock reaches its stamp, or the size
                    # bound takes them: skipping it instead would also take every row written
                    # before a clock stepped back (docs/storage.md).
                    boundary = self._writer.execute(
                        f"SELECT rowid FROM {table} WHERE ts >= ? ORDER BY rowid LIMIT 1",
                        (cutoff,)).fetchone()
                    if boundary is None:
                        boundary = self._writer.execute(
                            f"SELECT max(rowid) + 1 FROM {table}").fetchone()
                    self._delete_below(table, boundary[0])
                # Deleting rows frees B-tree pages less than proportionally: repeat a few times.
                for _ in range(8):
                    used = self.used_bytes()
                    if used <= self.size_limit(used):
                        break
                    share = min(0.5, max(0.05, 1 - 0.9 * self.size_limit(used) / used))
                    for table in self._catalog.tables.values():
                        lo, hi = self._writer.execute(
                            f"SELECT min(rowid), max(rowid) FROM {table}").fetchone()
                        if lo is not None:
                            self._delete_below(table, lo + int((hi - lo + 1) * share) + 1)
                    log.warning(
                        "embedded store above its %d-byte bound: dropped the oldest %.0f%% of "
                        "samples", self.max_size, share * 100,
                    )
                self._writer.execute(
                    "DELETE FROM series WHERE last_ns < ? AND last_ns > 0", (cutoff,))
            except sqlite3.Error as exc:
                self._last_error = f"retention failed: {exc}"
                raise StoreError(f"{self.path}: {exc}") from exc
            self._catalog.reset(self._writer)
            self._fast_ids.clear()
            self._generation += 1

    def _delete_below(self, table: str, rowid: int | None) -> None:
        if rowid is None:
            return
        while True:
            cursor = self._writer.execute(
                f"DELETE FROM {table} WHERE rowid IN "
                f"(SELECT rowid FROM {table} WHERE rowid < ? ORDER BY rowid LIMIT ?)",
                (rowid, _DELETE_BATCH),
            )
            if cursor.rowcount < _DELETE_BATCH:
                break

    def _flush_last_seen(self) -> None:
        if self._last_seen:
            self._writer.executemany(
                "UPDATE series SET last_ns = max(last_ns, ?) WHERE id = ?",
                [(ts, sid) for sid, ts in self._last_seen.items()],
            )
            self._last_seen.clear()

    def size_limit(self, used: int) -> int:
        """`max_size`, lowered so the filesystem keeps a reserve free.

        Retention itself needs free space (SQLite's deletes go through the WAL): a store that
        filled its disk could not shrink any more.
        """
        try:
            fs = os.statvfs(self.path.parent)
        except OSError:
            return self.max_size
        free = fs.f_bavail * fs.f_frsize
        reserve = max(FREE_SPACE_RESERVE, fs.f_blocks * fs.f_frsize // 20)
        return max(0, min(self.max_size, used + free - reserve))

    def used_bytes(self) -> int:
        pages, free, size = (
            self._writer.execute(f"PRAGMA {p}").fetchone()[0]
            for p in ("page_count", "freelist_count", "page_size")
        )
        return (pages - free) * size

    def status(self) -> ComponentStatus:
        return ComponentStatus(
            "store:embedded", ok=not self._last_error, reason=self._last_error,
            details={"path": str(self.path), "rows_written": self.rows_written,
                     "rejected_samples": dict(self.rejected)},
        )

    def close(self) -> None:
        with self._write_lock:
            try:
                self._flush_last_seen()
                self._writer.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            except sqlite3.Error as exc:
                log.warning("embedded store: final checkpoint failed: %s", exc)
            self._writer.close()
        with self._read_lock:
            self._reader.close()


def _both_tables(table: str, series: list[int], start_ns: int, end_ns: int,
                 cols: list[str], first: int = 1) -> tuple[str, list]:
    """A subquery of the window's rows from the indexed table and its twin of rows waiting to
    be folded, and its parameters: one statement, so one snapshot (a fold in between cannot
    show a row twice or not at all). The parameters are numbered from `first` and each bound
    once for both tables, so a read may name as many series as before the twin existed
    (SQLITE_MAX_VARIABLE_NUMBER, 32,766 by default, less the window's two)."""
    numbers = range(first, first + len(series) + 2)
    where = (f"series_id IN ({','.join(f'?{i}' for i in numbers[:-2])}) "
             f"AND ts >= ?{numbers[-2]} AND ts < ?{numbers[-1]}")
    select = f"SELECT series_id, ts, {', '.join(cols)} FROM"
    return (f"({select} {table} WHERE {where} UNION ALL {select} {table}{RECENT} WHERE {where})",
            [*series, start_ns, end_ns])


def _bucket_in_pandas(raw: pd.DataFrame, every_ns: int, agg: str,
                      fields: list[str]) -> pd.DataFrame:
    raw = raw.assign(ts=(raw["ts"] // every_ns) * every_ns).sort_values("ts", kind="stable")
    grouped = raw.groupby(["series_id", "ts"], sort=False)[fields]
    if agg in ("first", "last", "median"):
        out = getattr(grouped, agg)()
    else:
        out = grouped.quantile(parse_percentile(agg))
    return out.reset_index()


def _frame(raw: pd.DataFrame, series: dict[int, dict[str, str]], fields: list[str]) -> pd.DataFrame:
    """`time`, the series' tag columns, then the fields; sorted by time then tags."""
    import pandas as pd

    ids = raw["series_id"].astype("int64") if len(raw) else pd.Series([], dtype="int64")
    tag_keys = sorted({k for sid in set(ids) for k in series[int(sid)]}) if len(raw) else sorted(
        {k for tags in series.values() for k in tags})
    out = pd.DataFrame({"time": pd.to_datetime(raw["ts"].astype("int64"), unit="ns", utc=True)})
    for key in tag_keys:
        out[key] = [series[int(sid)].get(key, "") for sid in ids]
    for name in fields:
        out[name] = raw[name].astype(float) if name in raw.columns else float("nan")
    return out.sort_values(["time", *tag_keys], kind="stable").reset_index(drop=True)


def open_store(data_dir: Path, retention_s: float, max_size: int) -> EmbeddedStore:
    return EmbeddedStore(Path(data_dir) / "samples.db", retention_s, max_size)
