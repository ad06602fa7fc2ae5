"""The Kubernetes steps against a real kube-apiserver, acting with the agent's restricted token.

Tests play the kubelet (node status, pod status) and the humans (kubectl, PDBs) with the admin
token; every step acts with the token that deploy/base/rbac.yaml binds. The last test of this
module checks that RBAC both ways against the apiserver's audit log: a request it refused
fails, and so does a rule no request used.
"""

from __future__ import annotations

import datetime
import json
import socket
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import yaml
from conftest import (
    ACCESS_KINDS,
    DEPLOY_BASE,
    KubeAgent,
    deploy_objects,
    need,
    shipped_grants,
)
from kubernetes import client

from sloguard.actuators.capacity import STATE, ReduceCapacity, parse
from sloguard.actuators.cordon import INCIDENT, OWNER, TAINT_KEY, TAINTED, Cordon
from sloguard.actuators.env import ActuatorEnv
from sloguard.actuators.evict import Evict
from sloguard.actuators.kinds import StepFactory
from sloguard.actuators.ladder import Ladder
from sloguard.actuators.ledger import Ledger
from sloguard.actuators.policy import PolicySet
from sloguard.actuators.step import DONE, FAILED, PROPOSED, SKIPPED, StepContext
from sloguard.collectors.kube_pods import PodMetadataCache
from sloguard.core.incidents import FIRING, Evidence, Incident
from sloguard.store.incidents_db import IncidentStore

pytestmark = pytest.mark.kube

S = 1_000_000_000
CPU, MEM = "kubernetes.io/batch-cpu", "kubernetes.io/batch-memory"
CAPACITY = {"cpu": "4", "memory": "16Gi", "pods": "110", CPU: "8000", MEM: "16Gi"}
ALLOCATABLE = {"cpu": "4", "memory": "15Gi", "pods": "110", CPU: "7500", MEM: "15Gi"}
PRIORITIES = {"sg-low": -10, "sg-high": 1000}
CLASS = "koordinator.sh/qosClass"


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


@dataclass
class World:
    """One node and one namespace of the test apiserver, and the agent's view of them."""

    kube: Any
    agent: KubeAgent
    node: str
    namespace: str
    env: ActuatorEnv
    core: client.CoreV1Api  # admin: the kubelet, the humans
    created: set[str] = field(default_factory=set)  # pods made in `namespace`

    def ctx(self, dry_run: bool = False, resource: str = "cpu", incident: str = "inc-1",
            inventory: list[dict[str, str]] | None = None) -> StepContext:
        return StepContext(self.node, time.time_ns(), dry_run, incident,
                           "LSLatency firing for 40s; test", lambda: list(inventory or []),
                           resource)

    def read_node(self) -> client.V1Node:
        return self.core.read_node(self.node)

    def status(self, field_: str) -> dict[str, str]:
        node = self.read_node()
        return dict(getattr(node.status, field_) or {})

    def kubectl(self, *args: str) -> str:
        path = self.kube.kubectl_path
        need(path is not None, "the cached kubectl is missing (bash scripts/kube-testenv.sh)")
        out = subprocess.run([path, "--kubeconfig", self.kube.kubeconfig_path(), *args],
                             capture_output=True, text=True, timeout=60, check=False)
        assert out.returncode == 0, out.stderr
        return out.stdout

    def pod(self, name: str, *, label: str | None = None, priority: str | None = None,
            requests: dict[str, str] | None = None, limits: dict[str, str] | None = None,
            qos: str = "BestEffort", up_s: float = 60.0, labels: dict[str, str] | None = None,
            node: str | None = None) -> client.V1Pod:
        """Create a pod bound to the node and play the kubelet: Running, Ready, started."""
        if node is None:
            self.created.add(name)
        all_labels = dict(labels or {})
        if label is not None:
            all_labels[CLASS] = label
        resources = client.V1ResourceRequirements(requests=requests, limits=limits or requests)
        self.core.create_namespaced_pod(self.namespace, client.V1Pod(
            metadata=client.V1ObjectMeta(name=name, labels=all_labels),
            spec=client.V1PodSpec(
                node_name=node or self.node, priority_class_name=priority,
                termination_grace_period_seconds=30,
                containers=[client.V1Container(name="main", image="registry.invalid/x:1",
                                               resources=resources)])))
        started = datetime.datetime.now(datetime.UTC) - datetime.timedelta(seconds=up_s)
        now = _now()
        self.core.patch_namespaced_pod_status(name, self.namespace, {"status": {
            "phase": "Running", "qosClass": qos,
            "startTime": started.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": now},
                           {"type": "ContainersReady", "status": "True",
                            "lastTransitionTime": now}]}})
        pod = self.core.read_namespaced_pod(name, self.namespace)
        assert pod.status.qos_class == qos
        return pod

    def evicted(self) -> set[str]:
        """The pods of this node an eviction made Terminating, or deleted (grace period 0)."""
        pods = self.core.list_namespaced_pod(self.namespace).items
        terminating = {p.metadata.name for p in pods if p.metadata.deletion_timestamp}
        return terminating | (self.created - {p.metadata.name for p in pods})

    def events(self, reason: str) -> list[client.CoreV1Event]:
        found = self.core.list_namespaced_event(
            "default", field_selector=f"involvedObject.name={self.node},reason={reason}")
        return found.items


@pytest.fixture(scope="session")
def priority_classes(kube) -> dict[str, int]:
    scheduling = client.SchedulingV1Api(kube.api_client())
    for name, value in PRIORITIES.items():
        scheduling.create_priority_class(client.V1PriorityClass(
            metadata=client.V1ObjectMeta(name=name), value=value))
    # The Priority admission plugin reads classes from its informer's cache: a class created a
    # moment ago can be refused as unknown (403) until the cache has it. A dry-run pod goes
    # through admission and stores nothing.
    core = client.CoreV1Api(kube.api_client())

    def admitted(name: str) -> bool:
        probe = client.V1Pod(metadata=client.V1ObjectMeta(name="priority-probe"),
                             spec=client.V1PodSpec(priority_class_name=name, containers=[
                                 client.V1Container(name="main", image="none")]))
        try:
            core.create_namespaced_pod("default", probe, dry_run="All")
        except client.exceptions.ApiException as error:
            if error.status == 403 and "no PriorityClass" in (error.body or ""):
                return False
            raise
        return True

    for name in PRIORITIES:
        _wait_for(f"the Priority admission plugin to know {name}", lambda n=name: admitted(n), 30)
    return PRIORITIES


