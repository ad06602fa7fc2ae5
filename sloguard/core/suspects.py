"""The culprit vocabulary: which BE workloads an incident's LS slowdown is attributed to, and why.

An incident under a policy carries a ranked list of suspects among the node's BE workloads
(detector/attribution/ ranks them); the ladder acts on the top ones first, eviction ranks by
them, and the UI, the API and Slack show each suspect's evidence, so an SRE can check the claim
instead of trusting a score. Stored on the incident as plain dicts (`Incident.suspects`): the
forwarder, the cluster server and the API carry them as JSON. Dependency-free.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

RESOURCES = ("cpu", "cache", "memory", "io")


@dataclass(slots=True)
class Clue:
    """One scorer's evidence against one workload: a grade, the resource it points at, and
    the figures behind it in a sentence an SRE can check against the charts."""

    scorer: str
    score: float  # in [0, 1]: how strongly this evidence points at the workload
    resource: str = ""  # one of RESOURCES, or "" when the evidence does not say
    text: str = ""
    figures: dict[str, float] = field(default_factory=dict)


def workload_name(tags: dict[str, str]) -> str:
    """How people name a workload: namespace/pod for a pod, the declared name, or the cgroup."""
    if tags.get("pod"):
        return f"{tags.get('namespace', '')}/{tags['pod']}".lstrip("/")
    return tags.get("workload") or tags.get("cgroup", "")


@dataclass(slots=True)
class Suspect:
    cgroup: str  # the workload's cgroup tag: what levers and eviction find it by
    score: float  # the scorers' weighted mean, in [0, 1]
    rank: int  # 1 = the first suspect
    resource: str = ""  # what the strongest clue points at
    workload: dict[str, str] = field(default_factory=dict)  # its tags (pod, namespace, ...)
    clues: list[Clue] = field(default_factory=list)

    @property
    def name(self) -> str:
        return workload_name({**self.workload, "cgroup": self.cgroup})

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Suspect:
        data = dict(data)
        data["clues"] = [Clue(**c) for c in data.get("clues", [])]
        return cls(**data)


def suspects_of(incident: Any) -> list[Suspect]:
    """An incident's suspects, first suspect first (empty when none were attributed)."""
    found = [Suspect.from_dict(s) for s in getattr(incident, "suspects", None) or []]
    return sorted(found, key=lambda s: s.rank)
