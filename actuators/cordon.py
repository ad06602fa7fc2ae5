"""The cordon rung: no new pods land on a node whose LS pods are suffering.

What `kubectl cordon` does (spec.unschedulable = true), or, with `taint: NoSchedule` or
`PreferNoSchedule`, a taint of sloguard's own key instead. Ownership is written on the node (the
`sloguard.io/cordoned-by` annotation, with the incident), so the agent only uncordons what it
cordoned: a node a human cordoned stays cordoned, and a human who uncordons (or removes the
taint) or takes the annotation away wins: applied again for the same incident (a retry, a
`repeat`), the step finds its marks on a node that is schedulable again, removes the marks
and leaves the node as the human left it. Patches carry the resourceVersion read just before,
so a concurrent change fails the patch (retried) instead of being overwritten. Every change
leaves an Event on the node, where `kubectl describe node` shows it.
"""

from __future__ import annotations

import datetime
from typing import Any, ClassVar

from sloguard.actuators.env import ANNOTATION_PREFIX, ActuatorEnv
from sloguard.actuators.hookspecs import hookimpl
from sloguard.actuators.kube_step import KubeStep
from sloguard.actuators.kubeapi import emit_node_event
from sloguard.actuators.step import (
    DONE,
    PROPOSED,
    SKIPPED,
    StepContext,
    StepResult,
    reject_unknown,
)

OWNER = f"{ANNOTATION_PREFIX}cordoned-by"
INCIDENT = f"{ANNOTATION_PREFIX}cordon-incident"
SINCE = f"{ANNOTATION_PREFIX}cordoned-at"
TAINTED = f"{ANNOTATION_PREFIX}tainted-for"  # the incident sloguard's taint was set for
TAINT_KEY = f"{ANNOTATION_PREFIX}interference"
EFFECTS = ("NoSchedule", "PreferNoSchedule")