@pytest.fixture
def world(kube, kube_agent: KubeAgent, priority_classes, tmp_path) -> Iterator[World]:
    core = client.CoreV1Api(kube.api_client())
    suffix = uuid.uuid4().hex[:8]
    node, namespace = f"node-{suffix}", f"act-{suffix}"
    core.create_node(client.V1Node(metadata=client.V1ObjectMeta(name=node)))
    # The kubelet's part: capacity is status, written through the status subresource.
    core.patch_node_status(node, {"status": {"capacity": CAPACITY, "allocatable": ALLOCATABLE}})
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
    env = ActuatorEnv(node, Ledger(tmp_path / "actuators.db"), kube=kube_agent.api_client)
    yield World(kube, kube_agent, node, namespace, env, core)
    for pod in core.list_namespaced_pod(namespace).items:  # no kubelet finishes them
        core.delete_namespaced_pod(pod.metadata.name, namespace, grace_period_seconds=0)
    core.delete_namespace(namespace)
    core.delete_node(node)


def _wait_for(what: str, check: Callable[[], bool], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


# -- cordon --------------------------------------------------------------------------------

def test_cordon_records_ownership_and_uncordons_only_its_own(world: World):
    step = Cordon({}, world.env)
    result = step.apply(world.ctx())
    assert (result.status, result.undo) == (DONE, {"owned": True})
    node = world.read_node()
    assert node.spec.unschedulable is True
    assert node.metadata.annotations[OWNER] == f"sloguard/{world.node}"
    assert node.metadata.annotations[INCIDENT] == "inc-1"
    [event] = world.events("SloguardCordoned")
    assert event.source.component == "sloguard" and "LSLatency" in event.message
    again = step.apply(world.ctx())  # idempotent: nothing written the second time
    assert (again.status, again.detail) == (DONE, "already cordoned by sloguard")
    assert world.read_node().metadata.resource_version == node.metadata.resource_version
    undone = step.undo(world.ctx(), result.undo)
    assert (undone.status, undone.detail) == (DONE, "uncordoned")
    node = world.read_node()
    assert not node.spec.unschedulable and OWNER not in (node.metadata.annotations or {})
    assert len(world.events("SloguardUncordoned")) == 1


def test_kubectl_and_the_agent_agree_on_a_human_cordon(world: World):
    assert "cordoned" in world.kubectl("cordon", world.node)  # a human drains the node
    step = Cordon({}, world.env)
    result = step.apply(world.ctx())
    assert (result.status, result.undo) == (SKIPPED, {"owned": False})
    assert "someone else" in result.detail
    assert step.undo(world.ctx(), result.undo).status == SKIPPED
    assert world.kubectl("get", "node", world.node, "-o",
                         "jsonpath={.spec.unschedulable}") == "true"
    assert "SchedulingDisabled" in world.kubectl("get", "node", world.node)
    assert world.events("SloguardCordoned") == []
    world.kubectl("uncordon", world.node)
    assert not world.read_node().spec.unschedulable


def test_kubectl_and_the_agent_agree_and_a_human_uncordon_wins(world: World):
    step = Cordon({}, world.env)
    result = step.apply(world.ctx())
    assert result.status == DONE
    assert world.kubectl("get", "node", world.node, "-o",
                         "jsonpath={.spec.unschedulable}") == "true"
    assert "SchedulingDisabled" in world.kubectl("get", "node", world.node)
    assert "already cordoned" in world.kubectl("cordon", world.node)  # kubectl sees it too
    assert "SloguardCordoned" in world.kubectl("describe", "node", world.node)
    world.kubectl("uncordon", world.node)  # the human decides otherwise
    # The ladder applies the rung again (a repeat, a retry) for the same incident: the human
    # wins, the node stays schedulable and sloguard takes its marks away.
    again = step.apply(world.ctx())
    assert (again.status, again.undo) == (SKIPPED, {"owned": False})
    assert "not applied again" in again.detail
    node = world.read_node()
    assert not node.spec.unschedulable and OWNER not in (node.metadata.annotations or {})
    # The undo of the first apply leaves the node alone as well.
    undone = step.undo(world.ctx(), result.undo)
    assert undone.status == SKIPPED and not world.read_node().spec.unschedulable
    # A new incident may cordon again.
    assert step.apply(world.ctx(incident="inc-2")).status == DONE
    assert world.read_node().spec.unschedulable


def test_cordon_by_taint_keeps_other_taints(world: World):
    world.kubectl("taint", "nodes", world.node, "dedicated=gpu:NoSchedule")

    def taints() -> set[tuple[str, str, str | None]]:
        return {(t.key, t.effect, t.value) for t in world.read_node().spec.taints or []}

    others = taints()  # the human's, and node.kubernetes.io/not-ready (no kubelet here)
    assert ("dedicated", "NoSchedule", "gpu") in others
    step = Cordon({"taint": "NoSchedule"}, world.env)
    result = step.apply(world.ctx())
    assert result.status == DONE
    assert not world.read_node().spec.unschedulable
    assert taints() == others | {(TAINT_KEY, "NoSchedule", "inc-1")}
    assert step.apply(world.ctx()).detail.endswith("already set")
    undone = step.undo(world.ctx(), result.undo)
    assert undone.status == DONE
    assert taints() == others
    assert TAINTED not in (world.read_node().metadata.annotations or {})
    # A human removing sloguard's taint wins too.
    step.apply(world.ctx(incident="inc-2"))
    world.kubectl("taint", "nodes", world.node, f"{TAINT_KEY}:NoSchedule-")
    again = step.apply(world.ctx(incident="inc-2"))
    assert again.status == SKIPPED and "not applied again" in again.detail
    assert taints() == others
    with pytest.raises(ValueError, match="taint must be one of"):
        Cordon({"taint": "NoExecute"}, world.env)


# -- reduce capacity ---------------------------------------------------------------------------

def test_reduce_capacity_by_percent_and_restore(world: World):
    step = ReduceCapacity({"percent": 50, "floor": {CPU: 3000}}, world.env)
    assert world.status("capacity")[CPU] == "8k"  # the server rewrote "8000"
    result = step.apply(world.ctx())
    assert result.status == DONE, result.detail
    capacity, allocatable = world.status("capacity"), world.status("allocatable")
    # Written in canonical form, so they read back exactly as written; compared parsed.
    assert (capacity[CPU], allocatable[CPU]) == ("4k", "3750")
    assert (capacity[MEM], allocatable[MEM]) == ("8Gi", "7680Mi")
    assert parse(allocatable[MEM]) == parse("15Gi") / 2
    assert capacity["cpu"] == "4" and allocatable["memory"] == "15Gi"  # only BE resources
    assert result.undo["values"][CPU]["capacity"] == {"was": "8k", "set": "4k"}
    state = json.loads(world.read_node().metadata.annotations[STATE])
    assert state["owner"] == f"sloguard/{world.node}" and state["values"] == result.undo[
        "values"]
    assert "kubernetes.io/batch-cpu capacity 8k -> 4k" in result.detail
    assert len(world.events("SloguardBatchCapacityReduced")) == 1
    # Applied again (a repeat, or after a restart with a fresh step): our values stand, so
    # nothing is reduced twice and nothing is written.
    version = world.read_node().metadata.resource_version
    again = ReduceCapacity({"percent": 50, "floor": {CPU: 3000}}, world.env).apply(world.ctx())
    assert again.status == DONE and again.detail.startswith("already in force")
    assert again.undo == result.undo
    assert world.read_node().metadata.resource_version == version
    undone = step.undo(world.ctx(), result.undo)
    assert undone.status == DONE, undone.detail
    assert world.status("capacity") == {**CAPACITY, CPU: "8k"}
    assert world.status("allocatable") == ALLOCATABLE
    assert STATE not in (world.read_node().metadata.annotations or {})


def test_reduce_capacity_by_step_stops_at_the_floor(world: World):
    params = {"step": {CPU: 3000}, "resources": [CPU], "floor": {CPU: "50%"}}
    result = ReduceCapacity(params, world.env).apply(world.ctx())
    assert result.status == DONE
    assert world.status("capacity")[CPU] == "5k" and world.status("allocatable")[CPU] == "4500"
    assert world.status("capacity")[MEM] == "16Gi"  # not in `resources`
    deep = ReduceCapacity({"step": {CPU: 7000}, "resources": [CPU], "floor": {CPU: 2000}},
                          world.env)
    world.core.patch_node_status(world.node, {"status": {"capacity": {CPU: "2000"},
                                                         "allocatable": {CPU: "2000"}}})
    at_floor = deep.apply(world.ctx(incident="inc-2"))
    assert at_floor.status == SKIPPED and "at its floor" in at_floor.detail


def test_a_rewritten_value_is_reduced_again_and_left_alone_on_undo(world: World):
    step = ReduceCapacity({"percent": 50, "resources": [CPU]}, world.env)
    step.apply(world.ctx())
    assert world.status("capacity")[CPU] == "4k"
    # koordlet recomputes batch capacity: our value no longer stands.
    world.core.patch_node_status(world.node, {"status": {"capacity": {CPU: "6000"},
                                                         "allocatable": {CPU: "6000"}}})
    repeat = step.apply(world.ctx())  # the policy's `repeat`
    assert repeat.status == DONE and "rewritten to 6k" in repeat.detail
    assert world.status("capacity")[CPU] == "3k"
    assert repeat.undo["values"][CPU]["capacity"] == {"was": "6k", "set": "3k"}
    # Rewritten once more before the undo: allocatable is someone else's now.
    world.core.patch_node_status(world.node, {"status": {"allocatable": {CPU: "5000"}}})
    undone = step.undo(world.ctx(), repeat.undo)
    assert undone.status == DONE
    assert "allocatable is 5k now, not sloguard's 3k (rewritten since): left as it is" in \
        undone.detail
    assert world.status("capacity")[CPU] == "6k" and world.status("allocatable")[CPU] == "5k"


def test_quantities_written_in_canonical_form_read_back_unchanged(world: World):
    from sloguard.actuators.capacity import canonical

    values = ["8000", "7500", "0.5", "17179869184", "8053063680", "1536", "1073741825", "2.5",
              "123456789", "1e3"]
    for raw in values:
        binary = raw in ("17179869184", "8053063680", "1536", "1073741825", "2.5")
        text = canonical(parse(raw), binary)
        if binary and parse(raw) >= 1024 and parse(raw) % 1024 == 0:
            assert text.endswith("i")
        world.core.patch_node_status(world.node, {"status": {"capacity": {CPU: text}}})
        assert world.status("capacity")[CPU] == text, raw


# -- evict -------------------------------------------------------------------------------------

def _ranking_refs(detail: str) -> list[str]:
    """The pods of a `1. ns/a: ...; 2. ns/b: ...` ranking, in order."""
    ranking = detail.split("ranking (", 1)[1].split("). ", 1)[0].split("): ", 1)[1]
    return [item.split(": ", 1)[0].split(". ", 1)[1] for item in ranking.split("; ")]


def test_evict_ranks_be_pods_and_evicts_the_first_never_an_ls_pod(world: World):
    ns = world.namespace
    # An LS pod that would rank first by every other criterion: lowest priority, highest
    # usage, youngest.
    world.pod("ls-web", priority="sg-low", requests={"cpu": "1"}, qos="Guaranteed", up_s=5)
    world.pod("ls-labelled", label="LS", priority="sg-low", up_s=5)  # QoS BestEffort, label LS
    world.pod("be-low-priority", priority="sg-low", up_s=600)
    world.pod("be-hungry", up_s=300)
    world.pod("be-young", up_s=60)
    world.pod("be-old", up_s=7200)
    world.pod("be-labelled", label="BE", priority="sg-high", requests={"cpu": "2"},
              qos="Guaranteed", up_s=30)  # BE by the co-location label, whatever its QoS
    uids = {p.metadata.name: p.metadata.uid for p in world.core.list_namespaced_pod(ns).items}
    usage = {"ls-web": 4.0, "ls-labelled": 3.5, "be-hungry": 1.8, "be-young": 0.5,
             "be-old": 0.5, "be-low-priority": 0.1, "be-labelled": 2.0}
    by_uid = {uids[name]: value for name, value in usage.items()}
    world.env.usage = lambda uid, resource: by_uid.get(uid) if resource == "cpu" else None
    result = Evict({"per_hour": 5, "per_incident": 5, "grace_period": 7},
                   world.env).apply(world.ctx())
    assert result.status == DONE, result.detail
    assert _ranking_refs(result.detail) == [f"{ns}/{n}" for n in (
        "be-low-priority", "be-hungry", "be-young", "be-old", "be-labelled")]
    assert f"1. {ns}/be-low-priority: priority -10, cpu 0.1 cores, up 10m" in result.detail
    assert f"2. {ns}/be-hungry: priority 0, cpu 1.8 cores, up 5m" in result.detail
    left_out = result.detail.split("Not candidates: ", 1)[1].split(", ")
    assert sorted(left_out) == [f"{ns}/ls-labelled (LS)", f"{ns}/ls-web (LS)"]
    assert result.target == f"pod/{ns}/be-low-priority"
    assert result.detail.startswith(f"evicted {ns}/be-low-priority (policy/v1beta1 Eviction)")
    assert result.undo["evicted"] == f"{ns}/be-low-priority"
    assert result.undo["ranking"][0].startswith(f"1. {ns}/be-low-priority")
    assert world.evicted() == {"be-low-priority"}
    evicted = world.core.read_namespaced_pod("be-low-priority", ns)
    assert evicted.metadata.deletion_grace_period_seconds == 7  # the step's delete options
    [event] = world.events("SloguardEvicted")
    assert event.type == "Warning" and f"{ns}/be-low-priority" in event.message
    # The next apply (a repeat) takes the next one: the evicted pod is Terminating.
    nxt = Evict({"per_hour": 5, "per_incident": 5, "grace_period": 0},
                world.env).apply(world.ctx())
    assert nxt.target == f"pod/{ns}/be-hungry"
    assert f"{ns}/be-low-priority (terminating already)" in nxt.detail
    assert world.evicted() == {"be-low-priority", "be-hungry"}
    assert "be-hungry" not in {p.metadata.name for p in world.core.list_namespaced_pod(
        ns).items}  # grace period 0: gone at once
    # Undo cannot bring pods back, and says so.
    undone = Evict({}, world.env).undo(world.ctx(), result.undo)
    assert undone.status == DONE and "not restored" in undone.detail
    assert "ls-web" not in world.evicted() and "ls-labelled" not in world.evicted()


def test_evict_falls_back_to_requests_and_says_so(world: World):
    world.pod("be-small", label="BE", requests={CPU: "500"}, qos="BestEffort")
    world.pod("be-big", label="BE", requests={CPU: "2000"}, qos="BestEffort")
    result = Evict({}, world.env).apply(world.ctx(dry_run=True))
    assert result.status == PROPOSED
    assert f"1. {world.namespace}/be-big: priority 0, cpu 2 cores requested (no usage data)" \
        in result.detail


def test_an_ls_pod_is_never_evicted(world: World):
    world.pod("ls-burstable", priority="sg-low", requests={"cpu": "100m"}, limits={"cpu": "1"},
              qos="Burstable", up_s=1)
    world.pod("ls-labelled", label="LS", priority="sg-low", up_s=1)
    be = world.pod("be-but-ls-in-the-inventory", priority="sg-low", up_s=1)
    inventory = [{"pod_uid": be.metadata.uid, "class": "LS", "level": "pod"}]
    step = Evict({"per_hour": 10, "per_incident": 10}, world.env)
    for _ in range(3):
        result = step.apply(world.ctx(inventory=inventory))
        assert result.status == SKIPPED and result.detail.startswith("no BE pod to evict")
    assert "LS by the node's cgroup inventory" in result.detail
    assert world.evicted() == set()


def test_a_pdb_blocking_the_first_candidate_moves_on_to_the_next(world: World):
    ns = world.namespace
    world.pod("guarded", priority="sg-low", labels={"app": "guarded"})
    world.pod("unguarded")
    custom = client.CustomObjectsApi(world.kube.api_client())
    custom.create_namespaced_custom_object("policy", "v1beta1", ns, "poddisruptionbudgets", {
        "apiVersion": "policy/v1beta1", "kind": "PodDisruptionBudget",
        "metadata": {"name": "guarded"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "guarded"}}}})

    def settled() -> bool:
        pdb = custom.get_namespaced_custom_object("policy", "v1beta1", ns,
                                                  "poddisruptionbudgets", "guarded")
        status = pdb.get("status") or {}
        return status.get("observedGeneration") == pdb["metadata"]["generation"] and \
            status.get("currentHealthy") == 1 and status.get("disruptionsAllowed") == 0

    _wait_for("the disruption controller to fill the PDB status", settled)
    result = Evict({"per_hour": 5, "per_incident": 5}, world.env).apply(world.ctx())
    assert result.status == DONE, result.detail
    assert _ranking_refs(result.detail) == [f"{ns}/guarded", f"{ns}/unguarded"]
    assert result.target == f"pod/{ns}/unguarded"
    assert f"{ns}/guarded: blocked by a PodDisruptionBudget (HTTP 429" in result.detail
    assert result.undo["not_evicted"][0].startswith(f"{ns}/guarded: blocked")
    assert world.evicted() == {"unguarded"}
    # Only the guarded pod is left: blocked, nothing evicted, said so.
    blocked = Evict({"per_hour": 5, "per_incident": 5}, world.env).apply(world.ctx())
    assert blocked.status == SKIPPED and "no candidate could be evicted" in blocked.detail
    assert world.evicted() == {"unguarded"}


