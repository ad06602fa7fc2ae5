"""The embedded store: round trip, matchers, aggregation, retention, restart, failed writes."""

from __future__ import annotations

import math
import os
import sqlite3
import time

import pandas as pd
import pytest

from sloguard.core.samples import Sample
from sloguard.core.selectors import Matcher
from sloguard.store import StoreError, WindowQuery
from sloguard.store.embedded import EmbeddedStore

S = 1_000_000_000
T0 = 1_700_000_000 * S


def _samples(n: int = 60) -> list[Sample]:
    out = []
    for i in range(n):
        ts = T0 + i * S
        out.append(Sample("container_cpu", {"node": "n", "cgroup": "/a", "class": "LS"},
                          {"usage_cores": float(i), "throttled_ratio": 0.0}, ts))
        out.append(Sample("container_cpu", {"node": "n", "cgroup": "/b", "class": "BE"},
                          {"usage_cores": 100.0 + i}, ts))
        out.append(Sample("node_load", {"node": "n"}, {"load1": 1.5, "procs_running": 3}, ts))
    return out


@pytest.fixture
def store(tmp_path):
    s = EmbeddedStore(tmp_path / "samples.db", retention_s=3600, max_size=1 << 30)
    yield s
    s.close()


def test_round_trip_raw(store):
    store.write(_samples())
    frame = store.read(WindowQuery("container_cpu", T0, T0 + 60 * S))
    assert list(frame.columns) == [
        "time", "cgroup", "class", "node", "throttled_ratio", "usage_cores"]
    assert len(frame) == 120
    assert str(frame["time"].dtype) == "datetime64[ns, UTC]"
    a = frame[frame["cgroup"] == "/a"].sort_values("time")
    assert a["usage_cores"].tolist() == [float(i) for i in range(60)]
    assert a["time"].iloc[0] == pd.Timestamp(T0, unit="ns", tz="UTC")
    b = frame[frame["cgroup"] == "/b"]
    assert b["throttled_ratio"].isna().all()  # field absent from that series


def test_matchers_time_range_and_fields(store):
    store.write(_samples())
    frame = store.read(WindowQuery(
        "container_cpu", T0 + 10 * S, T0 + 20 * S, fields=("usage_cores",),
        matchers=(Matcher("class", "=~", "L."), Matcher("cgroup", "!=", "/zzz")),
    ))
    assert set(frame["cgroup"]) == {"/a"}
    assert frame["usage_cores"].tolist() == [float(i) for i in range(10, 20)]  # end exclusive
    assert "throttled_ratio" not in frame.columns
    none = store.read(WindowQuery("container_cpu", T0, T0 + 60 * S,
                                  matchers=(Matcher("class", "=", "nope"),)))
    assert none.empty and "time" in none.columns


def test_aggregation_per_interval(store):
    store.write(_samples())
    frame = store.read(WindowQuery("container_cpu", T0, T0 + 60 * S, fields=("usage_cores",),
                                   matchers=(Matcher("cgroup", "=", "/a"),),
                                   every_ns=10 * S, agg="mean"))
    assert frame["usage_cores"].tolist() == [4.5, 14.5, 24.5, 34.5, 44.5, 54.5]
    p90 = store.read(WindowQuery("container_cpu", T0, T0 + 60 * S, fields=("usage_cores",),
                                 matchers=(Matcher("cgroup", "=", "/a"),),
                                 every_ns=30 * S, agg="p90"))
    # Buckets align to the epoch as InfluxQL's GROUP BY time() does: T0 is 20 s into a 30 s
    # bucket, so the first bucket holds 10 samples and the second starts at T0 + 10 s.
    assert math.isclose(p90["usage_cores"].iloc[0], pd.Series(range(10)).quantile(0.9))
    assert math.isclose(p90["usage_cores"].iloc[1], pd.Series(range(10, 40)).quantile(0.9))
    assert p90["time"].iloc[1] == pd.Timestamp(T0 + 10 * S, unit="ns", tz="UTC")
    with pytest.raises(ValueError, match="unknown aggregation"):
        store.read(WindowQuery("container_cpu", T0, T0 + S, agg="p200"))


