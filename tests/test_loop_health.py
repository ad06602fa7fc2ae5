"""Health tells the truth, on the agent as users run it (`sloguard run`, real HTTP).

A thread of the agent that dies is reported in /readyz with its reason and restarted, with a
count; ticks that fail make /readyz, and once the loop has missed its beat /healthz, answer 503
with the reason. Threads are killed, and ticks broken, by a detector plugin loaded into the
agent's process (tests/support/chaos_plugin.py), as a bug in any part of the agent would.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest
from test_agent_e2e import AgentProcess

SUPPORT = Path(__file__).parent / "support"

RULES = """\
groups:
  - name: chaos
    rules:
      - alert: Chaos
        expr: node_memory
        field: total
        aggregate: last
        window: 5s
        detector: chaos_kill
        params: {{trigger: "{trigger}"}}
"""


@pytest.fixture
def chaos_agent(tmp_path, sloguard_bin, monkeypatch):
    """An agent with app latency configured (one TCP probe to a socket of the test's) and the
    chaos plugin watching `trigger`."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        filter(None, [str(SUPPORT), os.environ.get("PYTHONPATH", "")])))
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    trigger = tmp_path / "trigger"
    (tmp_path / "rules").mkdir()
    (tmp_path / "rules" / "chaos.yaml").write_text(RULES.format(trigger=trigger))
    config = tmp_path / "sloguard.yaml"
    config.write_text(
        "node_name: chaos-node\n"
        "interval: 500ms\n"
        f"rules: {{paths: [{tmp_path / 'rules'}]}}\n"
        "collectors: {cgroups: {enabled: false}}\n"
        "detectors: {plugins: [chaos_plugin]}\n"
        "app_latency:\n"
        "  probe_interval: 1s\n"
        f"  probes: [{{service: cache, kind: tcp, "
        f"address: '127.0.0.1:{listener.getsockname()[1]}'}}]\n")
    agent = AgentProcess(sloguard_bin, config, tmp_path / "data", tmp_path / "agent.log")
    agent.trigger = trigger
    try:
        yield agent
    finally:
        agent.terminate()
        listener.close()


def _component(agent: AgentProcess, name: str) -> dict:
    body = agent.get("/readyz").json()
    return next(c for c in body["components"] if c["name"] == name)


def _thread(agent: AgentProcess, component: str, thread: str) -> dict:
    return _component(agent, component)["details"]["threads"][thread]


def test_app_latency_runs_one_scraper_thread_that_stays_up(chaos_agent):
    """It was started twice (with the collectors, then by name): the two asyncio loops shared
    one wake-up event and the first thread died a second later, /readyz saying ok."""
    agent = chaos_agent
    agent.wait_for(lambda: _component(agent, "app_latency")["details"]["targets"][0]["attempts"]
                   >= 3, 20, "the probe never ran three times")
    log = agent.log.read_text()
    assert "different event loop" not in log and "scraper stopped" not in log, log[-3000:]
    assert _thread(agent, "app_latency", "app-latency") == {
        "alive": True, "restarts": 0, "last_reason": ""}
    assert _component(agent, "threads")["ok"]


@pytest.mark.parametrize(("thread", "component"), [("app-latency", "app_latency"),
                                                   ("agent-loop", "loop")])
def test_a_thread_that_dies_is_reported_and_restarted(chaos_agent, thread, component):
    agent = chaos_agent
    agent.wait_for(lambda: agent.get("/readyz").status_code == 200, 20, "never ready")
    agent.trigger.write_text(thread)
    restarted = agent.wait_for(
        lambda: (lambda t: t if t["restarts"] == 1 and t["alive"] else None)(
            _thread(agent, component, thread)), 20, f"{thread} was not restarted")
    assert "ThreadKilled" in restarted["last_reason"]
    threads = _component(agent, "threads")
    assert threads["details"]["watched"][thread]["restarts"] == 1
    assert threads["details"]["restarts_total"] == 1
    ticks = agent.get("/healthz").json()["ticks"]
    agent.wait_for(lambda: agent.get("/healthz").json()["ticks"] >= ticks + 4, 10,
                   "the loop does not tick after the restart")
    agent.wait_for(lambda: agent.get("/readyz").status_code == 200, 10, "not ready again")
    if thread == "app-latency":  # and it probes again
        attempts = _component(agent, "app_latency")["details"]["targets"][0]["attempts"]
        agent.wait_for(lambda: _component(agent, "app_latency")["details"]["targets"][0][
            "attempts"] > attempts + 1, 10, "the restarted scraper does not probe")


def test_failing_ticks_make_readyz_then_healthz_say_so(chaos_agent):
    agent = chaos_agent
    agent.wait_for(lambda: agent.get("/readyz").status_code == 200, 20, "never ready")
    agent.trigger.write_text("fail-ticks")  # every tick raises until the file goes
    ready = agent.wait_for(lambda: (lambda r: r if r.status_code == 503 else None)(
        agent.get("/readyz")), 10, "readyz stayed 200 while ticks failed")
    loop = next(c for c in ready.json()["components"] if c["name"] == "loop")
    assert not loop["ok"] and "ticks failed" in loop["reason"]
    assert "chaos: this tick breaks" in loop["reason"]
    health = agent.wait_for(lambda: (lambda r: r if r.status_code == 503 else None)(
        agent.get("/healthz")), 20, "healthz stayed 200 while no tick completed")
    assert "no tick completed" in health.json()["reason"]
    assert "chaos: this tick breaks" in health.json()["reason"]
    (agent.trigger.parent / "fail-ticks").unlink()  # mended
    agent.wait_for(lambda: agent.get("/healthz").status_code == 200, 10, "not healthy again")
    assert agent.get("/healthz").json()["reason"] == ""


def test_a_stopped_agent_leaves_no_thread_behind(tmp_path):
    """Agent.stop() ends every thread the agent started: the detector worker waited on its
    queue for good (one thread per agent stopped in-process, 80 in one test process)."""
    import threading
    import time

    from sloguard.agent import Agent
    from sloguard.settings import load_settings

    config = tmp_path / "c.yaml"
    config.write_text(f"node_name: n1\ndata_dir: {tmp_path / 'data'}\ninterval: 200ms\n"
                      "collectors:\n  cgroups: {enabled: false}\n  ebpf: {enabled: false}\n")
    before = set(threading.enumerate())
    agent = Agent(load_settings(config).settings)
    agent.start()
    try:
        deadline = time.monotonic() + 20
        while agent.engine._worker is None and time.monotonic() < deadline:
            time.sleep(0.05)  # until a tick has run a rule's detector on the worker
        assert agent.engine._worker is not None
    finally:
        agent.stop()
    deadline = time.monotonic() + 5
    while (left := [t.name for t in set(threading.enumerate()) - before if t.is_alive()]) \
            and time.monotonic() < deadline:
        time.sleep(0.05)
    assert left == []