class _Ladder:
    """The real ladder driving the real evict step, on a clock the test moves."""

    def __init__(self, world: World, tmp_path, params: dict[str, Any],
                 dry_run: bool = False) -> None:
        (tmp_path / "policies").mkdir()
        (tmp_path / "policies" / "evict.yaml").write_text(
            "policies:\n  - name: last-resort\n    undo_hold: 1s\n    steps:\n"
            "      - step: evict\n        repeat: 60s\n"
            f"        params: {json.dumps(params)}\n")
        factory = StepFactory(world.env)
        self.policies = PolicySet([str(tmp_path / "policies")], validate_step=factory.check)
        assert self.policies.reload().ok, self.policies.errors
        self.store = IncidentStore(tmp_path / "incidents.db")
        self.ladder = Ladder(world.node, self.policies, world.env.ledger, factory.make,
                             self.store.save, self.store.get, dry_run=dry_run)
        self.t0 = time.time_ns()
        self.node = world.node

    def incident(self, name: str, second: int) -> Incident:
        at = self.t0 + second * S
        incident = Incident(name, name, "LSLatency", "ls", "critical", self.node, FIRING,
                            {"pod": "web"}, at, at, fired_ns=at, policy="last-resort",
                            labels={"resource": "cpu"})
        self.store.save(incident)
        return incident

    def tick(self, second: int, *firing: Incident) -> None:
        now = self.t0 + second * S
        for incident in firing:
            incident.add_evidence(Evidence(now, 30.0, 10.0, "crossed"))
        self.ladder.tick(now, list(firing))


