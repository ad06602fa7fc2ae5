"""A store that cannot be written loses nothing: samples wait in memory and are written once it
comes back; beyond the bound the oldest go, counted. Detection goes on meanwhile."""

from __future__ import annotations

import sqlite3

from prometheus_client import generate_latest

from sloguard.agent import Agent
from sloguard.config import load_settings
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
