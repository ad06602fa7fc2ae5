"""The InfluxDB store against a real InfluxDB 1.x server (Debian's influxd, see
support/influxenv.py): round trips with exact timestamps, the embedded store's frame shape,
escaping and injection, duplicates, the spool across an outage and a restart, its bound, and
secrets kept out of everything shown."""

from __future__ import annotations

import json
import logging
import re
import subprocess
import time

import pandas as pd
import pytest
from prometheus_client import CollectorRegistry, generate_latest

from sloguard.collectors.node import NodeCollector
from sloguard.core.config import ConfigError
from sloguard.core.samples import Sample
from sloguard.core.selectors import Matcher
from sloguard.core.selfmetrics import AgentMetrics
from sloguard.settings import load_settings
from sloguard.store import StoreError, WindowQuery
from sloguard.store.config import StoreConfig
from sloguard.store.embedded import EmbeddedStore
from sloguard.store.influx import InfluxStore

pytestmark = pytest.mark.influx

S = 1_000_000_000
T0 = 1_700_000_000 * S
HOSTILE = [
    "with space", "comma,here", "equals=sign", 'double"quote', "single'quote",
    "back\\slash", "C:\\Program Files\\x", "ünïcødé 😀", "x' OR 'a'='a", '") OR ("a"="a',
    "'; DROP DATABASE sloguard; '", "/.*/", "a|b", "(group)", "[class]", "dot.star.*",
    "tab\there", "=,= ,=", "\\'", "end'", "100%", "%r %d %s %%",
]


def _cfg(server, db: str, **extra) -> StoreConfig:
    return StoreConfig(kind="influxdb", url=server.url, database=db, username=server.username,
                       password=server.password, flush_interval=0.1, **extra)


def embedded_frame(samples: list[Sample], query: WindowQuery, tmp_path) -> pd.DataFrame:
    """What the embedded store reads from the same samples: the reference frame."""
    reference = EmbeddedStore(tmp_path / "reference.db", retention_s=10**9, max_size=1 << 30)
    try:
        reference.write(samples)
        return reference.read(query)
    finally:
        reference.close()


def _metric(registry: CollectorRegistry, name: str, labels: str = "") -> float:
    total = 0.0
    for line in generate_latest(registry).decode().splitlines():
        if line.startswith(name + (labels or " ")) or (
                not labels and line.startswith(name + "{")):
            total += float(line.rsplit(" ", 1)[1])
    return total


@pytest.fixture
def store_pair(influx_server, influx_db, tmp_path):
    influx = InfluxStore(_cfg(influx_server, influx_db), tmp_path / "data")
    embedded = EmbeddedStore(tmp_path / "samples.db", retention_s=10**9, max_size=1 << 30)
    yield influx, embedded
    influx.close()
    embedded.close()


def _synthetic(n: int = 60) -> list[Sample]:
    out = []
    for i in range(n):
        ts = T0 + i * S + 123  # not on a second: the nanoseconds must survive
        out.append(Sample("container_cpu", {"node": "n", "cgroup": "/a", "class": "LS"},
                          {"usage_cores": i * 0.25, "throttled_ratio": 0.0}, ts))
        out.append(Sample("container_cpu", {"node": "n", "cgroup": "/b", "class": "BE",
                                            "pod": "web-1"}, {"usage_cores": 100.0 + i}, ts))
        out.append(Sample("node_load", {"node": "n"}, {"load1": 1.5, "procs_running": 3}, ts))
    return out


def test_collected_samples_read_back_exactly(store_pair):
    """What the real node collector produced is what read_samples gives back: same tags,
    values and nanosecond timestamps."""
    influx, _ = store_pair
    collector = NodeCollector("rt-node")
    written: list[Sample] = []
    for tick in range(3):
        written += collector.collect(T0 + tick * S + 7)
    influx.write(written)
    assert influx.flush(20), influx.status()
    for measurement in sorted({s.measurement for s in written}):
        expected = sorted(
            (s.time_ns, tuple(sorted(s.tags.items())),
              tuple(sorted((k, float(v)) for k, v in s.fields.items())))
             for s in written if s.measurement == measurement)
        back = influx.read_samples(WindowQuery(measurement, T0, T0 + 10 * S))
        got = sorted((s.time_ns, tuple(sorted(s.tags.items())), tuple(sorted(s.fields.items())))
                     for s in back)
        assert got == expected, measurement
        assert [s.time_ns for s in back] == sorted(s.time_ns for s in back)  # oldest first


