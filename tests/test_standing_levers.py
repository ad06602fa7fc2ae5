"""Standing levers (actuators/standing.py): a policy's levers kept in force at all times, with the
real ladder and the real cpu_idle and cpu_quota levers on this machine's real cgroups, so what is
asserted is what the kernel files hold."""

from __future__ import annotations

import pytest
from conftest import need
from support.levers import workload
from support.suspects_node import Node

from sloguard.actuators.env import ActuatorEnv
from sloguard.actuators.kinds import StepFactory
from sloguard.actuators.ladder import Ladder
from sloguard.actuators.ledger import Ledger
from sloguard.actuators.policy import PolicyFileError, load_policy_file

STANDING = """\
policies:
  - name: guard
    undo_hold: 10s
    standing:
      - step: cpu_idle
    steps:
      - step: suppress
        hold: 10s
        order: written
        levers:
          - step: cpu_idle
          - step: cpu_quota
            params: {threshold_percent: 50, min_cores: 0.5}
"""
WITHOUT = STANDING.replace("    standing:\n      - step: cpu_idle\n", "")


@pytest.fixture
def node(tmp_path, real_cgroups):
    need((real_cgroups.layout.v1.get("cpu") / "cpu.idle").exists(), "cpu.idle (kernel >= 5.15)")
    made = Node(tmp_path, real_cgroups, STANDING)
    made.real = real_cgroups
    made.path = tmp_path / "policies" / "p.yaml"
    yield made
    made.ladder.close()


def _quiet(node: Node, second: int) -> None:
    """A tick with no incident at all."""
    node.ladder.tick(node_time(second), [])


def node_time(second: int) -> int:
    from support.suspects_node import T0, S

    return T0 + second * S


def _quota(node: Node, name: str) -> str:
    return (node.cpu / node.be[name] / "cpu.cfs_quota_us").read_text().strip()


def test_a_standing_lever_is_in_force_without_an_incident_and_reaches_each_new_be(node):
    _quiet(node, 0)
    assert node.idle() == {"antagonist": "1", "napper": "1", "steady": "1"}
    assert (node.cpu / node.ls / "cpu.idle").read_text().strip() == "0"  # never LS
    [row] = node.ledger.rungs()
    assert (row.policy, row.kind, row.status, row.incident) == ("standing:guard", "cpu_idle",
                                                                "done", "")
    audited = len(node.ledger.audit_log())
    for second in (1, 2, 3):  # reconciled each tick; nothing changed: nothing written
        _quiet(node, second)
    assert len(node.ledger.audit_log()) == audited
    assert node.ledger.rungs()[0].undo == row.undo

    newcomer = node.real.create("be-newcomer")  # a BE workload the collector just found
    node.inventory.append(workload(newcomer, "BE"))
    _quiet(node, 4)
    assert (node.cpu / newcomer / "cpu.idle").read_text().strip() == "1"
    [entry] = node.ledger.audit_log()[:1]
    assert "reconciled" in entry.reason and entry.policy == "standing:guard"
    assert len(node.ledger.rungs()[0].undo["writes"]) == 4

    # someone puts a BE cgroup back to normal priority: with the same workloads, the next full
    # check (every 5 s, not every tick: the cost) puts it back
    (node.cpu / node.be["napper"] / "cpu.idle").write_text("0")
    _quiet(node, 5)
    assert node.idle()["napper"] == "0"
    _quiet(node, 9)
    assert node.idle()["napper"] == "1"


def test_with_no_be_workload_it_is_checked_every_few_seconds_not_every_tick(node, monkeypatch):
    """A node with no BE workload yet: the lever has nothing to hold (skipped), and each apply
    parses the cgroup layout; it was re-applied on every tick. A BE workload that appears is
    still reached within the tick that finds it."""
    from sloguard.actuators.cpu_idle import CpuIdle

    applied: list[int] = []
    real_apply = CpuIdle.apply

    def counted(self, ctx):
        applied.append(1)
        return real_apply(self, ctx)

    monkeypatch.setattr(CpuIdle, "apply", counted)
    be = [w for w in node.inventory if w["class"] == "BE"]
    node.inventory[:] = [w for w in node.inventory if w["class"] != "BE"]
    for second in range(5):
        _quiet(node, second)
    [row] = node.ledger.rungs()
    assert row.status == "skipped" and len(applied) == 1
    _quiet(node, 5)  # the periodic full check
    assert len(applied) == 2
    node.inventory.extend(be[:1])  # the collector finds a BE workload
    _quiet(node, 6)
    assert len(applied) == 3 and node.idle()["antagonist"] == "1"
    assert node.ledger.rungs()[0].status == "done"