def test_survives_restart(tmp_path):
    first = EmbeddedStore(tmp_path / "s.db", 3600, 1 << 30)
    first.write(_samples(10))
    first.close()
    second = EmbeddedStore(tmp_path / "s.db", 3600, 1 << 30)
    second.write([Sample("node_load", {"node": "n"}, {"load1": 9.0}, T0 + 100 * S)])
    frame = second.read(WindowQuery("node_load", T0, T0 + 200 * S, fields=("load1",)))
    assert frame["load1"].tolist() == [1.5] * 10 + [9.0]  # same series reused, not duplicated
    assert second._writer.execute("SELECT count(*) FROM series").fetchone()[0] == 3
    second.close()


def test_retention_by_age(store):
    store.write(_samples())
    store.maintain(T0 + 3600 * S + 30 * S)  # keeps what is newer than now - 1 h
    frame = store.read(WindowQuery("node_load", T0, T0 + 60 * S))
    assert len(frame) == 30
    assert frame["time"].min() == pd.Timestamp(T0 + 30 * S, unit="ns", tz="UTC")


def test_a_clock_stepped_back_deletes_nothing_inside_the_retention(tmp_path):
    """Retention goes in write order up to the first row inside the retention. After the wall
    clock is stepped back (a node that booted on a wrong RTC), every row written before is
    stamped ahead of it: none may be taken for one past the retention (a fix for rows stamped
    far ahead that skipped them took 6 h of data at one pass)."""
    hour = 3600 * S
    store = EmbeddedStore(tmp_path / "s.db", retention_s=6 * 3600, max_size=1 << 40)
    store.write([Sample("m", {"node": "n"}, {"v": 1.0}, T0 + i * 60 * S) for i in range(360)])
    back = T0 + 6 * hour - 13 * hour  # the clock now 13 h behind
    store.write([Sample("m", {"node": "n"}, {"v": 2.0}, back)])
    store.maintain(back)
    left = store.read(WindowQuery("m", 0, T0 + 7 * hour, fields=("v",)))
    assert len(left) == 361
    store.close()


def test_a_late_sample_does_not_age_its_series_out(tmp_path):
    """A series' last-seen time is its newest sample's, not the last one written: a sample
    older than the retention, written after fresh ones, made retention drop the series' entry
    and so hide every fresh row of it."""
    for fold in (0, 30):
        store = EmbeddedStore(tmp_path / f"s{fold}.db", retention_s=3600, max_size=1 << 40,
                              fold_every_s=fold)
        store.write([Sample("m", {"node": "n"}, {"v": float(i)}, T0 + i * S)
                     for i in range(3000)] + [Sample("m", {"node": "n"}, {"v": -1.0},
                                                     T0 - 7200 * S)])
        store.write([Sample("m", {"node": "n"}, {"v": -2.0}, T0 - 7100 * S)])  # a later batch
        store.maintain(T0 + 3000 * S)
        left = store.read(WindowQuery("m", T0, T0 + 4000 * S, fields=("v",)))
        assert left["v"].tolist() == [float(i) for i in range(3000)], fold
        store.close()


