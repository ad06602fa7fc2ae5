"""Pushed data cannot blind or crash the guard (issue #19).

A point stamped far ahead must not empty the rule windows (they are pruned against the agent's
clock); a time or value the store cannot hold is dropped and counted, never left to poison the
writes after it; and the receive endpoints refuse what is out of bounds with a 4xx naming the
line or field. The last test drives all of it through a real agent process.
"""

from __future__ import annotations

import json
import sqlite3
import time

import httpx
import pytest
from prometheus_client import generate_latest
from test_agent_e2e import AgentProcess
from test_app_latency_e2e import stop

from sloguard.agent import Agent
from sloguard.collectors.config import SloConfig
from sloguard.collectors.latency import LatencyBatch
from sloguard.collectors.slo_window import SloTracker
from sloguard.core.samples import Sample
from sloguard.core.selectors import parse_selector
from sloguard.detector.recent import RecentWindows
from sloguard.settings import load_settings
from sloguard.store import WindowQuery, embedded
from sloguard.store.embedded import EmbeddedStore

S = 10**9
DAY = 86_400 * S


def _sample(time_ns: int, value: object = 1.0, measurement: str = "m") -> Sample:
    return Sample(measurement, {"node": "n", "service": "web"}, {"v": value}, time_ns)


# -- the store ---------------------------------------------------------------------------------


@pytest.fixture
def store(tmp_path):
    s = EmbeddedStore(tmp_path / "samples.db", retention_s=3600, max_size=1 << 30)
    yield s
    s.close()


def _times(store: EmbeddedStore, measurement: str = "m") -> list[int]:
    return [s.time_ns for s in store.read_samples(WindowQuery(measurement, 0, 2**63 - 1))]


def test_a_sample_the_store_cannot_hold_is_dropped_and_counted_and_the_rest_written(store):
    now = time.time_ns()
    store.write([_sample(now), _sample(2**63), _sample(now + 1, 2**64), _sample(now + 2, "ok"),
                 _sample(now + 3, [1])])
    assert _times(store) == [now, now + 2]
    assert store.rejected == {"timestamp": 1, "value": 2}
    store.write([_sample(now + 4)])  # no transaction left open behind
    assert _times(store) == [now, now + 2, now + 4]
    assert store.status().ok and store.status().details["rejected_samples"]["value"] == 2


def test_a_value_sqlite_refuses_only_when_binding_it_is_found_and_dropped(store):
    now = time.time_ns()
    batch = [_sample(now + i) for i in range(200)]
    batch[137] = _sample(now + 137, "lone surrogate \ud800")  # passes the screen, fails to bind
    store.write(batch)
    assert len(_times(store)) == 199 and now + 137 not in _times(store)
    assert store.rejected == {"value": 1}
    store.write([_sample(now + 1000)])
    assert len(_times(store)) == 200


def test_fields_per_measurement_are_bounded(store, monkeypatch):
    monkeypatch.setattr(embedded, "MAX_FIELDS", 3)
    now = time.time_ns()
    store.write([Sample("m", {"node": "n"}, {f"f{i}": 1.0}, now + i) for i in range(5)])
    assert len(_times(store)) == 3 and store.rejected == {"fields": 2}


def test_a_locked_database_still_keeps_the_batch_for_a_retry(store, tmp_path):
    blocker = sqlite3.connect(tmp_path / "samples.db", timeout=0)
    blocker.execute("BEGIN EXCLUSIVE")
    store._writer.execute("PRAGMA busy_timeout=10")
    with pytest.raises(embedded.StoreError, match="locked"):
        store.write([_sample(time.time_ns())])
    blocker.rollback()
    blocker.close()
    assert store.rejected == {}  # retryable: not dropped


def _metric(agent: Agent, name: str) -> float:
    for line in generate_latest(agent.registry).decode().splitlines():
        if line.startswith(name):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not exported")