def test_eviction_budget_per_node_per_hour(world: World, tmp_path):
    for i in range(4):
        world.pod(f"be-{i}", up_s=60 * (i + 1))
    ladder = _Ladder(world, tmp_path, {"per_hour": 2, "per_incident": 10})
    incident = ladder.incident("inc-a", 0)
    for second in (0, 60, 120, 180):
        ladder.tick(second, incident)
    assert world.evicted() == {"be-0", "be-1"}  # shortest run time first
    audit = world.env.ledger.audit_log(kind="evict")
    assert [e.status for e in reversed(audit)] == [DONE, DONE, SKIPPED, SKIPPED]
    assert "per_hour 2" in audit[0].detail
    ladder.tick(3601, incident)  # the first eviction is more than an hour old
    assert world.evicted() == {"be-0", "be-1", "be-2"}
    # The incident carries each ranking with its reasons (the ladder's action records).
    actions = ladder.store.get("inc-a").actions
    assert [a.status for a in actions] == [DONE, DONE, SKIPPED, SKIPPED, DONE]
    assert f"1. {world.namespace}/be-0: priority 0, cpu: no usage data, no requests, up " in \
        actions[0].detail


def test_eviction_budget_per_incident(world: World, tmp_path):
    for i in range(3):
        world.pod(f"be-{i}", up_s=60 * (i + 1))
    ladder = _Ladder(world, tmp_path, {"per_hour": 10, "per_incident": 1})
    first = ladder.incident("inc-a", 0)
    for second in (0, 60, 120):
        ladder.tick(second, first)
    assert world.evicted() == {"be-0"}
    assert "per_incident 1" in world.env.ledger.audit_log(kind="evict")[0].detail
    for second in (121, 123):  # recovered: the rung is undone (a no-op for evictions)
        ladder.tick(second)
    assert world.env.ledger.rungs() == []
    second_incident = ladder.incident("inc-b", 200)
    ladder.tick(200, second_incident)
    assert world.evicted() == {"be-0", "be-1"}