QUERIES = [
    WindowQuery("container_cpu", T0, T0 + 60 * S),
    WindowQuery("container_cpu", T0 + 10 * S, T0 + 20 * S, fields=("usage_cores",),
                matchers=(Matcher("class", "=~", "L."), Matcher("cgroup", "!=", "/zzz"))),
    WindowQuery("container_cpu", T0, T0 + 60 * S, matchers=(Matcher("pod", "=", ""),)),
    WindowQuery("container_cpu", T0, T0 + 60 * S, matchers=(Matcher("pod", "!~", "web-.*"),)),
    WindowQuery("container_cpu", T0, T0 + 60 * S, matchers=(Matcher("class", "=", "none"),)),
    WindowQuery("node_load", T0, T0 + 60 * S, fields=("load1", "procs_running")),
    *(WindowQuery("container_cpu", T0, T0 + 60 * S, fields=("usage_cores",),
                  every_ns=10 * S, agg=agg)
      for agg in ("mean", "min", "max", "sum", "count", "first", "last", "median")),
    WindowQuery("container_cpu", T0, T0 + 60 * S, every_ns=30 * S, agg="max"),
]


@pytest.mark.parametrize("query", QUERIES, ids=lambda q: f"{q.measurement}-{q.agg}")
def test_frames_are_those_of_the_embedded_store(store_pair, query):
    influx, embedded = store_pair
    samples = _synthetic()
    influx.write(samples)
    embedded.write(samples)
    assert influx.flush(20), influx.status()
    expected = embedded.read(query)
    got = influx.read(query)
    if expected.empty:
        assert got.empty and "time" in got.columns
        return
    pd.testing.assert_frame_equal(got, expected, check_dtype=True)


def test_percentiles_are_influxql_nearest_rank(store_pair):
    influx, _ = store_pair
    influx.write(_synthetic())
    assert influx.flush(20)
    frame = influx.read(WindowQuery("container_cpu", T0, T0 + 60 * S, fields=("usage_cores",),
                                    matchers=(Matcher("cgroup", "=", "/a"),),
                                    every_ns=100 * S, agg="p90"))  # T0 starts a bucket
    values = sorted(i * 0.25 for i in range(60))
    rank = int(len(values) * 90 / 100 + 0.5) - 1  # InfluxQL's PERCENTILE
    assert frame["usage_cores"].tolist() == [values[rank]]
    assert str(frame["time"].dtype) == "datetime64[ns, UTC]"


def test_hostile_tag_values_round_trip_and_cannot_inject(influx_server, influx_db, tmp_path):
    registry = CollectorRegistry()
    store = InfluxStore(_cfg(influx_server, influx_db, gzip=True), tmp_path / "d",
                        AgentMetrics(registry).influx())
    try:
        assert store.status().details["gzip"] is True
        samples = [Sample("container_cpu", {"pod": value, "k": "v"}, {"usage_cores": float(i)},
                          T0 + i * S) for i, value in enumerate(HOSTILE)]
        bad = [Sample("container_cpu", {"pod": "new\nline"}, {"usage_cores": 1.0}, T0),
               Sample("container_cpu", {"pod": "trailing\\"}, {"usage_cores": 1.0}, T0)]
        store.write(samples[:5] + bad + samples[5:])
        assert store.flush(20), store.status()
        # the unwritable ones are counted and said, the rest of the same write went through
        assert _metric(registry, "sloguard_influx_points_rejected_total") == 2
        assert store.status().details["points_rejected"] == 2
        window = (T0, T0 + 100 * S)
        everything = store.read(WindowQuery("container_cpu", *window))
        assert sorted(everything["pod"]) == sorted(HOSTILE)
        for i, value in enumerate(HOSTILE):
            for matcher in (Matcher("pod", "=", value), Matcher("pod", "=~", re.escape(value))):
                frame = store.read(WindowQuery("container_cpu", *window, matchers=(matcher,)))
                assert frame["pod"].tolist() == [value], (matcher, frame)
                assert frame["usage_cores"].tolist() == [float(i)]
                assert frame["time"].tolist() == [pd.Timestamp(T0 + i * S, unit="ns", tz="UTC")]
            others = store.read(WindowQuery("container_cpu", *window,
                                            matchers=(Matcher("pod", "!=", value),)))
            assert sorted(others["pod"]) == sorted(v for v in HOSTILE if v != value)
            raw = store.read_samples(WindowQuery("container_cpu", *window,
                                                 matchers=(Matcher("pod", "=", value),)))
            assert [s.tags["pod"] for s in raw] == [value]
        # hostile strings as regexes are regexes of the pod's value, nothing more
        for value in ("x' OR 'a'='a", "/.*/", "(?:)$/ OR /(.*)", '.*\\/ OR "pod" =~ /.*',
                      "end'|x"):
            frame = store.read(WindowQuery("container_cpu", *window,
                                           matchers=(Matcher("pod", "=~", value),)))
            pods = sorted(frame["pod"]) if len(frame) else []
            assert pods == sorted(v for v in HOSTILE if re.fullmatch(value, v)), value
        databases = influx_server.query("SHOW DATABASES")["results"][0]["series"][0]["values"]
        assert [influx_db] in databases  # the DROP in a tag value stayed a string
    finally:
        store.close()


