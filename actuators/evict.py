"""The last rung: evict one best-effort pod, the one whose loss costs least and helps most.

Candidates are the pods bound to this node that are BE, and only those: the co-location label
(`koordinator.sh/qosClass`) decides when present, else the Kubernetes QoS class BestEffort;
a pod with neither is protected as LS (the same rule as collectors/kube_pods.py). A pod that
the node's cgroup inventory classes LS is protected too: both sources must agree it is BE.
Pods that eviction cannot help with are left out and said so: pods already terminating or
finished, mirror pods (the kubelet owns them), and DaemonSet pods (recreated on this node).

Ranking: the incident's suspects first, in their order (detector/attribution/: the BE
workload the LS slowdown is attributed to, with the evidence, is the one whose eviction helps),
then priority (lowest first), then usage of the contended resource
(highest first; measured usage through `ActuatorEnv.usage` when the agent has it, else the
pod's requests, which the ranking then says), then run time (shortest first: the least work
lost). The ranking with its reasons is the step's detail, so it lands in the incident.

Eviction goes through the Eviction API, so PodDisruptionBudgets hold: a 429 moves on to the
next candidate and is recorded. The Eviction's group/version comes from discovery, as kubectl
drain does it (policy/v1 on 1.22+, policy/v1beta1 on 1.20). Each apply evicts at most one pod;
the policy's `repeat` evicts the next while interference persists, within the budgets
(`per_hour` per node, `per_incident`), which are counted in the ledger's audit log and so
survive restarts. Evicted pods are not restored: their controllers recreate them elsewhere.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, ClassVar

from sloguard.actuators.env import ActuatorEnv
from sloguard.actuators.hookspecs import hookimpl
from sloguard.actuators.kube_step import KubeStep
from sloguard.actuators.kubeapi import (
    NotThisNode,
    api_status,
    describe,
    emit_node_event,
    transient,
)
from sloguard.actuators.step import (
    BE,
    DONE,
    FAILED,
    PROPOSED,
    SKIPPED,
    StepContext,
    StepResult,
    reject_unknown,
)
from sloguard.core.pods import PodMeta, pod_class

CLASS_LABEL = "koordinator.sh/qosClass"
MIRROR = "kubernetes.io/config.mirror"
HOUR_NS = 3600 * 1_000_000_000
# What the contended resource is called in pod requests: the standard resource, and the
# extended one Koordinator's BE pods request instead (batch-cpu in milli-cores).
REQUESTS = {
    "cpu": (("cpu", 1), ("kubernetes.io/batch-cpu", 0.001)),
    "memory": (("memory", 1), ("kubernetes.io/batch-memory", 1)),
}


@dataclass(frozen=True)
class Candidate:
    namespace: str
    name: str
    uid: str
    priority: int
    usage: float | None  # of the contended resource: cores or bytes; None when unknown
    source: str  # "usage" | "requests" | "none"
    up_s: float
    suspect: int = 0  # its rank among the incident's suspects; 0: not a suspect
    why_suspect: str = ""  # the suspect's score and strongest clue

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"


def _quantity(value: Any) -> float:
    from kubernetes.utils import parse_quantity

    try:
        return float(parse_quantity(value))
    except (ValueError, ArithmeticError, TypeError):
        return 0.0


def requested(pod: Any, resource: str) -> float | None:
    """The pod's requests of `resource` (cores or bytes), None when it names none."""
    names = REQUESTS.get(resource)
    if not names:
        return None
    total, seen = 0.0, False
    for container in pod.spec.containers or []:
        requests = (container.resources.requests if container.resources else None) or {}
        for name, scale in names:
            if name in requests:
                total += _quantity(requests[name]) * scale
                seen = True
    return total if seen else None


def classify(pod: Any, class_label: str) -> str:
    """LS or BE, by the rule the collectors use; no label and no QoS class is LS."""
    meta = PodMeta(pod.metadata.name, pod.metadata.namespace, pod.metadata.uid or "",
                   labels=dict(pod.metadata.labels or {}),
                   qos_class=(pod.status.qos_class if pod.status else None) or "")
    return pod_class(meta, "", class_label)


def _excluded(pod: Any) -> str:
    """Why evicting `pod` cannot help (empty when it can)."""
    if pod.metadata.deletion_timestamp is not None:
        return "terminating already"
    phase = pod.status.phase if pod.status else None
    if phase in ("Succeeded", "Failed"):
        return f"finished ({phase})"
    if MIRROR in (pod.metadata.annotations or {}):
        return "a mirror (static) pod"
    for owner in pod.metadata.owner_references or []:
        if owner.kind == "DaemonSet" and owner.controller:
            return "a DaemonSet pod (it would come back on this node)"
    return ""


