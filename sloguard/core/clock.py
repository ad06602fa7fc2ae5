"""The two clocks of the agent: wall time labels what happened, monotonic time runs timers.

Samples, incidents and messages are stamped with wall time (that is what an SRE and the other
nodes read). Durations the agent waits out (`for`, `recover_for`, rule intervals, a hung rule's
back-off, alert group timers) are measured on the monotonic clock: NTP stepping the clock, a VM
resumed from a snapshot or an operator's `date -s` must neither fire an alert early nor hold it
for an hour. Passing a clock object (instead of calling `time` everywhere) lets a test step the
wall clock of one in-process agent without touching the machine's.
"""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def wall_ns(self) -> int: ...

    def mono_ns(self) -> int: ...


class SystemClock:
    """The machine's clocks."""

    @staticmethod
    def wall_ns() -> int:
        return time.time_ns()

    @staticmethod
    def mono_ns() -> int:
        return time.monotonic_ns()


SYSTEM = SystemClock()
