"""Measure SQLite against DuckDB as sloguard's embedded sample store, on the agent's workload.

Why this exists: the issue asked to "measure SQLite and DuckDB here and choose". The engine
behind `sloguard.store.embedded` must be chosen on figures taken on this workload, not on
reputation: an agent that writes ~1300 values once per second, one small transaction each,
and reads short windows back is neither DuckDB's analytical workload nor a typical SQLite one.

Both engines get the SAME data (same seed, same timestamps) and the SAME Python code around
them: `LongStore` below keeps samples in long form (series + fields + samples tables, one row
per (series_id, field_id, ts, value), indexed on (series_id, field_id, ts)) and differs between
the engines only in the connection, the bulk insert call and the fetch into pandas. Measured:

1. insert rate (values/s; one value = one long row) writing batch by batch, one transaction
   per batch as the agent does: raw (rows prepared outside the timing) with SQLite's
   executemany and with each DuckDB bulk path (executemany, `append` of a DataFrame, INSERT
   from a registered DataFrame, INSERT from unnested lists), the fastest also with an ART
   index; then end to end through `store.write(list[Sample])`, DuckDB using the fastest path
   (and the index only if it made reads >= 1.11x faster);
2. window read latency, median and p95 over --reads repetitions, each returning a pandas
   DataFrame: the last 10 s, 60 s and 5 min of one field of one cgroup series, and of that
   field across all cgroup series (the detector's typical query);
3. on-disk size after the batches (files while open, and after a clean close);
4. RSS added to a fresh process by importing the engine, and after the workload (psutil);
5. whether readers work while the writer has the database open: a second process (tried for
   real; the error is reported) and a thread of the writer's process (how the UI reads).

The shipped `EmbeddedStore` (real agent code, whatever layout it has today) runs the same
workload too, as a reference. Every run is a fresh subprocess; each measurement is repeated
--repeats times with the engines alternating, and the tables show medians. Machines here are
noisy: read the DuckDB/SQLite ratios from the same run rather than the absolute figures. The
verdict line is computed from the numbers.

Run it from the repository root (several minutes; progress on stderr, tables on stdout):

    .venv/bin/python benchmarks/store_choice.py
    .venv/bin/python benchmarks/store_choice.py --batches 120 --repeats 1   # a quick look
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import psutil

from sloguard.core.samples import FieldValue, Sample
from sloguard.core.selectors import Matcher
from sloguard.store import StoreError, WindowQuery, check_aggregation

S = 1_000_000_000
T0 = 1_767_225_600 * S  # 2026-01-01T00:00:00Z
NODE = "node-a"
MB = 1024 * 1024
READ_FIELD = "usage_cores"
WINDOWS = (("10 s", 10), ("60 s", 60), ("5 min", 300))
SCOPES = ("1 series", "all cgroups")
DUCK_METHODS = ("executemany", "append", "register", "unnest")
INSERT_SERIES = "INSERT INTO series (id, measurement, tags) VALUES (?, ?, ?)"
INSERT_FIELD = "INSERT INTO fields (id, name) VALUES (?, ?)"
INSERT_SAMPLE = "INSERT INTO samples VALUES (?, ?, ?, ?)"
SQLITE_SCHEMA = """
CREATE TABLE IF NOT EXISTS series (id INTEGER PRIMARY KEY, measurement TEXT NOT NULL,
    tags TEXT NOT NULL, last_ns INTEGER NOT NULL DEFAULT 0, UNIQUE (measurement, tags));
CREATE TABLE IF NOT EXISTS fields (id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE);
CREATE TABLE IF NOT EXISTS samples (series_id INTEGER NOT NULL, field_id INTEGER NOT NULL,
    ts INTEGER NOT NULL, value);
