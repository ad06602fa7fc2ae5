"""The contract of a collector, and what the agent hands one when it builds it.

A collector is built once by the agent (`create`, from its config section; None when that
section turns it off or gives it nothing to do), started before the first tick (`start`: load
eBPF programs, start a scraper thread), polled once per tick by the agent's loop (`collect`),
and closed when the agent stops (`close`: detach programs, close held files, join threads).
It returns samples and never raises for data that vanished mid-read (a container that exited
is skipped and counted); it raises only when it cannot work at all, which the agent records in
the collector's status.

New collectors are plugins of the collectors extension point (collectors/registry.py;
docs/architecture.md has a worked example).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

from sloguard.core.health import ComponentStatus
from sloguard.core.samples import Sample


@dataclass
class CollectorContext:
    """What a collector may use when it is built."""

    node: str
    settings: Any  # the whole configuration: a collector reads its own section (see `section`)
    pods: Any = None  # the pod metadata cache (collectors/kube_pods.py), None without Kubernetes
    metrics: Any = None  # the agent's prometheus_client CollectorRegistry, for self-metrics
    # the collectors built before this one, by name: the cgroup collector's inventory is what
    # per-cgroup collectors (eBPF, CPI) attribute to
    built: dict[str, Any] = field(default_factory=dict)

    def section(self, name: str) -> Any:
        """`collectors.<name>`: a built-in's model, or a plugin's (validated against its
        `Config`), or None when the file does not mention a plugin's section."""
        return getattr(self.settings.collectors, name, None)


class Collector(Protocol):
    name: ClassVar[str]  # what `collectors.<name>` configures and /readyz shows

    @classmethod
    def create(cls, ctx: CollectorContext) -> Collector | None:
        """The collector this configuration asks for, or None (turned off, nothing to do)."""
        ...

    def start(self) -> None:
        """Acquire what the collector holds (programs, threads); called once, before a tick."""
        ...

    def collect(self, now_ns: int) -> list[Sample]:
        """Read the current values and return them as samples stamped `now_ns`."""
        ...

    def status(self) -> ComponentStatus:
        """Whether this collector works here, and why not when it does not."""
        ...

    def close(self) -> None:
        """Release what `start` acquired; the agent calls it once, when it stops."""
        ...


class CollectorBase:
    """Defaults for collectors that hold nothing: start and close do nothing."""

    name: ClassVar[str] = ""

    def start(self) -> None:
        return None

    def close(self) -> None:
        return None
