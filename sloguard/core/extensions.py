"""One way in for every extension point: detectors, steps (levers), collectors, scorers.

Each extension point is a pluggy hook that returns classes, each with a unique name (its `name`
attribute, `kind` for steps: what rule files, policies and the config write). Its built-ins are
plugin modules registered by name in code, as pytest registers its own plugins, so they exist
whatever the install metadata says; third parties come through the extension point's
entry-point group; the config may name extra plugin modules. A plugin that fails to import, or
whose hook raises, is reported by name and skipped: one broken plugin must not disarm the
others, and a name it would have provided says why it is missing.

    extension point   hook                  entry-point group      contract
    detectors         sloguard_detectors    sloguard.detectors     sloguard.detector.api
    steps             sloguard_steps        sloguard.steps         sloguard.actuators.step
    collectors        sloguard_collectors   sloguard.collectors    sloguard.collectors.base
    suspect scorers   sloguard_suspect_scorers  sloguard.scorers   sloguard.detector.attribution.api
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable, Mapping, Sequence
from importlib.metadata import entry_points
from types import ModuleType
from typing import Any

import pluggy

log = logging.getLogger(__name__)

PROJECT = "sloguard"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


class Extensions:
    """The table of one extension point: name -> class, who provided it, what failed."""

    def __init__(self, what: str, hookspecs: ModuleType, hook: str, group: str,
                 builtins: Mapping[str, str] | None = None, *, modules: Sequence[str] = (),
                 plugins: Sequence[Any] = (), use_entry_points: bool = True,
                 legacy_groups: Sequence[str] = (), key: str = "name") -> None:
        self.what = what  # "detector", "step", "collector": the word errors use
        self.group = group
        self.manager = pluggy.PluginManager(PROJECT)
        self.manager.add_hookspecs(hookspecs)
        self.errors: dict[str, str] = {}
        self._order: list[Any] = []  # plugins as registered: the built-ins first
        for plugin_name, module in (builtins or {}).items():
            self._register(f"built-in {module}", lambda m=module: importlib.import_module(m),
                           plugin_name)
        if use_entry_points:
            for name in (group, *legacy_groups):
                for ep in entry_points(group=name):
                    legacy = name if name != group else ""
                    self._register(f"entry point {ep.name} ({ep.value})", ep.load, ep.name,
                                   legacy)
        for module in modules:
            self._register(f"module {module}", lambda m=module: importlib.import_module(m),
                           module)
        for plugin in plugins:
            self._register(f"plugin {plugin!r}", lambda p=plugin: p, None)
        self.types: dict[str, type] = {}
        self.providers: dict[str, str] = {}
        # In registration order, not pluggy's call order: a third-party hookimpl marked
        # `trylast` is called first, and would otherwise take a built-in's name.
        impls = {id(impl.plugin): impl for impl in getattr(self.manager.hook, hook).get_hookimpls()}
        for impl in [impls[id(p)] for p in self._order if id(p) in impls]:
            provider = impl.plugin_name
            try:
                provided = list(impl.function() or [])
            except Exception as exc:
                self.errors[provider] = f"{hook}() raised {exc.__class__.__name__}: {exc}"
                log.error("%s plugin %s: %s", what, provider, self.errors[provider])
                continue
            for item in provided:
                name = getattr(item, key, None)
                if not isinstance(name, str) or not name:
                    self.errors[provider] = f"{item!r} has no `{key}`"
                elif name in self.types and self.types[name] is not item:
                    self.errors[provider] = (f"{what} {name!r} is already provided by "
                                             f"{self.providers[name]}")
                else:
                    self.types[name] = item
                    self.providers[name] = provider

    def _register(self, source: str, load: Callable[[], Any], name: str | None,
                  legacy_group: str = "") -> None:
        try:
            plugin = load()
            if self.manager.is_registered(plugin):
                return  # a built-in an older install still lists as an entry point
            if legacy_group:
                log.warning("%s plugin %s: the entry-point group %s is deprecated, use %s",
                            self.what, name, legacy_group, self.group)
            self.manager.register(plugin, name=name)
            self._order.append(plugin)
        except Exception as exc:  # a broken plugin is reported, the others still load
            self.errors[name or source] = f"{source}: {exc.__class__.__name__}: {exc}"
            log.error("cannot load %s plugin: %s", self.what, self.errors[name or source])

    def get(self, name: str) -> type:
        """The class registered as `name`; ValueError naming what is available (and which
        plugins failed, since the name may be theirs)."""
        found = self.types.get(name)
        if found is None:
            known = ", ".join(sorted(self.types)) or "none"
            broken = "; ".join(f"{plugin}: {why}" for plugin, why in sorted(self.errors.items()))
            raise ValueError(f"unknown {self.what} {name!r} (available: {known})"
                             + (f"; plugins that failed to load: {broken}" if broken else ""))
        return found

    def names(self) -> list[str]:
        return sorted(self.types)
