"""The contract of a collector.

A collector is polled once per tick by the agent's loop. It returns samples and never raises for
data that vanished mid-read (a container that exited is skipped and counted); it raises only when
it cannot work at all, which the agent records in the collector's status.
"""

from __future__ import annotations

from typing import Protocol

from sloguard.core.health import ComponentStatus
from sloguard.core.samples import Sample


class Collector(Protocol):
    name: str

    def collect(self, now_ns: int) -> list[Sample]:
        """Read the current values and return them as samples stamped `now_ns`."""
        ...

    def status(self) -> ComponentStatus:
        """Whether this collector works here, and why not when it does not."""
        ...
