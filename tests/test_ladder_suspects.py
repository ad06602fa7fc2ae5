"""`target: suspects` (docs/attribution.md): a lever on the incident's first suspect alone,
then the next, then the rest of the BE tier, each after a hold while interference persists,
undone in reverse; with the real cpu_idle lever on this machine's real cgroups, so what is
asserted is what the kernel files hold. And eviction ranks the suspects first."""

from __future__ import annotations

import pytest
from support.suspects_node import T0

from sloguard.actuators.env import ActuatorEnv
from sloguard.actuators.evict import rank
from sloguard.actuators.kinds import StepFactory
from sloguard.actuators.ledger import Ledger
from sloguard.actuators.policy import PolicyFileError, load_policy_file
from sloguard.core.suspects import Clue, Suspect


@pytest.fixture
def node(suspects_node):
    return suspects_node


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