def test_an_unreachable_api_server_fails_the_steps_for_a_retry(world: World, tmp_path):
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]

    def nowhere() -> client.ApiClient:
        config = client.Configuration()
        config.host = f"https://127.0.0.1:{port}"
        config.retries = False
        return client.ApiClient(config)

    env = ActuatorEnv(world.node, world.env.ledger, kube=nowhere, request_timeout_s=2)
    for step in (Evict({}, env), ReduceCapacity({"percent": 50}, env)):
        result = step.apply(world.ctx())
        assert (result.status, result.retry) == (FAILED, True), result.detail
        assert "API server unreachable" in result.detail
    undone = ReduceCapacity({"percent": 50}, env).undo(world.ctx(), {"values": {
        CPU: {"capacity": {"was": "8k", "set": "4k"}}}})
    assert (undone.status, undone.retry) == (FAILED, True)
    # The cordon step raises; the ladder records that as a failure to retry with backoff.
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "c.yaml").write_text(
        "policies:\n  - name: c\n    steps:\n      - step: cordon\n")
    factory = StepFactory(env)
    policies = PolicySet([str(tmp_path / "p")], validate_step=factory.check)
    assert policies.reload().ok
    store = IncidentStore(tmp_path / "incidents.db")
    ladder = Ladder(world.node, policies, env.ledger, factory.make, store.save, store.get,
                    dry_run=False)
    now = time.time_ns()
    incident = Incident("inc-c", "f", "LSLatency", "ls", "critical", world.node, FIRING, {},
                        now, now, fired_ns=now, policy="c")
    store.save(incident)
    ladder.tick(now, [incident])
    [row] = env.ledger.rungs()
    assert row.status == FAILED and row.retry_ns > now
    assert world.read_node().spec.unschedulable is None  # nothing changed, nothing half-done


def test_dry_run_touches_nothing(world: World):
    world.pod("be-a", up_s=30)
    before = world.read_node()
    requests_before = len(world.agent.audit())
    cordon = Cordon({}, world.env).apply(world.ctx(dry_run=True))
    taint = Cordon({"taint": "PreferNoSchedule"}, world.env).apply(world.ctx(dry_run=True))
    capacity = ReduceCapacity({"percent": 50}, world.env).apply(world.ctx(dry_run=True))
    evict = Evict({}, world.env).apply(world.ctx(dry_run=True))
    assert [r.status for r in (cordon, taint, capacity, evict)] == [PROPOSED] * 4
    assert "would set kubernetes.io/batch-cpu capacity 8k -> 4k" in capacity.detail
    assert evict.detail.startswith(f"would evict {world.namespace}/be-a")
    assert world.read_node().metadata.resource_version == before.metadata.resource_version
    assert world.evicted() == set()
    # The apiserver's own record: the agent only read.
    verbs = {e["verb"] for e in world.agent.audit()[requests_before:]}
    assert verbs <= {"get", "list"}, verbs
    undo_ctx = world.ctx(dry_run=True)
    assert ReduceCapacity({"percent": 50}, world.env).undo(undo_ctx, capacity.undo).status == \
        PROPOSED
    assert world.status("capacity")[CPU] == "8k"


