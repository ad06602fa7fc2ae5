"""Escalation policies: which steps, in which order, after how long interference persists.

    policies:
      - name: ls-interference
        undo_hold: 30s          # on recovery, time between undoing one step and the next
        stale_after: 30s        # evidence older than this never escalates past cordon
        steps:
          - step: notify
          - step: cordon
            after: 30s          # interference persisted this long since the previous step
          - step: reduce_capacity
            after: 30s
            params: {percent: 50}
          - step: suppress      # levers tried one by one, each verified on the LS signal
            after: 15s          # before the first lever
            hold: 15s           # each lever's time to show an effect before the next (default:
            levers:             # `after`)
              - step: cpu_idle
              - step: cpuset
                after: 5s       # a lever's own `after`, even 0s, overrides both
              - step: cpu_quota
              - step: memory_limit
          - step: resctrl
            after: 30s
          - step: evict
            after: 60s
            dry_run: true       # shadow mode for this step only
            repeat: 60s         # while interference persists, evict the next candidate
            params: {per_hour: 3, per_incident: 2}

A rule names its policy (`policy: ls-interference`). Policy files live in a `policies/`
directory beside the rules. Like rule files, a file that fails to load keeps its previous
policies active, and every problem is reported as `file:line:column: field: problem`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from sloguard.core.config import Duration
from sloguard.core.watched import WatchedFiles
from sloguard.core.yamlfile import YamlFileError, load_model, nearest

SUPPRESS = "suppress"
DEFAULT_SUSPECTS = 2


class StepSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    step: str = Field(description="step kind: notify, cordon, reduce_capacity, cpu_idle, cpuset, "
                                  "cpu_quota, memory_limit, resctrl, evict, or suppress")
    after: Duration = Field(0.0, description="how long interference must persist since the "
                                             "previous step (or since firing) before this one "
                                             "(suppress: before its first lever)")
    hold: Duration | None = Field(
        None, description="suppress only: the time each lever is given before the next is "
                          "tried (default: the step's `after`); a lever's own `after` overrides "
                          "it")
    dry_run: bool = Field(False, description="shadow mode for this step, whatever the global "
                                             "actuators.dry_run says")
    repeat: Duration | None = Field(
        None, description="apply again this often while interference persists (evict: the "
                          "next candidate, within the step's budgets)")
    params: dict[str, Any] = Field(default_factory=dict)
    levers: list[StepSpec] = Field(
        default_factory=list,
        description="suppress only: the levers, tried in the order learned on this node")
    order: Literal["learned", "written"] | None = Field(
        None, description="suppress only: `learned` (default) tries the levers that ended "
                          "interference on this node first; `written` always keeps the order "
                          "of `levers`")
    target: Literal["tier", "suspects"] | None = Field(
        None, description="a cgroup lever's targets: `tier` (default) every BE workload; "
                          "`suspects` the incident's first suspect alone, then the next (each "
                          "after a hold, while interference persists), then the rest of the "
                          "BE tier (docs/attribution.md)")
    suspects: int | None = Field(
        None, ge=1, le=5, description="with `target: suspects`: how many suspects are taken "
                                      "one at a time before the rest of the tier (default 2)")

    @model_validator(mode="after")
    def _levers(self) -> StepSpec:
        if self.suspects is not None and self.target != "suspects":
            raise ValueError("`suspects` counts the suspects of `target: suspects`; this step "
                             "targets the whole BE tier")
        if self.target is not None and self.step == SUPPRESS:
            raise ValueError("`target` goes on each lever, not on the suppress step")
        if self.hold is not None and self.step != SUPPRESS:
            raise ValueError(f"only a suppress step has `hold` (the time each of its levers is "
                             f"given); {self.step} waits only its `after`")
        if self.order is not None and self.step != SUPPRESS:
            raise ValueError(f"only a suppress step has `order` (of its levers); {self.step} "
                             "has none")
        if self.step == SUPPRESS:
            if not self.levers:
                raise ValueError("suppress needs `levers`")
            if any(lever.step == SUPPRESS or lever.levers for lever in self.levers):
                raise ValueError("levers cannot nest")
        elif self.levers:
            raise ValueError("only a suppress step has levers")
        return self

    def record(self) -> dict[str, Any]:
        """The rung as the ledger keeps it. A rung is never a suppress step, so `hold` and
        `order` are left out: an agent rolled back to a version without them can still undo
        what is in force."""
        return self.model_dump(exclude={name for name in ("hold", "order", "target", "suspects")
                                        if getattr(self, name) is None} or None)

    @property
    def widened(self) -> int:
        """With `target: suspects`, how many suspects come one by one before the tier; 0
        when the step targets the tier."""
        return (self.suspects or DEFAULT_SUSPECTS) if self.target == "suspects" else 0


class PolicySpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$")
    undo_hold: Duration = 30.0
    stale_after: Duration = 30.0
    relapse_window: Duration = Field(
        120.0, description="interference back within this long after recovery is a relapse: "
                           "the next descent waits undo_hold x 2^(relapses-1) before its first "
                           "undo")
    max_undo_wait: Duration = Field(600.0, description="the longest such wait")
    keep_while_cause: bool = Field(
        True, description="after an episode, keep the levers while the cause named by the "
                          "`and:` conditions of a rule driving this policy (BE busy) is "
                          "present, and lift them all at once when it is gone; false: lift "
                          "them one per undo_hold either way (with the relapse back-off)")
    standing: list[StepSpec] = Field(
        default_factory=list,
        description="cgroup levers kept in force at all times while this policy is loaded, "
                    "on every BE workload as it appears (koordlet's standing BE CPU QoS); "
                    "the ladder starts from them and never lifts them")
    steps: list[StepSpec] = Field(min_length=1)

    @model_validator(mode="after")
    def _standing(self) -> PolicySpec:
        kinds = [lever.step for lever in self.standing]
        for lever in self.standing:
            written = lever.model_fields_set - {"step", "params", "dry_run"}
            if lever.step == SUPPRESS:
                raise ValueError("standing: a suppress step cannot stand (name its levers)")
            if written:
                raise ValueError(f"standing: {lever.step}: a standing lever is always in force "
                                 f"on the whole BE tier, so it has no "
                                 f"{', '.join(sorted(written))}")
            if kinds.count(lever.step) > 1:
                raise ValueError(f"standing: {lever.step} is named twice")
        return self


class PolicyFileSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    policies: list[PolicySpec]


class PolicyFileError(Exception):
    """Every problem of one policy file, one `file:line:column: field: problem` per line."""


@dataclass(frozen=True)
class Rung:
    """One step of a policy as the ladder runs it (a suppress step becomes one rung per lever)."""

    index: int
    spec: StepSpec
    lever_group: int | None = None  # rungs of one suppress step share it; learned order
    # `target: suspects`: this rung takes the incident's suspect of this rank (1-based) not
    # already under its siblings; 0 with `siblings`: the rest of the BE tier after them
    suspect: int = 0
    siblings: tuple[int, ...] = ()  # the other rungs of the same widening lever

    @property
    def widening(self) -> str:
        """"suspect", "rest" or "" (a rung that targets the whole tier as written)."""
        if not self.siblings:
            return ""
        return "suspect" if self.suspect else "rest"


@dataclass(frozen=True)
class Policy:
    spec: PolicySpec
    source: str

    @property
    def name(self) -> str:
        return self.spec.name

    def rungs(self, lever_order: list[str] | None = None) -> list[Rung]:
        """The policy's steps flattened; levers ordered by `lever_order` (kinds that worked
        on this node first), else (or with `order: written`) as written.

        A lever's `after` is its own when written (0s included: the lever is wanted at once);
        else the step's `after` for the first lever tried, which waits on the rung before the
        step, and the step's `hold` (default: its `after`) for each following lever, which
        waits on the lever before it."""
        out: list[Rung] = []
        for position, spec in enumerate(self.spec.steps):
            if spec.step != SUPPRESS:
                self._add(out, spec, None, spec.after, position)
                continue
            levers = list(spec.levers)
            if lever_order and spec.order != "written":
                rank = {kind: i for i, kind in enumerate(lever_order)}
                levers.sort(key=lambda lever: rank.get(lever.step, len(rank)))
            for n, lever in enumerate(levers):
                if "after" in lever.model_fields_set:
                    after = lever.after
                elif n == 0 or spec.hold is None:
                    after = spec.after
                else:
                    after = spec.hold
                merged = lever.model_copy(update={"after": after,
                                                  "dry_run": lever.dry_run or spec.dry_run})
                self._add(out, merged, position, spec.hold if spec.hold is not None
                          else spec.after, position)
        return out

    @staticmethod
    def _add(out: list[Rung], spec: StepSpec, group: int | None, hold: float,
             position: int) -> None:
        """One rung; a `target: suspects` lever as several: its first suspect, each next one
        after `hold`, then the rest of the tier after `hold`. They form a lever group (one
        applied per tick, the next at once when one had no suspect to act on)."""
        if not spec.widened:
            out.append(Rung(len(out), spec, lever_group=group))
            return
        first = len(out)
        indices = tuple(range(first, first + spec.widened + 1))
        group = position if group is None else group
        for k in range(spec.widened + 1):
            step = spec if k == 0 else spec.model_copy(update={"after": hold})
            out.append(Rung(first + k, step, lever_group=group,
                            suspect=k + 1 if k < spec.widened else 0,
                            siblings=tuple(i for i in indices if i != first + k)))


def load_policy_file(path: Path, validate_step: Any = None,
                     cannot_stand: Any = None) -> list[Policy]:
    """Parse one file; `validate_step(spec)` raises ValueError for unknown kinds or params;
    `cannot_stand(kind)` says why a step kind cannot be a standing lever (or None)."""
    try:
        spec, lines = load_model(path, PolicyFileSpec, "a policy file defines `policies:`")
    except YamlFileError as exc:
        raise PolicyFileError(str(exc)) from exc
    problems = []
    policies = []
    seen: set[str] = set()
    for pi, policy in enumerate(spec.policies):
        loc = ("policies", str(pi))
        line, column = lines.get(loc, (1, 1))
        if policy.name in seen:
            problems.append(f"{path}:{line}:{column}: {'.'.join(loc)}: policy {policy.name} is "
                            "defined twice")
        seen.add(policy.name)
        entries = [(("standing", str(i)), lever) for i, lever in enumerate(policy.standing)]
        for si, step in enumerate(policy.steps):
            entries += [(("steps", str(si)), step)] + [
                (("steps", str(si), "levers", str(li)), lever)
                for li, lever in enumerate(step.levers)]
        for where, entry in entries:
            if entry.step == SUPPRESS or validate_step is None:
                continue
            at = (*loc, *where, "params") if entry.params else (*loc, *where, "step")
            try:
                validate_step(entry)
                why = cannot_stand(entry.step) if cannot_stand and where[0] == "standing" \
                    else None
                if why:
                    at = (*loc, *where, "step")
                    raise ValueError(why)
            except ValueError as exc:
                sline, scol = nearest(lines, at)
                problems.append(f"{path}:{sline}:{scol}: {'.'.join(at)}: {exc}")
        policies.append(Policy(policy, f"{path}:{line}:{column}"))
    if problems:
        raise PolicyFileError("\n".join(problems))
    return policies


class PolicySet(WatchedFiles[Policy]):
    """The active escalation policies, reloaded per file, with the semantics rule files have
    (sloguard/core/watched.py): a broken file keeps its last good policies."""

    def __init__(self, paths: list[str], validate_step: Any = None,
                 cannot_stand: Any = None) -> None:
        self.validate_step = validate_step
        super().__init__("policy", paths,
                         lambda path: load_policy_file(path, validate_step, cannot_stand),
                         key=lambda policy: policy.name, source=lambda policy: policy.source,
                         load_errors=(PolicyFileError,))

    def get(self, name: str) -> Policy | None:
        for policy in self._active:
            if policy.name == name:
                return policy
        return None

    @property
    def names(self) -> list[str]:
        return [p.name for p in self._active]

    @property
    def active(self) -> list[Policy]:
        return list(self._active)


StepSpec.model_rebuild()