def test_a_late_sample_after_a_retention_pass_or_a_restart_keeps_the_series(tmp_path):
    """The newest time is kept in the database too: after `maintain` wrote it out, or after a
    restart emptied the agent's memory of it, a late sample must not lower it."""
    path = tmp_path / "s.db"
    store = EmbeddedStore(path, retention_s=3600, max_size=1 << 40)
    store.write([Sample("m", {"node": "n"}, {"v": float(i)}, T0 + i * S) for i in range(100)])
    store.maintain(T0 + 100 * S)  # the newest time goes to the database
    store.write([Sample("m", {"node": "n"}, {"v": -1.0}, T0 - 7200 * S)])
    store.maintain(T0 + 200 * S)
    store.close()
    store = EmbeddedStore(path, retention_s=3600, max_size=1 << 40)  # a restart
    store.write([Sample("m", {"node": "n"}, {"v": -2.0}, T0 - 7100 * S)])
    store.maintain(T0 + 300 * S)
    left = store.read(WindowQuery("m", T0, T0 + 400 * S, fields=("v",)))
    assert left["v"].tolist() == [float(i) for i in range(100)]
    store.close()


def test_fresh_rows_stamped_a_little_ahead_survive_retention(tmp_path):
    """A pusher's clock runs a few seconds fast: when its rows are the only ones inside the
    retention, they stay (retention never deletes a row stamped after its cutoff)."""
    store = EmbeddedStore(tmp_path / "s.db", retention_s=60, max_size=1 << 40, fold_every_s=0)
    store.write([Sample("m", {"node": "n"}, {"v": 1.0}, T0 + i * S) for i in range(100)])
    store.write([Sample("m", {"node": "n"}, {"v": 2.0}, T0 + 1020 * S)])  # 20 s ahead
    store.maintain(T0 + 1000 * S)
    left = store.read(WindowQuery("m", 0, T0 + 2000 * S, fields=("v",)))
    assert left["v"].tolist() == [2.0]
    store.close()


def test_retention_by_size(tmp_path):
    store = EmbeddedStore(tmp_path / "s.db", retention_s=10 * 86400, max_size=600_000)
    batch = [Sample("m", {"node": "n", "i": str(i % 50)}, {"v": float(i)}, T0 + i * S // 100)
             for i in range(40_000)]
    store.write(batch)
    assert store.used_bytes() > 600_000
    store.maintain(T0 + 400 * S)
    assert store.used_bytes() <= 600_000
    left = store.read(WindowQuery("m", T0, T0 + 1000 * S, fields=("v",)))
    assert 0 < len(left) < 40_000
    assert left["v"].max() == 39_999.0  # the newest survive, the oldest went
    store.close()


def test_failed_write_raises_and_leaves_nothing_half_written(tmp_path):
    store = EmbeddedStore(tmp_path / "s.db", 3600, 1 << 30)
    store.write(_samples(1))
    blocker = sqlite3.connect(tmp_path / "s.db", timeout=0)
    blocker.execute("BEGIN EXCLUSIVE")  # another writer holds the database
    store._writer.execute("PRAGMA busy_timeout=100")
    new_series = [Sample("fresh", {"node": "n"}, {"v": 1.0}, T0 + 5 * S)]
    with pytest.raises(StoreError):
        store.write(new_series)
    assert not store.status().ok and "write failed" in store.status().reason
    blocker.rollback()
    blocker.close()
    store.write(new_series)  # the retry succeeds, with a valid catalog
    assert store.read(WindowQuery("fresh", T0, T0 + 10 * S))["v"].tolist() == [1.0]
    assert store.status().ok
    store.close()


def test_unwritable_location_is_a_store_error(tmp_path):
    target = tmp_path / "file"
    target.write_text("not a directory")  # a parent that is a file: fails for root too
    with pytest.raises((StoreError, OSError)):
        EmbeddedStore(target / "s.db", 3600, 1 << 30)


def test_series_ids_are_never_reused_after_retention(store):
    store.write([Sample("m", {"node": "n", "c": "/gone"}, {"v": 1.0}, T0)])
    assert store.read(WindowQuery("m", T0, T0 + S))["c"].tolist() == ["/gone"]  # reader cached
    store.maintain(T0 + 7200 * S)  # the series and its rows age out
    store.write([Sample("m", {"node": "n", "c": "/new"}, {"v": 2.0}, T0 + 7200 * S)])
    frame = store.read(WindowQuery("m", 0, T0 + 8000 * S))
    assert frame["c"].tolist() == ["/new"] and frame["v"].tolist() == [2.0]


def test_size_limit_keeps_a_free_space_reserve(tmp_path):

    store = EmbeddedStore(tmp_path / "s.db", 3600, max_size=1 << 60)
    fs = os.statvfs(tmp_path)
    free = fs.f_bavail * fs.f_frsize
    limit = store.size_limit(used=1000)
    assert limit < 1000 + free  # bounded by the filesystem, not by the huge max_size
    assert limit <= 1000 + free - 256 * 1024**2
    store.close()


# -- rows wait unindexed, then are folded (store/embedded.py's docstring says why) ------------

def _counts(store: EmbeddedStore, measurement: str) -> tuple[int, int]:
    """(rows in the indexed table, rows waiting in its twin)."""
    table = store._catalog.tables[measurement]
    conn = store._writer
    return (conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0],
            conn.execute(f"SELECT count(*) FROM {table}_recent").fetchone()[0])


