"""The contract of one rung of the escalation ladder: apply it, undo it, say why it cannot run.

Like koordlet's qosmanager strategies, each step kind is one file with its own parameters; the
ladder (actuators/ladder.py) decides when a step runs, this contract says what a step must do:

- `available()` names what is missing on this node (no resctrl, no Kubernetes API) or returns
  None. An unavailable step is skipped with that reason on the incident, never faked.
- `apply(ctx)` is idempotent: applying a step that is already in force changes nothing and says
  so. It returns a StepResult whose `undo` holds everything `undo` needs to restore the previous
  state (the old cpu.idle value, whether the node was already cordoned by someone else), so the
  ladder can persist it and undo the step after a restart.
- `undo(ctx, undo)` restores what `apply` changed and nothing else: a human's cordon is never
  lifted, a value someone changed since is left alone.
- Write-ahead: right before each change to the node (a cgroup file, a resctrl group, a node or
  an eviction through the API), `ctx.intend(undo)` with the undo data as it will stand once the
  change is made (the values from before included). It raises when the intent cannot be
  recorded, and then the change must not be made: a change the agent dies in is then undone
  (or adopted) on restart from that record, instead of staying in force for good.
- `recover(ctx, undo)`, optional: for a step whose apply cannot simply be repeated (evict: a
  second apply evicts a second pod), whether the change an intent announced happened; DONE
  (with the undo data) or SKIPPED. Steps without it are adopted from the intent and applied
  again, which their idempotence makes safe.
- With `ctx.dry_run`, a step touches nothing and describes what it would do (status
  "proposed"): shadow mode, so operators can read what the guardrail would have done.
- A step acts only on best-effort workloads: `ctx.be_workloads()` is the only way a step learns
  its targets, and it never yields an LS workload (tests/test_actuator_safety.py).
- `per_workload = True` (a class attribute) says the step acts on `ctx.be_workloads()` one by
  one, so a policy may give it `target: suspects`: the ladder then narrows `be_workloads()` to
  the incident's suspects (`ctx.only`), and the step writes their own cgroups
  (`ctx.narrowed`), never a parent that also holds innocent workloads.

Dependency-free: steps import what they need (the kubernetes client, cgroup files) themselves.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

DONE = "done"
PROPOSED = "proposed"  # dry-run: what would have been done
FAILED = "failed"
SKIPPED = "skipped"  # unavailable here, or nothing to do
UNDONE = "undone"

BE = "BE"

BACKOFF_S = (5.0, 10.0, 30.0, 60.0, 120.0, 300.0)  # a failed step's retries, then every 5 min


def backoff_ns(attempts: int) -> int:
    return int(BACKOFF_S[min(attempts, len(BACKOFF_S)) - 1] * 1e9)


@dataclass
class StepContext:
    """What a step may look at when it runs."""

    node: str
    now_ns: int
    dry_run: bool
    incident_id: str
    reason: str  # why the ladder runs this step now, for the audit log
    inventory: Callable[[], list[dict[str, str]]] = lambda: []
    # the contended resource of the incident (cpu, memory, io, cache), when the rule says
    resource: str = ""
    # write-ahead: record what is about to change (see the module's docstring); the ladder's
    # raises when the ledger cannot be written
    intend: Callable[[dict[str, Any]], None] = lambda undo: None
    # a `target: suspects` rung (docs/attribution.md): the BE workloads (cgroups) it is limited
    # to, and the ones its sibling rungs already hold; None / empty: the whole tier
    only: tuple[str, ...] | None = None
    exclude: tuple[str, ...] = ()
    # the incident's suspects, first first (core/suspects.py: Suspect): eviction ranks by them
    suspects: list[Any] = field(default_factory=list)

    def be_workloads(self) -> list[dict[str, str]]:
        """The best-effort workloads this step may touch now: the node's BE workloads, or the
        ones a `target: suspects` rung is narrowed to."""
        return [dict(w) for w in self.inventory() if w.get("class") == BE
                and (self.only is None or w.get("cgroup") in self.only)
                and w.get("cgroup") not in self.exclude]

    @property
    def narrowed(self) -> bool:
        """True for a rung limited to named suspects: a lever must then write their own
        cgroups, never a parent that holds the innocent ones too."""
        return self.only is not None


@dataclass
class StepResult:
    status: str  # done | proposed | failed | skipped | undone
    target: str
    detail: str
    undo: dict[str, Any] = field(default_factory=dict)  # what `undo` needs, JSON-serialisable
    retry: bool = False  # a transient failure (API unreachable): try again after a backoff


class Step(Protocol):
    kind: ClassVar[str]

    def __init__(self, params: dict[str, Any], env: Any) -> None:
        """Validate `params` (ValueError with a plain message rejects the policy file)."""

    def available(self) -> str | None:
        """None when the step can run here, else the reason it cannot."""

    def apply(self, ctx: StepContext) -> StepResult: ...

    def undo(self, ctx: StepContext, undo: dict[str, Any]) -> StepResult: ...


def reject_unknown(params: dict[str, Any], allowed: set[str], kind: str) -> None:
    unknown = set(params) - allowed
    if unknown:
        raise ValueError(f"unknown {kind} parameter(s): {', '.join(sorted(unknown))}")
