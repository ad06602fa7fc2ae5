"""The step kinds a policy may name, and the factory that builds them from a policy's steps.

Built-ins are named by module path and imported on first use, so an agent whose policies only
cordon never imports the cgroup or resctrl code, and a broken optional module fails only the
policies that use it (with the reason, against the policy file's line).
"""

from __future__ import annotations

import importlib
import json
from typing import Any

from sloguard.actuators.env import ActuatorEnv
from sloguard.actuators.policy import StepSpec

BUILTIN_STEPS = {
    "notify": "sloguard.actuators.notify:Notify",
    "cordon": "sloguard.actuators.cordon:Cordon",
    "reduce_capacity": "sloguard.actuators.capacity:ReduceCapacity",
    "evict": "sloguard.actuators.evict:Evict",
    "cpu_idle": "sloguard.actuators.cpu_idle:CpuIdle",
    "cpuset": "sloguard.actuators.cpuset:Cpuset",
    "cpu_quota": "sloguard.actuators.cpu_quota:CpuQuota",
    "memory_limit": "sloguard.actuators.memory_limit:MemoryLimit",
    "resctrl": "sloguard.actuators.resctrl:Resctrl",
}


class StepFactory:
    def __init__(self, env: ActuatorEnv, kinds: dict[str, str] | None = None) -> None:
        self.env = env
        self.kinds = dict(BUILTIN_STEPS if kinds is None else kinds)
        self._types: dict[str, type] = {}
        self._made: dict[str, Any] = {}

    def type_of(self, kind: str) -> type:
        if kind not in self._types:
            where = self.kinds.get(kind)
            if where is None:
                known = ", ".join(sorted(self.kinds))
                raise ValueError(f"unknown step {kind!r} (available: {known}, suppress)")
            module, _, name = where.partition(":")
            self._types[kind] = getattr(importlib.import_module(module), name)
        return self._types[kind]

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
        self.type_of(spec.step)(dict(spec.params), self.env)
