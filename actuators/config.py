"""The `actuators` section: dry-run, the escalation policies, and how long the audit is kept.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from sloguard.core.config import Duration, Section, shipped_rule_paths


def default_policy_paths() -> list[str]:
    """The escalation policies shipped with sloguard: policies/ beside the default rules."""
    return [str(Path(path) / "policies") for path in shipped_rule_paths()]


class ActuatorsConfig(Section):
    dry_run: bool = Field(True, description="shadow mode: record every step, take none")
    policies: list[str] = Field(
        default_factory=default_policy_paths,
        description="escalation policy files or directories of *.yaml")
    audit_retention: Duration = Field(
        90 * 86400, ge=3600,
        description="audit entries older than this are deleted (at least 1h: the eviction "
                    "budgets look back an hour)")

