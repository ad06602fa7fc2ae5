"""A daemon thread that runs detector code with a deadline.

Plugin code may hang. A thread cannot be killed, so a worker that misses its deadline is
abandoned and a new one started; being a daemon, an abandoned worker never keeps the agent from
exiting on SIGTERM (concurrent.futures' pool threads would: interpreter exit joins them). An
abandoned worker ends as soon as the work it was cut off in returns (it once waited for more
work forever), and the engine does not retry a rule while the worker it hung is still stuck, so
stuck workers number at most the rules that hang, not one more per back-off.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any


class DetectorWorker:
    def __init__(self) -> None:
        # None is abandon()'s wake-up for an idle worker
        self._tasks: queue.SimpleQueue[tuple[Callable[[], Any], Future] | None] = (
            queue.SimpleQueue())
        self._thread = threading.Thread(target=self._serve, name="detectors", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._abandoned:
            task = self._tasks.get()
            if task is None:
                break
            run, future = task
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(run())
            except BaseException as exc:  # handed to the caller, not lost with the thread
                future.set_exception(exc)

    _abandoned = False

    def abandon(self) -> None:
        """No more work for this worker: it ends once the work in hand returns, or at once
        when idle (an idle worker waits on its queue, so the flag alone never ended it: a
        thread stayed behind per agent stopped in-process, 80 in one test process)."""
        self._abandoned = True
        self._tasks.put(None)

    @property
    def stuck(self) -> bool:
        """Abandoned, and still inside the work it was cut off in."""
        return self._abandoned and self._thread.is_alive()

    def run(self, work: Callable[[], Any], timeout_s: float) -> Any:
        """`work()`'s result, its exception, or TimeoutError after `timeout_s`."""
        future: Future = Future()
        self._tasks.put((work, future))
        return future.result(timeout=timeout_s)
