"""The detector worker's one hand-over per evaluation (DetectorWorker.run_each): the works run in
order, each under its own deadline from its start, and none starts once the caller gave up."""

from __future__ import annotations

import textwrap
import threading
import time

from test_rules_engine import FIRING, RULES, _BadPlugins, _Harness

from sloguard.detector.registry import DetectorRegistry
from sloguard.detector.worker import DetectorWorker


def test_works_run_in_order_in_one_hand_over_and_failures_stay_their_own():
    worker = DetectorWorker()
    threads: list[int] = []

    def work(n):
        def run():
            threads.append(threading.get_ident())
            if n == 1:
                raise ValueError("plugin bug")
            return n * 10
        return run

    tasks = []
    queue = worker._tasks

    class Counted:  # the worker's queue, counting what is put on it
        def put(self, task):
            tasks.append(task)
            queue.put(task)

        def get(self):
            return queue.get()

    worker._tasks = Counted()
    outcomes, cut = worker.run_each([work(n) for n in range(3)], 1.0)
    assert cut is None and len(tasks) == 1  # one hand-over for the three
    assert [(ok, value if ok else repr(value)) for ok, value, _ in outcomes] == [
        (True, 0), (False, "ValueError('plugin bug')"), (True, 20)]
    assert len(set(threads)) == 1 and threads[0] != threading.get_ident()
    assert all(seconds >= 0 for _, _, seconds in outcomes)
    assert worker.run_each([], 1.0) == ([], None)
    worker.abandon()


def test_each_work_has_its_own_deadline_from_its_start():
    """Three works of 0.3 s under a deadline of 0.8 s each: 0.9 s in all, none cut off (the
    margin is wide: a loaded CI machine delays a wake-up)."""
    worker = DetectorWorker()
    outcomes, cut = worker.run_each([lambda: time.sleep(0.3)] * 3, 0.8)
    assert cut is None and [ok for ok, _, _ in outcomes] == [True, True, True]
    worker.abandon()


def test_a_work_past_its_deadline_is_cut_off_and_the_ones_after_it_never_start():
    release, started = threading.Event(), []
    worker = DetectorWorker()

    def hangs():
        started.append("hangs")
        release.wait(10)

    begun = time.monotonic()
    outcomes, cut = worker.run_each(
        [lambda: started.append("first"), hangs, lambda: started.append("after")], 0.3)
    waited = time.monotonic() - begun
    assert cut == 1 and [ok for ok, _, _ in outcomes] == [True]
    assert 0.3 <= waited < 2.0
    assert worker.stuck  # abandoned, its work still running
    release.set()
    deadline = time.monotonic() + 5
    while worker.stuck and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not worker.stuck  # it ended once the cut-off work returned...
    assert started == ["first", "hangs"]  # ...without starting the work after it


def test_a_hung_rule_between_two_others_costs_them_nothing(tmp_path):
    """The rules after a hung one go to a new worker in the same evaluation."""
    text = RULES + textwrap.indent(textwrap.dedent("""\
        - alert: Stuck
          expr: lat
          field: p99
          detector: hanging
        - alert: After
          expr: lat
          field: p99
          aggregate: last
          window: 3s
          params: {above: 10}
          for: 2s
    """), " " * 6)
    registry = DetectorRegistry(plugins=[_BadPlugins()])
    h = _Harness(tmp_path, text, registry=registry, timeout_s=0.2)
    for second in range(4):
        h.at(second, 30.0)
    states = {i.rule: i.state for i in h.all()}
    assert states == {"LSSlow": FIRING, "After": FIRING}
    assert "longer than 0.2s" in h.engine.status["ls/Stuck"].error
    assert h.engine.status["ls/After"].error == "" and h.engine.status["ls/After"].evaluations == 4


def test_a_systemexit_from_a_plugin_ends_the_evaluation_before_the_next_rule_runs(tmp_path):
    """A BaseException that is not an Exception (SystemExit from a plugin) leaves `evaluate`
    as it did when each rule had its own hand-over: the rules after it run no detector code."""
    import pytest

    from sloguard.detector.api import hookimpl

    ran: list[str] = []

    class Exiting:
        name = "exiting"

        def __init__(self, params):
            pass

        def update(self, value, time_ns):
            raise SystemExit(3)

    class Counting:
        name = "counting"

        def __init__(self, params):
            pass

        def update(self, value, time_ns):
            from sloguard.detector.api import Verdict

            ran.append("counting")
            return Verdict(False, True)

    class Plugins:
        @hookimpl
        def sloguard_detectors(self):
            return [Exiting, Counting]

    text = RULES + textwrap.indent(textwrap.dedent("""\
        - alert: Exits
          expr: lat
          field: p99
          detector: exiting
        - alert: After
          expr: lat
          field: p99
          detector: counting
    """), " " * 6)
    h = _Harness(tmp_path, text, registry=DetectorRegistry(plugins=[Plugins()]), timeout_s=1.0)
    with pytest.raises(SystemExit):
        h.at(0, 30.0)
    assert ran == []