CREATE INDEX IF NOT EXISTS samples_by_series ON samples (series_id, field_id, ts);
"""
SQLITE_PRAGMAS = ("journal_mode=WAL", "synchronous=NORMAL", "busy_timeout=5000")
DUCK_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS series (id INTEGER PRIMARY KEY, measurement VARCHAR NOT NULL, "
    "tags VARCHAR NOT NULL, last_ns BIGINT NOT NULL DEFAULT 0, UNIQUE (measurement, tags))",
    "CREATE TABLE IF NOT EXISTS fields (id INTEGER PRIMARY KEY, name VARCHAR NOT NULL UNIQUE)",
    "CREATE TABLE IF NOT EXISTS samples (series_id INTEGER NOT NULL, field_id INTEGER NOT NULL, "
    "ts BIGINT NOT NULL, value DOUBLE)",
)
DUCK_ART = "CREATE INDEX IF NOT EXISTS samples_by_series ON samples (series_id, field_id, ts)"

Row = tuple[int, int, int, FieldValue]


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# -- the workload ----------------------------------------------------------------------------


class Workload:
    """The agent's batches, deterministic for a seed: call batch(0), batch(1), ... in order.

    Per batch: `cgroups` pod cgroups with container_cpu (7 fields) and container_memory
    (5 fields), plus 60 node values over 49 node series; with 100 cgroups that is 1260 values
    over 249 series, stamped one tick (1 s, plus a few ms of jitter) apart as the agent does.
    """

    def __init__(self, cgroups: int, seed: int) -> None:
        self.rng = rng = random.Random(seed)
        self.pods: list[dict[str, Any]] = []
        for c in range(cgroups):
            qos = ("guaranteed", "burstable", "burstable", "besteffort")[c % 4]
            uid = str(uuid.UUID(int=rng.getrandbits(128)))
            unit = uid.replace("-", "_")
            path = (f"/kubepods.slice/kubepods-pod{unit}.slice" if qos == "guaranteed" else
                    f"/kubepods.slice/kubepods-{qos}.slice/kubepods-{qos}-pod{unit}.slice")
            limit = rng.choice((0.5, 1.0, 2.0, 4.0))
            limit_bytes = rng.choice((256, 512, 1024, 4096)) * MB
            self.pods.append({
                "tags": {
                    "node": NODE, "cgroup": path, "level": "pod", "qos": qos, "pod_uid": uid,
                    "pod": f"app-{c:03d}-{rng.getrandbits(20):05x}", "namespace": f"team-{c % 7}",
                    "class": "BE" if qos == "besteffort" else "LS",
                },
                "base": limit * rng.uniform(0.1, 0.7), "limit": limit, "usage_s": 0.0,
                "periods": 0, "throttled": 0, "throttled_s": 0.0,
                "mem": int(limit_bytes * rng.uniform(0.2, 0.6)), "limit_bytes": limit_bytes,
            })
        self.cores = [{"node": NODE, "cpu": str(k)} for k in range(42)]
        self.pressure = [{"node": NODE, "resource": r} for r in ("cpu", "memory", "io")]
        self.disks = [{"node": NODE, "device": d} for d in ("nvme0n1", "nvme1n1")]
        self.node_tags = {"node": NODE}

    def batch(self, i: int) -> list[Sample]:
        rng = self.rng
        ts = T0 + i * S + rng.randrange(3_000_000)  # the tick fires a few ms late
        out: list[Sample] = []
        for pod in self.pods:
            cores = min(pod["limit"], max(0.0, pod["base"] * (1 + 0.3 * rng.gauss(0, 1))))
            throttled = rng.randrange(4) if cores > 0.8 * pod["limit"] else 0
            pod["usage_s"] += cores
            pod["periods"] += 10
            pod["throttled"] += throttled
            pod["throttled_s"] += throttled * rng.uniform(0.001, 0.02)
            out.append(Sample("container_cpu", pod["tags"], {
                "usage_seconds_total": pod["usage_s"], "usage_cores": cores,
                "periods": pod["periods"], "throttled_periods": pod["throttled"],
                "throttled_ratio": throttled / 10, "throttled_seconds": pod["throttled_s"],
                "limit_cores": pod["limit"],
            }, ts))
            pod["mem"] = min(pod["limit_bytes"], max(
                16 * MB, pod["mem"] + 4096 * int(rng.gauss(0, 64))))
            cache = int(pod["mem"] * 0.3) // 4096 * 4096
            out.append(Sample("container_memory", pod["tags"], {
                "usage_bytes": pod["mem"], "working_set_bytes": pod["mem"] - cache // 2,
                "rss_bytes": pod["mem"] - cache, "cache_bytes": cache,
                "limit_bytes": pod["limit_bytes"],
            }, ts))
        busy = [min(100.0, max(0.0, rng.gauss(45, 20))) for _ in self.cores]
        out.append(Sample("node_cpu", self.node_tags, {
            "busy": sum(busy) / len(busy), "iowait": abs(rng.gauss(1, 0.5))}, ts))
        out.extend(Sample("node_cpu_core", tags, {"busy": b}, ts)
                   for tags, b in zip(self.cores, busy, strict=True))
        used = int(rng.gauss(60, 2) * 1024 * MB) // 4096 * 4096
        out.append(Sample("node_memory", self.node_tags, {
            "total": 128 * 1024 * MB, "used": used, "available": 128 * 1024 * MB - used,
            "cached": 20 * 1024 * MB + 4096 * rng.randrange(1000),
            "dirty": 4096 * rng.randrange(500), "swap_used": 0}, ts))
        out.extend(Sample("node_pressure", tags, {
            "some_rate": abs(rng.gauss(2, 1)), "full_rate": abs(rng.gauss(0.5, 0.3))}, ts)
            for tags in self.pressure)
        out.extend(Sample("node_disk", tags, {
            "reads_per_s": abs(rng.gauss(300, 80)), "writes_per_s": abs(rng.gauss(900, 200))}, ts)
            for tags in self.disks)
        return out


class Catalog:
    """Series and field ids assigned in Python (tags as sorted JSON, as the agent's store does),
    turning Samples into long rows."""

    def __init__(self) -> None:
        self.series: dict[tuple[str, str], int] = {}
        self.by_id: dict[int, tuple[str, dict[str, str]]] = {}
        self.fields: dict[str, int] = {}

    def rows(self, samples: Iterable[Sample]) -> tuple[list[Row], list[tuple], list[tuple]]:
        rows: list[Row] = []
        new_series: list[tuple[int, str, str]] = []
        new_fields: list[tuple[int, str]] = []
        for sample in samples:
            key = (sample.measurement,
                   json.dumps(sample.tags, sort_keys=True, separators=(",", ":")))
            sid = self.series.get(key)
            if sid is None:
                sid = self.series[key] = len(self.series) + 1
                self.by_id[sid] = (sample.measurement, dict(sample.tags))
                new_series.append((sid, *key))
            for name, value in sample.fields.items():
                fid = self.fields.get(name)
                if fid is None:
                    fid = self.fields[name] = len(self.fields) + 1
                    new_fields.append((fid, name))
                rows.append((sid, fid, sample.time_ns, value))
        return rows, new_series, new_fields

    def forget(self, new_series: list[tuple], new_fields: list[tuple]) -> None:
        for sid, measurement, tags in new_series:
            self.series.pop((measurement, tags), None)
            self.by_id.pop(sid, None)
        for _, name in new_fields:
            self.fields.pop(name, None)

    def load(self, series: Iterable[tuple], fields: Iterable[tuple]) -> None:
        for sid, measurement, tags in series:
            self.series[(measurement, tags)] = sid
            self.by_id[sid] = (measurement, json.loads(tags))
        for fid, name in fields:
            self.fields[name] = fid

    def ids(self, measurement: str, cgroup: str | None = None) -> list[int]:
        return [sid for sid, (m, tags) in self.by_id.items()
                if m == measurement and (cgroup is None or tags.get("cgroup") == cgroup)]


# -- the engines -----------------------------------------------------------------------------


def _frame(rows: list[Row]) -> pd.DataFrame:
    sid, fid, ts, value = zip(*rows, strict=True)
    return pd.DataFrame({
        "series_id": np.array(sid, dtype=np.int32), "field_id": np.array(fid, dtype=np.int32),
        "ts": np.array(ts, dtype=np.int64), "value": np.array(value, dtype=np.float64),
    })


def _sqlite_executemany(con: Any, rows: list[Row]) -> None:
    con.executemany(INSERT_SAMPLE, rows)


def _duck_append(con: Any, rows: list[Row]) -> None:
    con.append("samples", _frame(rows))


def _duck_register(con: Any, rows: list[Row]) -> None:
    con.register("batch_frame", _frame(rows))
    try:
        con.execute("INSERT INTO samples SELECT * FROM batch_frame")
    finally:
        con.unregister("batch_frame")


def _duck_unnest(con: Any, rows: list[Row]) -> None:
    sid, fid, ts, value = zip(*rows, strict=True)
    con.execute(
        "INSERT INTO samples SELECT unnest($1::INTEGER[]), unnest($2::INTEGER[]), "
        "unnest($3::BIGINT[]), unnest($4::DOUBLE[])",
        [list(sid), list(fid), list(ts), [float(v) for v in value]],
    )


BULK: dict[str, Callable[[Any, list[Row]], None]] = {
    "executemany": _sqlite_executemany, "append": _duck_append,
    "register": _duck_register, "unnest": _duck_unnest,
}


def _sqlite_connect(path: Path) -> Any:
    import sqlite3

    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    for pragma in SQLITE_PRAGMAS:
        conn.execute(f"PRAGMA {pragma}")
    conn.executescript(SQLITE_SCHEMA)
    return conn


def _duck_connect(path: Path, art: bool) -> Any:
    import duckdb

    con = duckdb.connect(str(path))
    for statement in DUCK_SCHEMA:
        con.execute(statement)
    if art:
        con.execute(DUCK_ART)
    return con


class LongStore:
    """The store contract (write a batch of Samples, read a window as a DataFrame) on either
    engine, with the long schema and one code path: the engines differ only in the connection,
    the bulk insert (SQLite executemany, DuckDB `method`) and the fetch into pandas (SQLite
    fetchall, DuckDB `.df()`). DuckDB values are DOUBLE (string fields would need another
    column; the workload has none). Raw windows only, no aggregation."""

    def __init__(self, engine: str, path: Path, method: str = "executemany",
                 art: bool = False) -> None:
        self.engine, self.path = engine, path
        if engine == "sqlite":
            import sqlite3

            self._errors: tuple[type[Exception], ...] = (sqlite3.Error,)
            self._writer = _sqlite_connect(path)
            self._reader = _sqlite_connect(path)
            self._begin = "BEGIN IMMEDIATE"
        else:
            import duckdb

            self._errors = (duckdb.Error,)
            self._writer = _duck_connect(path, art)
            self._reader = self._writer.cursor()  # a second connection to the same database
            self._begin = "BEGIN TRANSACTION"
        self._bulk = BULK[method]
        self._write_lock = threading.Lock()
        self._read_lock = threading.Lock()
        self._catalog = Catalog()
        self._catalog.load(
            self._writer.execute("SELECT id, measurement, tags FROM series").fetchall(),
            self._writer.execute("SELECT id, name FROM fields").fetchall())

    def write(self, samples: list[Sample]) -> None:
        if not samples:
            return
        with self._write_lock:
            rows, new_series, new_fields = self._catalog.rows(samples)
            con = self._writer
            try:
                con.execute(self._begin)
                if new_series:
                    con.executemany(INSERT_SERIES, new_series)
                if new_fields:
                    con.executemany(INSERT_FIELD, new_fields)
                self._bulk(con, rows)
                con.execute("COMMIT")
            except self._errors as exc:
                con.execute("ROLLBACK")
                self._catalog.forget(new_series, new_fields)
                raise StoreError(f"{self.path}: {exc}") from exc

    def read(self, query: WindowQuery) -> pd.DataFrame:
        check_aggregation(query.agg)
        if query.every_ns:
            raise NotImplementedError("the benchmark reads raw windows only")
        with self._read_lock:
            series = {
                sid: tags for sid, (measurement, tags) in list(self._catalog.by_id.items())
                if measurement == query.measurement and all(m.matches(tags)
                                                            for m in query.matchers)
            }
            fields = dict(self._catalog.fields)
            names = list(query.fields or sorted(fields))
            field_ids = {fields[f]: f for f in names if f in fields}
            long = pd.DataFrame(columns=["series_id", "field_id", "ts", "value"])
            if series and field_ids:
                sql = (f"SELECT series_id, field_id, ts, value FROM samples "
                       f"WHERE series_id IN ({','.join('?' * len(series))}) "
                       f"AND field_id IN ({','.join('?' * len(field_ids))}) "
                       f"AND ts >= ? AND ts < ?")
                params = [*series, *field_ids, query.start_ns, query.end_ns]
                try:
                    long = self._fetch(sql, params, ["series_id", "field_id", "ts", "value"])
                except self._errors as exc:
                    raise StoreError(f"{self.path}: {exc}") from exc
        return shape(long, series, field_ids, names)

    def _fetch(self, sql: str, params: list[int], columns: list[str]) -> pd.DataFrame:
        if self.engine == "sqlite":
            return pd.DataFrame(self._reader.execute(sql, params).fetchall(), columns=columns)
        return self._reader.execute(sql, params).df()

    def window(self, sids: list[int], fid: int, start: int, end: int) -> pd.DataFrame:
        """A bare window query (no catalog, no reshaping): the engine alone."""
        sql = (f"SELECT series_id, ts, value FROM samples WHERE series_id IN "
               f"({','.join('?' * len(sids))}) AND field_id = ? AND ts >= ? AND ts < ?")
        return self._fetch(sql, [*sids, fid, start, end], ["series_id", "ts", "value"])

    def insert_rows(self, rows: list[Row], new_series: list[tuple],
                    new_fields: list[tuple]) -> None:
        """One batch of prepared rows in one transaction: the engine alone."""
        con = self._writer
        con.execute(self._begin)
        try:
            if new_series:
                con.executemany(INSERT_SERIES, new_series)
            if new_fields:
                con.executemany(INSERT_FIELD, new_fields)
            self._bulk(con, rows)
            con.execute("COMMIT")
        except BaseException:
            con.execute("ROLLBACK")
            raise

    def close(self) -> None:
        with self._write_lock, self._read_lock:
            self._reader.close()
            if self.engine == "sqlite":
                self._writer.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            else:
                self._writer.execute("CHECKPOINT")
            self._writer.close()


def shape(long: pd.DataFrame, series: dict[int, dict[str, str]], field_ids: dict[int, str],
          names: list[str]) -> pd.DataFrame:
    """The agent's frame from long rows: `time`, the tag columns, one column per field."""
    if long.empty:
        keys = sorted({k for tags in series.values() for k in tags})
        frame = pd.DataFrame(columns=["time", *keys, *names])
        frame["time"] = pd.to_datetime(frame["time"], utc=True)
        return frame
    long = long.assign(value=pd.to_numeric(long["value"], errors="coerce"))
    wide = long.groupby(["series_id", "ts", "field_id"], sort=False)["value"].last().unstack()
    wide.columns = [field_ids[int(c)] for c in wide.columns]
    wide = wide.reset_index()
    ids = [int(sid) for sid in wide["series_id"].unique()]
    keys = sorted({k for sid in ids for k in series[sid]})
    for key in keys:
        wide[key] = wide["series_id"].map({sid: series[sid].get(key, "") for sid in ids})
    for name in names:
        if name not in wide.columns:
            wide[name] = np.nan
    wide["time"] = pd.to_datetime(wide["ts"], unit="ns", utc=True)
    return wide[["time", *keys, *names]].sort_values(["time", *keys]).reset_index(drop=True)


# -- one measurement, in a fresh process -----------------------------------------------------


def _rss() -> int:
    gc.collect()
    return psutil.Process().memory_info().rss


def _peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # kB on Linux


def _dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.iterdir() if p.is_file())


