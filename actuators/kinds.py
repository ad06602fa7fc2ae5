"""The step kinds a policy may name, and the factory that builds them from a policy's steps.

The steps extension point (sloguard/core/extensions.py): the built-in levers are registered
here by name, third parties come through the entry-point group `sloguard.steps`. A plugin that
fails to load is reported by name; a policy naming one of its steps is rejected with the reason,
against the policy file's line, while the other policies still load.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Mapping
from typing import Any

from sloguard.actuators import hookspecs
from sloguard.actuators.env import ActuatorEnv
from sloguard.actuators.policy import StepSpec
from sloguard.core.extensions import Extensions

ENTRY_POINT_GROUP = "sloguard.steps"

# The built-in step plugins, by plugin name: one file per lever (koordlet's one strategy each).
BUILTIN_STEPS = {
    "notify": "sloguard.actuators.notify",
    "cordon": "sloguard.actuators.cordon",
    "reduce_capacity": "sloguard.actuators.capacity",
    "evict": "sloguard.actuators.evict",
    "cpu_idle": "sloguard.actuators.cpu_idle",
    "cpuset": "sloguard.actuators.cpuset",
    "cpu_quota": "sloguard.actuators.cpu_quota",
    "memory_limit": "sloguard.actuators.memory_limit",
    "resctrl": "sloguard.actuators.resctrl",
}


class StepRegistry(Extensions):
    def __init__(self, use_entry_points: bool = True, plugins: tuple[Any, ...] = ()) -> None:
        super().__init__("step", hookspecs, "sloguard_steps", ENTRY_POINT_GROUP, BUILTIN_STEPS,
                         plugins=plugins, use_entry_points=use_entry_points, key="kind")


class StepFactory:
    """Builds policy steps. `kinds` replaces the registry with an explicit table of
    kind -> "module:Class" (tests use it for steps of their own)."""

    def __init__(self, env: ActuatorEnv, kinds: Mapping[str, str] | None = None,
                 registry: StepRegistry | None = None) -> None:
        self.env = env
        self.registry = registry if registry is not None or kinds else StepRegistry()
        self.kinds = dict(kinds or {})
        self._made: dict[str, Any] = {}

    def type_of(self, kind: str) -> type:
        if self.registry is not None:
            try:
                return self.registry.get(kind)
            except ValueError as exc:
                raise ValueError(f"{exc} (or suppress)") from None
        where = self.kinds.get(kind)
        if where is None:
            known = ", ".join(sorted(self.kinds))
            raise ValueError(f"unknown step {kind!r} (available: {known}, suppress)")
        module, _, name = where.partition(":")
        return getattr(importlib.import_module(module), name)

    def make(self, spec: StepSpec) -> Any:
        """The step for this spec; the same object for the same kind and params (steps may
        cache API clients and open files)."""
        key = json.dumps([spec.step, spec.params], sort_keys=True, default=str)
        step = self._made.get(key)
        if step is None:
            step = self._made[key] = self.type_of(spec.step)(dict(spec.params), self.env)
        return step

    def check(self, spec: StepSpec) -> None:
        """Refuse an unknown kind or bad params: the policy loader's `validate_step`."""
        kind = self.type_of(spec.step)
        if spec.target == "suspects" and not getattr(kind, "per_workload", False):
            raise ValueError(f"{spec.step} does not act on BE workloads one by one, so it has "
                             "no `target: suspects` (the cgroup levers have)")
        kind(dict(spec.params), self.env)

    def cannot_stand(self, kind: str) -> str | None:
        """Why a step kind cannot be a policy's standing lever: only a lever that acts on BE
        workloads one by one (and so reaches each new one as it appears) and whose value needs
        no measurement (`can_stand`) can; cpu_quota and memory_limit follow BE's usage, so a
        standing one would rewrite its files on every tick."""
        step = self.type_of(kind)
        if not getattr(step, "per_workload", False) or not getattr(step, "can_stand", False):
            return (f"{kind} cannot stand: only a lever that acts on each BE workload with a "
                    "value it needs no measurement for (cpu_idle, cpuset, resctrl) is kept in "
                    "force at all times")
        return None