def rank(pods: Iterable[Any], resource: str, now_ns: int,
         usage: Callable[[str, str], float | None] | None = None,
         class_label: str = CLASS_LABEL,
         inventory: Iterable[dict[str, str]] = (),
         suspects: Iterable[Any] = ()) -> tuple[list[Candidate], list[str]]:
    """The BE pods that may be evicted, best victim first, and why each other pod is not one.

    Only a pod that is BE by the API and not LS by the node's inventory is ever a candidate.
    `suspects` (core/suspects.py, first first) put the pods they name ahead of the others.
    """
    suspected = {}
    for suspect in suspects:
        uid = suspect.workload.get("pod_uid")
        if uid and uid not in suspected:
            clue = suspect.clues[0].text if suspect.clues else ""
            suspected[uid] = (suspect.rank, f"suspect #{suspect.rank} (score "
                                            f"{suspect.score:.2f}{': ' + clue if clue else ''})")
    ls_in_inventory = {w.get("pod_uid") for w in inventory
                       if w.get("pod_uid") and w.get("class") != BE}
    candidates: list[Candidate] = []
    left_out: list[str] = []
    for pod in pods:
        ref = f"{pod.metadata.namespace}/{pod.metadata.name}"
        if classify(pod, class_label) != BE:
            left_out.append(f"{ref} (LS)")
            continue
        if pod.metadata.uid in ls_in_inventory:
            left_out.append(f"{ref} (LS by the node's cgroup inventory)")
            continue
        why = _excluded(pod)
        if why:
            left_out.append(f"{ref} ({why})")
            continue
        measured = usage(pod.metadata.uid, resource) if usage is not None and resource else None
        if measured is not None:
            amount, source = float(measured), "usage"
        else:
            amount = requested(pod, resource) if resource else None
            source = "requests" if amount is not None else "none"
        started = (pod.status.start_time if pod.status else None) or \
            pod.metadata.creation_timestamp
        up_s = max(0.0, now_ns / 1e9 - started.timestamp()) if started else 0.0
        rank_of, why = suspected.get(pod.metadata.uid or "", (0, ""))
        candidates.append(Candidate(pod.metadata.namespace, pod.metadata.name,
                                    pod.metadata.uid or "", pod.spec.priority or 0, amount,
                                    source, up_s, rank_of, why))
    candidates.sort(key=lambda c: (c.suspect or len(suspected) + 1, c.priority,
                                   -(c.usage or 0.0), c.up_s, c.ref))
    return candidates, left_out


def _amount(resource: str, value: float) -> str:
    if resource == "cpu":
        return f"{value:.2f}".rstrip("0").rstrip(".") + " cores"
    if resource == "memory":
        for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
            if value >= size:
                return f"{value / size:.1f} {unit}"
        return f"{value:.0f} B"
    return f"{value:g}"


