"""The reduce-capacity rung: fewer BE pods are admitted to a node whose LS pods are suffering.

Co-location schedulers (Koordinator, and the colocation managers built like it) admit BE pods
against extended resources that the node advertises, by default `kubernetes.io/batch-cpu`
(milli-cores: "8000" is 8 cores) and `kubernetes.io/batch-memory` (bytes). Lowering them in
the node's status.capacity and status.allocatable makes the scheduler place fewer BE pods here
without touching the ones running (that is what the later rungs are for).

Status is only writable through the nodes/status subresource (a node patch that carries status
is silently ignored), and the server rewrites quantities ("8000" comes back as "8k"), so values
are parsed and compared as quantities, and written in canonical form so they read back as
written.

The value only holds while it stands: koordlet (or whichever component computes batch
capacity) rewrites it on its own schedule, typically every minute. Set `repeat` on the step
in the policy: each repeat that finds a value rewritten reduces again from the new value, and
finds its own value standing a no-op. What the agent changed is recorded on the node (the
`sloguard.io/batch-capacity` annotation) as well as in the ledger, so a restarted agent
neither reduces twice nor forgets the original; on undo a value someone changed since is left
alone.
"""

from __future__ import annotations

import json
from decimal import ROUND_CEILING, ROUND_FLOOR, Decimal
from typing import Any, ClassVar

from sloguard.actuators.env import ANNOTATION_PREFIX, ActuatorEnv
from sloguard.actuators.hookspecs import hookimpl
from sloguard.actuators.kube_step import KubeStep
from sloguard.actuators.kubeapi import api_status, describe, emit_node_event, transient
from sloguard.actuators.step import (
    DONE,
    FAILED,
    PROPOSED,
    SKIPPED,
    StepContext,
    StepResult,
    reject_unknown,
)

DEFAULT_RESOURCES = ("kubernetes.io/batch-cpu", "kubernetes.io/batch-memory")
STATE = f"{ANNOTATION_PREFIX}batch-capacity"
FIELDS = ("capacity", "allocatable")

_DECIMAL_SUFFIXES = {-9: "n", -6: "u", -3: "m", 0: "", 3: "k", 6: "M", 9: "G", 12: "T",
                     15: "P", 18: "E"}