def test_the_ladder_starts_from_it_and_never_lifts_it(node):
    _quiet(node, 0)
    node.tick(1)  # an episode: its cpu_idle rung is already in force: skipped, and its hold
    node.tick(10)  # runs from there (it is the episode's first chance to show it is enough)
    actions = node.incidents.get("inc-1").actions
    assert [(a.step, a.status) for a in actions] == [("cpu_idle", "skipped")]
    assert "already in force as a standing lever of policy guard" in actions[0].detail
    assert _quota(node, "antagonist") == "-1"
    node.tick(11)  # still over its objective after the hold: the next lever
    assert [(a.step, a.status) for a in node.incidents.get("inc-1").actions][1:] == [
        ("cpu_quota", "done")]
    assert _quota(node, "antagonist") != "-1"
    for second in (12, 22, 32, 42):  # the episode ends: the ladder comes all the way down
        node.tick(second, firing=False)
    assert _quota(node, "antagonist") == "-1"
    assert node.idle() == {"antagonist": "1", "napper": "1", "steady": "1"}
    assert [r.policy for r in node.ledger.rungs()] == ["standing:guard"]


def test_a_same_kind_rung_in_force_before_it_stood_is_lifted_without_lifting_it(node):
    node.path.write_text(WITHOUT)
    assert node.policies.reload().ok
    node.tick(0)  # the ladder's own cpu_idle, for real
    assert node.idle() == {"antagonist": "1", "napper": "1", "steady": "1"}
    node.path.write_text(STANDING)  # the operator makes it stand mid-episode
    assert node.policies.reload().ok
    node.tick(1)
    for second in (2, 12, 22, 32):
        node.tick(second, firing=False)
    assert node.idle() == {"antagonist": "1", "napper": "1", "steady": "1"}
    undo = [a for a in node.ledger.audit_log() if a.action == "undo" and a.kind == "cpu_idle"]
    assert undo and "still holds cpu_idle" in undo[0].detail


def test_dropped_from_the_configuration_it_is_undone_with_the_values_from_before(node):
    (node.cpu / node.be["steady"] / "cpu.shares").write_text("2048")
    _quiet(node, 0)
    assert (node.cpu / node.be["steady"] / "cpu.shares").read_text().strip() == "3"
    broken = node.path.read_text().replace("standing:", "standing: [")
    node.path.write_text(broken)  # a broken file keeps the last good policy, and its lever
    assert not node.policies.reload().ok
    _quiet(node, 1)
    assert node.idle() == {"antagonist": "1", "napper": "1", "steady": "1"}
    node.path.write_text(WITHOUT)
    assert node.policies.reload().ok
    _quiet(node, 2)
    assert node.idle() == {"antagonist": "0", "napper": "0", "steady": "0"}
    assert (node.cpu / node.be["steady"] / "cpu.shares").read_text().strip() == "2048"
    assert node.ledger.rungs() == []
    assert "no longer configured" in node.ledger.audit_log()[0].reason


def test_a_restarted_agent_carries_on_and_undoes_it_when_dropped(node, tmp_path):
    _quiet(node, 0)
    node.ladder.close()
    audited = len(node.ledger.audit_log())
    node.ladder = Ladder("node-a", node.policies, node.ledger, node.factory.make,
                         node.incidents.save, node.incidents.get,
                         inventory=lambda: [dict(w) for w in node.inventory], dry_run=False,
                         open_incidents=node.incidents.open_incidents)
    _quiet(node, 1)
    assert len(node.ledger.audit_log()) == audited  # found in force: nothing re-recorded
    node.path.write_text(WITHOUT.replace("name: guard", "name: other"))
    assert node.policies.reload().ok  # the whole policy gone
    _quiet(node, 2)
    assert node.idle() == {"antagonist": "0", "napper": "0", "steady": "0"}


