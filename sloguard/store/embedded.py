"""The embedded sample store: SQLite in WAL mode, in the agent's data directory.

Chosen over DuckDB after measuring both here (benchmarks/store_choice.py): insert and window
reads are of the same order for our batch sizes, while SQLite costs no extra dependency, keeps the
agent's RSS low, and lets the UI read while the loop writes (WAL). Samples are kept in long
form, one row per (series, field, time), so any field of any measurement is read by the same
index without schema changes when a collector grows a field.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
import time
from pathlib import Path

import numpy as np
import pandas as pd

from sloguard.health import ComponentStatus
from sloguard.samples import Sample
from sloguard.store import StoreError, WindowQuery, check_aggregation

log = logging.getLogger(__name__)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS series (
    id INTEGER PRIMARY KEY,
    measurement TEXT NOT NULL,
    tags TEXT NOT NULL,
    last_ns INTEGER NOT NULL DEFAULT 0,
    UNIQUE (measurement, tags)
);
CREATE TABLE IF NOT EXISTS fields (id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE);
CREATE TABLE IF NOT EXISTS samples (
    series_id INTEGER NOT NULL,
    field_id INTEGER NOT NULL,
    ts INTEGER NOT NULL,
    value
);
CREATE INDEX IF NOT EXISTS samples_by_series ON samples (series_id, field_id, ts);
"""
_SQL_AGG = {"mean": "AVG", "min": "MIN", "max": "MAX", "sum": "SUM", "count": "COUNT"}
_DELETE_BATCH = 100_000


