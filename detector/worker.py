"""A daemon thread that runs detector code with a deadline.

Plugin code may hang. A thread cannot be killed, so a worker that misses its deadline is
abandoned and a new one started; being a daemon, an abandoned worker never keeps the agent from
exiting on SIGTERM (concurrent.futures' pool threads would: interpreter exit joins them).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any


class DetectorWorker:
    def __init__(self) -> None:
        self._tasks: queue.SimpleQueue[tuple[Callable[[], Any], Future]] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._serve, name="detectors", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            run, future = self._tasks.get()
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(run())
            except BaseException as exc:  # handed to the caller, not lost with the thread
                future.set_exception(exc)

    def run(self, work: Callable[[], Any], timeout_s: float) -> Any:
        """`work()`'s result, its exception, or TimeoutError after `timeout_s`."""
        future: Future = Future()
        self._tasks.put((work, future))
        return future.result(timeout=timeout_s)