def test_shadow_mode_keeps_to_the_budget_as_if_it_had_evicted(world: World, tmp_path):
    for i in range(3):
        world.pod(f"be-{i}", up_s=60 * (i + 1))
    ladder = _Ladder(world, tmp_path, {"per_hour": 2, "per_incident": 10}, dry_run=True)
    incident = ladder.incident("inc-a", 0)
    for second in (0, 60, 120):
        ladder.tick(second, incident)
    audit = list(reversed(world.env.ledger.audit_log(kind="evict")))
    assert [e.status for e in audit] == [PROPOSED, PROPOSED, SKIPPED]
    assert "per_hour 2" in audit[2].detail and all(e.dry_run for e in audit)
    assert world.evicted() == set()


# -- one incident up the whole ladder and back down ---------------------------------------------

SCENARIO_POLICY = """\
policies:
  - name: guard
    undo_hold: 1s
    stale_after: 30s
    steps:
      - step: notify
      - step: cordon
        after: 1s
      - step: reduce_capacity
        after: 1s
        params: {percent: 50}
      - step: suppress
        after: 1s
        levers:
          - step: cpu_idle
          - step: cpuset
            params: {ls_cpus: [0]}
      - step: resctrl
        after: 1s
      - step: evict
        after: 1s
        params: {per_hour: 5, per_incident: 1}
"""


def test_one_incident_walks_up_the_whole_ladder_and_back_down(world: World, real_cgroups,
                                                               tmp_path):
    """The real steps in the shipped order, driven by the real ladder: at every rung the node,
    the pods, the cgroups and the audit log are checked, then again on the way down."""
    real_cgroups.use_cpuset()
    be_cg, ls_cg = real_cgroups.create("be"), real_cgroups.create("ls")
    hog = real_cgroups.spawn(be_cg)
    real_cgroups.spawn(ls_cg, "import time\ntime.sleep(120)")
    inventory = [{"cgroup": "/" + be_cg, "class": "BE", "level": "cgroup"},
                 {"cgroup": "/" + ls_cg, "class": "LS", "level": "cgroup"}]
    world.pod("batch-a", label="BE", requests={"cpu": "1"})
    world.pod("batch-b", label="BE", requests={"cpu": "2"})
    world.pod("web", label="LS", qos="Guaranteed", requests={"cpu": "4", "memory": "1Gi"})
    (tmp_path / "policies").mkdir()
    (tmp_path / "policies" / "p.yaml").write_text(SCENARIO_POLICY)
    incidents = IncidentStore(tmp_path / "incidents.db")
    factory = StepFactory(world.env)
    policies = PolicySet([str(tmp_path / "policies")], validate_step=factory.check)
    assert policies.reload().ok, policies.errors
    ladder = Ladder(world.node, policies, world.env.ledger, factory.make, incidents.save,
                    incidents.get, inventory=lambda: [dict(w) for w in inventory],
                    dry_run=False, open_incidents=incidents.open_incidents)
    start = time.time_ns()
    incident = Incident("inc-scenario", "f", "LSLatency", "ls", "critical", world.node, FIRING,
                        {"pod": "web"}, start, start, fired_ns=start, policy="guard",
                        labels={"resource": "cpu"})
    incidents.save(incident)
    cpu_root = next(r for r in real_cgroups.hierarchies() if (r / "cpu.shares").exists())
    cpuset_root = next(r for r in real_cgroups.hierarchies() if (r / "cpuset.cpus").exists())

    def tick(second: int, firing: bool = True) -> None:
        now = start + second * S
        if firing:
            incident.add_evidence(Evidence(now, 30.0, 10.0, "crossed"))
        elif incident.state == FIRING:
            incident.state = "resolved"
            incidents.save(incident)
        ladder.tick(now, [incident] if firing else [])

    def last_audit() -> tuple[str, str, str]:
        entry = world.env.ledger.audit_log(limit=1)[0]
        return entry.action, entry.kind, entry.status

    tick(0)
    assert last_audit() == ("apply", "notify", SKIPPED)  # no notifier: says so, goes on
    tick(1)
    assert last_audit() == ("apply", "cordon", DONE)
    assert world.read_node().spec.unschedulable is True
    tick(2)
    assert last_audit() == ("apply", "reduce_capacity", DONE)
    assert parse(world.status("allocatable")[CPU]) == parse("3750")
    tick(3)
    assert last_audit() == ("apply", "cpu_idle", DONE)
    assert (cpu_root / be_cg / "cpu.idle").read_text().strip() == "1"
    assert (cpu_root / ls_cg / "cpu.idle").read_text().strip() == "0"  # never LS
    tick(4)
    assert last_audit() == ("apply", "cpuset", DONE)
    assert (cpuset_root / be_cg / "cpuset.cpus").read_text().strip() == "1"
    tick(5)
    assert last_audit()[1:] == ("resctrl", SKIPPED)  # not on this machine: skipped, not faked
    tick(6)
    assert last_audit() == ("apply", "evict", DONE)
    assert world.evicted() == {"batch-b"}  # the larger BE pod; web (LS) is never a candidate
    tick(7)  # nothing above evict: the ladder holds (no repeat configured)
    assert [e.kind for e in world.env.ledger.audit_log(limit=20)].count("evict") == 1

    for second in range(8, 16):  # recovered: one rung undone per undo_hold (1 s)
        tick(second, firing=False)
    undone = [(e.kind, e.status) for e in reversed(world.env.ledger.audit_log(limit=20))
              if e.action == "undo"]
    # the rungs that changed something, in reverse (skipped ones are dropped without a hold)
    assert [k for k, _ in undone] == ["evict", "cpuset", "cpu_idle", "reduce_capacity", "cordon"]
    assert world.env.ledger.rungs() == []
    assert (cpu_root / be_cg / "cpu.idle").read_text().strip() == "0"
    assert (cpuset_root / be_cg / "cpuset.cpus").read_text().strip() == (
        cpuset_root / be_cg).parent.joinpath("cpuset.cpus").read_text().strip()
    assert parse(world.status("allocatable")[CPU]) == parse("7500")
    assert not world.read_node().spec.unschedulable
    assert hog.poll() is None  # BE was slowed, moved and restored, never killed
    stored = incidents.get("inc-scenario")
    assert stored.annotations["lever_that_worked"] == "cpuset"
    steps = [a.step for a in stored.actions]
    assert steps[:7] == ["notify", "cordon", "reduce_capacity", "cpu_idle", "cpuset",
                         "resctrl", "evict"]
    assert steps[-1] == "undo cordon"


