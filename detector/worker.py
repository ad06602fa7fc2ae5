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
import time
from collections.abc import Callable, Sequence
from typing import Any


class Batch:
    """Works handed over at once, run in order; each has its own deadline from its start.

    One hand-over per evaluation instead of one per rule: a hand-over between two threads
    (the work queued, the result waited for) cost ~96 us of CPU on this project's 2-vCPU VM,
    where the wake-ups cross CPUs (~31 us on one CPU), and a tick hands over about one per
    rule (benchmarks/agent_tick.py, "evaluate"; the measured run is in docs/performance.md).
    """

    def __init__(self, works: Sequence[Callable[[], Any]]) -> None:
        self.works = list(works)
        # (True, result, seconds) or (False, exception, seconds), in the works' order
        self.outcomes: list[tuple[bool, Any, float]] = []
        self.done = threading.Event()
        self.lock = threading.Lock()
        self.at: tuple[int, float] = (0, time.monotonic())  # the work running, and since when
        self.cut = False  # no further work may start: the caller gave up on this worker


class DetectorWorker:
    def __init__(self) -> None:
        # None is abandon()'s wake-up for an idle worker
        self._tasks: queue.SimpleQueue[Batch | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._serve, name="detectors", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._abandoned:
            task = self._tasks.get()
            if task is None:
                break
            self._run_batch(task)

    def _run_batch(self, batch: Batch) -> None:
        try:
            for index, work in enumerate(batch.works):
                with batch.lock:  # the caller's cut and this start never cross
                    if batch.cut or self._abandoned:
                        return
                    batch.at = (index, started := time.monotonic())
                try:
                    batch.outcomes.append((True, work(), time.monotonic() - started))
                except BaseException as exc:  # handed to the caller, not lost with the thread
                    batch.outcomes.append((False, exc, time.monotonic() - started))
                    if not isinstance(exc, Exception):  # SystemExit and the like end the
                        return  # evaluation where they are raised: no work after them runs
        finally:
            batch.done.set()

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
        """`work()`'s result, its exception, or TimeoutError after `timeout_s` (the worker is
        then abandoned): `run_each` of one work."""
        done, cut = self.run_each([work], timeout_s)
        if cut is not None:
            raise TimeoutError(f"cut off after {timeout_s:g}s")
        ok, value, _ = done[0]
        if not ok:
            raise value
        return value

    def run_each(self, works: Sequence[Callable[[], Any]],
                 timeout_s: float) -> tuple[list[tuple[bool, Any, float]], int | None]:
        """Run `works` in order in one hand-over, each cut off `timeout_s` after its start.

        Returns the outcomes of the works that ran, (True, result, seconds) or (False,
        exception, seconds), and the index of the work cut off at its deadline (None when none
        was). On a cut-off this worker is abandoned and the works after it did not start: the
        caller hands them to a new worker. No work starts once the caller has given up."""
        batch = Batch(works)
        if not batch.works:
            return [], None
        self._tasks.put(batch)
        wait = timeout_s  # the first work starts no earlier than now
        while not batch.done.wait(max(wait, 0.0)):
            with batch.lock:
                index, started = batch.at
                if len(batch.outcomes) > index:  # it has just returned: the next starts soon
                    wait = timeout_s
                    continue
                wait = started + timeout_s - time.monotonic()
                if wait > 0:
                    continue
                batch.cut = True
            self.abandon()
            return batch.outcomes[:index], index
        return batch.outcomes, None
