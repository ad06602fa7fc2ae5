"""Finds detector plugins and makes detectors by name.

The detectors extension point (sloguard/core/extensions.py): the built-ins are registered here
in code, third parties come through the entry-point group `sloguard.detectors` (the older
`sloguard.plugins` is still read, with a warning), and the config may name plugin modules
(`detectors.plugins`). `detectors.entry_points: false` turns off third parties only.
"""

from __future__ import annotations

import logging
from typing import Any

from sloguard.core.extensions import Extensions
from sloguard.detector import hookspecs

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "sloguard.detectors"
LEGACY_GROUP = "sloguard.plugins"

# The built-in detector plugins, by plugin name (what `providers` says).
BUILTIN_DETECTORS = {
    "threshold": "sloguard.plugins.threshold",
    "ewma": "sloguard.plugins.ewma",
    "changepoint": "sloguard.plugins.changepoint",
    "page_hinkley": "sloguard.plugins.page_hinkley",
    "slo": "sloguard.plugins.slo",
    "anomaly_likelihood": "sloguard.plugins.anomaly_likelihood",
    "anomaly_channels": "sloguard.plugins.anomaly_channels",
}


class DetectorRegistry(Extensions):
    def __init__(self, modules: list[str] | tuple[str, ...] = (), use_entry_points: bool = True,
                 plugins: list[Any] | tuple[Any, ...] = ()) -> None:
        super().__init__("detector", hookspecs, "sloguard_detectors", ENTRY_POINT_GROUP,
                         BUILTIN_DETECTORS, modules=modules, plugins=plugins,
                         use_entry_points=use_entry_points, legacy_groups=(LEGACY_GROUP,))

    @classmethod
    def from_config(cls, config: Any) -> DetectorRegistry:
        """The registry the `detectors` section of the config asks for."""
        return cls(config.plugins, use_entry_points=config.entry_points)

    def check(self, spec: Any) -> None:
        """Refuse a rule (or condition) whose detector or params this registry cannot make:
        the `validate_params` of a RuleSet."""
        self.make(spec.detector, spec.params)
        if getattr(spec, "on_arrival", False) and not getattr(
                self.types.get(spec.detector), "per_value", False):
            raise ValueError(f"on_arrival: detector {spec.detector!r} learns from each "
                             "evaluation, and would learn the same value several times; "
                             "on_arrival is for detectors that judge each value on its own "
                             "(threshold, slo_latency)")

    def make(self, kind: str, params: dict[str, Any]) -> Any:
        """A new detector; ValueError (shown against the rule) for an unknown kind or params."""
        return _construct(kind, self.get(kind), params)

    def batch_type(self, kind: str) -> Any:
        """The batch form of a detector type (its `batch` attribute), or None."""
        return getattr(self.types.get(kind), "batch", None)

    def make_batch(self, kind: str, params: dict[str, Any]) -> Any:
        """A new batch detector for one rule's signal; ValueError like `make`."""
        factory = self.batch_type(kind)
        if factory is None:
            raise ValueError(f"detector {kind!r} has no batch form")
        return _construct(kind, factory, params)


def _construct(kind: str, factory: Any, params: dict[str, Any]) -> Any:
    try:
        return factory(dict(params))
    except ValueError:
        raise
    except Exception as exc:
        raise ValueError(f"detector {kind!r} rejected its params: "
                         f"{exc.__class__.__name__}: {exc}") from exc