def test_the_same_point_twice_is_one_point(influx_server, influx_db, tmp_path):
    store = InfluxStore(_cfg(influx_server, influx_db), tmp_path / "d")
    try:
        batch = _synthetic(10)
        store.write(batch)
        assert store.flush(20)
        store.write(batch)
        assert store.flush(20)
        assert influx_server.count(influx_db, "container_cpu", "usage_cores") == 20
        assert store.status().details["points_sent"] == 60
    finally:
        store.close()


def test_outage_restart_and_replay_in_order(own_influx_server, tmp_path):
    """The server goes away, the agent restarts meanwhile: what it wrote waits in the spool and
    reaches the server, in order, once it is back."""
    server = own_influx_server
    db = server.create_database()
    registry = CollectorRegistry()
    store = InfluxStore(_cfg(server, db), tmp_path / "d", AgentMetrics(registry).influx())
    store.write(_synthetic(5))
    assert store.flush(20)
    server.stop()
    first = [Sample("node_load", {"node": "n"}, {"load1": 1.0}, T0 + 100 * S)]
    second = [Sample("node_load", {"node": "n"}, {"load1": 2.0}, T0 + 100 * S)]  # same point
    later = [s for s in _synthetic(30) if s.time_ns >= T0 + 5 * S]  # ticks 5..29
    store.write(later + first)
    assert not store.flush(1.5)
    store.write(second)
    assert not store.flush(1.5)
    status = store.status()
    assert not status.ok and "spooled" in status.reason
    assert status.details["spool_batches"] >= 1
    store.write([Sample("node_load", {"node": "n"}, {"load1": 3.0}, T0 + 200 * S)])
    deadline = time.monotonic() + 5  # spooled within a flush interval, not at the next retry
    while store.status().details["pending_points"]:
        assert time.monotonic() < deadline, store.status()
        time.sleep(0.05)
    assert _metric(registry, "sloguard_influx_spool_batches") >= 1
    assert _metric(registry, "sloguard_influx_spool_bytes") > 0
    assert _metric(registry, "sloguard_influx_write_failures_total") >= 1
    store.close()  # the agent stops while the server is away
    spooled = sorted(p.name for p in (tmp_path / "d" / "influx-spool").iterdir())
    assert spooled and all(name.endswith(".lp.gz") for name in spooled)

    server.start()
    again = InfluxStore(_cfg(server, db), tmp_path / "d")
    try:
        assert again.flush(30), again.status()
        assert again.status().ok and again.status().details["spool_batches"] == 0
        assert list((tmp_path / "d" / "influx-spool").iterdir()) == []
        assert server.count(db, "container_cpu", "usage_cores") == 2 * 30  # none lost
        frame = again.read(WindowQuery("container_cpu", T0, T0 + 30 * S))
        expected = embedded_frame(_synthetic(30), WindowQuery("container_cpu", T0, T0 + 30 * S),
                                  tmp_path)
        pd.testing.assert_frame_equal(frame, expected)
        load = again.read(WindowQuery("node_load", T0 + 100 * S, T0 + 101 * S,
                                      fields=("load1",)))
        assert load["load1"].tolist() == [2.0]  # replayed in order: the later write won
    finally:
        again.close()


