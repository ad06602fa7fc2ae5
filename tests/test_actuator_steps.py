"""The Kubernetes steps' own logic without a server: parameters, quantity arithmetic, and the
eviction ranking (including the property that an LS pod is never a candidate).

What they do to a real node and real pods is in tests/test_actuators_kube.py.
"""

from __future__ import annotations

import datetime
import random
from decimal import Decimal

import pytest
from kubernetes import client

from sloguard.actuators.capacity import ReduceCapacity, canonical, parse
from sloguard.actuators.env import ActuatorEnv
from sloguard.actuators.evict import CLASS_LABEL, Evict, rank, ranking_text, requested
from sloguard.actuators.kinds import BUILTIN_STEPS, StepFactory
from sloguard.actuators.ledger import Ledger
from sloguard.actuators.policy import StepSpec

NOW = datetime.datetime(2030, 1, 1, 12, 0, tzinfo=datetime.UTC)
NOW_NS = int(NOW.timestamp() * 1e9)
CPU, MEM = "kubernetes.io/batch-cpu", "kubernetes.io/batch-memory"


@pytest.fixture
def env(tmp_path) -> ActuatorEnv:
    return ActuatorEnv("node-a", Ledger(tmp_path / "ledger.db"))


# -- quantities ------------------------------------------------------------------------------

@pytest.mark.parametrize(("value", "binary", "text"), [
    ("8000", False, "8k"), ("7500", False, "7500"), ("0.5", False, "500m"), ("1.5", False,
                                                                              "1500m"),
    ("0", False, "0"), ("4000000", False, "4M"), ("0.0000001", False, "100n"),
    ("17179869184", True, "16Gi"), ("8053063680", True, "7680Mi"), ("1000", True, "1k"),
    ("1536", True, "1536"), ("1073741825", True, "1073741825"), ("2.5", True, "2500m"),
])
def test_canonical_form_is_apimachinery_s(value, binary, text):
    assert canonical(Decimal(value), binary) == text
    assert parse(text) == Decimal(value)


def test_quantities_compare_parsed_not_as_strings():
    assert parse("8k") == parse("8000") == parse(8000)
    assert parse("16Gi") == parse("17179869184")
    assert parse("500m") < parse("1")
    with pytest.raises(ValueError):
        parse("eight")
    with pytest.raises(ValueError):
        parse(True)


def test_reduction_by_percent_step_and_floor(env):
    half = ReduceCapacity({"percent": 50, "floor": {CPU: "3000"}}, env)
    assert half.reduced(CPU, "8k") == "4k"
    assert half.reduced(CPU, "5000") == "3k"  # 2500 is under the floor
    assert half.reduced(MEM, "16Gi") == "8Gi"  # binary stays binary
    assert half.reduced(MEM, "15Gi") == "7680Mi"
    assert half.reduced(CPU, "2000") == "2k"  # below the floor already: never raised
    odd = ReduceCapacity({"percent": 33}, env)
    assert odd.reduced(CPU, "1001") == "670"  # integers stay integers, rounded down
    assert odd.reduced(CPU, "1500m") == "1005m"  # fractional ones keep milli precision
    step = ReduceCapacity({"step": {CPU: 3000, MEM: "4Gi"}, "floor": {CPU: "50%"}}, env)
    assert step.reduced(CPU, "8k") == "5k"
    assert step.reduced(CPU, "5k") == "2500"  # 50% of what stood
    assert step.reduced(MEM, "2Gi") == "0"  # no floor: down to nothing, not below