class Cordon(KubeStep):
    kind: ClassVar[str] = "cordon"

    def __init__(self, params: dict[str, Any], env: ActuatorEnv) -> None:
        reject_unknown(params, {"taint"}, self.kind)
        self.taint = params.get("taint")
        if self.taint is not None and self.taint not in EFFECTS:
            raise ValueError(f"taint must be one of {', '.join(EFFECTS)} (or absent: cordon)")
        self.env = env
        self.owner = f"sloguard/{env.node}"

    def _read(self) -> Any:
        return self._api().read_node(self.env.node,
                                     _request_timeout=self.env.request_timeout_s)

    def _patch(self, body: dict[str, Any]) -> None:
        self._api().patch_node(self.env.node, body, _request_timeout=self.env.request_timeout_s)

    def _event(self, reason: str, message: str) -> None:
        emit_node_event(self._api(), self.env.node, reason, message, self.env.request_timeout_s)

    def _let_go(self, ctx: StepContext, node: Any, what: str,
                marks: dict[str, None]) -> StepResult:
        """A human undid our cordon (or taint) during this incident: they win, for good."""
        detail = (f"{what} by someone after sloguard did it for incident {ctx.incident_id}: "
                  "left as they left it, not applied again")
        if not ctx.dry_run:
            self._patch({"metadata": {"resourceVersion": node.metadata.resource_version,
                                      "annotations": marks}})
        return StepResult(SKIPPED, self.target, detail, {"owned": False})

    # -- apply -------------------------------------------------------------------------------

    def apply(self, ctx: StepContext) -> StepResult:
        node = self._read()
        annotations = node.metadata.annotations or {}
        if self.taint:
            return self._apply_taint(ctx, node, annotations)
        if node.spec.unschedulable:
            if annotations.get(OWNER) == self.owner:
                return StepResult(DONE, self.target, "already cordoned by sloguard",
                                  {"owned": True})
            return StepResult(SKIPPED, self.target,
                              "already cordoned by someone else: left to them", {"owned": False})
        if annotations.get(OWNER) == self.owner and annotations.get(INCIDENT) == ctx.incident_id:
            return self._let_go(ctx, node, "uncordoned",
                                {OWNER: None, INCIDENT: None, SINCE: None})
        if ctx.dry_run:
            return StepResult(PROPOSED, self.target, "would cordon the node (spec.unschedulable)",
                              {"owned": True})
        ctx.intend({"owned": True})  # write-ahead: a cordon the agent dies in is undone
        self._patch({
            "metadata": {"resourceVersion": node.metadata.resource_version, "annotations": {
                OWNER: self.owner, INCIDENT: ctx.incident_id, SINCE: _stamp(ctx.now_ns)}},
            "spec": {"unschedulable": True},
        })
        self._event("SloguardCordoned", f"cordoned (spec.unschedulable): {ctx.reason}")
        return StepResult(DONE, self.target, "cordoned (spec.unschedulable)", {"owned": True})

    def _apply_taint(self, ctx: StepContext, node: Any, annotations: dict[str, str]) -> StepResult:
        taints = list(node.spec.taints or [])
        if any(t.key == TAINT_KEY and t.effect == self.taint for t in taints):
            return StepResult(DONE, self.target, f"taint {TAINT_KEY}:{self.taint} already set",
                              {"owned": True, "taint": self.taint})
        if annotations.get(TAINTED) == ctx.incident_id:
            return self._let_go(ctx, node, f"taint {TAINT_KEY} removed", {TAINTED: None})
        if ctx.dry_run:
            return StepResult(PROPOSED, self.target, f"would taint {TAINT_KEY}:{self.taint}",
                              {"owned": True, "taint": self.taint})
        ctx.intend({"owned": True, "taint": self.taint})
        kept = [_taint_dict(t) for t in taints]
        kept.append({"key": TAINT_KEY, "value": ctx.incident_id, "effect": self.taint})
        self._patch({"metadata": {"resourceVersion": node.metadata.resource_version,
                                  "annotations": {TAINTED: ctx.incident_id}},
                     "spec": {"taints": kept}})
        self._event("SloguardTainted", f"tainted {TAINT_KEY}:{self.taint}: {ctx.reason}")
        return StepResult(DONE, self.target, f"tainted {TAINT_KEY}:{self.taint}",
                          {"owned": True, "taint": self.taint})

    # -- undo --------------------------------------------------------------------------------

    def undo(self, ctx: StepContext, undo: dict[str, Any]) -> StepResult:
        if not undo.get("owned"):
            return StepResult(SKIPPED, self.target, "not cordoned by sloguard: left as it is")
        node = self._read()
        annotations = node.metadata.annotations or {}
        if undo.get("taint"):
            marks = {TAINTED: None} if TAINTED in annotations else {}
            taints = list(node.spec.taints or [])
            kept = [t for t in taints if t.key != TAINT_KEY]
            if len(kept) == len(taints):
                if marks and not ctx.dry_run:
                    self._patch({"metadata": {"resourceVersion": node.metadata.resource_version,
                                              "annotations": marks}})
                return StepResult(DONE, self.target, "our taint is already gone")
            if ctx.dry_run:
                return StepResult(PROPOSED, self.target, f"would remove taint {TAINT_KEY}")
            self._patch({"metadata": {"resourceVersion": node.metadata.resource_version,
                                      "annotations": marks},
                         "spec": {"taints": [_taint_dict(t) for t in kept] or None}})
            self._event("SloguardUntainted", f"removed taint {TAINT_KEY}: {ctx.reason}")
            return StepResult(DONE, self.target, f"removed taint {TAINT_KEY}")
        if annotations.get(OWNER) != self.owner:
            return StepResult(SKIPPED, self.target, "the cordon is no longer sloguard's (its "
                                                    "annotation changed): left as it is")
        if ctx.dry_run:
            return StepResult(PROPOSED, self.target, "would uncordon the node")
        release = {OWNER: None, INCIDENT: None, SINCE: None}
        if not node.spec.unschedulable:  # a human uncordoned already: just drop our marks
            self._patch({"metadata": {"resourceVersion": node.metadata.resource_version,
                                      "annotations": release}})
            return StepResult(DONE, self.target, "someone uncordoned it already")
        self._patch({"metadata": {"resourceVersion": node.metadata.resource_version,
                                  "annotations": release},
                     "spec": {"unschedulable": None}})
        self._event("SloguardUncordoned", f"uncordoned: {ctx.reason}")
        return StepResult(DONE, self.target, "uncordoned")


def _taint_dict(taint: Any) -> dict[str, Any]:
    out = {"key": taint.key, "effect": taint.effect}
    if taint.value is not None:
        out["value"] = taint.value
    if taint.time_added is not None:
        out["timeAdded"] = taint.time_added.isoformat()
    return out


def _stamp(now_ns: int) -> str:
    return datetime.datetime.fromtimestamp(now_ns / 1e9, datetime.UTC).strftime(
        "%Y-%m-%dT%H:%M:%SZ")


@hookimpl
def sloguard_steps() -> list[type]:
    return [Cordon]