def _parse(variant: str) -> tuple[str, str, str, bool]:
    """'sqlite-raw', 'sqlite-store', 'sqlite-shipped', 'duckdb-raw-append-art', ...

    raw: prepared rows, bare SQL; store: LongStore end to end; shipped: the agent's
    EmbeddedStore as it is in the tree."""
    parts = variant.split("-")
    art = parts[-1] == "art"
    if art:
        parts = parts[:-1]
    engine, level = parts[0], parts[1] if len(parts) > 1 else ""
    method = parts[2] if len(parts) > 2 else "executemany"
    valid = (engine == "sqlite" and level in ("raw", "store", "shipped") and len(parts) == 2
             and not art) or (engine == "duckdb" and level in ("raw", "store") and method in BULK)
    if not valid:
        raise SystemExit(f"unknown variant {variant!r}")
    return engine, level, method, art


def _timed(fn: Callable[[], Any], reps: int, warmup: int = 3) -> tuple[list[float], Any]:
    result = None
    for _ in range(warmup):
        result = fn()
    times = []
    for _ in range(reps):
        started = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - started)
    return times, result


def _open(engine: str, level: str, method: str, art: bool, path: Path) -> Any:
    if level == "shipped":
        from sloguard.store.embedded import EmbeddedStore

        return EmbeddedStore(path, retention_s=86_400 * 365, max_size=1 << 40)
    return LongStore(engine, path, method, art)


