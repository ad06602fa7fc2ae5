"""Bounded memory and disk for incidents: evidence and actions are capped however they are
added, and resolved incidents leave the table after `incidents.retention`."""

from __future__ import annotations

import json
import sqlite3

from test_clock_jumps import SteppedClock

from sloguard.agent import Agent
from sloguard.core.incidents import (
    COMPACTED,
    FIRING,
    MAX_ACTIONS,
    MAX_EVIDENCE,
    RESOLVED,
    ActionRecord,
    Evidence,
    Incident,
)
from sloguard.settings import load_settings
from sloguard.store import MAINTAIN_EVERY_S
from sloguard.store.incidents_db import IncidentStore

S = 10**9
DAY = 86400 * S


def _incident(n: int, state: str, at: int) -> Incident:
    return Incident(id=f"inc-{n:04d}", fingerprint=f"fp-{n}", rule="LSSlow", group="ls",
                    severity="warning", node="node-a", state=state, series={"pod": "web"},
                    started_ns=at, updated_ns=at, resolved_ns=at if state == RESOLVED else None)


def test_a_flapping_incident_keeps_its_first_and_latest_actions_and_counts_the_rest(tmp_path):
    """The ladder appends to `actions` itself; an incident flapping for days once grew a
    document rewritten on every save without bound."""
    store = IncidentStore(tmp_path / "incidents.db")
    incident = _incident(1, FIRING, 0)
    for n in range(1000):  # appended directly, as actuators/ladder.py does
        incident.actions.append(ActionRecord(n * S, "cpu_idle", "/be", False, "done", f"#{n}"))
        incident.evidence.append(Evidence(n * S, float(n), 10.0))
        if n % 97 == 0:
            store.save(incident)
    store.save(incident)
    stored = store.get(incident.id)
    assert len(stored.actions) == MAX_ACTIONS and len(stored.evidence) == MAX_EVIDENCE
    assert [a.detail for a in stored.actions[:2]] == ["#0", "#1"]  # the first kept
    assert stored.actions[-1].detail == "#999"  # and the latest
    [marker] = [a for a in stored.actions if a.step == COMPACTED]
    assert marker.target == str(1000 - MAX_ACTIONS + 1)
    assert f"{1000 - MAX_ACTIONS + 1} actions left out" in marker.detail
    assert stored.evidence[0].value == 0.0 and stored.evidence[-1].value == 999.0
    doc = sqlite3.connect(tmp_path / "incidents.db").execute(
        "SELECT doc FROM incidents").fetchone()[0]
    assert len(json.loads(doc)["actions"]) == MAX_ACTIONS
    assert len(doc) < 100_000
    store.close()


def test_resolved_incidents_leave_the_table_after_the_retention(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("collectors: {node: {enabled: false}, cgroups: {enabled: false}}\n"
                      "incidents: {retention: 7d}\n")
    clock = SteppedClock()
    settings = load_settings(config, {"data_dir": ("--data-dir", tmp_path / "d")}).settings
    agent = Agent(settings, clock=clock)
    now = clock.wall_ns()
    try:
        agent.incidents.save(_incident(1, RESOLVED, now - 8 * DAY))  # past the retention
        agent.incidents.save(_incident(2, RESOLVED, now - 6 * DAY))
        agent.incidents.save(_incident(3, FIRING, now - 30 * DAY))  # open: kept however old
        agent.tick()
        assert agent.incidents.get("inc-0001") is not None  # not yet: every MAINTAIN_EVERY_S
        clock.mono += int(MAINTAIN_EVERY_S * S)
        agent.tick()
        assert agent.incidents.get("inc-0001") is None
        assert agent.incidents.get("inc-0002") is not None
        assert agent.incidents.get("inc-0003") is not None
    finally:
        agent.stop()


def test_the_retention_is_a_checked_duration(tmp_path):
    import pytest

    from sloguard.core.config import ConfigError

    config = tmp_path / "c.yaml"
    config.write_text("incidents:\n  retention: a month\n")
    with pytest.raises(ConfigError, match=r"c.yaml:2: incidents.retention: not a duration"):
        load_settings(config, {})
