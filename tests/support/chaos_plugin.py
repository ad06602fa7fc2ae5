"""A detector plugin that kills one of the agent's threads on request: chaos for the tests.

Loaded into a real agent process through `detectors.plugins` (plugins run in the agent's
process, which is what makes this possible). When the file named by its `trigger` parameter
appears, the next evaluation raises ThreadKilled inside the thread the file names, through
CPython's PyThreadState_SetAsyncExc: the thread ends as if a bug outside its own `try` had
hit it. ThreadKilled is a BaseException so that the threads' `except Exception` pass it by.
A trigger saying `fail-ticks` instead breaks every tick of the agent (its recent windows raise)
for as long as a file `fail-ticks` exists beside the trigger.
"""

from __future__ import annotations

import ctypes
import gc
import threading
from pathlib import Path
from typing import Any

from sloguard.detector.api import Verdict, hookimpl


class ThreadKilled(BaseException):
    pass


class ChaosKill:
    name = "chaos_kill"

    def __init__(self, params: dict[str, Any]) -> None:
        self.trigger = Path(params["trigger"])

    def update(self, value: float, time_ns: int) -> Verdict:
        try:
            target = self.trigger.read_text().strip()
        except FileNotFoundError:
            return Verdict(False, True, None, "")
        self.trigger.unlink()
        if target == "fail-ticks":
            _break_ticks(self.trigger.parent / "fail-ticks")
        for thread in threading.enumerate():
            if thread.name == target and thread.ident is not None:
                ctypes.pythonapi.PyThreadState_SetAsyncExc(
                    ctypes.c_ulong(thread.ident), ctypes.py_object(ThreadKilled))
        return Verdict(False, True, None, "")


def _break_ticks(marker: Path) -> None:
    from sloguard.agent import Agent

    marker.touch()
    for agent in [o for o in gc.get_objects() if isinstance(o, Agent)]:
        add = agent.windows.add

        def failing(*args: Any, add: Any = add, **kwargs: Any) -> None:
            if marker.exists():
                raise RuntimeError("chaos: this tick breaks")
            add(*args, **kwargs)

        agent.windows.add = failing


@hookimpl
def sloguard_detectors() -> list[type]:
    return [ChaosKill]