def test_spool_bound_and_full_policy_are_explicit(tmp_path, caplog):
    """Nothing listens on the URL (a real refused connection): batches pile up in the spool up
    to its bound; beyond it the oldest go, counted in /metrics and logged."""
    from support.influxenv import free_port

    registry = CollectorRegistry()
    cfg = StoreConfig(kind="influxdb", url=f"http://127.0.0.1:{free_port()}", database="x",
                      api="v1", batch_size=200, flush_interval=0.05, spool_max_size=8192,
                      timeout=1)
    store = InfluxStore(cfg, tmp_path / "d", AgentMetrics(registry).influx())
    caplog.set_level(logging.ERROR)
    try:
        for i in range(40):
            store.write([Sample("m", {"series": f"s{j}-{i}"}, {"v": float(j * i) + 0.123456},
                                T0 + i * S + j) for j in range(200)])
            store.flush(0.05)
        store.flush(0.5)
        spool = store.spool
        assert spool is not None and spool.bytes <= 8192
        dropped = _metric(registry, "sloguard_influx_spool_dropped_batches_total")
        assert dropped >= 1
        assert _metric(registry, "sloguard_influx_spool_dropped_points_total") == dropped * 200
        assert _metric(registry, "sloguard_influx_spool_max_bytes") == 8192
        assert "spool" in caplog.text and "drop_oldest" in caplog.text
        kept = [b.seq for b in spool._batches]
        assert kept == sorted(kept) and kept[-1] == spool._next_seq - 1  # the newest stayed
        assert store.status().details["spool_dropped_points"] == dropped * 200
    finally:
        store.close()


def test_v2_path_against_influxdb_1_6_is_refused_but_nothing_is_lost(
        influx_server, influx_db, tmp_path):
    """`api: v2` is obeyed even against a server without the v2 API: the 404 is reported and
    the points wait in the spool for a corrected configuration."""
    store = InfluxStore(_cfg(influx_server, influx_db, api="v2"), tmp_path / "d")
    try:
        store.write(_synthetic(3))
        assert not store.flush(2)
        deadline = time.monotonic() + 20  # the writer's first attempt may come late on a
        while store.status().ok and time.monotonic() < deadline:  # loaded machine (seen in CI)
            time.sleep(0.05)
        status = store.status()
        assert status.details["write_path"].startswith("v2")
        assert status.details["chosen_by"] == "config (store.api)"
        assert not status.ok and "404" in status.reason
    finally:
        store.close()
    fixed = InfluxStore(_cfg(influx_server, influx_db), tmp_path / "d")
    try:
        assert fixed.flush(20), fixed.status()
        assert fixed.status().details["write_path"].startswith("1.x")
        assert fixed.status().details["server_version"].startswith("1.6")
        assert influx_server.count(influx_db, "container_cpu", "usage_cores") == 6
    finally:
        fixed.close()


def test_config_errors_name_the_field(tmp_path):
    cases = {
        "store: {kind: influxdb, database: x}\n": "store.url: required with kind: influxdb",
        "store: {kind: influxdb, url: 'http://h:8086'}\n": "store.database: set database",
        "store: {kind: influxdb, url: 'ftp://h', bucket: b}\n": "store.url: must be an http",
        "store: {kind: influxdb, url: 'http://h', bucket: b, api: v3}\n": "store.api:",
        "store: {kind: influxdb, url: 'http://h', bucket: b, spool_full: never}\n":
            "store.spool_full:",
    }
    for text, expected in cases.items():
        path = tmp_path / "c.yaml"
        path.write_text(text)
        with pytest.raises(ConfigError) as err:
            load_settings(path)
        assert f"{path}:1: {expected}" in str(err.value), str(err.value)