def test_a_cgroup_that_comes_to_hold_an_ls_workload_is_put_back_at_once(node):
    """A standing lever never ends: what it wrote where an LS workload has appeared since (a
    besteffort QoS cgroup that now holds an LS-labelled pod) must not wait for its end."""
    _quiet(node, 0)
    child = node.real.create("be-steady/ls-child")
    node.inventory.append(workload(child, "LS"))
    _quiet(node, 1)
    assert node.idle() == {"antagonist": "1", "napper": "1", "steady": "0"}
    [row] = node.ledger.rungs()
    assert not any(w["cgroup"].endswith("be-steady") for w in row.undo["writes"])
    assert "holds the LS workload" in node.ledger.audit_log()[0].detail


def test_an_agent_that_stops_takes_its_standing_levers_with_it(node):
    (node.cpu / node.be["steady"] / "cpu.shares").write_text("2048")
    _quiet(node, 0)
    node.ladder.release_standing(node_time(1))
    assert node.idle() == {"antagonist": "0", "napper": "0", "steady": "0"}
    assert (node.cpu / node.be["steady"] / "cpu.shares").read_text().strip() == "2048"
    assert node.ledger.rungs() == []
    assert "the agent is stopping" in node.ledger.audit_log()[0].reason


def test_dry_run_switched_on_leaves_it_in_force_and_on_record(node):
    _quiet(node, 0)
    [before] = node.ledger.rungs()
    node.ladder.dry_run = True
    _quiet(node, 1)
    assert node.ledger.rungs() == [before]  # not turned into a proposal
    assert node.idle() == {"antagonist": "1", "napper": "1", "steady": "1"}


def test_in_dry_run_it_is_proposed_and_nothing_is_written(node):
    node.ladder.dry_run = True
    _quiet(node, 0)
    assert node.idle() == {"antagonist": "0", "napper": "0", "steady": "0"}
    [row] = node.ledger.rungs()
    assert row.status == "proposed"
    node.tick(1)  # the ladder's proposals start from it as well
    actions = node.incidents.get("inc-1").actions
    assert actions[0].status == "skipped" and "standing" in actions[0].detail
    node.ladder.dry_run = False  # switched off: taken for real at the next tick
    _quiet(node, 2)
    assert node.idle() == {"antagonist": "1", "napper": "1", "steady": "1"}


@pytest.mark.parametrize("text, message", [
    ("    standing:\n      - step: cordon\n",
     r"p.yaml:5:\d+: policies.0.standing.0.step: cordon cannot stand"),
    ("    standing:\n      - step: cpu_quota\n",  # follows usage: rewritten every tick
     r"policies.0.standing.0.step: cpu_quota cannot stand: only a lever that acts on each BE "
     r"workload with a value it needs no measurement for"),
    ("    standing:\n      - step: cpu_idle\n        after: 5s\n",
     r"a standing lever is always in force on the whole BE tier, so it has no after"),
    ("    standing:\n      - step: cpu_idle\n        target: suspects\n",
     r"so it has no target"),
    ("    standing:\n      - step: cpu_idle\n      - step: cpu_idle\n",
     r"cpu_idle is named twice"),
    ("    standing:\n      - step: cpu_idle\n        params: {mode: fast}\n",
     r"p.yaml:6:\d+: policies.0.standing.0.params: mode must be one of"),
])
def test_what_cannot_stand_is_refused_with_its_line(tmp_path, text, message):
    factory = StepFactory(ActuatorEnv("node-a", Ledger(tmp_path / "a.db")))
    path = tmp_path / "p.yaml"
    path.write_text("policies:\n  - name: p\n    undo_hold: 10s\n" + text
                    + "    steps:\n      - step: notify\n")
    with pytest.raises(PolicyFileError, match=message):
        load_policy_file(path, factory.check, factory.cannot_stand)