def _age(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    if seconds < 172800:
        return f"{seconds / 3600:.0f}h"
    return f"{seconds / 86400:.0f}d"


def reasons(candidate: Candidate, resource: str) -> str:
    """`priority 0, cpu 1.8 cores, up 3m`: what put the pod where it is in the ranking."""
    parts = [candidate.why_suspect] if candidate.why_suspect else []
    parts.append(f"priority {candidate.priority}")
    if resource:
        if candidate.source == "usage" and candidate.usage is not None:
            parts.append(f"{resource} {_amount(resource, candidate.usage)}")
        elif candidate.source == "requests" and candidate.usage is not None:
            parts.append(f"{resource} {_amount(resource, candidate.usage)} requested "
                         "(no usage data)")
        else:
            parts.append(f"{resource}: no usage data, no requests")
    parts.append(f"up {_age(candidate.up_s)}")
    return ", ".join(parts)


def ranking_text(candidates: list[Candidate], resource: str) -> list[str]:
    return [f"{i}. {c.ref}: {reasons(c, resource)}" for i, c in enumerate(candidates, 1)]


class Evict(KubeStep):
    kind: ClassVar[str] = "evict"

    def __init__(self, params: dict[str, Any], env: ActuatorEnv) -> None:
        reject_unknown(params, {"per_hour", "per_incident", "grace_period", "class_label"},
                       self.kind)
        self.per_hour = _count(params, "per_hour", 1)
        self.per_incident = _count(params, "per_incident", 1)
        grace = params.get("grace_period")
        if grace is not None and (isinstance(grace, bool) or not isinstance(grace, int)
                                  or grace < 0):
            raise ValueError("grace_period must be a whole number of seconds >= 0 (absent: "
                             "the pod's own terminationGracePeriodSeconds)")
        self.grace_period: int | None = grace
        label = params.get("class_label", CLASS_LABEL)
        if not isinstance(label, str) or not label:
            raise ValueError("class_label must be a label name")
        self.class_label = label
        self.env = env
        self._eviction_version = ""

    def eviction_version(self) -> str:
        """`policy/v1` or `policy/v1beta1`: what the server says pods/eviction takes.

        As kubectl drain does: the pods/eviction entry of the core API's discovery names the
        Eviction kind's group and version; policy/v1beta1 when it names none (old servers).
        """
        if not self._eviction_version:
            resources = self._api().get_api_resources(_request_timeout=self.env.request_timeout_s)
            found = next((r for r in resources.resources if r.name == "pods/eviction"), None)
            if found is None:
                raise LookupError("the API server does not serve pods/eviction")
            if found.group and found.version:
                self._eviction_version = f"{found.group}/{found.version}"
            else:
                self._eviction_version = "policy/v1beta1"
        return self._eviction_version

    # -- apply -------------------------------------------------------------------------------

    def _budget(self, ctx: StepContext) -> str:
        """Why no eviction is allowed now ('' when one is)."""
        ledger = self.env.ledger
        # Shadow mode counts its own proposals, so it proposes what the budget would allow.
        statuses = (DONE, PROPOSED) if ctx.dry_run else (DONE,)
        # an eviction whose outcome is not known yet (the reply was lost, the agent died in
        # it: an intent the ladder has not reconciled) counts as spent until it is known
        pending = [] if ctx.dry_run else [i for i in ledger.intents() if i.kind == self.kind]
        hour = sum(ledger.count(self.kind, s, ctx.now_ns - HOUR_NS) for s in statuses)
        hour += len(pending)
        if hour >= self.per_hour:
            return f"budget spent: {hour} eviction(s) on this node in the last hour " \
                   f"(per_hour {self.per_hour})"
        incident = sum(ledger.count(self.kind, s, 0, ctx.incident_id) for s in statuses)
        incident += sum(1 for i in pending if i.incident == ctx.incident_id)
        if incident >= self.per_incident:
            return f"budget spent: {incident} eviction(s) for incident {ctx.incident_id} " \
                   f"(per_incident {self.per_incident})"
        return ""

    def apply(self, ctx: StepContext) -> StepResult:
        spent = self._budget(ctx)
        if spent:
            return StepResult(SKIPPED, self.target, spent)
        try:
            pods = self._api().list_pod_for_all_namespaces(
                field_selector=f"spec.nodeName={self.env.node}",
                _request_timeout=self.env.request_timeout_s).items
        except Exception as exc:
            return self._failed(exc, "listing the node's pods")
        candidates, left_out = rank(pods, ctx.resource, ctx.now_ns, self.env.usage,
                                    self.class_label, ctx.inventory(), ctx.suspects)
        lines = ranking_text(candidates, ctx.resource)
        undo: dict[str, Any] = {"ranking": lines, "left_out": left_out}
        contended = f"contended: {ctx.resource}" if ctx.resource else "contended resource unknown"
        ranking = f"ranking ({contended}): " + ("; ".join(lines) or "none")
        if left_out:
            ranking += ". Not candidates: " + ", ".join(left_out)
        if not candidates:
            return StepResult(SKIPPED, self.target, f"no BE pod to evict; {ranking}", undo)
        if ctx.dry_run:
            top = candidates[0]
            undo["evicted"] = top.ref
            return StepResult(PROPOSED, f"pod/{top.ref}",
                              f"would evict {top.ref} (PodDisruptionBudgets are only consulted "
                              f"when evicting for real); {ranking}", undo)
        try:
            version = self.eviction_version()
        except Exception as exc:
            return self._failed(exc, "discovering the Eviction API version", ranking, undo)
        blocked: list[str] = []
        for candidate in candidates:
            # write-ahead: an eviction the agent dies in (or whose reply is lost) is looked up
            # before anything else, so that it is counted and never followed by a second one
            ctx.intend({**undo, "evicting": candidate.ref, "namespace": candidate.namespace,
                        "name": candidate.name, "uid": candidate.uid, "not_evicted": blocked})
            lost = ""
            try:
                self._evict(candidate, version)
            except Exception as exc:
                status = api_status(exc)
                if isinstance(exc, NotThisNode):  # re-read just before: bound elsewhere now
                    blocked.append(f"{candidate.ref}: {exc}")
                    continue
                if status not in (404, 409, 429):
                    # the server may have taken it and the reply been lost (a timeout, a
                    # dropped connection, a 5xx from a proxy): the pod says which
                    try:
                        evicted = self.evicted(candidate.namespace, candidate.name,
                                               candidate.uid)
                    except Exception as check:
                        undo["not_evicted"] = blocked
                        undo.update(evicting=candidate.ref, namespace=candidate.namespace,
                                    name=candidate.name, uid=candidate.uid)
                        return self._failed(exc, f"evicting {candidate.ref} (and then "
                                                 f"looking it up: {describe(check)})",
                                            ranking, undo)
                    if evicted:
                        lost = f" (the reply was lost: {describe(exc)}; the pod is {evicted})"
                if lost:
                    pass  # it was evicted: counted below like any other
                elif status == 429:
                    blocked.append(f"{candidate.ref}: blocked by a PodDisruptionBudget "
                                   f"({describe(exc)})")
                    continue
                elif status == 404:
                    blocked.append(f"{candidate.ref}: gone already")
                    continue
                elif status == 409:  # the uid precondition: a namesake replaced the pod
                    blocked.append(f"{candidate.ref}: replaced by a new pod since the ranking")
                    continue
                else:
                    undo["not_evicted"] = blocked
                    return self._failed(exc, f"evicting {candidate.ref}", ranking, undo)
            undo["evicted"] = candidate.ref
            undo["uid"] = candidate.uid
            undo["not_evicted"] = blocked
            said = f"evicted {candidate.ref} ({version} Eviction){lost}"
            if blocked:
                said += "; before it: " + "; ".join(blocked)
            emit_node_event(self._api(), self.env.node, "SloguardEvicted",
                            f"{said}: {ctx.reason}", self.env.request_timeout_s, warning=True)
            return StepResult(DONE, f"pod/{candidate.ref}", f"{said}; {ranking}", undo)
        undo["not_evicted"] = blocked
        return StepResult(SKIPPED, self.target,
                          "no candidate could be evicted: " + "; ".join(blocked) + f"; {ranking}",
                          undo)

    def evicted(self, namespace: str, name: str, uid: str) -> str:
        """How the pod shows it was evicted ('' when it was not): gone, replaced by a namesake,
        or terminating."""
        pod = self._api().find_pod(name, namespace, self.env.request_timeout_s)
        if pod is None:
            return "gone"
        if uid and pod.metadata.uid != uid:
            return "gone (a new pod has its name)"
        if pod.metadata.deletion_timestamp is not None:
            return "terminating"
        return ""

    def recover(self, ctx: StepContext, undo: dict[str, Any]) -> StepResult:
        """An eviction the agent died in, or whose reply was lost: did it happen? Counted in
        the budget when it did; never repeated blindly (a second apply evicts the next pod)."""
        ref = undo.get("evicting", "")
        if not ref:
            return StepResult(SKIPPED, self.target, "no eviction was under way")
        try:
            evicted = self.evicted(undo.get("namespace", ""), undo.get("name", ""),
                                   undo.get("uid", ""))
        except Exception as exc:
            return self._failed(exc, f"looking up {ref}, whose eviction was under way")
        if evicted:
            return StepResult(DONE, f"pod/{ref}", f"evicted {ref}: the pod is {evicted} "
                                                  "(the outcome was not recorded in time)",
                              {**undo, "evicted": ref})
        return StepResult(SKIPPED, f"pod/{ref}", f"{ref} was not evicted (the agent stopped "
                                                 "before the eviction took)")

    def _evict(self, candidate: Candidate, version: str) -> None:
        body: dict[str, Any] = {
            "apiVersion": version,
            "kind": "Eviction",
            "metadata": {"name": candidate.name, "namespace": candidate.namespace},
            # Evict the pod that was ranked, not a namesake created since.
            "deleteOptions": {"preconditions": {"uid": candidate.uid}},
        }
        if self.grace_period is not None:
            body["deleteOptions"]["gracePeriodSeconds"] = self.grace_period
        self._api().create_namespaced_pod_eviction(
            candidate.name, candidate.namespace, body,
            _request_timeout=self.env.request_timeout_s)

    def _failed(self, exc: Exception, doing: str, ranking: str = "",
                undo: dict[str, Any] | None = None) -> StepResult:
        detail = f"{doing}: {describe(exc)}" + (f"; {ranking}" if ranking else "")
        return StepResult(FAILED, self.target, detail, undo or {}, retry=transient(exc))

    # -- undo --------------------------------------------------------------------------------

    def undo(self, ctx: StepContext, undo: dict[str, Any]) -> StepResult:
        return StepResult(DONE, self.target, "evicted pods are not restored; their controllers "
                                             "recreate them elsewhere")


def _count(params: dict[str, Any], name: str, default: int) -> int:
    value = params.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be a whole number >= 0")
    return value


@hookimpl
def sloguard_steps() -> list[type]:
    return [Evict]
