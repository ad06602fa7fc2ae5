"""The collectors a node runs: the built-ins, registered here by name, and third-party plugins
of the entry-point group `sloguard.collectors` (the extension point of
sloguard/core/extensions.py).

The agent builds them in this table's order (the cgroup collector before the per-cgroup ones,
which attribute to its inventory), then the plugins'. A collector whose `create` raises is
reported by name and the others still run.
"""

from __future__ import annotations

import logging
from typing import Any

from sloguard.collectors import hookspecs
from sloguard.collectors.base import CollectorContext
from sloguard.core.extensions import Extensions

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "sloguard.collectors"

BUILTIN_COLLECTORS = {
    "node": "sloguard.collectors.node",
    "cgroups": "sloguard.collectors.cgroups",
    "ebpf": "sloguard.collectors.kernel_latency",
    "cpi": "sloguard.collectors.cpi",
    "app_latency": "sloguard.collectors.app_latency",
}
LIFECYCLE = ("create", "start", "collect", "status", "close")


class CollectorPlugins(Extensions):
    def __init__(self, use_entry_points: bool = True, plugins: tuple[Any, ...] = ()) -> None:
        super().__init__("collector", hookspecs, "sloguard_collectors", ENTRY_POINT_GROUP,
                         BUILTIN_COLLECTORS, plugins=plugins, use_entry_points=use_entry_points)
        for name, kind in list(self.types.items()):
            missing = [verb for verb in LIFECYCLE if not callable(getattr(kind, verb, None))]
            if missing:  # a part-made collector would fail on the loop thread, at a bad time
                self.errors[self.providers[name]] = (
                    f"collector {name!r} lacks {', '.join(missing)} (collectors/base.py)")
                del self.types[name], self.providers[name]

    def build(self, ctx: CollectorContext) -> tuple[list[Any], dict[str, str]]:
        """Every collector the configuration asks for, and why the ones that failed did."""
        built, errors = [], {}
        for name, kind in self.types.items():
            try:
                collector = kind.create(ctx)
            except Exception as exc:  # one broken collector must not stop the others
                errors[name] = f"cannot build collector {name}: {exc.__class__.__name__}: {exc}"
                log.error("%s", errors[name])
                continue
            if collector is not None:
                ctx.built[name] = collector
                built.append(collector)
        return built, errors
