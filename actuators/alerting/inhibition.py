"""Inhibition, as in Alertmanager: while a source alert fires, target alerts whose `equal`
labels have the same values are muted (e.g. a node-level incident mutes the pod-level ones on
that node: the reader has one thing to fix, not twenty).

Sources are every firing incident of the node, whether or not it has been notified yet: the
condition the source describes is real either way. An alert never inhibits itself, and an
alert that matches both sides is inhibited only by sources that do not (Alertmanager's rule,
which keeps two such alerts from muting each other).
"""

from __future__ import annotations

from dataclasses import dataclass

from sloguard.actuators.alerting.config import InhibitRuleConfig
from sloguard.core.selectors import Matcher, parse_matchers


@dataclass
class InhibitRule:
    source: tuple[Matcher, ...]
    target: tuple[Matcher, ...]
    equal: tuple[str, ...]

    @classmethod
    def from_config(cls, config: InhibitRuleConfig) -> InhibitRule:
        return cls(parse_matchers(config.source_matchers), parse_matchers(config.target_matchers),
                   tuple(config.equal))


class Inhibitor:
    def __init__(self, rules: list[InhibitRuleConfig]) -> None:
        self.rules = [InhibitRule.from_config(rule) for rule in rules]

    def inhibited_by(self, key: str, labels: dict[str, str],
                     sources: list[tuple[str, dict[str, str]]]) -> str | None:
        """The key of a firing source that mutes this alert, or None."""
        for rule in self.rules:
            if not all(m.matches(labels) for m in rule.target):
                continue
            two_sided = all(m.matches(labels) for m in rule.source)
            for source_key, source in sources:
                if source_key == key or not all(m.matches(source) for m in rule.source):
                    continue
                if two_sided and all(m.matches(source) for m in rule.target):
                    continue
                if all(source.get(name, "") == labels.get(name, "") for name in rule.equal):
                    return source_key
        return None