# -- blast radius: this node only, whatever the ClusterRole allows ---------------------------

def _about(calls: list[dict[str, Any]], name: str) -> list[str]:
    """The agent's requests that named `name` (a node or a pod), as the apiserver audited."""
    return [f"{c['verb']} {c.get('requestURI')}" for c in calls
            if (c.get("objectRef") or {}).get("name") == name or name in c.get("requestURI", "")]


def test_the_steps_refuse_to_address_any_node_but_their_own(world: World):
    from sloguard.actuators.kubeapi import NotThisNode

    other = f"other-{uuid.uuid4().hex[:8]}"
    world.core.create_node(client.V1Node(metadata=client.V1ObjectMeta(name=other)))
    try:
        victim = world.pod("be-on-the-other-node", node=other)
        for step in (Cordon({}, world.env), ReduceCapacity({"percent": 50}, world.env),
                     Evict({}, world.env)):
            api = step._api()
            name = victim.metadata.name
            for method, args, kwargs in (
                    ("read_node", (other,), {}),
                    ("patch_node", (other, {"spec": {"unschedulable": True}}), {}),
                    ("patch_node_status", (other, {"status": {}}), {}),
                    ("list_pod_for_all_namespaces", (), {}),
                    ("list_pod_for_all_namespaces", (),
                     {"field_selector": f"spec.nodeName={other}"}),
                    ("create_namespaced_event",
                     ("default", {"involvedObject": {"kind": "Node", "name": other}}), {}),
                    ("create_namespaced_pod_eviction",
                     (name, world.namespace, {"metadata": {"name": name}}), {})):
                with pytest.raises(NotThisNode, match="refused"):
                    getattr(api, method)(*args, **kwargs)
            with pytest.raises(AttributeError, match="not an API call the agent's steps"):
                api.delete_namespaced_pod(victim.metadata.name, world.namespace)
            with pytest.raises(AttributeError, match="not an API call"):
                api.patch_namespaced_pod(victim.metadata.name, world.namespace, {})
        assert world.core.read_node(other).spec.unschedulable is None
        assert victim.metadata.name not in world.evicted()
        calls = world.agent.audit()
        assert not [c for c in _about(calls, other) if c.split()[0] != "list"], \
            _about(calls, other)  # nothing about the other node left the agent but the re-read
        assert not [c for c in calls if (c.get("objectRef") or {}).get("subresource")
                    == "eviction" and c["objectRef"].get("name") == victim.metadata.name]
    finally:
        for pod in world.core.list_namespaced_pod(
                world.namespace, field_selector=f"spec.nodeName={other}").items:
            world.core.delete_namespaced_pod(pod.metadata.name, world.namespace,
                                             grace_period_seconds=0)
        world.core.delete_node(other)


def test_a_pod_rebound_elsewhere_since_the_ranking_is_not_evicted(world: World):
    """The ranking lists this node's pods; between it and the eviction the pod is replaced by
    a namesake on another node. The re-read just before the eviction finds it elsewhere."""
    ns, other = world.namespace, f"other-{uuid.uuid4().hex[:8]}"
    world.core.create_node(client.V1Node(metadata=client.V1ObjectMeta(name=other)))
    world.pod("be-moving", priority="sg-low")
    world.pod("be-staying", up_s=7200)
    swapped = []

    def usage(uid: str, resource: str) -> float | None:  # called while ranking
        if not swapped:
            swapped.append(uid)
            world.core.delete_namespaced_pod("be-moving", ns, grace_period_seconds=0)
            _wait_for("the pod to go", lambda: not world.core.list_namespaced_pod(
                ns, field_selector="metadata.name=be-moving").items)
            world.pod("be-moving", node=other)
        return None

    world.env.usage = usage
    try:
        result = Evict({"per_hour": 5, "per_incident": 5}, world.env).apply(world.ctx())
        assert result.status == DONE, result.detail
        assert result.target == f"pod/{ns}/be-staying"
        assert (f"{ns}/be-moving: refused: pod {ns}/be-moving is bound to node '{other}', "
                f"not this agent's node '{world.node}'") in result.detail
        assert world.core.read_namespaced_pod("be-moving", ns).metadata.deletion_timestamp \
            is None
        assert not [c for c in world.agent.audit() if (c.get("objectRef") or {}).get(
            "subresource") == "eviction" and c["objectRef"]["name"] == "be-moving"]
    finally:
        world.core.delete_namespaced_pod("be-moving", ns, grace_period_seconds=0)
        world.core.delete_node(other)


# -- the pod lister, the manifests, and RBAC both ways -------------------------------------------

def test_the_pod_lister_works_with_the_shipped_rbac(world: World):
    world.pod("be-a")
    world.pod("elsewhere", node="some-other-node")
    cache = PodMetadataCache(world.agent.api_client(), world.node, refresh_s=3600)
    cache.refresh()
    status = cache.status()
    assert status.ok, status.reason
    assert status.details["pods"] == 1


def test_deploy_base_renders_with_kubectl_kustomize(kube):
    path = kube.kubectl_path
    need(path is not None, "the cached kubectl is missing (bash scripts/kube-testenv.sh)")
    out = subprocess.run([path, "kustomize", str(DEPLOY_BASE)], capture_output=True, text=True,
                         timeout=60, check=True).stdout
    # The namespace and RBAC this module runs under, exactly as rendered (the workload and its
    # ConfigMaps: tests/test_deploy.py).
    rendered = [d for d in yaml.safe_load_all(out) if d and d["kind"] in ACCESS_KINDS]

    def key(obj: dict[str, Any]) -> tuple[str, str, str]:
        return obj["kind"], obj["metadata"].get("namespace", ""), obj["metadata"]["name"]

    assert sorted(rendered, key=key) == sorted(deploy_objects(), key=key)
    roles = [o for o in rendered if o["kind"] == "Role"]
    assert roles and all(r["metadata"]["namespace"] == "default" for r in roles)


