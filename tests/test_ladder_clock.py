"""The ladder's timers run on the monotonic clock (issue #19): a wall clock stepped an hour
forward must not take every rung at once, one stepped back must not hold the next rung (or an
undo) for an hour. Wall time stays the label of what was done."""

from __future__ import annotations

import pytest

from sloguard.actuators.env import ActuatorEnv
from sloguard.actuators.kinds import StepFactory
from sloguard.actuators.ladder import Ladder
from sloguard.actuators.ledger import Ledger
from sloguard.actuators.policy import PolicySet
from sloguard.core.incidents import FIRING, Incident
from sloguard.store.incidents_db import IncidentStore

S = 1_000_000_000
HOUR = 3600 * S
POLICY = """\
policies:
  - name: guard
    undo_hold: 10s
    steps:
      - step: notify
      - step: cordon
        after: 20s
"""
WALL0, MONO0 = 1_800_000_000 * S, 5_000 * S


def _world(tmp_path, policy: str) -> tuple[Ledger, IncidentStore, Ladder, Incident]:
    """The real ladder on a real ledger and incident store, and one incident firing since
    WALL0 (its clocks are the test's: nothing here reads the machine's)."""
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "guard.yaml").write_text(policy)
    ledger = Ledger(tmp_path / "actuators.db")
    factory = StepFactory(ActuatorEnv("node-a", ledger))
    policies = PolicySet([str(tmp_path / "p")], validate_step=factory.check)
    assert policies.reload().ok, policies.errors
    store = IncidentStore(tmp_path / "incidents.db")
    ladder = Ladder("node-a", policies, ledger, factory.make, store.save, store.get,
                    dry_run=False, open_incidents=store.open_incidents)
    incident = Incident("inc-1", "f", "LSLatency", "ls", "critical", "node-a", FIRING, {},
                        WALL0, WALL0, fired_ns=WALL0, policy="guard")
    store.save(incident)
    return ledger, store, ladder, incident


@pytest.mark.parametrize("jump", [HOUR, -HOUR], ids=["forward", "back"])
def test_a_wall_clock_step_changes_no_hold(tmp_path, jump):
    ledger, store, ladder, incident = _world(tmp_path, POLICY)

    def wall(second: int) -> int:  # the wall clock is stepped at second 5
        return WALL0 + second * S + (jump if second >= 5 else 0)

    taken: dict[str, int] = {}
    for second in range(0, 40):
        firing = second < 30
        if not firing and incident.state == FIRING:
            incident.state = "resolved"
            store.save(incident)
        ladder.tick(wall(second), [incident] if firing else [], MONO0 + second * S)
        for entry in ledger.audit_log():
            taken.setdefault(f"{entry.action} {entry.kind}", second)
    # cordon (unavailable here: skipped, but taken at its time) 20 s after notify, by the
    # monotonic clock; today's main took it at the forward step, or an hour after the back one
    assert taken["apply notify"] == 0 and taken["apply cordon"] == 20, taken
    [cordon] = [e for e in ledger.audit_log() if e.kind == "cordon"]
    assert cordon.time_ns == wall(20)  # the label is wall time
    assert cordon.status == "skipped"


def test_old_evidence_does_not_look_new_after_the_wall_clock_steps_back(tmp_path):
    """A rung past cordon needs fresh evidence; evidence that stopped coming stays stale
    however far the wall clock is stepped back (today's main took it for an hour)."""
    from sloguard.core.incidents import Evidence

    _, _, ladder, incident = _world(tmp_path, (
        "policies:\n  - name: guard\n    stale_after: 10s\n    steps:\n      - step: notify\n"
        "      - step: reduce_capacity\n        after: 20s\n        params: {percent: 50}\n"))
    ledger = ladder.ledger
    for second in range(0, 30):
        wall = WALL0 + second * S - (HOUR if second >= 5 else 0)
        if second < 5:  # evidence stops coming at 4 s
            incident.add_evidence(Evidence(wall, 30.0, 10.0, "crossed"))
        ladder.tick(wall, [incident], MONO0 + second * S)
    kinds = [e.kind for e in ledger.audit_log()]
    assert kinds == ["notify"], kinds  # reduce_capacity held: no fresh evidence


def test_a_restart_after_a_wall_clock_step_carries_on_the_same_timers(tmp_path):
    """A review finding: each run anchored its timers to the wall clock afresh, so after a
    step back and a restart every hold in the ledger lay an hour in the future."""
    ledger, store, ladder, incident = _world(tmp_path, POLICY)
    taken: dict[str, int] = {}
    for second in range(0, 40):
        if second == 10:  # the restart: a new process, its own anchor
            ladder = Ladder("node-a", ladder.policies, ledger, ladder.make_step, store.save,
                            store.get, dry_run=False, open_incidents=store.open_incidents)
        wall = WALL0 + second * S - (HOUR if second >= 5 else 0)
        ladder.tick(wall, [incident], MONO0 + second * S)
        for entry in ledger.audit_log():
            taken.setdefault(f"{entry.action} {entry.kind}", second)
    assert taken.get("apply cordon") == 20, taken
