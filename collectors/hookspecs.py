"""The collector plugin contract: the hook specification, and nothing else.

A plugin is a module (or object) with a `sloguard_collectors` function marked `@hookimpl`,
found through the entry-point group `sloguard.collectors`. The built-in collectors are plugins
registered by name in collectors/registry.py. What a collector must do is the `Collector`
protocol in collectors/base.py.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sloguard.core.extensions import PROJECT, hookimpl, hookspec

if TYPE_CHECKING:
    from sloguard.collectors.base import Collector

__all__ = ["PROJECT", "hookimpl", "hookspec", "sloguard_collectors"]


@hookspec
def sloguard_collectors() -> list[type[Collector]]:
    """Return the collector types this plugin provides.

    Each type has a unique class attribute `name` (its config section `collectors.<name>` and
    its component in /readyz), an optional pydantic model `Config` for that section (unknown
    keys and bad values are then errors with file and line, like the built-ins' sections), and
    follows the `Collector` protocol of collectors/base.py: `create(ctx)` builds it from its
    section or returns None, then start, collect once per tick, status, close.
    """
