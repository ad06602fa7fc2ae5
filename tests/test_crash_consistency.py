"""Crash consistency of the levers, on the real agent process (issue #19).

The sweep (tests/support/fault_sweep.py) kills `sloguard run` with SIGKILL at every write point
of a whole episode, one run per point: each cgroup write, each ledger write, each Kubernetes
API call that changes something, before and after. After a restart and the end of the episode
every cgroup file and node field must be back to its original value, no eviction or cordon may
have happened twice, and the ledger's audit must say what happened.
"""

from __future__ import annotations

import collections
import time

import pytest
from support.fault_sweep import Sweep


def _sweep(kube, kube_agent, real_cgroups, sloguard_bin, tmp_path) -> Sweep:
    return Sweep(sloguard_bin, kube.api_client(), kube_agent.kubeconfig(), kube_agent.audit,
                 real_cgroups, tmp_path)


def test_an_episode_without_faults_passes_every_kind_of_write_point(
        kube, kube_agent, real_cgroups, sloguard_bin, tmp_path):
    run = _sweep(kube, kube_agent, real_cgroups, sloguard_bin, tmp_path).run()
    assert run.violations == []
    kinds = {name.split(":")[0].split(" ")[0] for name in run.points}
    # the sweep below is only as good as the points an episode passes
    assert {"cgroup.write", "ledger.intend", "ledger.settle", "kube.PATCH",
            "kube.POST"} <= kinds, kinds


def test_killed_at_every_write_point_the_node_ends_as_it_began(
        kube, kube_agent, real_cgroups, sloguard_bin, tmp_path):
    sweep = _sweep(kube, kube_agent, real_cgroups, sloguard_bin, tmp_path)
    baseline = sweep.run()
    assert baseline.violations == [] and baseline.points
    failures, killed_at = [], collections.Counter()
    # side by side (Sweep.run_all): each run has its own node, cgroups and agent
    for run in sweep.run_all(list(range(1, len(baseline.points) + 1))):
        if run.killed:
            killed_at[run.point.split(":")[0]] += 1
        failures += [f"killed at #{run.kill} {run.point}: {v}" for v in run.violations]
    print(f"\ncrash sweep: {len(baseline.points)} write points, {sum(killed_at.values())} "
          f"kills, {len(failures)} invariant violations; kills by point: {dict(killed_at)}")
    assert failures == []
    assert sum(killed_at.values()) >= len(baseline.points) * 0.9  # the kills really happened


# -- in-process: the real ladder, real cgroups, a real ledger that stops taking writes ------

POLICY = """\
policies:
  - name: guard
    undo_hold: 1s
    steps:
      - step: suppress
        levers:
          - step: {lever}
            repeat: 5s
"""
S = 1_000_000_000


class _World:
    """One BE and one LS cgroup, the real ladder on a real ledger, on a clock the test moves."""

    def __init__(self, real_cgroups, tmp_path, lever: str = "cpu_idle") -> None:
        from sloguard.actuators.env import ActuatorEnv
        from sloguard.actuators.kinds import StepFactory
        from sloguard.actuators.ladder import Ladder
        from sloguard.actuators.ledger import Ledger
        from sloguard.actuators.policy import PolicySet
        from sloguard.store.incidents_db import IncidentStore

        self.be = real_cgroups.create("be")
        ls = real_cgroups.create("ls")
        self.cpu = next(r for r in real_cgroups.hierarchies() if (r / "cpu.idle").exists())
        inventory = [{"cgroup": "/" + self.be, "class": "BE", "level": "cgroup"},
                     {"cgroup": "/" + ls, "class": "LS", "level": "cgroup"}]
        self.policy_file = tmp_path / "policies" / "guard.yaml"
        self.policy_file.parent.mkdir()
        self.policy_file.write_text(POLICY.format(lever=lever))
        self.ledger = Ledger(tmp_path / "actuators.db")
        env = ActuatorEnv("node-a", self.ledger)
        factory = StepFactory(env)
        self.policies = PolicySet([str(self.policy_file.parent)], validate_step=factory.check)
        assert self.policies.reload().ok, self.policies.errors
        self.store = IncidentStore(tmp_path / "incidents.db")
        self.make = lambda: Ladder("node-a", self.policies, self.ledger, factory.make,
                                   self.store.save, self.store.get,
                                   inventory=lambda: [dict(w) for w in inventory],
                                   dry_run=False, open_incidents=self.store.open_incidents)
        self.ladder = self.make()
        self.t0 = time.time_ns()

    def incident(self):
        from sloguard.core.incidents import FIRING, Incident

        incident = Incident("inc-1", "f", "LSLatency", "ls", "critical", "node-a", FIRING, {},
                            self.t0, self.t0, fired_ns=self.t0, policy="guard")
        self.store.save(incident)
        return incident

    def tick(self, second: float, *firing) -> None:
        from sloguard.core.incidents import Evidence

        now = self.t0 + int(second * S)
        for incident in firing:
            incident.add_evidence(Evidence(now, 30.0, 10.0, "crossed"))
        if not firing:  # recovered: resolved in the store too, as the engine does
            for incident in self.store.open_incidents():
                incident.state = "resolved"
                self.store.save(incident)
        self.ladder.tick(now, list(firing))

    def idle(self) -> str:
        return (self.cpu / self.be / "cpu.idle").read_text().strip()

    def read_only(self) -> None:
        """The ledger's file stops taking writes, as a full disk or a locked file would."""
        self.ledger._conn.execute("PRAGMA query_only = ON")


