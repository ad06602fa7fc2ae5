"""The shipped run-queue rules (rules/runqueue.yaml) through the agent's engine: an LS pod
whose threads wait for a CPU fires, a BE pod never does, and the schedstat stand-in behaves the
same way on nodes without eBPF. Samples are written with explicit timestamps so a minute of
rule time takes milliseconds."""

from __future__ import annotations

from pathlib import Path

import pytest

from sloguard.actuators.dryrun import DryRunActuator
from sloguard.core.incidents import FIRING, RESOLVED
from sloguard.core.samples import Sample
from sloguard.detector.engine import Engine
from sloguard.detector.recent import RecentWindows
from sloguard.detector.registry import DetectorRegistry
from sloguard.detector.rules import RuleSet
from sloguard.store.incidents_db import IncidentStore

SHIPPED = Path(__file__).resolve().parent.parent / "rules" / "runqueue.yaml"
S = 1_000_000_000
T0 = 1_800_000_000 * S


def _engine(tmp_path):
    rules = RuleSet([str(SHIPPED)])
    assert rules.reload().changed and not rules.errors
    incidents = IncidentStore(tmp_path / "incidents.db")
    windows = RecentWindows()
    engine = Engine(windows, incidents, rules, "n", DryRunActuator("n"),
                    registry=DetectorRegistry(), inventory=lambda: [])
    return engine, windows, incidents


@pytest.mark.parametrize("measurement, field, bad, good", [
    ("ebpf_runqueue", "p99_us", 8000.0, 300.0),
    ("container_runqueue", "wait_per_timeslice_us", 2500.0, 20.0),
])
def test_ls_waiting_for_cpu_fires_and_resolves_be_never_fires(tmp_path, measurement, field,
                                                              bad, good):
    engine, windows, incidents = _engine(tmp_path)
    ls = {"node": "n", "class": "LS", "level": "pod", "pod": "web", "cgroup": "/kubepods/p1"}
    be = {"node": "n", "class": "BE", "level": "pod", "pod": "batch", "cgroup": "/kubepods/p2"}
    timeline = [(0, 70, bad), (70, 200, good)]
    for start, end, value in timeline:
        for second in range(start, end):
            now = T0 + second * S
            windows.add([Sample(measurement, ls, {field: value}, now),
                         Sample(measurement, be, {field: bad * 4}, now)])
            engine.evaluate(now)
            if second == 69:
                [incident] = incidents.query(limit=10)
                assert incident.state == FIRING and incident.series["pod"] == "web"
    [incident] = incidents.query(limit=10)
    assert incident.state == RESOLVED
    assert "web" in incident.summary
