"""`target: suspects` (docs/attribution.md): a lever on the incident's first suspect alone,
then the next, then the rest of the BE tier, each after a hold while interference persists,
undone in reverse; with the real cpu_idle lever on this machine's real cgroups, so what is
asserted is what the kernel files hold. And eviction ranks the suspects first."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import need
from support.levers import workload

from sloguard.actuators.env import ActuatorEnv
from sloguard.actuators.evict import rank
from sloguard.actuators.kinds import StepFactory
from sloguard.actuators.ladder import Ladder
from sloguard.actuators.ledger import Ledger
from sloguard.actuators.policy import PolicyFileError, PolicySet, load_policy_file
from sloguard.core.incidents import FIRING, Evidence, Incident
from sloguard.core.suspects import Clue, Suspect
from sloguard.store.incidents_db import IncidentStore

S = 1_000_000_000
T0 = 1_800_000_000 * S
POLICY = """\
policies:
  - name: guard
    undo_hold: 10s
    steps:
      - step: suppress
        hold: 10s
        order: written
        levers:
          - step: cpu_idle
            target: suspects
            suspects: 2
"""


class Node:
    def __init__(self, tmp_path: Path, real_cgroups, policy: str = POLICY) -> None:
        need("cpu" in real_cgroups.layout.v1, "a v1 cpu hierarchy (this host's)")
        self.cpu = real_cgroups.layout.v1["cpu"]
        self.be = {name: real_cgroups.create(f"be-{name}") for name in
                   ("antagonist", "napper", "steady")}
        self.ls = real_cgroups.create("ls")
        self.inventory = [workload(rel, "BE") for rel in self.be.values()] + [
            workload(self.ls, "LS")]
        (tmp_path / "policies").mkdir()
        (tmp_path / "policies" / "p.yaml").write_text(policy)
        self.ledger = Ledger(tmp_path / "actuators.db")
        factory = StepFactory(ActuatorEnv("node-a", self.ledger))
        self.policies = PolicySet([str(tmp_path / "policies")], validate_step=factory.check)
        assert self.policies.reload().ok, self.policies.errors
        self.incidents = IncidentStore(tmp_path / "incidents.db")
        self.ladder = Ladder("node-a", self.policies, self.ledger, factory.make,
                             self.incidents.save, self.incidents.get,
                             inventory=lambda: [dict(w) for w in self.inventory], dry_run=False,
                             open_incidents=self.incidents.open_incidents)
        self.incident = Incident("inc-1", "f", "LSLatencyInterference", "ls", "critical",
                                 "node-a", FIRING, {"slo": "redis"}, T0, T0, fired_ns=T0,
                                 policy="guard", labels={"resource": "cpu"})

    def suspect(self, *names: str) -> None:
        self.incident.suspects = [
            Suspect("/" + self.be[name], 0.9 - 0.2 * n, n + 1, "cpu", {"workload": name},
                    [Clue("runqueue_blame", 0.9, "cpu", f"{name} ran")]).to_dict()
            for n, name in enumerate(names)]

    def tick(self, second: int, firing: bool = True) -> None:
        now = T0 + second * S
        if firing:
            self.incident.add_evidence(Evidence(now, 3.0, 1.0, "crossed"))
        else:
            self.incident.state = "resolved"
        self.incidents.save(self.incident)
        self.ladder.tick(now, [self.incident] if firing else [])

    def idle(self) -> dict[str, str]:
        return {name: (self.cpu / rel / "cpu.idle").read_text().strip()
                for name, rel in self.be.items()}


@pytest.fixture
def node(tmp_path, real_cgroups):
    need((real_cgroups.layout.v1.get("cpu", Path("/nonexistent")) / "cpu.idle").exists(),
         "cpu.idle (kernel >= 5.15)")
    made = Node(tmp_path, real_cgroups)
    yield made
    made.ladder.close()


def test_the_first_suspect_alone_then_the_next_then_the_rest_and_back(node):
    node.suspect("antagonist", "napper")
    node.tick(0)
    assert node.idle() == {"antagonist": "1", "napper": "0", "steady": "0"}
    node.tick(9)
    assert node.idle()["napper"] == "0"  # its hold
    node.tick(10)
    assert node.idle() == {"antagonist": "1", "napper": "1", "steady": "0"}
    node.tick(20)
    assert node.idle() == {"antagonist": "1", "napper": "1", "steady": "1"}
    actions = [a for a in node.incidents.get("inc-1").actions if a.step == "cpu_idle"]
    assert "suspect #1 antagonist (score 0.90, cpu)" in actions[0].detail
    assert actions[0].target.endswith(f"[/{node.be['antagonist']}]")
    assert "rest of the BE tier" in actions[2].detail
    node.tick(21, firing=False)  # undone in reverse, one per undo_hold
    assert node.idle() == {"antagonist": "1", "napper": "1", "steady": "0"}
    node.tick(31, firing=False)
    assert node.idle() == {"antagonist": "1", "napper": "0", "steady": "0"}
    node.tick(41, firing=False)
    assert node.idle() == {"antagonist": "0", "napper": "0", "steady": "0"}
    assert node.ledger.rungs() == []


def test_without_suspects_the_lever_goes_to_the_whole_tier_at_once(node):
    node.tick(0)
    assert node.idle() == {"antagonist": "1", "napper": "1", "steady": "1"}
    skipped = [a for a in node.incidents.get("inc-1").actions if a.status == "skipped"]
    assert len(skipped) == 2 and "no suspect #1: the incident has 0" in skipped[0].detail
    for second in (1, 11):
        node.tick(second, firing=False)
    assert node.idle() == {"antagonist": "0", "napper": "0", "steady": "0"}
    assert node.ledger.rungs() == []


def test_a_reranked_incident_widens_to_the_next_suspect_not_held_yet(node):
    node.suspect("antagonist", "napper")
    node.tick(0)
    node.suspect("napper", "antagonist", "steady")  # the ranking moved meanwhile
    node.tick(10)  # suspect #2's rung: the first ranked one the first rung does not hold
    assert node.idle() == {"antagonist": "1", "napper": "1", "steady": "0"}
    node.tick(20)
    assert node.idle() == {"antagonist": "1", "napper": "1", "steady": "1"}
    for second in (21, 31, 41):
        node.tick(second, firing=False)
    assert node.idle() == {"antagonist": "0", "napper": "0", "steady": "0"}


def test_target_suspects_is_refused_where_it_means_nothing(tmp_path):
    factory = StepFactory(ActuatorEnv("node-a", Ledger(tmp_path / "a.db")))
    path = tmp_path / "p.yaml"
    path.write_text("policies:\n  - name: p\n    steps:\n      - step: cordon\n"
                    "        target: suspects\n")
    with pytest.raises(PolicyFileError, match=r"p.yaml:4:\d+: policies.0.steps.0.step: cordon "
                                              r"does not act on BE workloads one by one"):
        load_policy_file(path, factory.check)
    path.write_text("policies:\n  - name: p\n    steps:\n      - step: cpu_idle\n"
                    "        suspects: 3\n")
    with pytest.raises(PolicyFileError, match="`suspects` counts the suspects"):
        load_policy_file(path, factory.check)


def _pod(name: str, uid: str, priority: int = 0):
    from kubernetes.client import V1ObjectMeta, V1Pod, V1PodSpec, V1PodStatus

    return V1Pod(metadata=V1ObjectMeta(name=name, namespace="batch", uid=uid,
                                       labels={"koordinator.sh/qosClass": "BE"}),
                 spec=V1PodSpec(containers=[], priority=priority),
                 status=V1PodStatus(phase="Running", qos_class="BestEffort"))


def test_eviction_ranks_the_suspects_first_and_says_why():
    pods = [_pod("big", "u-big"), _pod("culprit", "u-culprit", priority=5), _pod("tiny", "u-t")]
    usage = {"u-big": 1.5, "u-culprit": 0.3, "u-t": 0.01}
    suspect = Suspect("/kubepods/besteffort/podu-culprit", 0.8, 1, "cpu",
                      {"pod": "culprit", "namespace": "batch", "pod_uid": "u-culprit"},
                      [Clue("runqueue_blame", 0.8, "cpu", "LS waited 40 ms behind it")])
    ranked, _ = rank(pods, "cpu", T0, lambda uid, res: usage[uid], suspects=[suspect])
    assert [c.name for c in ranked] == ["culprit", "big", "tiny"]  # then priority, usage
    from sloguard.actuators.evict import reasons

    assert reasons(ranked[0], "cpu").startswith(
        "suspect #1 (score 0.80: LS waited 40 ms behind it), priority 5")
    plain, _ = rank(pods, "cpu", T0, lambda uid, res: usage[uid])
    assert [c.name for c in plain] == ["big", "tiny", "culprit"]
