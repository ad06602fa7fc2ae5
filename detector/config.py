"""The `rules` and `detectors` sections: which rule files are loaded, and which detector plugins.
"""

from __future__ import annotations

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