_BINARY_SUFFIXES = ("", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei")


def parse(value: Any) -> Decimal:
    """A quantity ("8k", "16Gi", "500m", 8000) as a number; ValueError when it is not one."""
    from kubernetes.utils import parse_quantity

    if isinstance(value, bool):
        raise ValueError(f"not a quantity: {value!r}")
    try:
        return Decimal(parse_quantity(value))
    except (ValueError, ArithmeticError, TypeError) as exc:
        raise ValueError(f"not a quantity: {value!r}") from exc


def canonical(value: Decimal, binary: bool = False) -> str:
    """`value` as the API server would print it, so that what is written reads back the same.

    apimachinery's rules: decimal-SI uses the largest power-of-1000 suffix that leaves an
    integer mantissa ("8000" -> "8k", "7500" stays, "0.5" -> "500m"); binary-SI (kept when
    the original had a Ki/Mi/... suffix) the largest power of 1024, for integers of at least
    1024 only (smaller or fractional values fall back to decimal-SI). Precision is nano,
    rounded up.
    """
    value = value.quantize(Decimal("1e-9"), rounding=ROUND_CEILING)
    if value == 0:
        return "0"
    sign = "-" if value < 0 else ""
    value = abs(value)
    if binary and value == value.to_integral_value() and value >= 1024:
        number, power = int(value), 0
        while power < len(_BINARY_SUFFIXES) - 1 and number % 1024 == 0:
            number //= 1024
            power += 1
        return f"{sign}{number}{_BINARY_SUFFIXES[power]}"
    _, digits, exponent = value.normalize().as_tuple()
    mantissa = int("".join(map(str, digits)))
    assert isinstance(exponent, int)
    three = min(18, exponent - exponent % 3)  # the largest multiple of 3 not above it
    mantissa *= 10 ** (exponent - three)
    return f"{sign}{mantissa}{_DECIMAL_SUFFIXES[three]}"


def _binary(text: str) -> bool:
    return str(text).endswith("i")


class ReduceCapacity(KubeStep):
    kind: ClassVar[str] = "reduce_capacity"

    def __init__(self, params: dict[str, Any], env: ActuatorEnv) -> None:
        reject_unknown(params, {"resources", "step", "percent", "floor"}, self.kind)
        resources = params.get("resources", list(DEFAULT_RESOURCES))
        if (not isinstance(resources, list) or not resources
                or not all(isinstance(r, str) and r for r in resources)):
            raise ValueError("resources must be a non-empty list of resource names")
        if len(set(resources)) != len(resources):
            raise ValueError("resources lists a name twice")
        self.resources: list[str] = resources
        if ("step" in params) == ("percent" in params):
            raise ValueError("give exactly one of `step` (an amount per resource) or `percent`")
        self.step: dict[str, Decimal] = {}
        self.percent: Decimal | None = None
        if "step" in params:
            step = params["step"]
            if not isinstance(step, dict):
                raise ValueError("step must map each resource to a quantity, e.g. "
                                 "{kubernetes.io/batch-cpu: 2000, kubernetes.io/batch-memory: "
                                 "4Gi}")
            self._known(step, "step")
            missing = [r for r in resources if r not in step]
            if missing:
                raise ValueError(f"step names no amount for {', '.join(missing)}")
            for name, amount in step.items():
                self.step[name] = parse(amount)
                if self.step[name] <= 0:
                    raise ValueError(f"step for {name} must be positive")
        else:
            percent = params["percent"]
            if isinstance(percent, bool) or not isinstance(percent, int | float) or not (
                    0 < percent <= 100):
                raise ValueError("percent must be a number in (0, 100]")
            self.percent = Decimal(str(percent))
        floor = params.get("floor", {})
        if not isinstance(floor, dict):
            raise ValueError("floor must map resources to a quantity or a percentage of the "
                             "value before the reduction (\"25%\")")
        self._known(floor, "floor")
        self.floor: dict[str, tuple[Decimal, bool]] = {}  # name -> (amount, is a percentage)
        for name, value in floor.items():
            if isinstance(value, str) and value.strip().endswith("%"):
                pct = parse(value.strip()[:-1])
                if not 0 <= pct <= 100:
                    raise ValueError(f"floor for {name} must be between 0% and 100%")
                self.floor[name] = (pct, True)
            else:
                amount = parse(value)
                if amount < 0:
                    raise ValueError(f"floor for {name} must not be negative")
                self.floor[name] = (amount, False)
        self.env = env
        self.owner = f"sloguard/{env.node}"

    def _known(self, mapping: dict[str, Any], what: str) -> None:
        unknown = [k for k in mapping if k not in self.resources]
        if unknown:
            raise ValueError(f"{what} names {', '.join(map(str, unknown))}, not in resources "
                             f"({', '.join(self.resources)})")

    # -- the arithmetic ------------------------------------------------------------------------

    def reduced(self, name: str, was: str) -> str:
        """The value to set for `name` when `was` stands: reduced by the step or percentage,
        not below the floor, never above `was`; integer when `was` is, else milli."""
        original = parse(was)
        if self.percent is not None:
            value = original * (100 - self.percent) / 100
        else:
            value = original - self.step[name]
        floor = Decimal(0)
        if name in self.floor:
            amount, is_pct = self.floor[name]
            floor = original * amount / 100 if is_pct else amount
        unit = Decimal(1) if original == original.to_integral_value() else Decimal("0.001")
        value = max(value.quantize(unit, rounding=ROUND_FLOOR),
                    floor.quantize(unit, rounding=ROUND_CEILING), Decimal(0))
        return canonical(min(value, original), _binary(was))

    # -- apply ---------------------------------------------------------------------------------

    def _state(self, node: Any) -> dict[str, Any]:
        """What this agent set, from the node's annotation (another owner's is not ours)."""
        raw = (node.metadata.annotations or {}).get(STATE)
        try:
            state = json.loads(raw) if raw else {}
        except ValueError:
            return {}
        if not isinstance(state, dict) or state.get("owner") != self.owner:
            return {}
        values = state.get("values")
        return values if isinstance(values, dict) else {}

    def apply(self, ctx: StepContext) -> StepResult:
        try:
            node = self._read()
        except Exception as exc:
            return self._failed(exc, "reading the node")
        status = node.status
        current = {"capacity": dict(status.capacity or {}) if status else {},
                   "allocatable": dict(status.allocatable or {}) if status else {}}
        mine = self._state(node)
        standing: dict[str, dict[str, dict[str, str]]] = {}  # our values still in place
        changes: dict[str, dict[str, dict[str, str]]] = {}
        notes: list[str] = []
        for name in self.resources:
            if all(name not in current[f] for f in FIELDS):
                notes.append(f"the node does not advertise {name}")
                continue
            for field in FIELDS:
                now = current[field].get(name)
                if now is None:
                    continue
                ours = mine.get(name, {}).get(field)
                if ours and parse(now) == parse(ours["set"]):
                    standing.setdefault(name, {})[field] = ours
                    continue
                if ours:
                    notes.append(f"{name} {field} was rewritten to {now} since sloguard set "
                                 f"{ours['set']}: reducing from {now}")
                want = self.reduced(name, now)
                if parse(want) >= parse(now):
                    notes.append(f"{name} {field} {now} is at its floor")
                    continue
                changes.setdefault(name, {})[field] = {"was": str(now), "set": want}
        values = {name: {**standing.get(name, {}), **changes.get(name, {})}
                  for name in self.resources if name in standing or name in changes}
        undo = {"values": values}
        if not changes:
            if standing:
                return StepResult(DONE, self.target, "already in force: " + _describe(values),
                                  undo)
            return StepResult(SKIPPED, self.target, "nothing to reduce: " + "; ".join(notes))
        said = _describe(changes) + (f" ({'; '.join(notes)})" if notes else "")
        if ctx.dry_run:
            return StepResult(PROPOSED, self.target, f"would set {said}", undo)
        state = json.dumps({"owner": self.owner, "incident": ctx.incident_id, "values": values},
                           sort_keys=True, separators=(",", ":"))
        ctx.intend(undo)  # write-ahead: what the values were, before any of them changes
        try:
            # The record first: if the status patch then fails, the record names values that do
            # not stand, which the next apply and the undo both recognise as not ours.
            marked = self._api().patch_node(
                self.env.node,
                {"metadata": {"resourceVersion": node.metadata.resource_version,
                              "annotations": {STATE: state}}},
                _request_timeout=self.env.request_timeout_s)
            self._patch_status(marked.metadata.resource_version, changes, "set")
        except Exception as exc:
            return self._failed(exc, f"setting {said}")
        emit_node_event(self._api(), self.env.node, "SloguardBatchCapacityReduced",
                        f"{said}: {ctx.reason}", self.env.request_timeout_s)
        return StepResult(DONE, self.target, f"set {said}", undo)

    # -- undo ----------------------------------------------------------------------------------

    def undo(self, ctx: StepContext, undo: dict[str, Any]) -> StepResult:
        values: dict[str, dict[str, dict[str, str]]] = undo.get("values") or {}
        if not values:
            return StepResult(DONE, self.target, "nothing was changed")
        try:
            node = self._read()
        except Exception as exc:
            return self._failed(exc, "reading the node")
        status = node.status
        current = {"capacity": dict(status.capacity or {}) if status else {},
                   "allocatable": dict(status.allocatable or {}) if status else {}}
        restore: dict[str, dict[str, dict[str, str]]] = {}
        notes: list[str] = []
        for name, fields in values.items():
            for field, record in fields.items():
                now = current.get(field, {}).get(name)
                if now is None:
                    notes.append(f"{name} {field} is gone: left as it is")
                elif parse(now) == parse(record["set"]):
                    restore.setdefault(name, {})[field] = {"was": record["set"],
                                                           "set": record["was"]}
                elif parse(now) == parse(record["was"]):
                    notes.append(f"{name} {field} is back at {now} already")
                else:
                    notes.append(f"{name} {field} is {now} now, not sloguard's {record['set']} "
                                 "(rewritten since): left as it is")
        said = _describe(restore) if restore else "nothing to restore"
        if notes:
            said += f" ({'; '.join(notes)})"
        if ctx.dry_run:
            return StepResult(PROPOSED, self.target, f"would restore {said}")
        try:
            version = node.metadata.resource_version
            if restore:
                version = self._patch_status(version, restore, "set").metadata.resource_version
            if self._state(node):
                self._api().patch_node(
                    self.env.node, {"metadata": {"resourceVersion": version,
                                                 "annotations": {STATE: None}}},
                    _request_timeout=self.env.request_timeout_s)
        except Exception as exc:
            return self._failed(exc, f"restoring {said}")
        if restore:
            emit_node_event(self._api(), self.env.node, "SloguardBatchCapacityRestored",
                            f"{said}: {ctx.reason}", self.env.request_timeout_s)
        return StepResult(DONE, self.target, f"restored {said}" if restore else said)

    # -- API ------------------------------------------------------------------------------------

    def _read(self) -> Any:
        return self._api().read_node(self.env.node, _request_timeout=self.env.request_timeout_s)

    def _patch_status(self, version: str, values: dict[str, dict[str, dict[str, str]]],
                      which: str) -> Any:
        status: dict[str, dict[str, str]] = {}
        for name, fields in values.items():
            for field, record in fields.items():
                status.setdefault(field, {})[name] = record[which]
        return self._api().patch_node_status(
            self.env.node, {"metadata": {"resourceVersion": version}, "status": status},
            _request_timeout=self.env.request_timeout_s)

    def _failed(self, exc: Exception, doing: str) -> StepResult:
        # 409: the node changed between the read and the patch; the next attempt re-reads it.
        retry = transient(exc) or api_status(exc) == 409
        return StepResult(FAILED, self.target, f"{doing}: {describe(exc)}", retry=retry)


def _describe(values: dict[str, dict[str, dict[str, str]]]) -> str:
    parts = []
    for name, fields in values.items():
        said = [f"{field} {r['was']} -> {r['set']}" for field, r in fields.items()]
        parts.append(f"{name} {', '.join(said)}")
    return "; ".join(parts)


@hookimpl
def sloguard_steps() -> list[type]:
    return [ReduceCapacity]
