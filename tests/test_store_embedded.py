"""The embedded store: round trip, matchers, aggregation, retention, restart, failed writes."""

from __future__ import annotations

import math
import os
import sqlite3

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