def test_rbac_is_exactly_what_the_agent_uses(request, kube_agent: KubeAgent):
    """Runs last in this module: every request the agent's token made, as audited by the
    apiserver, against the rules shipped in deploy/base."""
    here = {item.name for item in request.session.items if item.module is request.module}
    if here != set(_test_names()):
        pytest.skip("needs every test of this module in the same run (it checks what they "
                    "used)")
    calls = kube_agent.audit()
    assert calls, "the agent made no requests at all"
    refused = sorted({f"{c['verb']} {c.get('requestURI')}" for c in calls
                      if c.get("responseStatus", {}).get("code") == 403})
    assert not refused, f"the shipped RBAC refused requests the agent needs: {refused}"
    used = set()
    for call in calls:
        ref = call.get("objectRef")
        if not ref:
            continue  # discovery (/api/v1, /apis): open to every authenticated user
        resource = ref["resource"] + (f"/{ref['subresource']}" if ref.get("subresource") else "")
        used.add((ref.get("apiGroup", ""), resource, call["verb"], ref.get("namespace", "")))
    unused = []
    for group, resource, verb, scope in sorted(shipped_grants()):
        if not any(u[:3] == (group, resource, verb) and scope in ("*", u[3]) for u in used):
            unused.append(f"{verb} {group or 'core'}/{resource}" + (
                f" in {scope}" if scope != "*" else ""))
    assert not unused, f"the shipped RBAC grants what the agent never used: {unused}"
    beyond = sorted(u for u in used if not any(
        g[:3] == u[:3] and g[3] in ("*", u[3]) for g in shipped_grants()))
    assert not beyond, f"requests outside the shipped RBAC that were not refused: {beyond}"


def _test_names() -> list[str]:
    return [name for name in globals() if name.startswith("test_")]


# -- evictions whose reply is lost (issue #19) --------------------------------------------------

def _losing_replies(world: World, lose: Callable[[str, str], bool]) -> None:
    """The agent's client, with the reply of each request `lose(method, url)` picks thrown
    away after the real apiserver has handled it: what a timeout after the server accepted
    looks like from the agent's side."""
    import urllib3

    api = world.agent.api_client()
    request = api.rest_client.request

    def lossy(method: str, url: str, *args: Any, **kwargs: Any) -> Any:
        if lose(method, url):
            request(method, url, *args, **kwargs)
            raise urllib3.exceptions.ReadTimeoutError(None, url, "Read timed out (test)")
        return request(method, url, *args, **kwargs)

    api.rest_client.request = lossy
    world.env.kube = lambda: api


def test_an_eviction_whose_reply_was_lost_counts_against_the_budget(world: World, tmp_path):
    for i in range(3):
        world.pod(f"be-{i}", up_s=60 * (i + 1))
    _losing_replies(world, lambda method, url: method == "POST" and url.endswith("/eviction"))
    ladder = _Ladder(world, tmp_path, {"per_hour": 10, "per_incident": 1})
    incident = ladder.incident("inc-a", 0)
    for second in (0, 10, 60, 120):  # a retry would be due at 5 s, the repeat at 60 s
        ladder.tick(second, incident)
    assert world.evicted() == {"be-0"}  # today's main evicted be-1 on the retry
    audit = [(e.status, e.detail) for e in reversed(world.env.ledger.audit_log(kind="evict"))]
    assert audit[0][0] == DONE and "the reply was lost" in audit[0][1], audit[0]
    assert [status for status, _ in audit[1:]] == [SKIPPED, SKIPPED]
    assert "per_incident 1" in audit[1][1]


def test_an_eviction_whose_outcome_is_unknown_is_looked_up_before_anything_else(
        world: World, tmp_path):
    for i in range(3):
        world.pod(f"be-{i}", up_s=60 * (i + 1))
    down, sent = [True], [False]  # once the eviction is sent, every reply is lost for a while

    def lose(method: str, url: str) -> bool:
        if url.endswith("/eviction"):
            sent[0] = True
        return down[0] and sent[0] and f"/namespaces/{world.namespace}/pods" in url

    _losing_replies(world, lose)
    ladder = _Ladder(world, tmp_path, {"per_hour": 10, "per_incident": 1})
    incident = ladder.incident("inc-a", 0)
    ladder.tick(0, incident)
    [row] = world.env.ledger.rungs()
    assert row.status == FAILED  # not known whether it happened
    [intent] = world.env.ledger.intents()
    assert intent.undo["evicting"] == f"{world.namespace}/be-0"
    down[0] = False
    ladder.tick(10, incident)  # the retry is due: the lookup comes first, and it did happen
    assert world.evicted() == {"be-0"}
    assert world.env.ledger.intents() == []
    [row] = world.env.ledger.rungs()
    assert row.status == DONE and row.undo["evicted"] == f"{world.namespace}/be-0"
    ladder.tick(75, incident)  # the repeat (60 s after the eviction was found): budget spent
    assert world.evicted() == {"be-0"}
    statuses = [e.status for e in reversed(world.env.ledger.audit_log(kind="evict"))]
    assert statuses == [FAILED, DONE, SKIPPED]


def test_an_eviction_the_ledger_could_not_record_still_counts(world: World, tmp_path,
                                                              monkeypatch):
    """A review finding: the ledger failed right after a real eviction; the step cannot be
    undone, so its intent must stay and count, or the next tick evicts a second pod."""
    from sloguard.core import failpoints

    for i in range(3):
        world.pod(f"be-{i}", up_s=60 * (i + 1))
    ladder = _Ladder(world, tmp_path, {"per_hour": 10, "per_incident": 1})
    incident = ladder.incident("inc-a", 0)
    conn = world.env.ledger._conn

    def full_after_the_eviction(name: str) -> None:
        """The settle after the eviction fails once (a busy or full file); the writes right
        after it go through again."""
        if name == "ledger.settle:before" and world.evicted() and not failed:
            failed.append(name)
            conn.execute("PRAGMA query_only = ON")
        elif failed:
            conn.execute("PRAGMA query_only = OFF")

    failed: list[str] = []

    monkeypatch.setattr(failpoints, "hit", full_after_the_eviction)
    ladder.tick(0, incident)
    assert world.evicted() == {"be-0"}
    assert "readonly" in ladder.ladder.errors.get("last-resort", ""), ladder.ladder.errors
    monkeypatch.undo()
    conn.execute("PRAGMA query_only = OFF")
    for second in (1, 10, 70):
        ladder.tick(second, incident)
    assert world.evicted() == {"be-0"}
    done = [e for e in world.env.ledger.audit_log(kind="evict") if e.status == DONE]
    assert len(done) == 1 and world.env.ledger.intents() == []
