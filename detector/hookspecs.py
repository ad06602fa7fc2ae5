"""The detector plugin contract: the hook specification, and nothing else.

A plugin is a module (or object) with functions marked `@hookimpl`, found through the
entry-point group `sloguard.detectors` or named in the config (`detectors.plugins`). The
built-in detectors are plugins registered by name in detector/registry.py. The shapes plugins
exchange with the engine (`Verdict`, the `Detector` protocol) are in `sloguard.detector.api`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sloguard.core.extensions import PROJECT, hookimpl, hookspec

if TYPE_CHECKING:
    from sloguard.detector.api import Detector

__all__ = ["PROJECT", "hookimpl", "hookspec", "sloguard_detectors"]


@hookspec
def sloguard_detectors() -> list[type[Detector]]:
    """Return the detector types this plugin provides.

    Each type has a unique class attribute `name` (what rules write as `detector:`), takes the
    rule's `params` mapping in its constructor (raising ValueError, with a plain message, for
    parameters it does not accept: the rule file is then rejected with file and line), and is
    instantiated once per (rule, series). Its `update(value, time_ns)` is called once per
    evaluation with the rule's aggregate for that series, NaN when there is no data, and
    returns a `Verdict`. Instances may keep state (a running mean, a window): that is what
    makes streaming detectors cheap. The engine never fires on NaN, whatever a detector says,
    and cuts off an evaluation that takes longer than `detectors.timeout`. A type may also
    offer a batch form as its `batch` attribute (`sloguard.detector.api.BatchDetector`): one
    numpy call for all of a rule's series, used by the engine instead of per-series objects.
    """