def test_a_ledger_that_cannot_take_the_intent_means_the_lever_is_not_applied(
        real_cgroups, tmp_path):
    world = _World(real_cgroups, tmp_path)
    world.read_only()
    world.tick(0, world.incident())
    assert world.idle() == "0"  # never written: the original could not be put on record
    assert "readonly" in world.ladder.errors["guard"]


def test_a_lever_whose_outcome_cannot_be_recorded_is_undone_at_once(
        real_cgroups, tmp_path, monkeypatch):
    """Today's main wrote the ledger after the cgroup: a failing write there left cpu.idle in
    force with no record, for good."""
    from sloguard.core import failpoints

    world = _World(real_cgroups, tmp_path)

    def after_the_write(name: str) -> None:
        if name == "cgroup.write:after":
            world.read_only()

    monkeypatch.setattr(failpoints, "hit", after_the_write)
    world.tick(0, world.incident())
    assert world.idle() == "0"
    assert "readonly" in world.ladder.errors["guard"]
    # The intent is still there (it could not be cleared either): once the ledger takes writes
    # again, a restarted agent reconciles it and finds nothing left to undo.
    world.ledger._conn.execute("PRAGMA query_only = OFF")
    [intent] = world.ledger.intents()
    assert intent.kind == "cpu_idle" and intent.undo["writes"][0]["old"] == "0"
    world.ladder = world.make()
    world.tick(1)
    world.tick(3)
    assert world.ledger.intents() == [] and world.ledger.rungs() == []
    assert world.idle() == "0"


def test_an_intent_left_by_a_crash_is_adopted_and_undone_after_the_restart(
        real_cgroups, tmp_path, monkeypatch):
    from sloguard.core import failpoints

    world = _World(real_cgroups, tmp_path)

    class Died(BaseException):
        pass

    def die(name: str) -> None:
        if name == "cgroup.write:after":
            raise Died  # the process ends here: nothing after the write runs

    monkeypatch.setattr(failpoints, "hit", die)
    incident = world.incident()
    with pytest.raises(Died):
        world.tick(0, incident)
    assert world.idle() == "1" and world.ledger.rungs() == []  # in force, not yet recorded
    monkeypatch.undo()
    world.ladder = world.make()  # the restart
    world.tick(1, incident)  # still firing: adopted and applied again, not twice
    [row] = world.ledger.rungs()
    assert (row.kind, row.status, row.undo["writes"][0]["old"]) == ("cpu_idle", "done", "0")
    assert world.idle() == "1" and world.ledger.intents() == []
    world.tick(2)
    world.tick(4)
    assert world.idle() == "0" and world.ledger.rungs() == []
    audit = [(e.action, e.status) for e in reversed(world.ledger.audit_log(kind="cpu_idle"))]
    assert audit[0] == ("apply", "done") and audit[-1] == ("undo", "done")
    assert "stopped while this step was being applied" in world.ledger.audit_log(
        kind="cpu_idle")[-1].reason


def test_editing_a_policy_mid_episode_keeps_the_undo_of_the_lever_in_force(
        real_cgroups, tmp_path):
    """A `repeat` that finds another step at the rung now must not overwrite the record of
    the lever in force (today's main lost cpu.idle's original and left it at 1)."""
    world = _World(real_cgroups, tmp_path)
    incident = world.incident()
    world.tick(0, incident)
    assert world.idle() == "1"
    world.policy_file.write_text(POLICY.format(lever="cpu_quota"))
    assert world.policies.reload().ok, world.policies.errors
    world.tick(6, incident)  # the repeat is due
    [row] = world.ledger.rungs()
    assert row.kind == "cpu_idle" and row.undo["writes"][0]["old"] == "0"
    world.tick(7)
    world.tick(9)
    assert world.idle() == "0" and world.ledger.rungs() == []


