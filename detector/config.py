"""The `rules` and `detectors` sections: which rule files are loaded, and which detector plugins.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from sloguard.core.config import Duration, Section, shipped_rule_paths


class RulesConfig(Section):
    paths: list[str] = Field(
        default_factory=shipped_rule_paths, description="rule files or directories of *.yaml"
    )


class DetectorsConfig(Section):
    plugins: list[str] = Field(
        default_factory=list, description="extra plugin modules to load (import paths)")
    entry_points: bool = Field(
        True, description="load third-party plugins of the sloguard.detectors entry-point group "
                          "(the built-ins are always there)")
    timeout: Duration = Field(1.0, gt=0, description="longest one rule's detectors may take")



class ScorerConfig(Section):
    weight: float = Field(1.0, ge=0, description="its weight in a suspect's score (0: off)")
    params: dict[str, Any] = Field(default_factory=dict, description="the scorer's parameters")


def default_scorers() -> dict[str, ScorerConfig]:
    return {"runqueue_blame": ScorerConfig(), "co_movement": ScorerConfig()}


class AttributionConfig(Section):
    enabled: bool = Field(True, description="rank the BE suspects of each firing incident "
                                            "under a policy (docs/attribution.md)")
    every: Duration = Field(10.0, gt=0, description="how often a firing incident's suspects "
                                                    "are ranked again (a policy's hold is 10 s: "
                                                    "each widened rung sees a fresh ranking)")
    lookback: Duration = Field(60.0, gt=0, description="how far before the incident's onset "
                                                       "the scorers look")
    timeout: Duration = Field(1.0, gt=0, description="longest the ranking of one incident may "
                                                     "take (its reads included); past it, the "
                                                     "suspects stay as they were")
    scorers: dict[str, ScorerConfig] = Field(
        default_factory=default_scorers,
        description="the scorers by name, each with its weight and params")
    plugins: list[str] = Field(default_factory=list,
                               description="extra scorer plugin modules to load (import paths)")
    entry_points: bool = Field(True, description="load third-party scorers of the "
                                                 "sloguard.scorers entry-point group")