def test_rows_are_read_once_before_and_after_they_are_folded(tmp_path):
    store = EmbeddedStore(tmp_path / "s.db", 3600, 1 << 30, fold_every_s=3600)
    store.write(_samples(30))
    assert _counts(store, "container_cpu") == (0, 60)  # waiting, not in the index yet
    query = WindowQuery("container_cpu", T0, T0 + 60 * S, fields=("usage_cores",))
    before = store.read(query)
    totals = store.read_totals(query)
    buckets = store.read(WindowQuery("container_cpu", T0, T0 + 60 * S, fields=("usage_cores",),
                                     every_ns=10 * S, agg="sum"))
    store.fold_every_s = 0.0001  # the next write folds
    store.write([Sample("node_load", {"node": "n"}, {"load1": 2.0, "new_field": 1}, T0 + 40 * S)])
    assert _counts(store, "container_cpu") == (60, 0)
    assert _counts(store, "node_load") == (31, 0)
    assert store.read(query).equals(before) and len(before) == 60
    assert sorted(store.read_totals(query), key=str) == sorted(totals, key=str)
    assert store.read(WindowQuery("container_cpu", T0, T0 + 60 * S, fields=("usage_cores",),
                                  every_ns=10 * S, agg="sum")).equals(buckets)
    # a field that appeared while rows waited is in both tables
    assert store.read(WindowQuery("node_load", T0, T0 + 60 * S,
                                  fields=("new_field",)))["new_field"].dropna().tolist() == [1]
    store.close()