class EmbeddedStore:
    name = "embedded"

    def __init__(self, path: Path, retention_s: float, max_size: int) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.retention_ns = int(retention_s * 1e9)
        self.max_size = max_size
        self._write_lock = threading.Lock()
        self._read_lock = threading.Lock()
        self._writer = self._connect()
        self._writer.executescript(_SCHEMA)
        self._reader = self._connect()
        self._series: dict[tuple[str, str], int] = {}
        self._series_by_id: dict[int, tuple[str, dict[str, str]]] = {}
        self._fields: dict[str, int] = {}
        self._last_seen: dict[int, int] = {}
        self._last_error = ""
        self.rows_written = 0
        self._load_catalog(self._writer)

    def _connect(self) -> sqlite3.Connection:
        try:
            conn = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute("PRAGMA busy_timeout=5000")
        except sqlite3.Error as exc:
            raise StoreError(f"{self.path}: cannot open the embedded store: {exc}") from exc
        return conn

    def _load_catalog(self, conn: sqlite3.Connection) -> None:
        for sid, measurement, tags in conn.execute(
            "SELECT id, measurement, tags FROM series WHERE id > ?", (max(self._series_by_id,
                                                                           default=0),)
        ):
            self._series[(measurement, tags)] = sid
            self._series_by_id[sid] = (measurement, json.loads(tags))
        for fid, name in conn.execute("SELECT id, name FROM fields"):
            self._fields[name] = fid

    # -- writing -------------------------------------------------------------------------

    def write(self, samples: list[Sample]) -> None:
        if not samples:
            return
        with self._write_lock:
            conn = self._writer
            try:
                conn.execute("BEGIN IMMEDIATE")
                rows = []
                for sample in samples:
                    sid = self._series_id(conn, sample)
                    self._last_seen[sid] = sample.time_ns
                    for name, value in sample.fields.items():
                        fid = self._fields.get(name)
                        if fid is None:
                            fid = self._field_id(conn, name)
                        rows.append((sid, fid, sample.time_ns, value))
                conn.executemany("INSERT INTO samples VALUES (?, ?, ?, ?)", rows)
                conn.execute("COMMIT")
            except sqlite3.Error as exc:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                # New catalog entries of the failed transaction are gone: forget them.
                self._series.clear()
                self._series_by_id.clear()
                self._fields.clear()
                self._load_catalog(conn)
                self._last_error = f"write failed: {exc}"
                raise StoreError(f"{self.path}: {exc}") from exc
            self.rows_written += len(rows)
            self._last_error = ""

    def _series_id(self, conn: sqlite3.Connection, sample: Sample) -> int:
        tags = json.dumps(sample.tags, sort_keys=True, separators=(",", ":"))
        key = (sample.measurement, tags)
        sid = self._series.get(key)
        if sid is None:
            cursor = conn.execute(
                "INSERT INTO series (measurement, tags) VALUES (?, ?)", key
            )
            sid = int(cursor.lastrowid)
            self._series[key] = sid
            self._series_by_id[sid] = (sample.measurement, dict(sample.tags))
        return sid

    def _field_id(self, conn: sqlite3.Connection, name: str) -> int:
        cursor = conn.execute("INSERT INTO fields (name) VALUES (?)", (name,))
        self._fields[name] = int(cursor.lastrowid)
        return self._fields[name]

    # -- reading -------------------------------------------------------------------------

    def read(self, query: WindowQuery) -> pd.DataFrame:
        agg = check_aggregation(query.agg)
        with self._read_lock:
            try:
                self._load_catalog(self._reader)
            except sqlite3.Error as exc:
                raise StoreError(f"{self.path}: {exc}") from exc
            series = {
                sid: tags
                for sid, (measurement, tags) in list(self._series_by_id.items())
                if measurement == query.measurement
                and all(m.matches(tags) for m in query.matchers)
            }
            names = query.fields or tuple(self._fields)
            field_ids = {self._fields[f]: f for f in names if f in self._fields}
            if not series or not field_ids:
                return _empty_frame(series, query.fields or ())
            raw = self._select(query, agg, list(series), list(field_ids))
        # Without a field list: every field these series have in the window, in a stable order.
        wanted = query.fields or tuple(sorted({field_ids[row[1]] for row in raw}))
        return _to_frame(raw, query, agg, series, field_ids, wanted)

    def _select(
        self, query: WindowQuery, agg: str, series: list[int], fields: list[int]
    ) -> list[tuple]:
        marks_s = ",".join("?" * len(series))
        marks_f = ",".join("?" * len(fields))
        where = (
            f"series_id IN ({marks_s}) AND field_id IN ({marks_f}) AND ts >= ? AND ts < ?"
        )
        params = [*series, *fields, query.start_ns, query.end_ns]
        if query.every_ns and agg in _SQL_AGG:
            sql = (
                f"SELECT series_id, field_id, (ts / ?) * ? AS bucket, {_SQL_AGG[agg]}(value) "
                f"FROM samples WHERE {where} GROUP BY series_id, field_id, bucket"
            )
            params = [query.every_ns, query.every_ns, *params]
        else:
            sql = f"SELECT series_id, field_id, ts, value FROM samples WHERE {where}"
        try:
            return self._reader.execute(sql, params).fetchall()
        except sqlite3.Error as exc:
            raise StoreError(f"{self.path}: {exc}") from exc

    # -- retention -----------------------------------------------------------------------

    def maintain(self, now_ns: int) -> None:
        """Drop samples older than the retention, then the oldest ones above the size bound."""
        with self._write_lock:
            try:
                self._flush_last_seen()
                cutoff = now_ns - self.retention_ns
                boundary = self._writer.execute(
                    "SELECT rowid FROM samples WHERE ts >= ? ORDER BY rowid LIMIT 1", (cutoff,)
                ).fetchone()
                if boundary is None:
                    boundary = self._writer.execute("SELECT max(rowid) + 1 FROM samples").fetchone()
                self._delete_below(boundary[0])
                # Deleting rows frees B-tree pages less than proportionally: repeat a few times.
                for _ in range(8):
                    used = self.used_bytes()
                    lo, hi = self._writer.execute(
                        "SELECT min(rowid), max(rowid) FROM samples"
                    ).fetchone()
                    if used <= self.max_size or lo is None:
                        break
                    share = min(0.5, max(0.05, 1 - 0.9 * self.max_size / used))
                    self._delete_below(lo + int((hi - lo + 1) * share) + 1)
                    log.warning(
                        "embedded store above its %d-byte bound: dropped the oldest %.0f%% of "
                        "samples", self.max_size, share * 100,
                    )
                self._writer.execute(
                    "DELETE FROM series WHERE last_ns < ? AND last_ns > 0", (cutoff,)
                )
            except sqlite3.Error as exc:
                self._last_error = f"retention failed: {exc}"
                raise StoreError(f"{self.path}: {exc}") from exc

    def _delete_below(self, rowid: int | None) -> None:
        if rowid is None:
            return
        while True:
            cursor = self._writer.execute(
                "DELETE FROM samples WHERE rowid IN "
                "(SELECT rowid FROM samples WHERE rowid < ? ORDER BY rowid LIMIT ?)",
                (rowid, _DELETE_BATCH),
            )
            if cursor.rowcount < _DELETE_BATCH:
                break

    def _flush_last_seen(self) -> None:
        if self._last_seen:
            self._writer.executemany(
                "UPDATE series SET last_ns = ? WHERE id = ?",
                [(ts, sid) for sid, ts in self._last_seen.items()],
            )
            self._last_seen.clear()

    def used_bytes(self) -> int:
        pages, free, size = (
            self._writer.execute(f"PRAGMA {p}").fetchone()[0]
            for p in ("page_count", "freelist_count", "page_size")
        )
        return (pages - free) * size

    def status(self) -> ComponentStatus:
        return ComponentStatus(
            "store:embedded",
            ok=not self._last_error,
            reason=self._last_error,
            details={"path": str(self.path), "rows_written": self.rows_written},
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


def _empty_frame(series: dict[int, dict[str, str]], fields: tuple[str, ...]) -> pd.DataFrame:
    tag_keys = sorted({k for tags in series.values() for k in tags})
    frame = pd.DataFrame(columns=["time", *tag_keys, *fields])
    frame["time"] = pd.to_datetime(frame["time"], utc=True)
    return frame


def _to_frame(
    raw: list[tuple],
    query: WindowQuery,
    agg: str,
    series: dict[int, dict[str, str]],
    field_ids: dict[int, str],
    wanted: tuple[str, ...],
) -> pd.DataFrame:
    if not raw:
        return _empty_frame(series, wanted)
    long = pd.DataFrame(raw, columns=["series_id", "field_id", "ts", "value"])
    long["value"] = pd.to_numeric(long["value"], errors="coerce")
    if query.every_ns and agg not in _SQL_AGG:
        long["ts"] = (long["ts"] // query.every_ns) * query.every_ns
        grouped = long.sort_values("ts").groupby(["series_id", "field_id", "ts"])["value"]
        if agg == "first":
            values = grouped.first()
        elif agg == "last":
            values = grouped.last()
        elif agg == "median":
            values = grouped.median()
        else:
            values = grouped.quantile(float(agg[1:]) / 100)
        long = values.reset_index()
    wide = long.groupby(["series_id", "ts", "field_id"], sort=False)["value"].last().unstack()
    wide.columns = [field_ids[c] for c in wide.columns]
    wide = wide.reset_index()
    tag_keys = sorted({k for sid in wide["series_id"].unique() for k in series[int(sid)]})
    for key in tag_keys:
        wide[key] = [series[int(sid)].get(key, "") for sid in wide["series_id"]]
    for name in wanted:
        if name not in wide.columns:
            wide[name] = np.nan
    wide["time"] = pd.to_datetime(wide["ts"], unit="ns", utc=True)
    frame = wide[["time", *tag_keys, *wanted]].sort_values(["time", *tag_keys])
    return frame.reset_index(drop=True)


def open_store(data_dir: Path, retention_s: float, max_size: int) -> EmbeddedStore:
    started = time.monotonic()
    store = EmbeddedStore(Path(data_dir) / "samples.db", retention_s, max_size)
    log.info("embedded store %s opened in %.2fs", store.path, time.monotonic() - started)
    return store
