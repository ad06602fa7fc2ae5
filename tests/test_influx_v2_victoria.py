"""The v2 write path (the official influxdb-client, /api/v2/write) against a real server.

The server is Debian's VictoriaMetrics, and it is NOT InfluxDB 2: no InfluxDB with the v2 API
(1.8+, 2.x, 3.x) can be installed on this machine, and VictoriaMetrics is a real server that
accepts line protocol on /api/v2/write. It stores `measurement_field` metrics with millisecond
timestamps and has no InfluxQL, so the data is read back through its own export API, and the
timestamps are compared in milliseconds.
"""

from __future__ import annotations

import time

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from sloguard.core.samples import Sample
from sloguard.core.selfmetrics import AgentMetrics
from sloguard.store.config import StoreConfig
from sloguard.store.influx import InfluxStore

pytestmark = pytest.mark.influx

PODS = ["web 1", "a,b=c", 'q"uote', "ünï😀", "back\\slash"]


def _samples(now_ms: int, ticks: int) -> list[Sample]:
    out = []
    for i in range(ticks):
        ts = (now_ms - (ticks - i) * 1000) * 1_000_000  # in the past: the export ends at now
        for j, pod in enumerate(PODS):
            out.append(Sample("container_cpu", {"node": "vm-node", "pod": pod, "class": "LS"},
                              {"usage_cores": i + j / 10, "periods": 10 + i}, ts))
    return out


@pytest.mark.parametrize("api", ["v2", "auto"])
def test_writes_reach_the_server_through_the_chosen_path(victoria_server, tmp_path, api):
    registry = CollectorRegistry()
    bucket = f"sloguard-{api}"
    cfg = StoreConfig(kind="influxdb", url=victoria_server.url, api=api, bucket=bucket,
                      org="lab", token="not-checked-by-victoria-metrics", flush_interval=0.1,
                      batch_size=7, gzip=api == "v2")  # influxdb-client's gzip, on the v2 run
    store = InfluxStore(cfg, tmp_path / "data", AgentMetrics(registry).influx())
    samples = _samples(time.time_ns() // 1_000_000, 20)
    try:
        store.write(samples)
        assert store.flush(20), store.status()
        status = store.status()
        # VictoriaMetrics' /ping reports no InfluxDB version: `auto` falls back to 1.x /write
        assert status.details["write_path"].startswith("v2" if api == "v2" else "1.x")
        assert status.ok and status.details["points_sent"] == len(samples)
    finally:
        store.close()
    metrics = generate_latest(registry).decode()
    assert f'sloguard_influx_points_sent_total{{path="{api if api == "v2" else "v1"}"}} 100.0' \
        in metrics
    assert "sloguard_influx_batches_sent_total" in metrics
    for field in ("usage_cores", "periods"):
        exported = victoria_server.export(f'{{__name__="container_cpu_{field}",db="{bucket}"}}'
                                          if api == "auto" else
                                          f'{{__name__="container_cpu_{field}"}}')
        series = {row["metric"]["pod"]: row for row in exported
                  if row["metric"].get("node") == "vm-node"
                  and row["metric"].get("db", bucket) == bucket}
        assert sorted(series) == sorted(PODS)
        for pod, row in series.items():
            expected = sorted((s.time_ns // 1_000_000, float(s.fields[field]))
                              for s in samples if s.tags["pod"] == pod)
            got = sorted(zip(row["timestamps"], row["values"], strict=True))
            assert got == expected, (pod, field)