def test_rows_waiting_when_the_agent_is_killed_are_kept_and_folded_at_the_next_start(tmp_path):
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent(f"""
        import os
        from sloguard.core.samples import Sample
        from sloguard.store.embedded import EmbeddedStore
        store = EmbeddedStore({str(tmp_path / 's.db')!r}, 3600, 1 << 30, fold_every_s=3600)
        for i in range(20):
            store.write([Sample("m", {{"node": "n", "c": str(c)}}, {{"v": float(i)}},
                                {T0} + i * {S}) for c in range(5)])
        os._exit(9)  # killed: no close, no final checkpoint
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 9, done.stderr
    store = EmbeddedStore(tmp_path / "s.db", 3600, 1 << 30)
    assert _counts(store, "m") == (100, 0)  # folded as it opened
    frame = store.read(WindowQuery("m", T0, T0 + 30 * S))
    assert len(frame) == 100 and sorted(set(frame["v"])) == [float(i) for i in range(20)]
    store.close()


def test_a_store_written_before_the_twins_gets_them(tmp_path):
    old = EmbeddedStore(tmp_path / "s.db", 3600, 1 << 30, fold_every_s=0)  # as before: indexed
    old.write(_samples(10))
    assert _counts(old, "node_load") == (10, 0)
    old.close()
    conn = sqlite3.connect(tmp_path / "s.db")
    for (name,) in conn.execute(
            "SELECT name FROM sqlite_master WHERE name LIKE '%_recent'").fetchall():
        conn.execute(f"DROP TABLE {name}")
    conn.commit()
    conn.close()
    store = EmbeddedStore(tmp_path / "s.db", 3600, 1 << 30)
    store.write([Sample("node_load", {"node": "n"}, {"load1": 7.0, "procs_running": 1},
                        T0 + 20 * S)])
    assert _counts(store, "node_load") == (10, 1)
    assert store.read(WindowQuery("node_load", T0, T0 + 30 * S,
                                  fields=("load1",)))["load1"].tolist() == [1.5] * 10 + [7.0]
    store.close()


def test_a_reader_never_sees_a_fold_half_done(tmp_path):
    """Another connection reads while the writer folds at every other write: each read has
    whole batches, never a row twice (in both tables) or missing (in neither)."""
    import threading

    writer = EmbeddedStore(tmp_path / "s.db", 3600, 1 << 30, fold_every_s=0.002)
    reader = EmbeddedStore(tmp_path / "s.db", 3600, 1 << 30)
    stop, seen, bad = threading.Event(), [], []
    query = WindowQuery("m", 0, T0 + 10**6 * S, fields=("v",))

    def read() -> None:
        while not stop.is_set():
            frame = reader.read(query)
            seen.append(len(frame))
            if len(frame) % 50 or frame.duplicated(["time", "c"]).any():
                bad.append(len(frame))

    thread = threading.Thread(target=read)
    thread.start()
    for i in range(200):
        writer.write([Sample("m", {"node": "n", "c": str(c)}, {"v": float(i)}, T0 + i * S)
                      for c in range(50)])
        if i % 2:
            time.sleep(0.003)
    stop.set()
    thread.join()
    assert not bad, bad[:10]
    assert len(seen) > 20 and seen == sorted(seen)  # reads went on while it wrote
    assert len(reader.read(query)) == 200 * 50
    folded, waiting = _counts(writer, "m")
    assert folded > 0 and folded + waiting == 200 * 50
    writer.close()
    reader.close()


def test_opening_a_store_with_nothing_waiting_does_not_wait_for_its_writer(tmp_path):
    """A backtest or a second process opening the agent's store while the agent holds the
    write lock: with nothing waiting to be folded, opening takes no write lock, so it does not
    wait for the agent (nor fail after the busy timeout)."""
    first = EmbeddedStore(tmp_path / "s.db", 3600, 1 << 30, fold_every_s=0)
    first.write(_samples(5))
    first._writer.execute("BEGIN IMMEDIATE")  # the agent, mid-write
    try:
        started = time.monotonic()
        again = EmbeddedStore(tmp_path / "s.db", 3600, 1 << 30)
        assert time.monotonic() - started < 2
        assert len(again.read(WindowQuery("node_load", T0, T0 + 10 * S))) == 5
        again.close()
    finally:
        first._writer.execute("ROLLBACK")
    first.close()


def test_a_twin_short_of_a_column_is_mended_when_the_store_opens(tmp_path):
    """A version without twins (a downgrade) added a field to the indexed table alone; the
    next start gives the twin that column too, and reads and folds keep working."""
    first = EmbeddedStore(tmp_path / "s.db", 3600, 1 << 30)
    first.write(_samples(5))
    table = first._catalog.tables["node_load"]
    first.close()
    conn = sqlite3.connect(tmp_path / "s.db")
    conn.execute(f"ALTER TABLE {table} ADD COLUMN f9")
    conn.execute("INSERT INTO fields VALUES (?, 'older_field', 'f9')", (int(table[1:]),))
    conn.execute(f"INSERT INTO {table} (series_id, ts, f9) VALUES "
                 f"((SELECT id FROM series WHERE measurement = 'node_load'), {T0 + 7 * S}, 4.0)")
    conn.commit()
    conn.close()
    store = EmbeddedStore(tmp_path / "s.db", 3600, 1 << 30, fold_every_s=0.0001)
    store.write([Sample("node_load", {"node": "n"}, {"older_field": 5.0}, T0 + 8 * S)])
    frame = store.read(WindowQuery("node_load", T0, T0 + 10 * S, fields=("older_field",)))
    assert frame["older_field"].dropna().tolist() == [4.0, 5.0]
    assert _counts(store, "node_load")[1] == 0  # folded
    store.close()


def test_a_read_binds_each_series_once_for_both_tables(tmp_path):
    """A read names its series once though it reads two tables, so the twin does not halve how
    many series one read may name (SQLite's default limit is 32,766 parameters)."""
    store = EmbeddedStore(tmp_path / "samples.db", retention_s=3600, max_size=1 << 30)
    try:
        store.write([Sample("container_cpu", {"cgroup": f"/c{i}"}, {"usage_cores": float(i)},
                            T0 + k * S) for i in range(600) for k in range(2)])
        store.maintain(T0 + 2 * S)  # folded; the next write waits: both tables hold rows
        store.write([Sample("container_cpu", {"cgroup": f"/c{i}"}, {"usage_cores": float(i)},
                            T0 + 2 * S) for i in range(600)])
        store._reader.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, 1000)
        raw = store.read(WindowQuery("container_cpu", T0, T0 + 10 * S))
        assert len(raw) == 1800
        buckets = store.read(WindowQuery("container_cpu", T0, T0 + 10 * S, every_ns=10 * S,
                                         agg="max"))
        assert len(buckets) == 600 and buckets["usage_cores"].sum() == sum(range(600))
        totals = store.read_totals(WindowQuery("container_cpu", T0, T0 + 10 * S,
                                               fields=("usage_cores",)))
        assert sorted(count for _, _, count in totals) == [3] * 600
    finally:
        store.close()


def test_the_fold_is_due_by_the_store_clock(tmp_path):
    """The fold waits fold_every_s on the store's clock, not on wall time: a benchmark writing
    a simulated second per call folds as a 1 s agent would."""
    now = [1000.0]
    store = EmbeddedStore(tmp_path / "s.db", 3600, 1 << 30, fold_every_s=30,
                          clock=lambda: now[0])
    try:
        for i in range(3):
            now[0] += 10
            store.write([Sample("node_load", {"node": "n"}, {"load1": 1.0}, T0 + i * S)])
            assert _counts(store, "node_load") == ((3, 0) if i == 2 else (0, i + 1))
    finally:
        store.close()


def test_the_catalog_is_read_from_one_snapshot(tmp_path):
    """A measurement committed between the reader's query of the measurements and its query of
    the fields left a field without its measurement: the reading thread died on a KeyError
    (found by a CI run, then made certain here by committing from SQLite's statement trace)."""
    writer = EmbeddedStore(tmp_path / "s.db", 3600, 1 << 30)
    reader = EmbeddedStore(tmp_path / "s.db", 3600, 1 << 30)
    writer.write([Sample("a", {"n": "1"}, {"v": 1.0}, T0)])
    committed = []

    def commit_in_between(sql: str) -> None:
        if "FROM fields" in sql and not committed:
            committed.append(sql)
            writer.write([Sample("b", {"n": "1"}, {"w": 2.0}, T0)])

    reader._reader.set_trace_callback(commit_in_between)
    assert reader.read(WindowQuery("a", 0, T0 + S, fields=("v",)))["v"].tolist() == [1.0]
    assert committed  # the commit did land between the two queries
    reader._reader.set_trace_callback(None)
    assert reader.read(WindowQuery("b", 0, T0 + S, fields=("w",)))["w"].tolist() == [2.0]
    writer.close()
    reader.close()
