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
from sloguard.core.selectors import Selector, parse_selector
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

    @property
    def selector(self) -> Selector:
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

    @property
    def key(self) -> str:
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


class RuleSet:
    """The active rules, reloaded per file.

    A file that fails to load keeps its last good rules; so does every file under a configured
    path that has disappeared (an unmounted ConfigMap), while a file removed from a directory
    that is still there takes its rules with it. `reload` runs on the agent's loop; readers on
    other threads get immutable snapshots through `rules` and `errors`.
    """

    def __init__(self, paths: list[str], validate_params: Any = None) -> None:
        self.paths = paths
        self.validate_params = validate_params
        self.by_file: dict[str, list[LoadedRule]] = {}
        self._file_errors: dict[str, str] = {}
        self._mtimes: dict[str, float] = {}
        self._active: tuple[LoadedRule, ...] = ()
        self._errors: dict[str, str] = {}

    @property
    def rules(self) -> list[LoadedRule]:
        return list(self._active)

    @property
    def errors(self) -> dict[str, str]:
        return dict(self._errors)

    def files(self) -> tuple[list[Path], dict[str, str], set[str]]:
        """Rule files found, errors of configured paths, and the paths that could not be read."""
        found: list[Path] = []
        errors: dict[str, str] = {}
        unreadable: set[str] = set()
        for entry in self.paths:
            path = Path(entry)
            try:
                if path.is_dir():
                    found.extend(sorted(p for p in path.iterdir()
                                        if p.suffix in (".yaml", ".yml") and p.is_file()))
                elif path.exists():
                    found.append(path)
                else:
                    errors[entry] = f"{entry}: does not exist; keeping the rules loaded from it"
                    unreadable.add(entry)
            except OSError as exc:
                errors[entry] = f"{entry}: cannot list: {exc.strerror}; keeping its rules"
                unreadable.add(entry)
        return found, errors, unreadable

    def reload(self) -> bool:
        """Load changed files; return True when the active rules changed."""
        changed = False
        found, path_errors, unreadable = self.files()
        current = {str(p): p for p in found}
        for name in list(self.by_file):
            kept = any(name == u or name.startswith(u.rstrip("/") + "/") for u in unreadable)
            if name not in current and not kept:
                del self.by_file[name]
                self._mtimes.pop(name, None)
                self._file_errors.pop(name, None)
                changed = True
        for name in list(self._file_errors):
            if name not in current and name not in self.by_file:
                del self._file_errors[name]
        for name, path in current.items():
            try:
                mtime = path.stat().st_mtime
            except OSError as exc:
                self._file_errors[name] = f"{name}: cannot read: {exc.strerror}"
                continue
            if self._mtimes.get(name) == mtime:
                continue
            self._mtimes[name] = mtime
            try:
                rules = load_rule_file(path, self.validate_params)
            except RuleFileError as exc:
                self._file_errors[name] = str(exc)
                kept = len(self.by_file.get(name, []))
                log.error("rule file rejected, keeping its %d previous rules:\n%s", kept, exc)
                continue
            self._file_errors.pop(name, None)
            self.by_file[name] = rules
            changed = True
            log.info("loaded %d rules from %s", len(rules), name)
        active: list[LoadedRule] = []
        errors = {**path_errors, **self._file_errors}
        seen: dict[str, str] = {}
        for name in sorted(self.by_file):
            for rule in self.by_file[name]:
                if rule.key in seen:
                    errors[name] = (f"{rule.source}: rule {rule.key} is already defined at "
                                    f"{seen[rule.key]}; this one is ignored")
                    continue
                seen[rule.key] = rule.source
                active.append(rule)
        self._active = tuple(active)
        self._errors = errors
        return changed
