"""Rule files: groups of alerting rules in the shape of Prometheus alerting rules.

    groups:
      - name: ls-protection
        rules:
          - alert: LSCpuStall
            expr: container_pressure{class="LS", resource="cpu"}
            field: some_rate
            aggregate: mean
            window: 10s
            detector: threshold
            params: {above: 20, recover_below: 10}
            for: 5s
            recover_for: 10s
            severity: warning
            labels: {team: sre}
            annotations:
              summary: "{{ $labels.cgroup }} stalled on CPU {{ $value }}% of the time"

Loading is per file and all-or-nothing: a file with any error keeps its previously loaded rules
active and the error (file, line, field) is reported, so a typo pushed to a ConfigMap never
disarms the guardrail.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)

from sloguard.core.config import Duration
from sloguard.core.incidents import AGENT_GROUP
from sloguard.core.selectors import Selector, parse_selector
from sloguard.core.watched import WatchedFiles
from sloguard.core.yamlfile import YamlFileError, load_model, nearest
from sloguard.store import check_aggregation

log = logging.getLogger(__name__)

AGGREGATES_EXTRA = ("rate",)


class EvaluationCount(BaseModel):
    """Fire on `crossed` of the last `of` evaluations, rather than on every one of them."""

    model_config = ConfigDict(extra="forbid")

    crossed: int = Field(ge=1)
    of: int = Field(ge=1, le=1000)

    @model_validator(mode="after")
    def _order(self) -> EvaluationCount:
        if self.crossed > self.of:
            raise ValueError(f"crossed ({self.crossed}) cannot exceed of ({self.of})")
        return self


class SignalSpec(BaseModel):
    """A signal and the detector that judges it: what a rule and each of its conditions have."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    expr: str = Field(description="series selector: measurement{tag=\"value\", ...}")
    field: str
    aggregate: str = "mean"
    window: Duration = 10.0
    detector: str = "threshold"
    params: dict[str, Any] = Field(default_factory=dict)

    @field_validator("expr")
    @classmethod
    def _selector(cls, value: str) -> str:
        parse_selector(value)
        return value

    @field_validator("aggregate")
    @classmethod
    def _aggregate(cls, value: str) -> str:
        return value if value in AGGREGATES_EXTRA else check_aggregation(value)

    @cached_property
    def selector(self) -> Selector:
        # parsed once per loaded rule, not on each of its evaluations (5,400 parses in 300
        # ticks of the 100-cgroup agent, ~2% of its tick: /tmp-free profile in performance.md)
        return parse_selector(self.expr)


class Condition(SignalSpec):
    """Another signal that must agree before a compound rule fires (e.g. BE CPU high while LS
    latency is up). It holds while any of its series is crossed."""


class RuleSpec(SignalSpec):
    alert: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    and_: list[Condition] = Field(
        default_factory=list, alias="and",
        description="conditions that must all hold too; the rule stays one alert per series "
                    "of its own expr")
    unless: list[Condition] = Field(
        default_factory=list,
        description="conditions none of which may hold (Prometheus `unless`): while one does, "
                    "the rule does not fire, and a firing alert recovers; e.g. route an "
                    "I/O-bound cause to a rule and policy of its own")
    for_: Duration = Field(0.0, alias="for")
    for_evaluations: EvaluationCount | None = Field(
        None, description="fire when this many of the last evaluations crossed (with `for`)")
    recover_for: Duration = 0.0
    severity: Literal["info", "warning", "critical"] = "warning"
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    policy: str | None = Field(
        None, pattern=r"^[A-Za-z0-9_.-]+$",
        description="the escalation policy a firing alert of this rule drives (policies/)")
    on_arrival: bool = Field(
        False, description="also evaluate the rule as soon as new data for its own signal "
                           "arrives (a push, a scrape), at most every `arrival_floor` (100 ms), "
                           "and let its policy act in that evaluation; needs a detector that "
                           "judges each value on its own (threshold, slo_latency)")

    @model_validator(mode="after")
    def _arrival(self) -> RuleSpec:
        if self.on_arrival and self.for_evaluations is not None:
            raise ValueError("on_arrival evaluates a rule more often than the tick, so "
                             "for_evaluations (a count of evaluations) would mean something "
                             "else: use `for` (seconds)")
        return self

    @property
    def conditions(self) -> list[tuple[str, int, Condition]]:
        """Every other signal of the rule: ("and" | "unless", index, condition)."""
        return [("and", i, c) for i, c in enumerate(self.and_)] + \
            [("unless", i, c) for i, c in enumerate(self.unless)]

    @property
    def signals(self) -> list[SignalSpec]:
        """The rule's own signal, then every condition's: what the engine subscribes to."""
        return [self, *(c for _, _, c in self.conditions)]


class GroupSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    interval: Duration | None = None
    rules: list[RuleSpec]

    @field_validator("name")
    @classmethod
    def _not_the_agents(cls, value: str) -> str:
        if value == AGENT_GROUP:
            raise ValueError(f"the group name {AGENT_GROUP!r} is reserved for the incidents the "
                             "agent raises about itself (RulesInvalid): choose another")
        return value


class RuleFileSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    groups: list[GroupSpec]


def rule_file_schema() -> dict[str, Any]:
    """JSON Schema of a rule file, for editors (yaml-language-server) and CI linters."""
    schema = RuleFileSpec.model_json_schema(by_alias=True)
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "sloguard rule file"
    return schema


@dataclass(frozen=True)
class LoadedRule:
    group: str
    spec: RuleSpec
    source: str  # file:line
    interval: float | None = None  # the group's evaluation interval; None: every tick

    @cached_property
    def key(self) -> str:
        """`group/alert`; kept, as the engine asks for it a few hundred times a tick."""
        return f"{self.group}/{self.spec.alert}"


class RuleFileError(Exception):
    pass


def load_rule_file(path: Path, validate_params: Any = None) -> list[LoadedRule]:
    """Parse one file; raise RuleFileError with a `file:line:column: field: problem` line for
    every problem found (not only the first)."""
    try:
        spec, lines = load_model(path, RuleFileSpec,
                                 "a rule file defines `groups:` (`groups: []` for none)")
    except YamlFileError as exc:
        raise RuleFileError(str(exc)) from exc
    rules: list[LoadedRule] = []
    problems: list[str] = []
    seen: set[str] = set()
    for gi, group in enumerate(spec.groups):
        for ri, rule in enumerate(group.rules):
            loc = ("groups", str(gi), "rules", str(ri))
            line, column = lines.get(loc, (1, 1))
            source = f"{path}:{line}:{column}"
            loaded = LoadedRule(group.name, rule, source, group.interval)
            if rule.on_arrival and group.interval is not None:
                problems.append(f"{source}: {'.'.join(loc)}.on_arrival: the group is evaluated "
                                f"every {group.interval:g}s, not on each tick: on_arrival has "
                                "no place in it")
            if loaded.key in seen:
                problems.append(f"{source}: {'.'.join(loc)}: rule {loaded.key} is defined twice")
            seen.add(loaded.key)
            if validate_params is not None:
                signals = [(loc, rule)] + [((*loc, kind, str(ci)), cond)
                                           for kind, ci, cond in rule.conditions]
                for where, signal in signals:
                    try:
                        validate_params(signal)
                    except ValueError as exc:
                        at = (*where, "params") if (*where, "params") in lines else (
                            *where, "detector")
                        pline, pcolumn = nearest(lines, at)
                        problems.append(f"{path}:{pline}:{pcolumn}: {'.'.join(at)}: {exc}")
            rules.append(loaded)
    if problems:
        raise RuleFileError("\n".join(problems))
    return rules


class RuleSet(WatchedFiles[LoadedRule]):
    """The active rules, reloaded per file (sloguard/core/watched.py has the semantics it shares
    with the escalation policies: a broken file keeps its last good rules, and so does every
    file under a configured path that has disappeared; a file removed from a directory that is
    still there takes its rules with it)."""

    def __init__(self, paths: list[str], validate_params: Any = None) -> None:
        self.validate_params = validate_params
        super().__init__("rule", paths, lambda path: load_rule_file(path, validate_params),
                         key=lambda rule: rule.key, source=lambda rule: rule.source,
                         load_errors=(RuleFileError,))

    @property
    def rules(self) -> list[LoadedRule]:
        return self.items
