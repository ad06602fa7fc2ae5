"""The suspect-scorer plugin contract: the hook specification, and nothing else.

A plugin is a module with functions marked `@hookimpl` (the detectors' marker), found through
the entry-point group `sloguard.scorers` or named in the config (`attribution.plugins`). The
built-ins are registered by name in detector/attribution/registry.py. The shapes a scorer
exchanges with the attributor (`Case`, `Clue`) are in `sloguard.detector.attribution.api`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sloguard.core.extensions import PROJECT, hookimpl, hookspec

if TYPE_CHECKING:
    from sloguard.detector.attribution.api import Scorer

__all__ = ["PROJECT", "hookimpl", "hookspec", "sloguard_suspect_scorers"]


@hookspec
def sloguard_suspect_scorers() -> list[type[Scorer]]:
    """Return the suspect scorer types this plugin provides.

    Each type has a unique class attribute `name` (what `attribution.scorers` names), takes
    its params mapping in its constructor (raising ValueError with a plain message for params
    it does not accept: the config is then refused naming the field), and is instantiated once.
    Its `score(case)` is called for each firing incident under a policy (at firing, then every
    `attribution.every`) and returns a mapping from a candidate's cgroup to a `Clue` (a grade in
    [0, 1], the resource the evidence points at, and a sentence with the figures). An empty
    mapping abstains: the scorer has no evidence for this case (its signal is missing here, or
    the incident is about a resource it does not measure), and the ranking then leaves it out
    of the weighted mean instead of counting zeros. A candidate it has evidence for but that
    is not implicated gets a Clue of score 0 or is simply absent. A scorer that raises or
    overruns `attribution.timeout` is reported in /readyz and left out for that case.
    """
