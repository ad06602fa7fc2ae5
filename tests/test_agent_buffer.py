"""A store that cannot be written loses nothing: samples wait in memory and are written once it
comes back; beyond the bound the oldest go, counted. Detection goes on meanwhile."""

from __future__ import annotations

import sqlite3
import threading

from prometheus_client import generate_latest

from sloguard.agent import Agent
from sloguard.settings import load_settings
from sloguard.store import WindowQuery


def _agent(tmp_path, buffer_samples: int) -> Agent:
    config = tmp_path / "c.yaml"
    config.write_text(f"store: {{buffer_samples: {buffer_samples}}}\n"
                      "collectors: {cgroups: {enabled: false}}\n")
    return Agent(load_settings(config, {"data_dir": ("--data-dir", tmp_path / "d")}).settings)


def _count(agent: Agent) -> int:
    frame = agent.store.read(WindowQuery("node_memory", 0, 2**62, fields=("total",)))
    return len(frame)


def _metric(agent: Agent, name: str) -> float:
    for line in generate_latest(agent.registry).decode().splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not exported")


def test_samples_wait_while_the_store_is_locked_and_are_written_after(tmp_path):
    agent = _agent(tmp_path, 200_000)
    try:
        agent.tick()
        assert _count(agent) == 1
        blocker = sqlite3.connect(tmp_path / "d" / "samples.db", timeout=0)
        blocker.execute("BEGIN EXCLUSIVE")
        agent.store._writer.execute("PRAGMA busy_timeout=50")
        agent.tick()
        agent.tick()
        assert _metric(agent, "sloguard_samples_buffered") > 0
        assert _metric(agent, 'sloguard_store_errors_total') >= 2
        store = next(c for c in agent.components() if c.name == "store:embedded")
        assert not store.ok and "locked" in store.reason
        blocker.rollback()
        blocker.close()
        agent.tick()
        assert _count(agent) == 4  # nothing lost: the two buffered ticks and this one
        assert _metric(agent, "sloguard_samples_buffered") == 0
        assert _metric(agent, "sloguard_samples_dropped_total") == 0
        assert next(c for c in agent.components() if c.name == "store:embedded").ok
    finally:
        agent.stop()


def test_buffer_bound_drops_the_oldest_and_counts_them(tmp_path):
    agent = _agent(tmp_path, 1000)
    try:
        blocker = sqlite3.connect(tmp_path / "d" / "samples.db", timeout=0)
        blocker.execute("BEGIN EXCLUSIVE")
        agent.store._writer.execute("PRAGMA busy_timeout=10")
        ticks = 0
        while _metric(agent, "sloguard_samples_dropped_total") == 0:
            agent.tick()
            ticks += 1
            assert ticks < 200
        assert _metric(agent, "sloguard_samples_buffered") == 1000
        blocker.rollback()
        blocker.close()
        agent.tick()
        assert 0 < _count(agent) < ticks + 1  # the newest made it, the oldest were dropped
    finally:
        agent.stop()


def test_an_incident_store_that_cannot_be_written_makes_readyz_say_so(tmp_path):
    """Issue #19: incidents that could not be saved waited (and were retried) unseen: /readyz
    showed every component ok."""
    from test_clock_jumps import RULES, Feed, SteppedClock

    (tmp_path / "rules").mkdir()
    (tmp_path / "rules" / "r.yaml").write_text(RULES)
    config = tmp_path / "c.yaml"
    config.write_text("node_name: jump-node\n"
                      "collectors: {node: {enabled: false}, cgroups: {enabled: false}}\n"
                      f"rules: {{paths: [{tmp_path / 'rules'}]}}\n")
    clock = SteppedClock()
    settings = load_settings(config, {"data_dir": ("--data-dir", tmp_path / "d")}).settings
    agent = Agent(settings, clock=clock)
    feed = Feed()
    feed.value = 30.0
    agent.collectors.append(feed)
    # ticked by the test, but /readyz wants a loop thread: one that ends when the agent stops
    agent._thread = threading.Thread(target=agent._stop.wait, daemon=True)
    agent._thread.start()
    try:
        agent.tick()
        assert next(c for c in agent.components() if c.name == "incidents").ok
        blocker = sqlite3.connect(tmp_path / "d" / "incidents.db", timeout=0)
        blocker.execute("BEGIN EXCLUSIVE")
        agent.incidents._conn.execute("PRAGMA busy_timeout=50")
        for _ in range(3):
            clock.mono += 10**9
            agent.tick()
        incidents = next(c for c in agent.components() if c.name == "incidents")
        assert not incidents.ok and incidents.details["unsaved"] == 1
        assert "incident changes wait to be saved" in incidents.reason
        assert "locked" in incidents.reason
        assert not agent.ready()
        blocker.rollback()
        blocker.close()
        clock.mono += 10**9
        agent.tick()
        assert next(c for c in agent.components() if c.name == "incidents").ok
        assert agent.ready()
    finally:
        agent.stop()