@pytest.mark.parametrize(("params", "message"), [
    ({}, "exactly one of"),
    ({"percent": 50, "step": {CPU: 1, MEM: 1}}, "exactly one of"),
    ({"percent": 0}, "percent must be"),
    ({"percent": 150}, "percent must be"),
    ({"percent": True}, "percent must be"),
    ({"step": "2"}, "step must map"),
    ({"step": {CPU: 1000}}, "no amount for kubernetes.io/batch-memory"),
    ({"step": {CPU: "lots", MEM: 1}}, "not a quantity"),
    ({"step": {CPU: -1, MEM: 1}}, "must be positive"),
    ({"percent": 50, "floor": {"cpu": 1}}, "floor names cpu, not in resources"),
    ({"percent": 50, "floor": {CPU: "120%"}}, "between 0% and 100%"),
    ({"percent": 50, "resources": []}, "non-empty list"),
    ({"percent": 50, "resources": [CPU, CPU]}, "twice"),
    ({"percent": 50, "by": 1}, "unknown reduce_capacity parameter(s): by"),
])
def test_reduce_capacity_rejects_bad_params(env, params, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        ReduceCapacity(params, env)


@pytest.mark.parametrize(("params", "message"), [
    ({"per_hour": -1}, "per_hour"),
    ({"per_incident": 1.5}, "per_incident"),
    ({"grace_period": -3}, "grace_period"),
    ({"class_label": ""}, "class_label"),
    ({"max": 3}, "unknown evict parameter"),
])
def test_evict_rejects_bad_params(env, params, message):
    with pytest.raises(ValueError, match=message):
        Evict(params, env)


def test_the_steps_are_registered_for_policies(env):
    factory = StepFactory(env)
    assert factory.registry.providers["reduce_capacity"] == "reduce_capacity"
    assert BUILTIN_STEPS["reduce_capacity"] == "sloguard.actuators.capacity"
    factory.check(StepSpec(step="reduce_capacity", params={"percent": 50}))
    factory.check(StepSpec(step="evict", params={"per_hour": 3, "per_incident": 2}))
    without_kube = factory.make(StepSpec(step="evict"))
    assert "not configured" in without_kube.available()


# -- the eviction ranking ------------------------------------------------------------------

def _pod(name, *, label=None, qos="BestEffort", priority=0, cpu=None, batch_cpu=None,
         up_s=60.0, namespace="ns", uid=None, terminating=False, daemonset=False):
    requests = {}
    if cpu is not None:
        requests["cpu"] = cpu
    if batch_cpu is not None:
        requests[CPU] = batch_cpu
    owners = [client.V1OwnerReference(api_version="apps/v1", kind="DaemonSet", name="ds",
                                      uid="ds-uid", controller=True)] if daemonset else None
    return client.V1Pod(
        metadata=client.V1ObjectMeta(
            name=name, namespace=namespace, uid=uid or f"uid-{name}",
            labels={CLASS_LABEL: label} if label is not None else {},
            deletion_timestamp=NOW if terminating else None, owner_references=owners),
        spec=client.V1PodSpec(priority=priority, containers=[client.V1Container(
            name="c", image="x", resources=client.V1ResourceRequirements(requests=requests))]),
        status=client.V1PodStatus(qos_class=qos, phase="Running",
                                  start_time=NOW - datetime.timedelta(seconds=up_s)),
    )


def test_ranking_priority_then_usage_then_run_time():
    pods = [
        _pod("old", up_s=7200, cpu="500m"),
        _pod("young", up_s=60, cpu="500m"),
        _pod("hungry", up_s=600, cpu="2"),
        _pod("low-priority", priority=-10, up_s=600, cpu="100m"),
        _pod("important", priority=1000, up_s=5, cpu="8"),
    ]
    ranked, left_out = rank(pods, "cpu", NOW_NS)
    assert [c.name for c in ranked] == ["low-priority", "hungry", "young", "old", "important"]
    assert left_out == []
    assert ranking_text(ranked, "cpu")[:3] == [
        "1. ns/low-priority: priority -10, cpu 0.1 cores requested (no usage data), up 10m",
        "2. ns/hungry: priority 0, cpu 2 cores requested (no usage data), up 10m",
        "3. ns/young: priority 0, cpu 0.5 cores requested (no usage data), up 60s",
    ]


def test_measured_usage_ranks_before_requests_and_says_so():
    pods = [_pod("a", cpu="4"), _pod("b", cpu="100m"), _pod("c", batch_cpu="1500")]
    usage = {"uid-a": 0.2, "uid-b": 1.8}
    ranked, _ = rank(pods, "cpu", NOW_NS, usage=lambda uid, res: usage.get(uid))
    assert [c.name for c in ranked] == ["b", "c", "a"]
    text = ranking_text(ranked, "cpu")
    assert text[0] == "1. ns/b: priority 0, cpu 1.8 cores, up 60s"
    assert "cpu 1.5 cores requested (no usage data)" in text[1]  # batch-cpu is milli-cores
    assert requested(_pod("m", batch_cpu="2000"), "memory") is None


def test_pods_eviction_cannot_help_with_are_left_out_with_the_reason():
    pods = [_pod("done", terminating=True), _pod("ds", daemonset=True), _pod("ok")]
    ranked, left_out = rank(pods, "memory", NOW_NS)
    assert [c.name for c in ranked] == ["ok"]
    assert left_out == ["ns/done (terminating already)",
                        "ns/ds (a DaemonSet pod (it would come back on this node))"]
    assert ranking_text(ranked, "memory") == [
        "1. ns/ok: priority 0, memory: no usage data, no requests, up 60s"]


def _oracle_be(pod) -> bool:
    """The classification, written out independently: label first, then QoS, else LS."""
    label = (pod.metadata.labels or {}).get(CLASS_LABEL)
    if label:
        return label.upper() == "BE"
    return pod.status.qos_class == "BestEffort"


def test_property_an_ls_pod_is_never_a_candidate():
    """Random pods, labels, QoS classes, priorities, usage and inventories: whatever ranks
    where, no pod that is LS (by label, by QoS, or by the node's inventory) is a candidate,
    and every BE pod that eviction can help with is one."""
    rng = random.Random(7)
    labels = [None, "", "BE", "be", "LS", "LSR", "LSE", "SYSTEM", "Be "]
    qos_classes = ["BestEffort", "Burstable", "Guaranteed", None]
    for trial in range(500):
        pods, usage, inventory = [], {}, []
        for i in range(rng.randint(0, 10)):
            pod = _pod(f"p{i}", label=rng.choice(labels), qos=rng.choice(qos_classes),
                       priority=rng.choice([-100, 0, 0, 10, 100000]),
                       cpu=rng.choice([None, "100m", "2", "16"]), up_s=rng.uniform(0, 1e5),
                       uid=f"t{trial}-{i}", terminating=rng.random() < 0.1)
            pods.append(pod)
            if rng.random() < 0.5:
                usage[pod.metadata.uid] = rng.uniform(0, 32)
            if rng.random() < 0.3:
                inventory.append({"pod_uid": pod.metadata.uid,
                                  "class": rng.choice(["BE", "LS"])})
        ranked, _ = rank(pods, rng.choice(["cpu", "memory", ""]), NOW_NS,
                         usage=lambda uid, res, u=usage: u.get(uid), inventory=inventory)
        ls_inventory = {w["pod_uid"] for w in inventory if w["class"] == "LS"}
        by_uid = {p.metadata.uid: p for p in pods}
        for candidate in ranked:
            pod = by_uid[candidate.uid]
            assert _oracle_be(pod), (trial, pod.metadata.labels, pod.status.qos_class)
            assert candidate.uid not in ls_inventory
        expected = {p.metadata.uid for p in pods if _oracle_be(p)
                    and p.metadata.uid not in ls_inventory and not p.metadata.deletion_timestamp}
        assert {c.uid for c in ranked} == expected
        keys = [(c.priority, -(c.usage or 0), c.up_s) for c in ranked]
        assert keys == sorted(keys)
