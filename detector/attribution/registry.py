"""Finds suspect-scorer plugins and makes scorers by name (sloguard/core/extensions.py):
the built-ins registered here in code, third parties through the entry-point group
`sloguard.scorers`, and plugin modules the config names (`attribution.plugins`)."""

from __future__ import annotations

from typing import Any

from sloguard.core.extensions import Extensions
from sloguard.detector.attribution import hookspecs

ENTRY_POINT_GROUP = "sloguard.scorers"

BUILTIN_SCORERS = {
    "runqueue_blame": "sloguard.plugins.runqueue_blame",
    "co_movement": "sloguard.plugins.co_movement",
}


class ScorerRegistry(Extensions):
    def __init__(self, modules: list[str] | tuple[str, ...] = (), use_entry_points: bool = True,
                 plugins: list[Any] | tuple[Any, ...] = ()) -> None:
        super().__init__("scorer", hookspecs, "sloguard_suspect_scorers", ENTRY_POINT_GROUP,
                         BUILTIN_SCORERS, modules=modules, plugins=plugins,
                         use_entry_points=use_entry_points)

    def make(self, name: str, params: dict[str, Any]) -> Any:
        """A scorer; ValueError naming it for an unknown name or params it refuses."""
        factory = self.get(name)
        try:
            return factory(dict(params))
        except ValueError as exc:
            raise ValueError(f"scorer {name!r}: {exc}") from exc
        except Exception as exc:
            raise ValueError(f"scorer {name!r} rejected its params: "
                             f"{exc.__class__.__name__}: {exc}") from exc