def test_the_agent_loop_writes_on_after_a_sample_out_of_range(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("collectors: {cgroups: {enabled: false}}\n")
    agent = Agent(load_settings(config, {"data_dir": ("--data-dir", tmp_path / "d")}).settings)
    try:
        agent._enqueue([_sample(2**63, measurement="node_memory")])
        agent.tick()  # raised OverflowError, and every later tick failed
        agent.tick()
        assert _metric(agent, "sloguard_samples_buffered") == 0
        assert _metric(agent, 'sloguard_store_samples_rejected_total{reason="timestamp"}') == 1
        frame = agent.store.read(WindowQuery("node_memory", 0, 2**62, fields=("total",)))
        assert len(frame) == 2  # both ticks' own samples
        assert next(c for c in agent.components() if c.name == "store:embedded").ok
    finally:
        agent.stop()


# -- rule windows and SLO windows --------------------------------------------------------------


def test_a_point_stamped_ahead_does_not_empty_the_rule_windows():
    windows = RecentWindows()
    sub, _ = windows.subscribe(parse_selector('m{service="web"}'), "v", 60)
    now = time.time_ns()
    windows.add([_sample(now - i * S) for i in range(10)], now_ns=now)
    windows.add([_sample(now + DAY)], now_ns=now + S)  # pruned against the agent's clock
    assert len(sub.window(now - 60 * S, now + 2 * S)[(("node", "n"), ("service", "web"))][0]) == 10


def test_a_batch_stamped_ahead_does_not_empty_the_slo_window():
    tracker = SloTracker([SloConfig(service="web", latency_ms=100, window=60)])
    now = time.time_ns()
    tracker.add("web", "", LatencyBatch(values=[300.0] * 10, requests=10), now)
    tracker.add("web", "", LatencyBatch(values=[1.0], requests=1), now + DAY)
    [sample] = tracker.samples("n", now + S)
    assert sample.fields["requests"] == 11 and sample.fields["latency_ms"] >= 300


# -- the real agent ----------------------------------------------------------------------------

TOKEN = "push-guard-token-8c2"
RULES = """\
groups:
  - name: push
    rules:
      - alert: PushedSlow
        expr: app_latency{service="web"}
        field: p99
        aggregate: max
        window: 30s
        params: {above: 100, recover_below: 50}
        for: 0s
        recover_for: 2s
        severity: warning
"""


def test_pushed_data_cannot_blind_or_crash_the_agent(tmp_path, sloguard_bin):
    (tmp_path / "rules").mkdir()
    (tmp_path / "rules" / "push.yaml").write_text(RULES)
    config = tmp_path / "sloguard.yaml"
    config.write_text(
        "node_name: push-guard\n"
        "interval: 500ms\n"
        f"rules: {{paths: ['{tmp_path / 'rules'}']}}\n"
        "collectors: {cgroups: {enabled: false}}\n"
        f"app_latency: {{receive: {{enabled: true, token: {TOKEN}, max_series: 5,"
        " measurements: [app_latency, custom]}}\n"
    )
    log = tmp_path / "agent.log"
    agent = AgentProcess(sloguard_bin, config, tmp_path / "data", log)
    auth = {"Authorization": f"Bearer {TOKEN}"}

    def write(body: str, precision: str = "ns") -> httpx.Response:
        return httpx.post(f"{agent.url}/api/v1/write?precision={precision}", content=body,
                          headers=auth, timeout=30)

    def observe(body: object) -> httpx.Response:
        content = body if isinstance(body, str) else json.dumps(body)
        return httpx.post(f"{agent.url}/api/v1/observations", content=content, headers=auth,
                          timeout=30)

    def ticks() -> float:
        for line in agent.get("/metrics").text.splitlines():
            if line.startswith("sloguard_tick_duration_seconds_count"):
                return float(line.split()[-1])
        return 0.0

    def firing() -> list[dict]:
        return [i for i in agent.incidents(state="firing") if i["rule"] == "PushedSlow"]

    try:
        assert write("app_latency,service=web p99=300").status_code == 204
        agent.wait_for(firing, 30, "the pushed latency never fired the rule")

        ahead = time.time_ns() + DAY
        answer = write(f"app_latency,service=web p99=1\napp_latency,service=web p99=1 {ahead}")
        assert answer.status_code == 400, answer.text
        assert answer.json()["detail"].startswith("line 2: timestamp ")
        assert "ahead of the agent's clock (receive.max_future: 30s)" in answer.json()["detail"]
        old = write(f"app_latency,service=web p99=1 {time.time_ns() - 3600 * S}")
        assert old.status_code == 400 and "receive.max_past: 300s" in old.json()["detail"]
        time.sleep(4)  # twice recover_for: an emptied window would have resolved it
        assert firing(), "the incident resolved: the pushed point blinded the rule"

        huge = write("app_latency,service=web p99=1 9223372036854775808")
        assert huge.status_code == 400 and "out of range" in huge.json()["detail"]
        superscript = write("app_latency,service=web p99=1 ²")
        assert superscript.status_code == 400
        assert superscript.json()["detail"].startswith("line 1, column 31: timestamp must be")
        digits = write("app_latency,service=web p99=" + "1" * 20_000 + "x")
        assert digits.status_code == 400 and "field 'p99'" in digits.json()["detail"]
        reserved = write("app_latency,service=web,class=BE p99=1")
        assert reserved.status_code == 400
        assert "line 1: tag 'class' is the agent's own" in reserved.json()["detail"]
        many = "\n".join(f"app_latency,service=s{i} p99=1" for i in range(10))
        capped = write(many)
        assert capped.status_code == 400
        assert capped.json()["detail"].startswith("line 5: a new series beyond "
                                                  "receive.max_series (5 series")
        deep = observe("[" * 100_000)
        assert deep.status_code == 400 and "not JSON" in deep.json()["detail"]
        stamped = observe({"observations": [{"service": "web", "latency_ms": [1],
                                             "time_ns": 2**64}]})
        assert stamped.status_code == 422
        assert stamped.json()["detail"].startswith("observations.0.time_ns: timestamp ")

        # A value the line protocol allows and the store cannot hold (an unsigned 64-bit
        # integer past 2**63) is dropped and counted; the loop and the store go on.
        assert write("custom,service=web big=18446744073709551615u").status_code == 204
        assert write("custom,service=web big=7u").status_code == 204

        def rejected():
            metrics = agent.get("/metrics").text
            return 'sloguard_store_samples_rejected_total{reason="value"} 1.0' in metrics

        agent.wait_for(rejected, 20, "the unstorable sample was never counted")
        before = ticks()
        agent.wait_for(lambda: ticks() >= before + 2, 20, "the loop stopped ticking")
        store = next(c for c in agent.get("/readyz").json()["components"]
                     if c["name"] == "store:embedded")
        assert store["ok"] and store["details"]["buffered_samples"] == 0
        assert agent.get("/healthz").status_code == 200
        assert firing()
        received = next(c for c in agent.get("/readyz").json()["components"]
                        if c["name"] == "app_latency")["details"]["received"]["rejected"]
        assert received["write timestamp"] == 2 and received["write reserved_tag"] == 1
        assert received["write cardinality"] == 1
        assert received["observations timestamp"] == 1
    finally:
        stop(agent)
    text = log.read_text()
    assert "unwritten" not in text and "tick failed" not in text
    assert "cannot start a transaction within a transaction" not in text