def test_the_audit_is_pruned_by_retention_in_batches(tmp_path):
    from sloguard.actuators.ledger import AuditEntry, Ledger

    ledger = Ledger(tmp_path / "actuators.db")
    for i in range(12):
        ledger.audit(AuditEntry(i * S, "node-a", "inc", "guard", 0, "evict", "apply", False,
                                "done", "pod/x", "", ""))
    assert ledger.prune_audit(10 * S, batch=4) == 10  # three batches
    assert [e.time_ns for e in ledger.audit_log()] == [11 * S, 10 * S]


def test_the_audit_retention_cannot_be_shorter_than_the_eviction_budgets(tmp_path):
    from sloguard.core.config import ConfigError
    from sloguard.settings import load_settings

    bad = tmp_path / "bad.yaml"
    bad.write_text("actuators:\n  audit_retention: 10m\n")
    with pytest.raises(ConfigError, match="audit_retention"):
        load_settings(bad)


def test_an_episode_left_open_by_a_crash_after_the_last_undo_is_ended(
        real_cgroups, tmp_path, monkeypatch):
    """Found by the sweep (killed right after the last undo was recorded): the open episode
    was never visited again, so the next episode inherited its lever order."""
    from sloguard.core import failpoints

    world = _World(real_cgroups, tmp_path)
    incident = world.incident()
    world.tick(0, incident)

    class Died(BaseException):
        pass

    def die(name: str) -> None:
        if name == "ledger.end_episode:before":
            raise Died

    monkeypatch.setattr(failpoints, "hit", die)
    with pytest.raises(Died):
        for second in (1, 2, 3):
            world.tick(second)
    monkeypatch.undo()
    assert world.ledger.rungs() == [] and world.ledger.open_episodes() == ["guard"]
    # as the sweep left it: the descent was saved on an earlier tick (its rungs came down one
    # per undo_hold), so nothing says the policy fired
    from sloguard.actuators.ledger import Descent

    world.ledger.put_descent("guard", Descent(firing=False, came_down_ns=world.t0 + S))
    world.ladder = world.make()  # the restart
    world.tick(4)
    assert world.ledger.open_episodes() == []


def test_a_repeat_the_agent_died_in_is_adopted_with_the_value_it_wrote_and_the_original():
    """A review finding: the rung's record won whole, so its stale `wrote` hid the repeat's
    new value from undo (which leaves a value it did not write alone), for good."""
    from sloguard.actuators.ladder import _merged

    recorded = {"writes": [{"file": "/a/memory.high", "old": "max", "wrote": "1000"},
                           {"file": "/b/memory.high", "old": "max", "wrote": "2000"}],
                "enabled": ["/p/cgroup.subtree_control"]}
    intent = {"writes": [{"file": "/a/memory.high", "old": "max", "wrote": "800"},
                         {"file": "/c/memory.high", "old": "4000", "wrote": "900"}],
              "enabled": ["/q/cgroup.subtree_control"]}
    merged = _merged(recorded, intent)
    by_file = {w["file"]: (w["old"], w["wrote"]) for w in merged["writes"]}
    assert by_file == {"/a/memory.high": ("max", "800"), "/b/memory.high": ("max", "2000"),
                       "/c/memory.high": ("4000", "900")}
    assert merged["enabled"] == ["/p/cgroup.subtree_control", "/q/cgroup.subtree_control"]


def test_an_agent_that_lost_its_port_is_started_on_another(tmp_path, sloguard_bin,
                                                            monkeypatch):
    """The sweep's harness: the port _free_port found can be taken before the agent binds it
    (a CI run lost a restarted agent so, and the run's checks all failed); the agent is then
    started again on another port."""
    import socket

    import support.fault_sweep as fault_sweep

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    ports = iter([taken.getsockname()[1], fault_sweep._free_port()])
    monkeypatch.setattr(fault_sweep, "_free_port", lambda: next(ports))
    config = tmp_path / "sloguard.yaml"
    config.write_text("collectors:\n  cgroups:\n    include: []\n")
    agent = fault_sweep.Agent(sloguard_bin, config, tmp_path / "data", tmp_path / "agent.log",
                              {})
    try:
        assert agent.up(30)
        assert agent.port != taken.getsockname()[1]
        assert b"address already in use" in (tmp_path / "agent.log").read_bytes()
    finally:
        agent.proc.kill()
        agent.proc.wait()
        taken.close()
