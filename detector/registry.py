"""Finds detector plugins and makes detectors by name.

Plugins come from the entry-point group `sloguard.plugins` (the built-ins are registered there
too, by sloguard's own pyproject.toml) and from module paths in the config. A plugin that fails
to import, or whose hook raises, is reported by name and skipped: one broken plugin must not
disarm the detectors of all the others.
"""

from __future__ import annotations

import importlib
import logging
from importlib.metadata import entry_points
from typing import Any

import pluggy

from sloguard.detector import hookspecs

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "sloguard.plugins"


class DetectorRegistry:
    def __init__(self, modules: list[str] | tuple[str, ...] = (), use_entry_points: bool = True,
                 plugins: list[Any] | tuple[Any, ...] = ()) -> None:
        self.manager = pluggy.PluginManager(hookspecs.PROJECT)
        self.manager.add_hookspecs(hookspecs)
        self.errors: dict[str, str] = {}
        if use_entry_points:
            for ep in entry_points(group=ENTRY_POINT_GROUP):
                self._register(f"entry point {ep.name} ({ep.value})", ep.load, ep.name)
        for module in modules:
            self._register(f"module {module}", lambda m=module: importlib.import_module(m),
                           module)
        for plugin in plugins:
            self._register(f"plugin {plugin!r}", lambda p=plugin: p, None)
        self.types: dict[str, type] = {}
        self.providers: dict[str, str] = {}
        for impl in self.manager.hook.sloguard_detectors.get_hookimpls():
            name = impl.plugin_name
            try:
                provided = list(impl.function() or [])
            except Exception as exc:
                self.errors[name] = f"sloguard_detectors() raised {exc.__class__.__name__}: {exc}"
                log.error("detector plugin %s: %s", name, self.errors[name])
                continue
            for detector in provided:
                kind = getattr(detector, "name", None)
                if not isinstance(kind, str) or not kind:
                    self.errors[name] = f"{detector!r} has no `name`"
                elif kind in self.types and self.types[kind] is not detector:
                    self.errors[name] = (f"detector {kind!r} is already provided by "
                                         f"{self.providers[kind]}")
                else:
                    self.types[kind] = detector
                    self.providers[kind] = name

    def _register(self, what: str, load: Any, name: str | None) -> None:
        try:
            plugin = load()
            if self.manager.is_registered(plugin):
                return
            self.manager.register(plugin, name=name)
        except Exception as exc:  # a broken plugin is reported, the others still load
            self.errors[name or what] = f"{what}: {exc.__class__.__name__}: {exc}"
            log.error("cannot load detector plugin: %s", self.errors[name or what])

    @classmethod
    def from_config(cls, config: Any) -> DetectorRegistry:
        """The registry the `detectors` section of the config asks for."""
        return cls(config.plugins, use_entry_points=config.entry_points)

    def check(self, spec: Any) -> None:
        """Refuse a rule (or condition) whose detector or params this registry cannot make:
        the `validate_params` of a RuleSet."""
        self.make(spec.detector, spec.params)

    def make(self, kind: str, params: dict[str, Any]) -> Any:
        """A new detector; ValueError (shown against the rule) for an unknown kind or params."""
        factory = self.types.get(kind)
        if factory is None:
            known = ", ".join(sorted(self.types)) or "none"
            raise ValueError(f"unknown detector {kind!r} (available: {known})")
        try:
            return factory(dict(params))
        except ValueError:
            raise
        except Exception as exc:
            raise ValueError(f"detector {kind!r} rejected its params: "
                             f"{exc.__class__.__name__}: {exc}") from exc

    def batch_type(self, kind: str) -> Any:
        """The batch form of a detector type (its `batch` attribute), or None."""
        return getattr(self.types.get(kind), "batch", None)

    def make_batch(self, kind: str, params: dict[str, Any]) -> Any:
        """A new batch detector for one rule's signal; ValueError like `make`."""
        factory = self.batch_type(kind)
        if factory is None:
            raise ValueError(f"detector {kind!r} has no batch form")
        try:
            return factory(dict(params))
        except ValueError:
            raise
        except Exception as exc:
            raise ValueError(f"detector {kind!r} rejected its params: "
                             f"{exc.__class__.__name__}: {exc}") from exc