def _describe_sqlite(path: Path) -> str:
    import sqlite3

    conn = sqlite3.connect(path)
    try:
        names = [n for (n,) in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")]
    finally:
        conn.close()
    return f"{len(names)} tables: {', '.join(names[:8])}{', ...' if len(names) > 8 else ''}"


def run_worker(variant: str, workdir: Path, args: argparse.Namespace) -> dict[str, Any]:
    engine, level, method, art = _parse(variant)
    tag = f"[{variant} r{args.round}]"
    base = _rss()
    started = time.perf_counter()
    if engine == "sqlite":
        import sqlite3

        version = sqlite3.sqlite_version
        if level == "shipped":
            import sloguard.store.embedded  # noqa: F401
    else:
        import duckdb

        version = duckdb.__version__
    import_s = time.perf_counter() - started
    after_import = _rss()

    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / ("samples.db" if engine == "sqlite" else "samples.duckdb")
    workload = Workload(args.cgroups, args.seed)
    catalog = Catalog()  # for raw runs only
    store = _open(engine, level, method, art, path)

    # (1) inserts, one transaction per batch
    times: list[float] = []
    stamps: list[int] = []
    values = 0
    series: set[tuple] = set()
    step = max(1, args.batches // 5)
    for i in range(args.batches):
        batch = workload.batch(i)
        stamps.append(batch[0].time_ns)
        series.update(s.series_key() for s in batch)
        if level == "raw":
            rows, new_series, new_fields = catalog.rows(batch)
            t0 = time.perf_counter()
            store.insert_rows(rows, new_series, new_fields)
        else:
            t0 = time.perf_counter()
            store.write(batch)
        times.append(time.perf_counter() - t0)
        values += sum(len(s.fields) for s in batch)
        if (i + 1) % step == 0 or i + 1 == args.batches:
            log(f"{tag} {i + 1}/{args.batches} batches, {values / sum(times):,.0f} values/s")
    size_open = _dir_bytes(workdir)

    # (2) window reads
    end = stamps[-1] + 1
    one_cgroup = workload.pods[min(7, len(workload.pods) - 1)]["tags"]["cgroup"]
    reads: dict[str, dict[str, float]] = {}
    for scope in SCOPES:
        for label, seconds in WINDOWS:
            start = end - seconds * S
            if level == "raw":
                sids = catalog.ids("container_cpu", one_cgroup if scope == SCOPES[0] else None)
                fid = catalog.fields[READ_FIELD]

                def fn(s: list[int] = sids, f: int = fid, a: int = start) -> pd.DataFrame:
                    return store.window(s, f, a, end)
                column = "value"
            else:
                matchers = (Matcher("cgroup", "=", one_cgroup),) if scope == SCOPES[0] else ()
                query = WindowQuery("container_cpu", start, end, fields=(READ_FIELD,),
                                    matchers=matchers)

                def fn(q: WindowQuery = query) -> pd.DataFrame:
                    return store.read(q)
                column = READ_FIELD
            lat, frame = _timed(fn, args.reads)
            reads[f"{scope}, last {label}"] = {
                "median_ms": statistics.median(lat) * 1e3,
                "p95_ms": float(np.percentile(lat, 95)) * 1e3,
                "rows": len(frame), "checksum": float(frame[column].sum()),
            }
    log(f"{tag} reads done ({args.reads} repetitions per window)")
    after_workload = _rss()
    peak = _peak_rss()

    # (3) size after a clean close
    store.close()
    size_closed = _dir_bytes(workdir)

    first = min(args.first or args.batches, args.batches)
    result: dict[str, Any] = {
        "variant": variant, "engine": engine, "version": version, "batches": args.batches,
        "values": values, "series": len(series),
        "values_per_s": values / sum(times),
        "values_per_s_first": values * first / args.batches / sum(times[:first]),
        "batch_p95_ms": float(np.percentile(times, 95)) * 1e3,
        "reads": reads, "disk_open_mb": size_open / MB, "disk_closed_mb": size_closed / MB,
        "bytes_per_value": size_closed / values, "import_s": import_s,
        "rss_import_mb": (after_import - base) / MB,
        "rss_workload_mb": (after_workload - base) / MB, "rss_peak_mb": (peak - base) / MB,
        "layout": _describe_sqlite(path) if engine == "sqlite" else "long (3 tables)",
    }
    if level != "raw":
        result.update(_concurrency(engine, level, method, art, path, workload, args.batches,
                                   tag))
    return result


def _concurrency(engine: str, level: str, method: str, art: bool, path: Path,
                 workload: Workload, next_batch: int, tag: str) -> dict[str, Any]:
    """(5) Reopen the store, keep writing, and read from a thread and from another process."""
    store = _open(engine, level, method, art, path)
    end = T0 + (next_batch + 1000) * S
    query = WindowQuery("container_cpu", end - 3600 * S, end, fields=(READ_FIELD,))
    thread_errors: list[str] = []
    thread_rows: list[int] = []

    def ui_reader() -> None:
        for _ in range(10):
            try:
                thread_rows.append(len(store.read(query)))
            except Exception as exc:
                thread_errors.append(f"{type(exc).__name__}: {exc}")
            time.sleep(0.02)

    reader = threading.Thread(target=ui_reader)
    reader.start()
    while reader.is_alive():
        store.write(workload.batch(next_batch))
        next_batch += 1
        time.sleep(0.01)
    reader.join()

    proc = subprocess.Popen(
        [sys.executable, str(Path(__file__).resolve()), "--reader", engine, str(path)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    written, write_errors = 0, []
    deadline = time.monotonic() + 60
    while proc.poll() is None and time.monotonic() < deadline:
        try:
            store.write(workload.batch(next_batch))
            written += 1
        except Exception as exc:
            write_errors.append(f"{type(exc).__name__}: {exc}")
        next_batch += 1
        time.sleep(0.05)
    if proc.poll() is None:
        proc.kill()
    out, err = proc.communicate(timeout=30)
    lines = out.strip().splitlines()
    second = json.loads(lines[-1]) if lines else {
        "ok": False, "error": (err.strip().splitlines() or ["no output"])[-1]}
    store.close()
    if write_errors:
        second["ok"] = False
        second["error"] = f"the writer failed meanwhile: {write_errors[0]}"
    log(f"{tag} reader thread: {'no' if thread_errors else 'yes'}; second process: "
        + ("yes" if second["ok"] else f"no ({second['error']})"))
    return {
        "thread_ok": not thread_errors and bool(thread_rows),
        "thread_error": thread_errors[0] if thread_errors else "",
        "process_ok": bool(second["ok"]), "process_error": second.get("error", ""),
        "process_new_batches": second.get("new_batches", 0), "writer_batches": written,
    }


def run_reader(engine: str, path: str) -> dict[str, Any]:
    """The second process: open the database the writer holds and read the last 10 s of every
    table with a `ts` column, six times over ~1 s (any layout)."""
    seen: list[int] = []
    try:
        if engine == "sqlite":
            import sqlite3

            conn: Any = sqlite3.connect(path, timeout=5)
            listing = ("SELECT m.name FROM sqlite_master m, pragma_table_info(m.name) p "
                       "WHERE m.type = 'table' AND p.name = 'ts'")
        else:
            import duckdb

            conn = duckdb.connect(path, read_only=True)
            listing = "SELECT table_name FROM information_schema.columns WHERE column_name = 'ts'"
        for _ in range(6):
            tables = [t for (t,) in conn.execute(listing).fetchall()]
            last = max((conn.execute(f"SELECT max(ts) FROM {t}").fetchone()[0] or 0)
                       for t in tables) if tables else 0
            frames = [pd.DataFrame(conn.execute(f"SELECT * FROM {t} WHERE ts >= ?",
                                                [last - 10 * S]).fetchall()) for t in tables]
            if not last or not sum(len(f) for f in frames):
                return {"ok": False, "error": "read nothing"}
            seen.append(int(last))
            time.sleep(0.2)
        conn.close()
    except Exception as exc:
        text = (str(exc).strip().splitlines() or [""])[0].split(" See also")[0]
        return {"ok": False,
                "error": f"{type(exc).__name__}: {text.replace(path, Path(path).name)}"}
    return {"ok": True, "error": "", "new_batches": round((seen[-1] - seen[0]) / S)}


# -- orchestration and report ----------------------------------------------------------------


def _run(variant: str, round_: int, root: Path, args: argparse.Namespace) -> dict[str, Any]:
    workdir = root / f"{variant}-r{round_}"
    if workdir.exists():
        shutil.rmtree(workdir)
    command = [
        sys.executable, str(Path(__file__).resolve()), "--worker", variant,
        "--dir", str(workdir), "--round", str(round_), "--batches", str(args.batches),
        "--cgroups", str(args.cgroups), "--reads", str(args.reads), "--seed", str(args.seed),
        "--duck-executemany-batches", str(args.first),
    ]
    if variant == "duckdb-raw-executemany":
        command[command.index("--batches") + 1] = str(args.first)
    log(f"== round {round_}/{args.repeats}: {variant}")
    done = subprocess.run(command, stdout=subprocess.PIPE, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{variant} failed (exit {done.returncode}); see the stderr above")
    if not args.keep:
        shutil.rmtree(workdir, ignore_errors=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def _med(results: list[dict[str, Any]], key: str, read: str | None = None) -> float:
    if read is None:
        return statistics.median(r[key] for r in results)
    return statistics.median(r["reads"][read][key] for r in results)


def _geomean(values: Iterable[float]) -> float:
    values = list(values)
    return math.exp(sum(math.log(v) for v in values) / len(values))


def _read_labels() -> list[str]:
    return [f"{scope}, last {label}" for scope in SCOPES for label, _ in WINDOWS]


def _read_geomean(results: list[dict[str, Any]]) -> float:
    return _geomean(_med(results, "median_ms", lbl) for lbl in _read_labels())


def _num(x: float) -> str:
    if math.isnan(x):
        return "n/a"
    if x >= 10_000:
        return f"{x:,.0f}"
    if x >= 100:
        return f"{x:.0f}"
    if x >= 10:
        return f"{x:.1f}"
    return f"{x:.2f}" if x >= 0.1 else f"{x:.3f}"


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def _duckdb_footprint() -> float:
    """Installed size of the duckdb distribution (its compiled module included), in MB."""
    from importlib import metadata

    try:
        files = metadata.distribution("duckdb").files or []
    except metadata.PackageNotFoundError:
        return float("nan")
    paths = [Path(str(f.locate())) for f in files]
    return sum(p.stat().st_size for p in paths if p.is_file()) / MB


def _yes_no(results: list[dict[str, Any]], key: str, err: str) -> str:
    bad = [r[err] for r in results if not r[key]]
    return "yes" if not bad else f"no: {bad[0]}"


def report(res: dict[str, list[dict[str, Any]]], duck_store: str, best: str,
           art_note: str, args: argparse.Namespace) -> None:
    sq, du = res["sqlite-store"], res[duck_store]
    shipped = res["sqlite-shipped"]
    labels = _read_labels()
    print(f"# SQLite vs DuckDB for the embedded sample store (medians of {args.repeats} runs)")
    print()
    print(f"SQLite {sq[0]['version']} (WAL, synchronous=NORMAL), DuckDB {du[0]['version']} "
          f"(defaults); {args.batches} batches of {sq[0]['values'] // args.batches} values over "
          f"{sq[0]['series']} series, 1 s apart ({sq[0]['values']:,} values); "
          f"{args.reads} reads per window; Python {sys.version.split()[0]}, "
          f"{os.cpu_count()} CPUs.")
    print()
    print("## Every variant (values/s; read medians in ms; raw = prepared rows and bare SQL, "
          "store = LongStore, shipped = the agent's EmbeddedStore)")
    print()
    header = ["variant", "batches", "values/s", "batch p95 ms", *labels, "disk MB", "RSS+ MB"]
    rows = [[variant, str(r[0]["batches"]), _num(_med(r, "values_per_s")),
             _num(_med(r, "batch_p95_ms")),
             *[_num(_med(r, "median_ms", lbl)) for lbl in labels],
             _num(_med(r, "disk_closed_mb")), _num(_med(r, "rss_workload_mb"))]
            for variant, r in res.items()]
    print(_table(header, rows))
    print()
    ranking = sorted(((_med(res[f"duckdb-raw-{m}"], "values_per_s_first"), m)
                      for m in DUCK_METHODS if f"duckdb-raw-{m}" in res), reverse=True)
    print(f"DuckDB bulk paths by insert rate over the first {args.first} batches: " + ", ".join(
        f"{m} {_num(r)}/s" for r, m in ranking) + f"; fastest: {best}. {art_note}")
    print()
    ratio = _med(du, "values_per_s") / _med(shipped, "values_per_s")
    print(f"The shipped EmbeddedStore ({shipped[0]['layout']}): "
          f"{_num(_med(shipped, 'values_per_s'))} values/s (DuckDB store: {ratio:.2f}x that), "
          f"read geomean {_num(_read_geomean(shipped))} ms (DuckDB store: "
          f"{_read_geomean(du) / _read_geomean(shipped):.2f}x that), "
          f"{_num(_med(shipped, 'disk_closed_mb'))} MB on disk, "
          f"second process reads: {_yes_no(shipped, 'process_ok', 'process_error')}.")
    print()

    same = all(
        r[0]["reads"][lbl]["rows"] == sq[0]["reads"][lbl]["rows"]
        and math.isclose(r[0]["reads"][lbl]["checksum"], sq[0]["reads"][lbl]["checksum"],
                         rel_tol=1e-9)
        for r in (du, shipped) for lbl in labels)
    print("All three stores returned the same rows and values for every window: "
          f"{'yes' if same else 'NO, the figures compare different results'}.")
    print()

    print(f"## SQLite vs DuckDB, same store code and long schema (DuckDB: {duck_store})")
    print()
    print("A ratio above 1 means DuckDB's figure is higher: better for values/s, worse for "
          "ms, MB and bytes.")
    print()
    table: list[list[str]] = []

    def line(metric: str, s: float, d: float) -> None:
        table.append([metric, _num(s), _num(d), f"{d / s:.2f}" if s > 0 else "n/a"])

    line("insert via store.write(Samples), values/s (higher is better)",
         _med(sq, "values_per_s"), _med(du, "values_per_s"))
    line("store.write p95 per batch, ms", _med(sq, "batch_p95_ms"), _med(du, "batch_p95_ms"))
    line(f"insert raw, values/s (SQLite executemany, DuckDB {best})",
         _med(res["sqlite-raw"], "values_per_s"), _med(res[f"duckdb-raw-{best}"],
                                                       "values_per_s"))
    if "duckdb-raw-executemany" in res:
        line(f"insert raw, values/s (executemany on both, first {args.first} batches)",
             _med(res["sqlite-raw"], "values_per_s_first"),
             _med(res["duckdb-raw-executemany"], "values_per_s_first"))
    for lbl in labels:
        shown = lbl.replace("all cgroups", f"{args.cgroups} cgroup series")
        line(f"read {READ_FIELD}, {shown}, median ms", _med(sq, "median_ms", lbl),
             _med(du, "median_ms", lbl))
        line(f"read {READ_FIELD}, {shown}, p95 ms", _med(sq, "p95_ms", lbl),
             _med(du, "p95_ms", lbl))
    duck_raw = res[duck_store.replace("-store-", "-raw-")]
    line(f"read, geomean of the 6 medians, engine alone (bare SQL, DuckDB {best}), ms",
         _read_geomean(res["sqlite-raw"]), _read_geomean(duck_raw))
    line(f"on disk after {args.batches} batches, open (incl. WAL), MB",
         _med(sq, "disk_open_mb"), _med(du, "disk_open_mb"))
    line("on disk after close, MB", _med(sq, "disk_closed_mb"), _med(du, "disk_closed_mb"))
    line("on disk after close, bytes/value", _med(sq, "bytes_per_value"),
         _med(du, "bytes_per_value"))
    line("RSS added by importing the engine, MB", _med(sq, "rss_import_mb"),
         _med(du, "rss_import_mb"))
    line("RSS added after the workload, MB", _med(sq, "rss_workload_mb"),
         _med(du, "rss_workload_mb"))
    line("peak RSS added, MB", _med(sq, "rss_peak_mb"), _med(du, "rss_peak_mb"))
    line("import time, ms", _med(sq, "import_s") * 1e3, _med(du, "import_s") * 1e3)
    duck_mb = _duckdb_footprint()
    table.append(["installed size of the engine package, MB", "0 (stdlib)", _num(duck_mb),
                  "n/a"])
    table.append(["second process reads while the writer has it open",
                  _yes_no(sq, "process_ok", "process_error"),
                  _yes_no(du, "process_ok", "process_error"), "n/a"])
    table.append(["reader thread in the writer's process (how the UI reads)",
                  _yes_no(sq, "thread_ok", "thread_error"),
                  _yes_no(du, "thread_ok", "thread_error"), "n/a"])
    print(_table(["metric", "SQLite", "DuckDB", "DuckDB/SQLite"], table))
    print()
    engine_reads = _read_geomean(res["sqlite-raw"]) / _read_geomean(duck_raw)
    print(verdict(sq, du, shipped, best, "-art" in duck_store, duck_mb, engine_reads))


def verdict(sq: list[dict[str, Any]], du: list[dict[str, Any]], shipped: list[dict[str, Any]],
            best: str, art: bool, duck_mb: float, engine_reads: float) -> str:
    """DuckDB must meet every requirement SQLite meets and be clearly faster (geometric mean of
    its insert and read speed-ups >= 1.5) to be worth a new dependency; otherwise SQLite.

    Computed on the like-for-like pair (same store code, long schema); the shipped store's
    figures against the same DuckDB store are appended for context."""
    insert = _med(du, "values_per_s") / _med(sq, "values_per_s")
    reads = _geomean(_med(sq, "median_ms", lbl) / _med(du, "median_ms", lbl)
                     for lbl in _read_labels())
    speed = _geomean([insert, reads])
    extra_rss = _med(du, "rss_workload_mb") - _med(sq, "rss_workload_mb")
    disk = _med(du, "disk_closed_mb") / _med(sq, "disk_closed_mb")
    checks = (("process_ok", "no second process can read while the agent writes"),
              ("thread_ok", "a reader thread fails while the agent writes"))
    duck_fails = [why for key, why in checks
                  if all(r[key] for r in sq) and not all(r[key] for r in du)]
    sqlite_fails = [why for key, why in checks
                    if all(r[key] for r in du) and not all(r[key] for r in sq)]
    def pace(x: float) -> str:
        return f"{x:.2f}x faster" if x >= 1 else f"{1 / x:.2f}x slower"

    shipped_insert = _med(shipped, "values_per_s") / _med(du, "values_per_s")
    shipped_reads = _read_geomean(du) / _read_geomean(shipped)
    threads = ("; a reader thread in the writer's process works with both"
               if all(r["thread_ok"] for r in sq + du) else "")
    figures = (f"Long schema on both: DuckDB ({best}{', ART' if art else ''}) is "
               f"{pace(speed)} overall, inserting at {insert:.2f}x SQLite's rate and reading "
               f"windows {pace(reads)} end to end ({pace(engine_reads)} for the engine alone), "
               f"with {extra_rss:+.0f} MB RSS and {disk:.2f}x the disk{threads}; the shipped "
               f"EmbeddedStore inserts at {shipped_insert:.2f}x and reads at "
               f"{shipped_reads:.2f}x the speed of that DuckDB store")
    if not duck_fails and (sqlite_fails or speed >= 1.5):
        why = f"with SQLite {sqlite_fails[0]}" if sqlite_fails else f"{speed:.2f}x faster"
        return f"Verdict: switch to DuckDB, {why}. {figures}."
    reasons = [f"with DuckDB {why}" for why in duck_fails]
    if speed < 1.5:
        reasons.append(f"DuckDB is not clearly faster ({speed:.2f}x overall, where 1.5x would "
                       f"be needed to justify a {duck_mb:.0f} MB dependency)")
    return f"Verdict: keep SQLite: {', and '.join(reasons)}. {figures}."


def orchestrate(args: argparse.Namespace) -> None:
    root = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="store_choice-"))
    root.mkdir(parents=True, exist_ok=True)
    methods = [m for m in DUCK_METHODS if m != "executemany" or not args.skip_duck_executemany]
    res: dict[str, list[dict[str, Any]]] = {}

    def rounds(variants: list[str]) -> None:
        for r in range(1, args.repeats + 1):
            # alternate the order so that no engine always runs first on a fresh machine
            for variant in variants if r % 2 else list(reversed(variants)):
                res.setdefault(variant, []).append(_run(variant, r, root, args))

    try:
        log(f"working in {root}")
        rounds(["sqlite-raw", *(f"duckdb-raw-{m}" for m in methods)])
        best = max(methods, key=lambda m: _med(res[f"duckdb-raw-{m}"], "values_per_s_first"))
        rounds([f"duckdb-raw-{best}-art"])
        plain = _read_geomean(res[f"duckdb-raw-{best}"])
        indexed = _read_geomean(res[f"duckdb-raw-{best}-art"])
        art = indexed * 1.11 <= plain
        slower = _med(res[f"duckdb-raw-{best}"], "values_per_s") / _med(
            res[f"duckdb-raw-{best}-art"], "values_per_s")
        art_note = (f"An ART index on (series_id, field_id, ts) made DuckDB's raw reads "
                    f"{plain / indexed:.2f}x as fast (geomean) and inserts {slower:.2f}x "
                    f"slower: {'used' if art else 'not used'} in its store (needs >= 1.11x).")
        log(art_note)
        duck_store = f"duckdb-store-{best}{'-art' * art}"
        rounds(["sqlite-store", duck_store, "sqlite-shipped"])
    finally:
        if not args.dir and not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    report(res, duck_store, best, art_note, args)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, default=600, help="1 s batches to write [600]")
    parser.add_argument("--cgroups", type=int, default=100, help="pod cgroups per batch [100]")
    parser.add_argument("--repeats", type=int, default=3, help="runs per measurement [3]")
    parser.add_argument("--reads", type=int, default=50, help="repetitions per window [50]")
    parser.add_argument("--seed", type=int, default=7, help="workload seed [7]")
    parser.add_argument("--dir", help="where the databases go [a temporary directory]")
    parser.add_argument("--keep", action="store_true", help="keep the databases")
    parser.add_argument("--duck-executemany-batches", dest="first", metavar="N", type=int,
                        default=60,
                        help="DuckDB's executemany (~100x slower than its other paths) writes "
                        "only this many batches; the DuckDB paths are ranked, and executemany "
                        "compared with SQLite's, on their rate over that many first batches "
                        "[60; 0 = all]")
    parser.add_argument("--skip-duck-executemany", action="store_true",
                        help="do not measure DuckDB's executemany at all")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--round", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--reader", nargs=2, metavar=("ENGINE", "PATH"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.first = min(args.first or args.batches, args.batches)
    if args.reader:
        print(json.dumps(run_reader(*args.reader)))
    elif args.worker:
        print(json.dumps(run_worker(args.worker, Path(args.dir), args)))
    else:
        orchestrate(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