def test_secrets_never_shown(influx_server, influx_db, tmp_path, sloguard_bin, caplog,
                             monkeypatch):
    token, password = "tok-SECRET-123", "pw-SECRET-456"
    config = tmp_path / "c.yaml"
    config.write_text(f"store:\n  kind: influxdb\n  url: {influx_server.url}\n"
                      f"  database: {influx_db}\n  username: {influx_server.username}\n"
                      f"  password: {password}\n  token: {token}\n")
    shown = subprocess.run([sloguard_bin, "config", "show", "-c", str(config)],
                           capture_output=True, text=True, check=True).stdout
    as_json = subprocess.run([sloguard_bin, "config", "show", "-c", str(config), "--json"],
                             capture_output=True, text=True, check=True).stdout
    for text in (shown, as_json):
        assert token not in text and password not in text
    rows = {row["key"]: row["value"] for row in json.loads(as_json)}
    assert rows["store.password"] == "**********" and rows["store.kind"] == "influxdb"
    # errors about a secret do not repeat it
    config.write_text(f"store: {{kind: influxdb, url: 'http://h', database: d, "
                      f"password: [{password}]}}\n")
    failed = subprocess.run([sloguard_bin, "config", "show", "-c", str(config)],
                            capture_output=True, text=True)
    assert failed.returncode == 2 and "store.password" in failed.stderr
    assert password not in failed.stderr
    config.write_text(f"store: {{kind: influxdb, url: 'http://u:{password}@h', database: d}}\n")
    failed = subprocess.run([sloguard_bin, "config", "show", "-c", str(config)],
                            capture_output=True, text=True)
    assert failed.returncode == 2 and "store.url" in failed.stderr
    assert password not in failed.stderr
    # the wrong password: refused (401), logged, reported, and never shown
    monkeypatch.setenv("SLOGUARD_STORE__PASSWORD", password)
    settings = load_settings(None, {"data_dir": ("--data-dir", tmp_path / "data")}).settings
    cfg = settings.store.model_copy(update={
        "kind": "influxdb", "url": influx_server.url, "database": influx_db,
        "username": influx_server.username, "flush_interval": 0.1})
    assert cfg.password is not None and cfg.password.get_secret_value() == password
    caplog.set_level(logging.DEBUG)
    store = InfluxStore(cfg, tmp_path / "data")
    try:
        store.write(_synthetic(2))
        assert not store.flush(2)
        status = store.status()
        assert not status.ok and "401" in status.reason
        text = json.dumps(status.as_dict()) + caplog.text + repr(store.creds) + repr(cfg)
        assert password not in text and token not in text
    finally:
        store.close()
    with pytest.raises(StoreError):
        InfluxStore(cfg, tmp_path / "data", writer=False).write(_synthetic(1))


def test_series_bound_refuses_new_series_until_old_ones_expire(tmp_path):
    from support.influxenv import free_port

    registry = CollectorRegistry()
    cfg = StoreConfig(kind="influxdb", url=f"http://127.0.0.1:{free_port()}", database="x",
                      api="v1", max_series=2, timeout=1)
    store = InfluxStore(cfg, tmp_path / "d", AgentMetrics(registry).influx())
    try:
        store.write([Sample("m", {"s": str(i)}, {"v": 1.0}, T0) for i in range(3)])
        store.write([Sample("m", {"s": "0"}, {"v": 2.0}, T0 + S)])  # a known series goes on
        assert _metric(registry, "sloguard_influx_points_rejected_total",
                       '{reason="cardinality"}') == 1
        store.maintain(T0 + 2 * 3600 * S)  # an hour later the old series no longer count
        store.write([Sample("m", {"s": "new"}, {"v": 1.0}, T0 + 2 * 3600 * S)])
        assert store.points_rejected == 1
    finally:
        store.close()


def test_a_batch_over_the_servers_body_limit_is_split(make_influx_server, tmp_path):
    """influxd refuses bodies over its max-body-size with 413: the writer halves the batch
    until the parts fit, and every point arrives."""
    server = make_influx_server(max_body_size=4096)
    db = server.create_database()
    store = InfluxStore(_cfg(server, db, batch_size=400, gzip=False), tmp_path / "d")
    try:
        store.write(_synthetic(100))  # 300 lines, ~20 KB in one batch
        assert store.flush(30), store.status()
        assert server.count(db, "container_cpu", "usage_cores") == 200
        assert server.count(db, "node_load", "load1") == 100
        assert store.points_rejected == 0
    finally:
        store.close()


def test_series_reads_are_those_of_the_embedded_store(store_pair):
    """`read_series` (what attribution reads): InfluxDB by its samples grouped, the embedded
    store by its rows grouped; the same series, times and values either way."""
    from sloguard.store import read_series

    influx, embedded = store_pair
    samples = _synthetic()
    influx.write(samples)
    embedded.write(samples)
    assert influx.flush(20), influx.status()
    query = WindowQuery("container_cpu", T0, T0 + 60 * S, fields=("usage_cores",))

    def key(found):
        return sorted((tuple(sorted(tags.items())), list(times), list(values))
                      for tags, times, values in found)

    got, expected = read_series(influx, query), read_series(embedded, query)
    assert expected and key(got) == key(expected)
    assert all(times == sorted(times) for _, times, _ in expected)
    with pytest.raises(ValueError, match="one field"):
        read_series(embedded, WindowQuery("container_cpu", T0, T0 + S))
