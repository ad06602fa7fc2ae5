"""The agent with `store: {kind: influxdb}` against a real InfluxDB 1.6.7.

One test takes the server away for 60 s while the agent keeps collecting (what the issue asks
for): every sample collected before, during and after must be in InfluxDB afterwards, with its
exact timestamp, and none twice. The other runs `sloguard run` end to end (collect, detect,
incidents) and then `sloguard backtest`, which reads the history back through InfluxQL.
"""

from __future__ import annotations

import math
import subprocess
import time

import pytest
from prometheus_client import generate_latest
from test_agent_e2e import RULES, AgentProcess

from sloguard.agent import Agent
from sloguard.collectors.base import CollectorBase
from sloguard.core.health import ComponentStatus
from sloguard.core.samples import Sample
from sloguard.settings import load_settings
from sloguard.store import WindowQuery

pytestmark = pytest.mark.influx

OUTAGE_S = 60.0


class Recording:
    """Passes a collector's samples through and remembers them: the reference of what the
    collectors wrote."""

    def __init__(self, inner) -> None:
        self.inner, self.name, self.samples = inner, inner.name, []

    def collect(self, now_ns: int) -> list[Sample]:
        out = self.inner.collect(now_ns)
        self.samples.extend(out)
        return out

    def status(self) -> ComponentStatus:
        return self.inner.status()

    def start(self) -> None:
        self.inner.start()

    def close(self) -> None:
        self.inner.close()


class Sequence(CollectorBase):
    """A counter per tick, so that a gap or a reordering is visible at a glance."""

    name = "sequence"

    def __init__(self) -> None:
        self.next = 0

    def collect(self, now_ns: int) -> list[Sample]:
        self.next += 1
        return [Sample("test_sequence", {"node": "outage-node"}, {"seq": self.next}, now_ns)]

    def status(self) -> ComponentStatus:
        return ComponentStatus("sequence", ok=True)


def _store_status(agent: Agent) -> ComponentStatus:
    return next(c for c in agent.components() if c.name == "store:influxdb")


def _key(sample: Sample) -> tuple:
    fields = tuple(sorted((k, float(v)) for k, v in sample.fields.items()
                          if not (isinstance(v, float) and not math.isfinite(v))))
    return sample.measurement, sample.time_ns, tuple(sorted(sample.tags.items())), fields


def test_a_60_second_outage_loses_nothing(own_influx_server, tmp_path):
    server = own_influx_server
    db = server.create_database()
    config = tmp_path / "sloguard.yaml"
    config.write_text(
        f"node_name: outage-node\ninterval: 500ms\n"
        f"store:\n  kind: influxdb\n  url: {server.url}\n  database: {db}\n"
        f"  username: {server.username}\n  password: {server.password}\n"
        f"  max_backoff: 4s\n  flush_interval: 500ms\n"
        f"collectors: {{cgroups: {{enabled: false}}}}\n")
    settings = load_settings(config, {"data_dir": ("--data-dir", tmp_path / "data")}).settings
    agent = Agent(settings)
    recorders = [Recording(c) for c in [*agent.collectors, Sequence()]]
    agent.collectors = recorders
    agent.start()
    try:
        deadline = time.monotonic() + 20
        while server.count(db, "test_sequence", "seq") < 3:
            assert time.monotonic() < deadline, _store_status(agent)
            time.sleep(0.2)
        assert _store_status(agent).details["write_path"].startswith("1.x")

        server.stop()
        stopped = time.monotonic()
        time.sleep(OUTAGE_S)
        status = _store_status(agent)
        assert not status.ok and "spooled" in status.reason, status
        assert status.details["spool_batches"] > 0
        assert not agent.ready()
        ticks_during = recorders[-1].samples[-1].fields["seq"]

        server.start()
        assert time.monotonic() - stopped >= OUTAGE_S
        deadline = time.monotonic() + 60
        while True:  # the agent finds the server again by itself (backoff <= 4 s)
            status = _store_status(agent)
            if status.ok and status.details["spool_batches"] == 0:
                break
            assert time.monotonic() < deadline, status
            time.sleep(0.25)
        time.sleep(1.0)
        metrics = generate_latest(agent.registry).decode()
    finally:
        agent.stop()  # flushes what the last ticks collected

    collected = [s for r in recorders for s in r.samples]
    assert ticks_during > OUTAGE_S / 0.5 * 0.8  # it really kept collecting during the outage
    for line in ("sloguard_samples_dropped_total 0.0",
                 "sloguard_influx_spool_dropped_points_total 0.0"):
        assert line in metrics
    assert "sloguard_influx_points_rejected_total{" not in metrics

    from sloguard.store.influx import InfluxStore

    reader = InfluxStore(settings.store, tmp_path / "data", writer=False)
    try:
        start = min(s.time_ns for s in collected)
        end = max(s.time_ns for s in collected) + 1
        for measurement in sorted({s.measurement for s in collected}):
            expected = sorted(_key(s) for s in collected if s.measurement == measurement)
            back = reader.read_samples(WindowQuery(measurement, start, end))
            got = sorted(_key(s) for s in back)
            assert got == expected, f"{measurement}: {len(got)} read, {len(expected)} collected"
        seq = reader.read_samples(WindowQuery("test_sequence", start, end))
        assert [s.fields["seq"] for s in seq] == [float(i) for i in range(1, len(seq) + 1)]
    finally:
        reader.close()


def test_agent_end_to_end_with_influxdb(influx_server, influx_db, tmp_path, real_cgroups,
                                        sloguard_bin):
    svc = real_cgroups.create("svc")
    real_cgroups.prioritise(svc)  # the busy loop must get its core on a loaded machine
    (tmp_path / "rules").mkdir()
    (tmp_path / "rules" / "e2e.yaml").write_text(RULES)
    config = tmp_path / "sloguard.yaml"
    config.write_text(
        f"node_name: influx-e2e\ninterval: 500ms\n"
        f"rules:\n  paths: [{tmp_path / 'rules'}]\n"
        f"store:\n  kind: influxdb\n  url: {influx_server.url}\n  database: {influx_db}\n"
        f"  username: {influx_server.username}\n  password: {influx_server.password}\n"
        f"  flush_interval: 500ms\n"
        f"collectors:\n  cgroups:\n    include: []\n    rediscover: 1s\n"
        f"    declare:\n      - {{path: '{svc}', class: LS, name: svc}}\n")
    started = time.time()
    agent = AgentProcess(sloguard_bin, config, tmp_path / "data", tmp_path / "agent.log")
    try:
        ready = agent.wait_for(lambda: agent.get("/readyz"), 10, "no readyz").json()
        store = next(c for c in ready["components"] if c["name"] == "store:influxdb")
        assert store["ok"], store
        assert influx_server.password not in agent.get("/readyz").text

        hog = real_cgroups.spawn(svc)
        firing = agent.wait_for(lambda: agent.incidents(state="firing"), 20, "never fired")
        incident = firing[0]
        assert incident["rule"] == "LSBusy" and incident["series"]["workload"] == "svc"
        hog.kill()
        hog.wait()
        agent.wait_for(lambda: agent.incidents(state="resolved"), 20, "never resolved")

        store = next(c for c in agent.get("/readyz").json()["components"]
                     if c["name"] == "store:influxdb")
        assert store["ok"] and store["details"]["write_path"].startswith("1.x /write")
        assert store["details"]["server_version"].startswith("1.6")
        assert store["details"]["points_sent"] > 0
        metrics = agent.get("/metrics").text
        assert 'sloguard_influx_points_sent_total{path="v1"}' in metrics
        assert "sloguard_influx_spool_bytes 0.0" in metrics
        assert agent.terminate() == 0
    finally:
        if agent.proc.poll() is None:
            agent.terminate()
    rows = influx_server.query(
        "SELECT COUNT(\"usage_cores\") FROM \"container_cpu\" WHERE \"workload\" = 'svc'",
        db=influx_db)["results"][0]["series"]
    assert rows[0]["values"][0][1] > 10  # the collectors' samples are in InfluxDB

    # the backtest reads the same history back through InfluxQL and finds the same incident
    result = subprocess.run(
        [sloguard_bin, "backtest", "--rules", str(tmp_path / "rules"), "-c", str(config),
         "--data-dir", str(tmp_path / "data"), "--from", str(started - 5), "--step", "500ms"],
        capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "e2e/LSBusy" in result.stdout and "workload=svc" in result.stdout, result.stdout
