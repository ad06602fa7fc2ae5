"""Rules and the incident lifecycle on the real embedded stores."""

from __future__ import annotations

import functools
import math
import os
import textwrap

import pytest

from sloguard.actuators.dryrun import DryRunActuator
from sloguard.core.incidents import FIRING, PENDING, RESOLVED
from sloguard.core.samples import Sample
from sloguard.detector.api import hookimpl
from sloguard.detector.engine import Engine
from sloguard.detector.incident_making import render
from sloguard.detector.recent import RecentWindows
from sloguard.detector.registry import DetectorRegistry
from sloguard.detector.rules import RuleFileError, RuleSet, load_rule_file
from sloguard.detector.signals import SignalKey, aggregate
from sloguard.plugins.threshold import Threshold
from sloguard.store.embedded import EmbeddedStore
from sloguard.store.incidents_db import IncidentStore

REGISTRY = DetectorRegistry()
make_detector = REGISTRY.make

S = 1_000_000_000
T0 = 1_800_000_000 * S

RULES = """\
groups:
  - name: ls
    rules:
      - alert: LSSlow
        expr: lat{class="LS"}
        field: p99
        aggregate: last
        window: 3s
        params: {above: 10, recover_below: 5}
        for: 2s
        recover_for: 2s
        severity: critical
        labels: {team: web}
        annotations:
          summary: "{{ $labels.pod }} p99 {{ $value }} ms"
"""


def test_threshold_hysteresis_and_nan():
    t = Threshold({"above": 10, "recover_below": 5})
    assert [(t.update(v).crossed, t.update(v).recovered) for v in (11, 7, 5, 4)] == [
        (True, False), (False, False), (False, True), (False, True)]  # 7: the hysteresis band
    assert (t.update(math.nan).crossed, t.update(math.nan).recovered) == (False, True)
    low = make_detector("threshold", {"below": 1, "recover_above": 2})
    assert low.update(0.5).crossed and not low.update(1.5).recovered and low.update(2).recovered
    for bad in ({}, {"above": 1, "below": 2}, {"above": "x"}, {"above": 1, "recover_below": 2},
                {"above": 1, "recover_above": 0}, {"above": 1, "bogus": 1}):
        with pytest.raises(ValueError):
            Threshold(bad)
    with pytest.raises(ValueError, match="unknown detector"):
        make_detector("magic", {})


def test_rule_file_errors_name_file_line_and_field(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text(RULES.replace("window: 3s", "window: 3 sec"))
    with pytest.raises(RuleFileError,
                       match=rf"{path}:8:9: groups.0.rules.0.window: not a duration"):
        load_rule_file(path)
    path.write_text(RULES.replace('expr: lat{class="LS"}', 'expr: lat{class=LS}'))
    with pytest.raises(RuleFileError, match=rf"{path}:5:9: groups.0.rules.0.expr"):
        load_rule_file(path)
    path.write_text(RULES.replace("params: {above: 10, recover_below: 5}", "params: {abve: 1}"))
    validate = lambda spec: make_detector(spec.detector, spec.params)  # noqa: E731
    with pytest.raises(RuleFileError,
                       match=rf"{path}:9:9: groups.0.rules.0.params: unknown threshold"):
        load_rule_file(path, validate)
    path.write_text(RULES + "        colour: red\n")
    with pytest.raises(RuleFileError, match=rf"{path}:16:9: groups.0.rules.0.colour: unknown"):
        load_rule_file(path)


def test_broken_file_keeps_previous_rules(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text(RULES)
    rules = RuleSet([str(tmp_path)])
    assert rules.reload().changed and [r.key for r in rules.rules] == ["ls/LSSlow"]
    path.write_text("groups: [ {name: x, rules: [ {alert: A} ] } ]\n")
    os.utime(path, (1, 1))  # a new mtime even within the same second
    assert not rules.reload().changed
    assert [r.key for r in rules.rules] == ["ls/LSSlow"]  # still armed
    assert "expr" in rules.errors[str(path)] and f"{path}:1:" in rules.errors[str(path)]
    path.write_text(RULES.replace("LSSlow", "LSSlower"))
    os.utime(path, (2, 2))
    assert rules.reload().changed and [r.key for r in rules.rules] == ["ls/LSSlower"]
    assert rules.errors == {}


class _Harness:
    def __init__(self, tmp_path, rules_text=RULES, registry=REGISTRY, timeout_s=1.0,
                 batches=True):
        self.registry, self.timeout_s, self.batches = registry, timeout_s, batches
        (tmp_path / "rules").mkdir(exist_ok=True)
        (tmp_path / "rules" / "r.yaml").write_text(rules_text)
        self.tmp = tmp_path
        self.store = EmbeddedStore(tmp_path / "samples.db", 3600, 1 << 30)
        self.open()

    def open(self):
        self.incidents = IncidentStore(self.tmp / "incidents.db")
        self.rules = RuleSet([str(self.tmp / "rules")])
        self.rules.reload()
        self.windows = RecentWindows()
        self.engine = Engine(
            self.windows, self.incidents, self.rules, "node-a", DryRunActuator("node-a"),
            registry=self.registry, timeout_s=self.timeout_s, batches=self.batches,
            inventory=lambda: [{"cgroup": "/x", "class": "LS"}, {"cgroup": "/y", "class": "BE"}],
        )
        self.engine.sync_windows(self.store, self.now)
        return self.engine.restore()

    now = T0

    def at(self, second: int, value: float | None, pod: str = "web-1") -> None:
        now = self.now = T0 + second * S
        if value is not None:
            sample = Sample("lat", {"node": "node-a", "class": "LS", "pod": pod},
                            {"p99": value}, now)
            self.store.write([sample])
            self.windows.add([sample])
        self.engine.evaluate(now)

    def all(self):
        return self.incidents.query(limit=100)


def test_lifecycle_pending_firing_resolved(tmp_path):
    h = _Harness(tmp_path)
    h.at(0, 1.0)
    assert h.all() == []
    h.at(1, 20.0)
    [incident] = h.all()
    assert incident.state == PENDING and incident.actions == []
    h.at(2, 20.0)
    assert h.all()[0].state == PENDING
    h.at(3, 25.0)  # `for: 2s` has elapsed
    [incident] = h.all()
    assert incident.state == FIRING and incident.fired_ns == T0 + 3 * S
    assert incident.severity == "critical" and incident.labels["team"] == "web"
    assert incident.summary == "web-1 p99 25 ms"
    assert incident.affected == [{"pod": "web-1"}]
    assert [(a.step, a.dry_run, a.status) for a in incident.actions] == [
        ("notify", True, "proposed")]
    assert incident.evidence[0].value == 20.0 and incident.evidence[0].threshold == 10
    h.at(4, 7.0)  # between the bounds: hysteresis keeps it firing
    h.at(5, 3.0)  # recovered: the 2 s hold starts
    h.at(6, 3.0)
    assert h.all()[0].state == FIRING
    h.at(7, 3.0)
    [incident] = h.all()
    assert incident.state == RESOLVED and incident.resolved_ns == T0 + 7 * S
    assert incident.peak == 25.0
    assert len(incident.actions) == 2


def test_pending_that_clears_leaves_no_incident_and_nan_never_fires(tmp_path):
    h = _Harness(tmp_path)
    h.at(0, 50.0)
    assert h.all()[0].state == PENDING
    h.at(1, 1.0)
    assert h.all() == []
    h.at(2, math.nan)
    h.at(3, None)  # no data at all
    h.at(8, None)
    assert h.all() == []


def test_incidents_survive_a_restart(tmp_path):
    h = _Harness(tmp_path)
    for second in range(4):
        h.at(second, 30.0)
    [before] = h.all()
    assert before.state == FIRING
    h.incidents.close()
    assert h.open() == 1  # a new engine over the same files adopts the incident
    h.at(4, 30.0)
    h.at(5, 1.0)
    h.at(7, 1.0)
    [after] = h.all()
    assert after.id == before.id and after.state == RESOLVED
    assert after.fired_ns == before.fired_ns


class _Exploding:
    name = "exploding"

    def __init__(self, params):
        pass

    def update(self, value, time_ns):
        raise ZeroDivisionError("plugin bug")


class _Hanging:
    name = "hanging"

    def __init__(self, params):
        pass

    def update(self, value, time_ns):
        import time

        time.sleep(3)


class _BadPlugins:
    @hookimpl
    def sloguard_detectors(self):
        return [_Exploding, _Hanging]


def test_failing_and_hanging_detectors_do_not_stop_the_others(tmp_path):
    text = RULES + textwrap.indent(textwrap.dedent("""\
        - alert: Broken
          expr: lat
          field: p99
          detector: exploding
        - alert: Stuck
          expr: lat
          field: p99
          detector: hanging
    """), " " * 6)
    registry = DetectorRegistry(plugins=[_BadPlugins()])
    h = _Harness(tmp_path, text, registry=registry, timeout_s=0.2)
    for second in range(4):
        h.at(second, 30.0)
    assert h.all()[0].state == FIRING and h.all()[0].rule == "LSSlow"
    assert "ZeroDivisionError: plugin bug" in h.engine.status["ls/Broken"].error
    assert "longer than 0.2s" in h.engine.status["ls/Stuck"].error
    assert h.engine.status["ls/Stuck"].evaluations == 1  # skipped after being cut off
    assert h.engine.status["ls/LSSlow"].error == ""


def test_a_rule_that_hangs_for_good_leaves_one_stuck_worker_not_one_per_backoff(tmp_path):
    """Issue #19: each retry of a rule whose plugin never returns abandoned one more worker
    thread, and an abandoned worker whose work did return waited for more work forever."""
    import threading
    import time as clock

    from sloguard.detector.engine import HUNG_BACKOFF_S

    release = threading.Event()

    class Forever:
        name = "forever"

        def __init__(self, params):
            pass

        def update(self, value, time_ns):
            release.wait(60)
            return Threshold({"above": 10}).update(value, time_ns)

    class Plugin:
        @hookimpl
        def sloguard_detectors(self):
            return [Forever]

    before = {t for t in threading.enumerate() if t.name == "detectors"}

    def workers():  # started by this test (those of earlier tests may still be ending)
        return [t for t in threading.enumerate()
                if t.name == "detectors" and t not in before and t.is_alive()]

    text = RULES.replace("        params: {above: 10, recover_below: 5}\n",
                         "        detector: forever\n")
    h = _Harness(tmp_path, text, registry=DetectorRegistry(plugins=[Plugin()]), timeout_s=0.2)
    backoff = int(HUNG_BACKOFF_S)
    try:
        for second in range(0, 6 * backoff, backoff // 2):
            h.at(second, 30.0)
        assert h.engine.status["ls/LSSlow"].evaluations == 1  # waits for the stuck code
        assert "once that code has returned" in h.engine.status["ls/LSSlow"].error
        assert h.engine.stuck_workers == 1
        assert len(workers()) == 1  # the stuck one (no fresh one was needed)
    finally:
        release.set()
    deadline = clock.monotonic() + 5
    while workers() and clock.monotonic() < deadline:
        clock.sleep(0.01)
    assert workers() == []  # the abandoned worker ended once its work returned
    assert h.engine.stuck_workers == 0
    h.at(6 * backoff, 30.0)  # tried again: it runs (on a new worker) and can fire
    assert h.engine.status["ls/LSSlow"].evaluations == 2
    h.engine.close()


@pytest.mark.parametrize("batches", [True, False])
def test_a_rule_without_series_runs_no_detector_code(tmp_path, monkeypatch, batches):
    """Most shipped rules have no series on a node without LS pods: their evaluation is not
    handed to the detector worker (a round trip each), and nothing else changes: the rule is
    evaluated, and fires and resolves as before once its series come and go."""
    from sloguard.detector.worker import DetectorWorker

    runs: list[int] = []  # one per rule's detector code handed over
    real_run = DetectorWorker.run_each

    def counted(self, works, timeout_s):
        runs.extend(1 for _ in works)
        return real_run(self, works, timeout_s)

    monkeypatch.setattr(DetectorWorker, "run_each", counted)
    h = _Harness(tmp_path, batches=batches)
    for second in range(3):
        h.at(second, None)
    status = h.engine.status["ls/LSSlow"]
    assert (runs, status.evaluations, status.error, status.series) == ([], 3, "", 0)
    for second in range(3, 6):
        h.at(second, 30.0)
    assert [i.state for i in h.all()] == [FIRING] and len(runs) == 3
    for second in range(6, 20):  # the series stops: its open alert is judged on NaN
        h.at(second, None)
    assert [i.state for i in h.all()] == [RESOLVED]
    settled = len(runs)
    h.at(20, None)  # nothing open, no series: back to no detector code
    assert len(runs) == settled
    h.at(21, 30.0)  # a value again: judged on the worker, and a new episode begins
    assert len(runs) == settled + 1 and [i.state for i in h.all()] == [PENDING, RESOLVED]
    h.engine.close()


def test_backfill_from_the_store_continues_windows_after_restart(tmp_path):
    h = _Harness(tmp_path)
    for second in range(3):
        h.at(second, 30.0)  # pending since second 1 of 2 needed
    h.store.write([Sample("lat", {"node": "node-a", "class": "LS", "pod": "web-9"},
                          {"p99": 99.0}, T0 + 2 * S)])
    h.incidents.close()
    h.open()  # restart: windows come back from the store
    spec = h.rules.rules[0].spec
    subscription, new = h.windows.subscribe(spec.selector, spec.field, spec.window)
    assert not new  # created and backfilled when the engine synced its windows
    assert {dict(k)["pod"] for k in subscription.window(T0, T0 + 3 * S)} == {"web-1", "web-9"}


def test_aggregates_match_pandas():
    import pandas as pd

    values = [3.0, 1.0, 4.0, 1.0, 5.0, 9.0, 2.0, 6.0]
    times = [T0 + i * S for i in range(len(values))]
    series = pd.Series(values)
    for how, expected in (("mean", series.mean()), ("max", 9.0), ("min", 1.0),
                          ("sum", series.sum()), ("count", 8.0), ("median", series.median()),
                          ("p90", series.quantile(0.9)), ("p99.9", series.quantile(0.999)),
                          ("first", 3.0), ("last", 6.0)):
        assert math.isclose(aggregate(times, values, how), expected), how
    assert aggregate(times[:3], [10.0, 20.0, 40.0], "rate") == 15.0
    assert aggregate(times[:4], [100.0, 200.0, 0.0, 150.0], "rate") == 250 / 3  # across a reset
    assert aggregate(times[:3], [math.nan, 10.0, 20.0], "rate") == 10.0  # NaN dropped with its time
    assert math.isnan(aggregate(times[:1], [10.0], "rate"))
    assert math.isnan(aggregate([], [], "mean"))
    assert aggregate(times[:2], [math.nan, 2.0], "mean") == 2.0


def test_last_without_copying_the_window_agrees_with_the_window():
    from sloguard.core.selectors import parse_selector
    from sloguard.detector.recent import Subscription

    sub = Subscription(parse_selector("m"), "v", 10 * S)

    def put(pod, second, value):
        sub.offer(Sample("m", {"pod": pod}, {"v": value}, T0 + second * S), (("pod", pod),))

    for second in range(12):
        put("steady", second, float(second))
    put("gap", 1, 5.0)
    put("gap", 2, math.nan)  # the newest point is NaN: the one before counts
    put("old", 0, 1.0)  # outside the window entirely
    for second, value in ((3, 3.0), (5, 5.0), (4, 4.0)):
        put("shuffled", second, value)  # arrived out of order: the latest by time counts
    last = sub.last(T0 + S, T0 + 12 * S)
    assert last == {(("pod", "steady"),): 11.0, (("pod", "gap"),): 5.0,
                    (("pod", "shuffled"),): 5.0}
    window = sub.window(T0 + S, T0 + 12 * S)
    ordered = {k: aggregate(t, v, "last") for k, (t, v) in window.items() if k != (
        ("pod", "shuffled"),)}
    assert ordered == {k: v for k, v in last.items() if k != (("pod", "shuffled"),)}


def test_series_are_independent(tmp_path):
    h = _Harness(tmp_path)
    for second in range(4):
        h.at(second, 30.0, pod="web-1")
        h.at(second, 1.0, pod="web-2")
    [incident] = h.all()
    assert incident.series["pod"] == "web-1"


def test_render():
    assert render("{{ $labels.a }}={{$value}}", {"a": "x"}, 1.23456) == "x=1.235"
    assert render("{{ $labels.missing }}|{{ $value }}", {}, None) == "|n/a"


def test_pending_needs_the_firing_bound_throughout(tmp_path):
    h = _Harness(tmp_path)
    h.at(0, 30.0)
    h.at(1, 7.0)  # inside the hysteresis band: not past `above`, so pending is cancelled
    assert h.all() == []
    for second in range(2, 6):
        h.at(second, 7.0)
    assert h.all() == []


def test_recovery_hold_restarts_when_the_value_climbs_back(tmp_path):
    h = _Harness(tmp_path)
    for second in range(4):
        h.at(second, 30.0)
    assert h.all()[0].state == FIRING
    h.at(4, 3.0)  # recovered: hold starts
    h.at(5, 7.0)  # back in the band: not recovered, hold restarts
    h.at(6, 7.0)
    h.at(7, 3.0)
    h.at(8, 3.0)
    assert h.all()[0].state == FIRING
    h.at(9, 3.0)
    [incident] = h.all()
    assert incident.state == RESOLVED and incident.resolved_ns == T0 + 9 * S


@pytest.mark.parametrize("batches", [True, False])
def test_quiet_since_marks_a_firing_incident_whose_condition_stopped_crossing(tmp_path,
                                                                              batches):
    """The ladder reads quiet_since_ns from the live incident, the UI and the forwarder from
    the store: every change must reach both."""
    h = _Harness(tmp_path, batches=batches)
    for second in range(4):
        h.at(second, 30.0)
    live = h.engine.firing()[0]
    assert live.quiet_since_ns is None and h.all()[0].quiet_since_ns is None
    h.at(4, 7.0)  # the band: still firing, no longer crossing
    h.at(5, 7.0)
    assert live.quiet_since_ns == T0 + 4 * S == h.all()[0].quiet_since_ns
    h.at(6, 3.0)  # recovering: still quiet since the band began
    assert live.quiet_since_ns == T0 + 4 * S == h.all()[0].quiet_since_ns
    h.at(7, 30.0)  # crossing again
    assert live.quiet_since_ns is None and h.all()[0].quiet_since_ns is None
    h.at(8, 3.0)  # straight from crossing to recovering: saved although nothing else is
    [stored] = h.all()
    assert stored.state == FIRING and stored.quiet_since_ns == T0 + 8 * S
    assert stored.updated_ns == T0 + 8 * S
    h.at(9, 3.0)
    h.at(10, 3.0)
    [stored] = h.all()
    assert stored.state == RESOLVED and stored.quiet_since_ns == T0 + 8 * S


def test_quiet_since_of_a_restarted_agent_and_of_rows_stored_before_it_existed(tmp_path):
    import json
    import sqlite3

    h = _Harness(tmp_path)
    for second in range(4):
        h.at(second, 30.0)
    h.at(4, 3.0)
    h.incidents.close()
    assert h.open() == 1
    h.at(5, 3.0)  # the quiet spell goes on across the restart
    assert h.engine.firing()[0].quiet_since_ns == T0 + 4 * S
    [incident] = h.all()
    with sqlite3.connect(h.incidents.path) as conn:  # a row written by an older agent
        doc = json.loads(conn.execute("SELECT doc FROM incidents").fetchone()[0])
        del doc["quiet_since_ns"]
        conn.execute("UPDATE incidents SET doc = ?", (json.dumps(doc),))
    conn.close()
    assert h.incidents.get(incident.id).quiet_since_ns is None


def test_changed_parameters_apply_to_open_alerts(tmp_path):
    h = _Harness(tmp_path)
    for second in range(4):
        h.at(second, 30.0)
    assert h.all()[0].state == FIRING
    path = tmp_path / "rules" / "r.yaml"
    path.write_text(RULES.replace("{above: 10, recover_below: 5}",
                                  "{above: 100, recover_below: 50}"))
    os.utime(path, (5, 5))
    assert h.rules.reload().changed
    for second in range(4, 7):
        h.at(second, 30.0)  # now below the new recover bound
    assert h.all()[0].state == RESOLVED


def test_a_failed_save_is_retried_and_the_alert_can_fire_again(tmp_path):
    h = _Harness(tmp_path)
    for second in range(4):
        h.at(second, 30.0)
    real_save, failures = h.incidents.save, []

    def flaky_save(incident):
        if not failures and incident.state == RESOLVED:
            failures.append(incident.id)
            raise OSError("disk full")
        real_save(incident)

    h.incidents.save = flaky_save
    for second in range(4, 7):
        h.at(second, 1.0)  # resolves at 6; that save fails once
    assert h.engine.unsaved == 1 and h.all()[0].state == FIRING  # not yet on disk
    h.at(7, 1.0)  # retried
    assert h.engine.unsaved == 0 and h.all()[0].state == RESOLVED
    for second in range(8, 12):
        h.at(second, 30.0)
    assert [i.state for i in h.all()] == [FIRING, RESOLVED]  # a new incident, not a zombie


def test_broken_or_empty_rule_files_keep_incidents_and_rules(tmp_path):
    h = _Harness(tmp_path)
    for second in range(4):
        h.at(second, 30.0)
    path = tmp_path / "rules" / "r.yaml"
    path.write_text("")  # a truncated write
    os.utime(path, (5, 5))
    h.rules.reload()
    assert "empty" in h.rules.errors[str(path)]
    assert [r.key for r in h.rules.rules] == ["ls/LSSlow"]
    h.at(4, 30.0)
    assert h.all()[0].state == FIRING
    # A restart while the file is broken: the incident stays open, and is adopted once the
    # file is fixed.
    h.incidents.close()
    h.open()
    assert h.rules.rules == [] and h.rules.errors
    h.at(5, 30.0)
    assert h.all()[0].state == FIRING and h.engine.states == {}
    path.write_text(RULES)
    os.utime(path, (6, 6))
    h.rules.reload()
    assert h.engine.restore() == 1
    h.at(6, 30.0)
    assert [i.state for i in h.all()] == [FIRING]
    path.unlink()  # a file removed on purpose: its rules and incidents go
    h.rules.reload()
    h.at(7, 30.0)
    assert [i.state for i in h.all()] == [RESOLVED]


def test_missing_rules_directory_keeps_the_rules(tmp_path):
    h = _Harness(tmp_path)
    for second in range(4):
        h.at(second, 30.0)
    (tmp_path / "rules" / "r.yaml").rename(tmp_path / "r.yaml")
    (tmp_path / "rules").rmdir()  # an unmounted ConfigMap
    h.rules.reload()
    assert "does not exist" in h.rules.errors[str(tmp_path / "rules")]
    h.at(4, 30.0)
    assert [r.key for r in h.rules.rules] == ["ls/LSSlow"] and h.all()[0].state == FIRING


def test_restart_drops_pending_incidents(tmp_path):
    h = _Harness(tmp_path)
    h.at(0, 30.0)
    assert h.all()[0].state == PENDING
    h.incidents.close()
    h.open()
    assert h.all() == []


def test_windows_stay_bounded_after_a_clock_step_back(tmp_path):
    h = _Harness(tmp_path)
    for second in range(3):
        h.at(second, 30.0)
    for second in range(-7200, -7180):  # the wall clock jumps back two hours
        h.at(second, 30.0)
    spec = h.rules.rules[0].spec
    subscription, _ = h.windows.subscribe(spec.selector, spec.field, spec.window)
    [points] = subscription.series.values()
    from sloguard.detector.recent import _PRUNE_EVERY_NS

    # a 3 s window, 1 s of slack, pruned every few seconds: not every sample since the step
    assert len(points) <= 3 + 1 + _PRUNE_EVERY_NS // S + 1
    assert [t for t, _ in points][-1] == T0 - 7181 * S
    assert h.all()[0].state == FIRING


def test_for_evaluations_fires_on_n_of_the_last_m(tmp_path):
    text = RULES.replace("for: 2s", "for: 0s\n        for_evaluations: {crossed: 3, of: 5}")
    h = _Harness(tmp_path, text)
    for second, value in enumerate([30, 1, 30, 1]):  # 2 of the last 5: still pending
        h.at(second, float(value))
    assert h.all()[0].state == PENDING  # a single quiet evaluation does not cancel it
    h.at(4, 30.0)  # 3 of the last 5
    assert h.all()[0].state == FIRING
    (tmp_path / "b").mkdir()
    h2 = _Harness(tmp_path / "b", text)
    for second, value in enumerate([30, 1, 1, 1, 1, 1]):  # no crossing in the last 5: dropped
        h2.at(second, float(value))
    assert h2.all() == []


def test_for_evaluations_can_fire_on_a_quiet_evaluation(tmp_path):
    """N of M crossed before `for` elapsed: the incident fires on the first evaluation after
    `for`, crossed or not, and is quiet from the start when it did not cross."""
    text = RULES.replace("for: 2s", "for: 2s\n        for_evaluations: {crossed: 2, of: 5}")
    h = _Harness(tmp_path, text)
    h.at(0, 30.0)
    h.at(1, 30.0)
    h.at(2, 1.0)
    [incident] = h.all()
    assert incident.state == FIRING and incident.quiet_since_ns == T0 + 2 * S
    assert h.engine.firing()[0].quiet_since_ns == T0 + 2 * S
    h.at(3, 1.0)  # the quiet spell is not restarted
    assert h.all()[0].quiet_since_ns == T0 + 2 * S
    h.at(4, 30.0)
    assert h.all()[0].quiet_since_ns is None


def test_for_evaluations_is_validated(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text(RULES.replace("for: 2s", "for_evaluations: {crossed: 6, of: 5}"))
    with pytest.raises(RuleFileError, match="crossed \\(6\\) cannot exceed of \\(5\\)"):
        load_rule_file(path)


COMPOUND = RULES.replace("        severity: critical", """        and:
          - expr: cpu{class="BE"}
            field: usage
            aggregate: last
            window: 3s
            params: {above: 1.5}
        severity: critical""")


def test_compound_rule_fires_only_when_the_conditions_agree(tmp_path):
    h = _Harness(tmp_path, COMPOUND)

    def be(second, usage, pod="batch"):
        sample = Sample("cpu", {"node": "node-a", "class": "BE", "pod": pod}, {"usage": usage},
                        T0 + second * S)
        h.store.write([sample])
        h.windows.add([sample])

    for second in range(4):  # LS slow, but BE is idle: no interference to blame
        be(second, 0.2)
        h.at(second, 30.0)
    assert h.all() == []
    for second in range(4, 8):  # BE busy while LS is slow: fire
        be(second, 1.9)
        be(second, 0.1, pod="idle")
        h.at(second, 30.0)
    [incident] = h.all()
    assert incident.state == FIRING and incident.series["pod"] == "web-1"
    assert 'cpu{class="BE"} usage: 1 of 2 series crossed' in incident.evidence[0].note
    assert incident.quiet_since_ns is None
    be(8, 0.1)  # BE stops while LS is still slow: no longer crossing, recovering
    h.at(8, 30.0)
    [incident] = h.all()
    assert incident.state == FIRING and incident.quiet_since_ns == T0 + 8 * S
    be(9, 1.9)  # BE is back: crossing again
    h.at(9, 30.0)
    assert h.all()[0].quiet_since_ns is None
    for second in range(10, 13):  # BE stops: the compound condition is gone, it recovers
        be(second, 0.1)
        be(second, 0.1, pod="idle")
        h.at(second, 30.0)
    [incident] = h.all()
    assert incident.state == RESOLVED and incident.quiet_since_ns == T0 + 10 * S


def test_a_firing_on_conditions_waits_for_them_on_fresh_samples(tmp_path):
    """Engine.confirm_firing (the agent's, which can read the cgroups again): a firing of a
    rule with `and:` conditions is held until the rule is judged on samples collected after
    the evaluation that would fire it; BE idle on those, the pending alert goes."""
    h = _Harness(tmp_path, COMPOUND.replace("for: 2s", "for: 0s"))
    h.engine.confirm_firing = True

    def be(ns, usage):
        sample = Sample("cpu", {"node": "node-a", "class": "BE", "pod": "batch"},
                        {"usage": usage}, ns)
        h.windows.add([sample])

    be(T0, 1.9)  # the tick's BE sample: busy (it spans the antagonist's end)
    h.at(0, 30.0)
    assert [i.state for i in h.all()] == [PENDING]
    assert h.engine.awaiting_fresh == {"ls/LSSlow"} and h.engine.firing() == []
    be(T0 + S // 10, 0.0)  # read again 100 ms later: BE has stopped
    h.engine.evaluate(T0 + S // 10, fresh=True, only=frozenset(h.engine.awaiting_fresh))
    assert h.all() == [] and h.engine.awaiting_fresh == set()
    be(T0 + S, 1.9)  # an antagonist that runs on: it fires on the fresh sample
    h.at(1, 30.0)
    assert h.engine.firing() == []
    be(T0 + S + S // 10, 1.9)
    h.engine.evaluate(T0 + S + S // 10, fresh=True, only=frozenset({"ls/LSSlow"}))
    [incident] = h.all()
    assert incident.state == FIRING and h.engine.awaiting_fresh == set()
    # a rule whose detector learns from each evaluation is not judged twice: it fires at once
    (tmp_path / "m").mkdir()
    learning = _Harness(tmp_path / "m", MANY)
    by_name = {rule.spec.alert: rule for rule in learning.rules.rules}
    assert not learning.engine._judged_again(by_name["Blamed"])
    assert h.engine._judged_again(h.rules.rules[0])


def _windowed(how: str, window: str = "5s", policy: bool = False) -> str:
    """COMPOUND (LS slow and BE busy) with BE busy as `how` over `window`, firing at once and
    resolving 2 s after recovery."""
    rules = COMPOUND.replace("for: 2s", "for: 0s").replace(
        "aggregate: last\n            window: 3s\n            params: {above: 1.5}",
        f"aggregate: {how}\n            window: {window}\n            params: {{above: 1.5, "
        "recover_below: 0.5}")
    assert f"aggregate: {how}" in rules
    return rules.replace("        severity: critical",
                         "        severity: critical\n        policy: guard") if policy else rules


class _Fresh:
    """The agent's sequence on the harness: a tick's evaluation, then BE read afresh 100 ms
    later and the rules judged again on it (Agent._confirm_firings, confirm_interference)."""

    def __init__(self, h):
        self.h = h
        h.engine.confirm_firing = True
        h.engine.reread = frozenset({"cpu"})  # what the agent's fresh read collects

    def be(self, ns, usage, pod="batch"):
        self.h.windows.add([Sample("cpu", {"node": "node-a", "class": "BE", "pod": pod},
                                   {"usage": usage}, ns)])

    def confirm(self, ns, only=True):
        engine = self.h.engine
        engine.evaluate(ns, fresh=True,
                        only=frozenset(engine.awaiting_fresh) if only else None)


@pytest.mark.parametrize("how, busy, idle", [
    ("max", [3.0, 3.0, 3.0], 0.0),
    ("mean", [3.0, 3.0, 3.0], 0.0),
    ("p99", [3.0, 3.0, 3.0], 0.0),
    ("rate", [0.0, 4.0, 8.0], 8.0),  # a counter: 4 a second, then no increase
])
def test_a_confirmation_judges_a_condition_on_its_newest_sample(tmp_path, how, busy, idle):
    """A condition aggregated over its window (BE busy: the maximum over 5 s) held for 5 s
    after BE stopped, so the confirmation on fresh samples still fired; the newest sample (a
    rate: the last two) must agree with the window for the firing to go ahead."""
    h = _Harness(tmp_path, _windowed(how))
    f = _Fresh(h)
    for second, usage in enumerate(busy):  # BE busy, LS within its objective
        f.be(T0 + second * S, usage)
        h.at(second, 1.0)
    stop = len(busy)
    f.be(T0 + stop * S, idle)  # BE has stopped; LS is slow (its window lags)
    h.at(stop, 30.0)
    assert h.engine.awaiting_fresh == {"ls/LSSlow"}  # the window still says busy
    f.be(T0 + stop * S + S // 10, idle)  # read again 100 ms later: still stopped
    f.confirm(T0 + stop * S + S // 10)
    assert [i.state for i in h.all()] == [PENDING] and h.engine.firing() == []
    # BE back: the fresh sample is busy, so the firing goes ahead
    back = busy[-1] + 4.0 if how == "rate" else busy[-1]
    f.be(T0 + (stop + 1) * S, back)
    h.at(stop + 1, 30.0)
    f.be(T0 + (stop + 1) * S + S // 10, back + 0.4 if how == "rate" else back)
    f.confirm(T0 + (stop + 1) * S + S // 10)
    assert [i.state for i in h.all()] == [FIRING]


@pytest.mark.parametrize("how", ["min", "mean"])
def test_a_fresh_read_never_fires_what_the_window_does_not(tmp_path, how):
    """The newest sample can only hold a firing back: BE idle for 4 s and busy on the one
    fresh read is not "BE busy" for a minimum or a mean over 5 s."""
    h = _Harness(tmp_path, _windowed(how))
    f = _Fresh(h)
    for second in range(4):
        f.be(T0 + second * S, 0.0)
        h.at(second, 30.0)  # LS slow, BE idle: held back, nothing pending
    assert h.all() == [] and h.engine.held_back == {"ls/LSSlow"}
    f.be(T0 + 3 * S + S // 10, 3.0)  # the agent's re-read of a held-back rule (_on_arrival)
    f.confirm(T0 + 3 * S + S // 10, only=False)
    assert h.all() == []


def test_a_fresh_read_leaves_firing_alerts_and_their_lifted_levers_to_the_window(tmp_path):
    """One 100 ms read that catches BE idle between bursts neither quiets a firing alert nor
    says the cause is gone for a lever that comes off; it does hold back a lever about to go
    on (cause_present(now=True))."""
    h = _Harness(tmp_path, _windowed("max", policy=True))
    f = _Fresh(h)
    for second in range(3):
        f.be(T0 + second * S, 3.0)
        h.at(second, 30.0)
        f.be(T0 + second * S + S // 10, 3.0)
        f.confirm(T0 + second * S + S // 10)
    [incident] = h.all()
    assert incident.state == FIRING and incident.quiet_since_ns is None
    f.be(T0 + 3 * S, 3.0)
    h.at(3, 30.0)
    f.be(T0 + 3 * S + S // 10, 0.0)  # a lull between bursts
    f.confirm(T0 + 3 * S + S // 10, only=False)
    [incident] = h.all()
    assert incident.state == FIRING and incident.quiet_since_ns is None
    assert h.engine.cause_present("guard") is True  # what the descent reads: no lift
    assert h.engine.cause_present("guard", now=True) is False  # no new lever now
    h.at(4, 30.0)  # the next tick's evaluation answers for itself again
    assert h.engine.cause_present("guard", now=True) is True


@pytest.mark.parametrize("others", [[], ["other"]])
def test_a_series_missing_from_the_fresh_read_has_gone(tmp_path, others):
    """A BE pod that exited has no sample in the fresh read; its newest is the tick's, which
    spans the antagonist's end and reads busy: it no longer counts, and with no BE series
    left in the read the cause is gone (not unknown) for a lever about to go on."""
    h = _Harness(tmp_path, _windowed("max", policy=True))
    f = _Fresh(h)
    f.be(T0, 3.0)
    h.at(0, 30.0)
    assert h.engine.awaiting_fresh == {"ls/LSSlow"}
    for pod in others:  # the fresh read: another, idle, BE pod, or none at all
        f.be(T0 + S // 10, 0.0, pod=pod)
    f.confirm(T0 + S // 10)
    assert h.engine.firing() == []
    assert h.engine.cause_present("guard", now=True) is False


def test_a_rule_reloaded_away_is_no_longer_held_back(tmp_path):
    """held_back names only rules loaded now: the agent's evaluation on arrival reads the
    cgroups afresh on the arrival that holds a rule back, and a key left from a rule reloaded
    away would have counted a later one of that name as held already."""
    rules = _windowed("max")
    h = _Harness(tmp_path, rules)
    f = _Fresh(h)
    f.be(T0, 0.0)
    h.at(0, 30.0)  # LS slow, BE idle: held back
    assert h.engine.held_back == {"ls/LSSlow"}
    (tmp_path / "rules" / "r.yaml").write_text(rules.replace("LSSlow", "Renamed"))
    h.rules.reload()
    h.at(1, 30.0)
    assert h.engine.held_back == {"ls/Renamed"}


def test_a_held_back_rule_is_judged_on_arrival_again_only_once_its_conditions_have_more(
        tmp_path):
    """LS over its objective with BE idle holds an `on_arrival` rule back on every push; judged
    again on each, it cost every BE series for nothing (benchmarks/agent_arrival.py). It waits
    for its conditions to be given a sample (a tick's collection, a fresh read) and is then
    judged as ever: BE busy, it fires."""
    rules = _windowed("max").replace("        severity: critical",
                                     "        severity: critical\n        on_arrival: true")
    h = _Harness(tmp_path, rules)
    f = _Fresh(h)
    h.engine.confirm_firing = False  # a firing goes ahead on the evaluation that allows it

    def arrive(ns: int, p99: float) -> None:
        h.windows.add([Sample("lat", {"node": "node-a", "class": "LS", "pod": "web-1"},
                              {"p99": p99}, ns)])
        h.engine.evaluate(ns, arrived=frozenset({"lat"}))

    f.be(T0, 0.0)
    h.at(0, 30.0)  # the tick: LS slow, BE idle: held back
    assert h.engine.held_back == {"ls/LSSlow"}
    status = h.engine.status["ls/LSSlow"]
    judged = status.evaluations
    for tenth in (3, 6):  # pushes, nothing new for BE: not judged again, still held back
        arrive(T0 + tenth * S // 10, 30.0)
        assert status.evaluations == judged and h.engine.held_back == {"ls/LSSlow"}
    assert h.engine.unchanged_on_arrival == 2
    f.be(T0 + 7 * S // 10, 3.0)  # BE read (afresh, or by the tick): busy
    arrive(T0 + 8 * S // 10, 30.0)
    assert status.evaluations == judged + 1
    assert [i.rule for i in h.engine.firing()] == ["LSSlow"]
    assert h.engine.held_back == set()
    arrive(T0 + 9 * S // 10, 30.0)  # firing, not held back: judged on every arrival
    assert status.evaluations == judged + 2 and h.engine.unchanged_on_arrival == 2


def test_a_held_back_rule_whose_condition_learns_is_judged_on_every_arrival(tmp_path):
    """A condition whose detector learns from each evaluation (ewma) judges the same window
    differently the next time: waiting for new samples would change what it says."""
    rules = _windowed("max").replace(
        "            params: {above: 1.5, recover_below: 0.5}",
        "            detector: ewma\n            params: {warmup: 3, min_std: 1}").replace(
        "        severity: critical", "        severity: critical\n        on_arrival: true")
    assert "detector: ewma" in rules
    h = _Harness(tmp_path, rules)
    f = _Fresh(h)
    f.be(T0, 0.0)
    h.at(0, 30.0)
    assert h.engine.held_back == {"ls/LSSlow"}
    judged = h.engine.status["ls/LSSlow"].evaluations
    for tenth in (3, 6):
        h.windows.add([Sample("lat", {"node": "node-a", "class": "LS", "pod": "web-1"},
                              {"p99": 30.0}, T0 + tenth * S // 10)])
        h.engine.evaluate(T0 + tenth * S // 10, arrived=frozenset({"lat"}))
    assert h.engine.status["ls/LSSlow"].evaluations == judged + 2
    assert h.engine.unchanged_on_arrival == 0


def test_a_lever_about_to_go_on_asks_the_rules_judged_afresh(tmp_path):
    """Two rules drive the policy; only the one whose firing waited was judged on the fresh
    read (Agent._confirm_firings). Its newest samples say BE stopped: the other rule's cause,
    judged on the tick's samples, does not let a lever go on (cause_present(now=True))."""
    rules = _windowed("max", policy=True)
    second = rules + rules[rules.index("      - alert: LSSlow"):].replace("LSSlow", "Other")
    h = _Harness(tmp_path, second)
    f = _Fresh(h)
    f.be(T0, 3.0)
    h.at(0, 30.0)
    f.be(T0 + S // 10, 3.0)
    f.confirm(T0 + S // 10)
    assert {i.rule for i in h.engine.firing()} == {"Other", "LSSlow"}
    h.engine.resolve_by_hand(next(i.id for i in h.engine.firing() if i.rule == "LSSlow"),
                             "sre", "", T0 + S // 5)
    f.be(T0 + S, 3.0)
    h.at(1, 30.0)  # LSSlow pending again, awaiting the fresh read; Other fires on
    assert h.engine.awaiting_fresh == {"ls/LSSlow"}
    assert h.engine.cause_present("guard", now=True) is True
    f.be(T0 + S + S // 10, 0.0)  # BE stopped
    f.confirm(T0 + S + S // 10)  # only LSSlow is judged again
    assert h.engine.cause_present("guard", now=True) is False
    assert h.engine.cause_present("guard") is True  # the window: no lever comes off


def test_a_firing_held_back_keeps_its_for_clock(tmp_path):
    """Held back by the newest samples (a lull between bursts), a pending alert of a rule with
    `for` stays pending: the next confirmation that agrees fires it, its `for` not restarted."""
    h = _Harness(tmp_path, _windowed("max").replace("for: 0s", "for: 3s"))
    f = _Fresh(h)
    for second in range(3):
        f.be(T0 + second * S, 3.0)
        h.at(second, 30.0)
    assert [i.state for i in h.all()] == [PENDING] and not h.engine.awaiting_fresh
    f.be(T0 + 3 * S, 3.0)
    h.at(3, 30.0)  # `for` has run: the firing waits for the fresh read
    assert h.engine.awaiting_fresh == {"ls/LSSlow"}
    f.be(T0 + 3 * S + S // 10, 0.0)  # a lull
    f.confirm(T0 + 3 * S + S // 10)
    [pending] = h.all()
    assert pending.state == PENDING and h.engine.firing() == []
    f.be(T0 + 4 * S, 3.0)
    h.at(4, 30.0)
    f.be(T0 + 4 * S + S // 10, 3.0)  # busy again: it fires, the same incident
    f.confirm(T0 + 4 * S + S // 10)
    [incident] = h.all()
    assert incident.state == FIRING and incident.id == pending.id


@pytest.mark.parametrize("reread", [False, True])
def test_a_confirmation_of_a_rate_skips_a_newest_nan(tmp_path, reread):
    """A NaN is no data. For a measurement the fresh read collects, a read without a number
    tells nothing new: the firing waits for the next; for another, the rate is taken over its
    last two numbers."""
    h = _Harness(tmp_path, _windowed("rate"))
    f = _Fresh(h)
    h.engine.reread = frozenset({"cpu"} if reread else ())
    f.be(T0, 0.0)
    f.be(T0 + S, 4.0)
    h.at(1, 30.0)
    assert h.engine.awaiting_fresh == {"ls/LSSlow"}
    f.be(T0 + S + S // 20, 4.2)
    f.be(T0 + S + S // 10, math.nan)  # the fresh read's counter unreadable
    f.confirm(T0 + S + S // 10)
    assert [i.state for i in h.all()] == [PENDING if reread else FIRING]


@pytest.mark.parametrize("how", ["sum", "count"])
def test_a_confirmation_keeps_a_condition_that_counts_its_window(tmp_path, how):
    """A sum or count over the window is what happened in it: no single sample tells it, so
    the confirmation judges the window as the tick did."""
    h = _Harness(tmp_path, _windowed(how))
    f = _Fresh(h)
    f.be(T0, 2.0)  # two OOM kills, say, a second ago
    f.be(T0 + S // 2, 2.0)
    f.be(T0 + S, 0.0)
    h.at(1, 30.0)
    f.be(T0 + S + S // 10, 0.0)
    f.confirm(T0 + S + S // 10)
    assert [i.state for i in h.all()] == [FIRING]


def test_the_cause_of_a_policy_is_its_rules_and_conditions_even_after_recovery(tmp_path):
    """Engine.cause_present: what tells the ladder "the lever works" (LS recovered, BE still
    busy: keep the levers) from "the cause is gone" (BE stopped: lift them)."""
    h = _Harness(tmp_path, COMPOUND.replace("        severity: critical",
                                            "        severity: critical\n        policy: guard"))

    def be(second, usage):
        sample = Sample("cpu", {"node": "node-a", "class": "BE", "pod": "batch"},
                        {"usage": usage}, T0 + second * S)
        h.store.write([sample])
        h.windows.add([sample])

    assert h.engine.cause_present("guard") is None  # not evaluated yet: nobody can tell
    for second in range(3):
        be(second, 1.9)
        h.at(second, 30.0)
    assert h.engine.cause_present("guard") is True and h.all()[0].state == FIRING
    for second in range(3, 8):  # LS recovers under the lever while BE still runs
        be(second, 1.9)
        h.at(second, 1.0)
    assert h.all()[0].state == RESOLVED
    assert h.engine.cause_present("guard") is True
    be(8, 0.1)  # BE stops
    h.at(8, 1.0)
    assert h.engine.cause_present("guard") is False
    assert h.engine.cause_present("other") is None


UNLESS = COMPOUND.replace("        severity: critical", """        unless:
          - expr: io{class="BE"}
            field: stall
            aggregate: max
            window: 3s
            params: {above: 5, recover_below: 1}
        severity: critical""")


def test_unless_keeps_a_rule_quiet_while_its_condition_holds(tmp_path):
    """Prometheus `unless`: the rule fires only while none of its `unless` conditions holds,
    a firing alert recovers once one does, and no series at all blocks nothing."""
    h = _Harness(tmp_path, UNLESS)

    def be(second, usage, stall=None):
        samples = [Sample("cpu", {"node": "node-a", "class": "BE", "pod": "batch"},
                          {"usage": usage}, T0 + second * S)]
        if stall is not None:
            samples.append(Sample("io", {"node": "node-a", "class": "BE", "pod": "batch"},
                                  {"stall": stall}, T0 + second * S))
        h.store.write(samples)
        h.windows.add(samples)

    for second in range(4):  # LS slow, BE busy, but BE stalls on I/O: another rule's case
        be(second, 1.9, stall=20.0)
        h.at(second, 30.0)
    assert h.all() == []
    for second in range(4, 12):  # the stall is gone (max over 3 s, then hysteresis below 1)
        be(second, 1.9, stall=0.0)
        h.at(second, 30.0)
    [incident] = h.all()
    assert incident.state == FIRING
    assert any('unless io{class="BE"} stall: 0 of 1 series crossed' in e.note
               for e in incident.evidence)
    for second in range(12, 16):  # the stall comes back: the alert recovers
        be(second, 1.9, stall=20.0)
        h.at(second, 30.0)
    [incident] = h.all()
    assert incident.state == RESOLVED


def test_unless_without_any_series_blocks_nothing(tmp_path):
    h = _Harness(tmp_path, UNLESS)
    for second in range(8):
        sample = Sample("cpu", {"node": "node-a", "class": "BE", "pod": "batch"},
                        {"usage": 1.9}, T0 + second * S)
        h.store.write([sample])
        h.windows.add([sample])
        h.at(second, 30.0)
    assert [i.state for i in h.all()] == [FIRING]


@pytest.mark.parametrize("batches", [True, False])
def test_a_stateful_detector_under_unless_warms_up(tmp_path, batches):
    """Issue #19: a condition's detector lives from one evaluation to the next. Signal keys
    were strings, and only an `#andN` suffix was parsed back off them: every detector under
    `unless:` was dropped after each evaluation, so an EWMA there never left its warm-up and
    the `unless` never blocked anything."""
    text = UNLESS.replace("params: {above: 5, recover_below: 1}",
                          "detector: ewma\n            params: {warmup: 3, min_std: 1}"
                          ).replace("aggregate: max\n            window: 3s\n            detector",
                                    "aggregate: last\n            window: 3s\n            detector")
    h = _Harness(tmp_path, text, batches=batches)

    def be(second, usage, stall):
        samples = [Sample("cpu", {"node": "node-a", "class": "BE", "pod": "batch"},
                          {"usage": usage}, T0 + second * S),
                   Sample("io", {"node": "node-a", "class": "BE", "pod": "batch"},
                          {"stall": stall}, T0 + second * S)]
        h.windows.add(samples)

    for second in range(6):  # the EWMA learns the BE pod's usual stall; LS is fine
        be(second, 0.2, stall=1.0)
        h.at(second, 1.0)
    for second in range(6, 12):  # LS slow, BE busy, but BE stalls on I/O: not this rule's case
        be(second, 1.9, stall=50.0)
        h.at(second, 30.0)
    assert h.all() == []
    for second in range(12, 18):  # the stall is back to its usual: nothing blocks the rule
        be(second, 1.9, stall=1.0)
        h.at(second, 30.0)
    assert [i.state for i in h.all()] == [FIRING]


def test_unless_conditions_are_validated(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text(UNLESS.replace("params: {above: 5, recover_below: 1}",
                                   "params: {abov: 5}"))
    validate = lambda spec: make_detector(spec.detector, spec.params)  # noqa: E731
    with pytest.raises(RuleFileError,
                       match=r"r.yaml:\d+:\d+: groups.0.rules.0.unless.0.params: unknown"):
        load_rule_file(path, validate)


def test_compound_conditions_are_validated(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text(COMPOUND.replace("params: {above: 1.5}", "params: {abve: 1.5}"))
    validate = lambda spec: make_detector(spec.detector, spec.params)  # noqa: E731
    with pytest.raises(RuleFileError, match=r"groups.0.rules.0.and.0.params: unknown threshold"):
        load_rule_file(path, validate)


def test_a_hung_rule_is_retried_after_a_backoff_and_can_resolve(tmp_path):
    import time as clock

    from sloguard.detector.engine import HUNG_BACKOFF_S

    class Sometimes:
        name = "sometimes"
        slow = False

        def __init__(self, params):
            self.inner = Threshold({"above": 10, "recover_below": 5})

        def update(self, value, time_ns):
            if Sometimes.slow:
                clock.sleep(0.5)
            return self.inner.update(value, time_ns)

    class Plugin:
        @hookimpl
        def sloguard_detectors(self):
            return [Sometimes]

    text = RULES.replace("        params: {above: 10, recover_below: 5}\n",
                         "        detector: sometimes\n")
    h = _Harness(tmp_path, text, registry=DetectorRegistry(plugins=[Plugin()]), timeout_s=0.2)
    for second in range(4):
        h.at(second, 30.0)
    assert h.all()[0].state == FIRING
    Sometimes.slow = True
    h.at(4, 30.0)  # cut off once (the agent was starved of CPU, say)
    assert "longer than 0.2s" in h.engine.status["ls/LSSlow"].error
    Sometimes.slow = False
    h.at(5, 1.0)
    assert h.engine.status["ls/LSSlow"].evaluations == 5  # backing off
    deadline = clock.monotonic() + 5
    while h.engine.stuck_workers and clock.monotonic() < deadline:
        clock.sleep(0.01)  # the cut-off call returns (a rule is not retried while it runs)
    backoff = int(HUNG_BACKOFF_S)
    for second in range(5 + backoff, 9 + backoff):
        h.at(second, 1.0)
    assert h.engine.status["ls/LSSlow"].error == ""
    assert h.all()[0].state == RESOLVED  # evaluated again: the incident could end


def test_one_failing_series_does_not_block_the_others(tmp_path):
    h = _Harness(tmp_path, RULES.replace("params: {above: 10, recover_below: 5}",
                                         "detector: slo_latency\n        params: {target: 10}"))
    for second in range(4):
        h.at(second, 30.0)
    assert h.all()[0].state == FIRING

    class Broken:
        def update(self, value, time_ns):
            raise ValueError("bad input for this series")

    for second in range(4, 8):
        h.at(second, 1.0)
        h.at(second, 1.0, pod="web-2")
        series = (("class", "LS"), ("node", "node-a"), ("pod", "web-2"))
        detectors = h.engine._detectors[SignalKey("ls/LSSlow")]
        spec, _ = detectors[series]
        detectors[series] = (spec, Broken())
    assert "1 series failed" in h.engine.status["ls/LSSlow"].error
    assert h.all()[0].state == RESOLVED  # web-1 still resolved


MANY = """\
groups:
  - name: many
    rules:
      - alert: Spiky
        expr: lat{class="LS"}
        field: p99
        aggregate: max
        window: 2s
        params: {above: 20, recover_below: 12}
        for: 0s
        for_evaluations: {crossed: 2, of: 4}
        recover_for: 2s
      - alert: Unusual
        expr: lat{class="LS"}
        field: p99
        aggregate: last
        window: 2s
        detector: ewma
        params: {warmup: 8, band: 3, fading_factor: 0.2}
        for: 1s
      - alert: Blamed
        expr: lat{class="LS"}
        field: p99
        aggregate: last
        window: 2s
        detector: ewma
        params: {warmup: 8, band: 2.5, direction: both}
        and:
          - expr: cpu{class="BE"}
            field: usage
            aggregate: last
            window: 2s
            params: {above: 1.5}
      - alert: Rare
        expr: lat{class="LS"}
        field: p99
        aggregate: last
        window: 2s
        detector: anomaly_likelihood
        params: {warmup: 10, bins: 5, memory: 40, average: 3}
        for: 0s
      - alert: Shapes
        expr: lat{class="LS"}
        field: p99
        aggregate: last
        window: 2s
        detector: anomaly_channels
        params: {warmup: 10, bins: 5, memory: 40, volatility_span: 4, segments: 3, segment: 3,
                 prototypes: 4, vigilance: 0.2}
        for: 0s
"""


def _replay(tmp_path, batches: bool, leave_at: int | None = None, watch=None) -> list:
    """Drive an engine through churning, gappy, spiky series; the incidents it leaves. From
    `leave_at`, all pods but the first 8 are gone; `watch(second, engine)` after each tick."""
    import random

    rng = random.Random(5)
    h = _Harness(tmp_path, MANY, batches=batches)
    for second in range(150):
        now = T0 + second * S
        samples = []
        for pod in range(40):
            if (pod < 10 and 50 <= second < 70) or (pod >= 30 and second < 40):
                continue  # pods that go away for a while, pods that start late
            if leave_at is not None and second >= leave_at and pod >= 8:
                continue
            if rng.random() < 0.05:
                continue  # a missed scrape
            value = rng.gauss(10, 1) + (30 if rng.random() < 0.03 else 0)
            if pod % 7 == 0 and 90 <= second < 110:
                value += 12  # a lasting shift
            samples.append(Sample("lat", {"node": "node-a", "class": "LS", "pod": f"web-{pod}"},
                                  {"p99": value}, now))
        busy = 1.9 if 80 <= second < 120 else 0.2
        samples.append(Sample("cpu", {"node": "node-a", "class": "BE", "pod": "b"},
                              {"usage": busy}, now))
        h.windows.add(samples)
        h.now = now
        h.engine.evaluate(now)
        if watch:
            watch(second, h.engine)
    assert all(not status.error for status in h.engine.status.values())
    return sorted(
        (i.rule, sorted(i.series.items()), i.state, i.started_ns, i.fired_ns, i.resolved_ns,
         i.quiet_since_ns,
         [(e.time_ns, e.value, None if e.threshold is None else round(e.threshold, 9), e.note)
          for e in i.evidence])
        for i in h.incidents.query(limit=10_000))


def test_batch_path_gives_the_incidents_of_the_per_series_path(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    batched = _replay(tmp_path / "a", batches=True)
    one_by_one = _replay(tmp_path / "b", batches=False)
    rules = {incident[0] for incident in batched}
    assert rules == {"Spiky", "Unusual", "Blamed", "Rare", "Shapes"}, rules  # each rule fires
    assert {FIRING, RESOLVED} <= {incident[2] for incident in batched}
    assert len(batched) == len(one_by_one)
    for mine, theirs in zip(batched, one_by_one, strict=True):
        assert mine == theirs


def test_batches_compacted_after_most_series_go_give_the_per_series_incidents(tmp_path,
                                                                             monkeypatch):
    """Issue #25: once most of a rule's series are gone its batch is compacted (memory given
    back), and the incidents stay those of one detector per series."""
    from sloguard.detector import batching

    monkeypatch.setattr(batching, "COMPACT_FROM", 8)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    seen: dict[str, list] = {}

    def watch(second, engine):
        for key, slots in engine._batches.items():
            if not key.condition and slots.detector is not None:
                nbytes = getattr(slots.detector, "nbytes", lambda: 0)()
                rule = key.rule.rsplit("/", 1)[-1]
                seen.setdefault(rule, []).append((second, len(slots.owner), nbytes))

    batched = _replay(tmp_path / "a", batches=True, leave_at=100, watch=watch)
    one_by_one = _replay(tmp_path / "b", batches=False, leave_at=100)
    assert {incident[0] for incident in batched} >= {"Rare", "Shapes"}
    assert batched == one_by_one
    for rule in ("Rare", "Shapes", "Unusual", "Spiky"):
        peak = max(size for _, size, _ in seen[rule])
        assert peak == 40 and seen[rule][-1][1] <= 10, (rule, seen[rule][-1])
    for rule in ("Rare", "Shapes"):
        assert seen[rule][-1][2] * 3 < max(nbytes for _, _, nbytes in seen[rule])


def _edit_rules(h, text: str, stamp: int) -> None:
    path = h.tmp / "rules" / "r.yaml"
    path.write_text(text)
    os.utime(path, (stamp, stamp))
    assert h.rules.reload().changed, h.rules.errors


COUNTED = RULES.replace("for: 2s", "for: 0s\n        for_evaluations: {crossed: 2, of: 10}"
                        ).replace("recover_for: 2s", "recover_for: 0s")


@pytest.mark.parametrize("batches", [True, False])
def test_a_counted_series_that_went_away_across_a_rule_edit_does_not_break_the_rule(
        tmp_path, batches):
    """A series still counting evaluations after its alert resolved, gone from the data
    when the rule's parameters change, is simply forgotten (the batch path once looked it
    up in the new batch and failed the rule with KeyError, tick after tick)."""
    h = _Harness(tmp_path, COUNTED, batches=batches)
    h.at(0, 30.0)
    h.at(1, 30.0)
    assert h.all()[0].state == FIRING
    h.at(2, 1.0)
    assert h.all()[0].state == RESOLVED  # its history still holds two crossings
    h.at(3, 1.0, pod="web-2")
    h.at(5, 1.0, pod="web-2")  # web-1's last value is still in the 3 s window
    _edit_rules(h, COUNTED.replace("above: 10", "above: 11"), 6)
    h.at(6, 1.0, pod="web-2")  # and now it is not, as the parameters change
    h.at(7, 50.0, pod="web-2")
    assert h.engine.status["ls/LSSlow"].error == ""
    assert {(i.series["pod"], i.state) for i in h.all()} == {
        ("web-1", RESOLVED), ("web-2", PENDING)}


def test_history_of_a_rule_that_stops_counting_is_not_revived_later(tmp_path):
    """Crossings counted before `for_evaluations` was taken off a rule must not count when
    it is put back an hour later."""
    text = RULES.replace("for: 2s", "for: 0s\n        for_evaluations: {crossed: 2, of: 5}")
    h = _Harness(tmp_path, text)
    h.at(0, 30.0)
    assert h.all()[0].state == PENDING
    _edit_rules(h, RULES.replace("for: 2s", "for: 0s"), 1)
    for second in range(1, 5):
        h.at(second, 1.0)  # quiet: the pending alert is cancelled
    assert h.all() == []
    _edit_rules(h, text, 3600)
    h.at(3600, 30.0)  # one crossing of the last five: pending, not firing
    assert [i.state for i in h.all()] == [PENDING]


@pytest.mark.parametrize("batches", [True, False])
def test_a_hash_in_the_group_name_keeps_detector_state(tmp_path, batches):
    """Rule keys are `group/alert`; only a compound rule's own `#andN` suffix may be taken
    off them. A group named with a `#` once had its detectors and its for_evaluations
    history dropped after every evaluation."""
    text = RULES.replace("name: ls", "name: ls#canary").replace(
        "for: 2s", "for: 0s\n        for_evaluations: {crossed: 3, of: 5}")
    h = _Harness(tmp_path, text, batches=batches)
    for second, value in enumerate([30, 1, 30, 1]):
        h.at(second, float(value))
    assert h.all()[0].state == PENDING
    h.at(4, 30.0)
    assert h.all()[0].state == FIRING


def test_an_abandoned_worker_never_shares_a_detector_with_the_retried_rule(tmp_path):
    """A rule cut off at its deadline leaves its worker running on; when the rule is tried
    again, its detectors must not be the ones that worker may still be updating (it is not
    tried again while that worker runs, and then on detectors built afresh)."""
    import threading
    import time

    from sloguard.detector.engine import HUNG_BACKOFF_S

    release = threading.Event()
    overlaps: list[str] = []

    class Exclusive:
        name = "exclusive"
        block = False

        def __init__(self, params):
            self.inner = Threshold({"above": 10, "recover_below": 5})
            self.busy = False

        def update(self, value, time_ns):
            if self.busy:
                overlaps.append("two threads updated one detector at once")
            self.busy = True
            try:
                if Exclusive.block:
                    release.wait(5)
                return self.inner.update(value, time_ns)
            finally:
                self.busy = False

    class Plugin:
        @hookimpl
        def sloguard_detectors(self):
            return [Exclusive]

    text = RULES.replace("        params: {above: 10, recover_below: 5}\n",
                         "        detector: exclusive\n")
    h = _Harness(tmp_path, text, registry=DetectorRegistry(plugins=[Plugin()]), timeout_s=0.2)
    try:
        h.at(0, 30.0)
        Exclusive.block = True
        h.at(1, 30.0)  # cut off: its worker waits inside update
        assert "longer than 0.2s" in h.engine.status["ls/LSSlow"].error
        Exclusive.block = False
        h.at(2 + int(HUNG_BACKOFF_S), 30.0)  # due again, but that worker still waits:
        assert h.engine.status["ls/LSSlow"].evaluations == 2  # not tried meanwhile
    finally:
        release.set()
    deadline = time.monotonic() + 5
    while h.engine.stuck_workers and time.monotonic() < deadline:
        time.sleep(0.01)
    h.at(3 + int(HUNG_BACKOFF_S), 30.0)  # its code returned: tried again, on fresh detectors
    assert overlaps == []
    assert h.engine.status["ls/LSSlow"].error == ""


def test_the_batch_path_imports_numpy_outside_the_detector_deadline(tmp_path):
    """Importing numpy takes ~0.2 s, far more on a node busy with the very interference being
    watched; inside the worker's deadline (1 s) it once got the shipped threshold rules cut
    off and skipped for a minute at start-up. It is imported on the engine's own thread."""
    import subprocess
    import sys

    script = tmp_path / "first_tick.py"
    script.write_text(textwrap.dedent(f"""\
        import sys, threading
        from pathlib import Path

        from sloguard.actuators.dryrun import DryRunActuator
        from sloguard.detector.engine import Engine
        from sloguard.detector.recent import RecentWindows
        from sloguard.detector.rules import RuleSet
        from sloguard.core.samples import Sample
        from sloguard.store.incidents_db import IncidentStore

        importers = []

        class Watch:
            def find_spec(self, name, path=None, target=None):
                if name == "numpy":
                    importers.append(threading.current_thread().name)
                return None

        tmp = Path({str(tmp_path)!r})
        (tmp / "rules").mkdir()
        (tmp / "rules" / "r.yaml").write_text({RULES!r})
        rules = RuleSet([str(tmp / "rules")])
        rules.reload()
        windows = RecentWindows()
        engine = Engine(windows, IncidentStore(tmp / "i.db"), rules, "node-a",
                        DryRunActuator("node-a"))
        engine.sync_windows(None, {T0})
        assert "numpy" not in sys.modules, "imported before the first evaluation"
        sys.meta_path.insert(0, Watch())
        windows.add([Sample("lat", {{"class": "LS", "pod": "w"}}, {{"p99": 30.0}}, {T0})])
        engine.evaluate({T0})
        assert engine.status["ls/LSSlow"].error == "", engine.status["ls/LSSlow"].error
        print(importers)
    """))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "['MainThread']"


def test_shipped_slo_interference_rule_needs_busy_be_work_and_drives_the_policy(tmp_path):
    from pathlib import Path

    shipped = (Path(__file__).resolve().parent.parent / "rules" / "ls-latency-slo.yaml")
    h = _Harness(tmp_path, shipped.read_text())

    def tick(second: int, ratio: float, be_cores: float) -> None:
        now = h.now = T0 + second * S
        samples = [
            Sample("app_slo", {"node": "node-a", "service": "web", "percentile": "p99"},
                   {"latency_ratio": ratio, "burn_rate": 0.0}, now),
            Sample("container_cpu", {"node": "node-a", "class": "BE", "level": "pod",
                                     "pod": "batch"}, {"usage_cores": be_cores}, now)]
        h.store.write(samples)
        h.windows.add(samples)
        h.engine.evaluate(now)

    for second in range(30):  # over the SLO, BE idle: the service's own problem
        tick(second, 2.0, 0.02)
    rules = {i.rule for i in h.all()}
    assert "LSLatencySLOBreach" in rules and "LSLatencyInterference" not in rules
    for second in range(30, 80):  # BE busy meanwhile: interference, the ladder's business
        tick(second, 2.0, 1.5)
    [guard] = [i for i in h.all() if i.rule == "LSLatencyInterference"]
    assert guard.state == FIRING and guard.policy == "ls-interference"
    assert guard.labels["resource"] == "cpu"
    # the fast rule moves levers without paging; the lasting breach is the page
    [breach] = [i for i in h.all() if i.rule == "LSLatencySLOBreach"]
    assert (guard.severity, breach.severity) == ("warning", "critical")


def test_shipped_slo_rules_route_an_io_bound_be_to_the_io_policy(tmp_path):
    """The lab: moving an I/O-bound BE off the LS cores made the LS tail worse, so a breach
    while BE stalls on I/O drives ls-io (no cpuset), and only a breach without it drives
    ls-interference; each episode gets exactly one of the two."""
    from pathlib import Path

    shipped = Path(__file__).resolve().parent.parent / "rules" / "ls-latency-slo.yaml"
    h = _Harness(tmp_path, shipped.read_text())

    def tick(second: int, io_stall: float) -> None:
        now = h.now = T0 + second * S
        be = {"node": "node-a", "class": "BE", "level": "pod", "pod": "batch"}
        samples = [
            Sample("app_slo", {"node": "node-a", "service": "web", "percentile": "p99"},
                   {"latency_ratio": 2.0 if second % 100 < 20 else 0.5, "burn_rate": 0.0},
                   now),
            Sample("container_cpu", be, {"usage_cores": 1.5}, now),
            Sample("container_pressure", {**be, "resource": "io"}, {"some_rate": io_stall},
                   now)]
        h.store.write(samples)
        h.windows.add(samples)
        h.engine.evaluate(now)

    def firing() -> dict[str, str]:
        return {i.rule: i.policy for i in h.all()
                if i.state == FIRING and i.rule.startswith("LSLatency") and "SLO" not in i.rule}

    for second in range(20):  # BE stalled on I/O 15-30% of the time (stress-ng --iomix)
        tick(second, 15.0 + second % 3 * 7)
    assert firing() == {"LSLatencyIOInterference": "ls-io"}
    [io] = [i for i in h.all() if i.rule == "LSLatencyIOInterference"]
    assert io.labels["resource"] == "io"
    for second in range(20, 100):  # recovered: both quiet
        tick(second, 0.0)
    assert firing() == {}
    for second in range(100, 120):  # BE on the CPU, no I/O stall: the CPU/cache policy
        tick(second, 0.3)
    assert firing() == {"LSLatencyInterference": "ls-interference"}


def _ls_stalled_tick(h: _Harness, resource: str, second: int, be_cores: float) -> None:
    """One tick of an LS cgroup stalled on `resource` 40% of the time beside a BE pod."""
    now = h.now = T0 + second * S
    samples = [
        Sample("container_pressure", {"node": "node-a", "class": "LS", "level": "pod",
                                      "pod": "web", "resource": resource},
               {"some_rate": 40.0}, now),
        Sample("container_cpu", {"node": "node-a", "class": "BE", "level": "pod",
                                 "pod": "batch"}, {"usage_cores": be_cores}, now)]
    h.store.write(samples)
    h.windows.add(samples)
    h.engine.evaluate(now)


@pytest.mark.parametrize(("file", "rule", "resource", "policy"), [
    ("node-pressure.yaml", "LSCpuStall", "cpu", "ls-interference"),
    ("io-and-memory.yaml", "LSMemoryStall", "memory", "ls-memory")])
def test_shipped_ls_stall_rules_drive_the_policy_only_while_be_work_runs(tmp_path, file, rule,
                                                                          resource, policy):
    """The lab measured the LS cgroup's CPU PSI jumping to ~20% with no BE on the node: a
    stall with BE idle must not move levers that act on BE."""
    from pathlib import Path

    shipped = Path(__file__).resolve().parent.parent / "rules" / file
    h = _Harness(tmp_path, shipped.read_text())

    tick = functools.partial(_ls_stalled_tick, h, resource)

    for second in range(40):  # stalled, BE idle
        tick(second, 0.02)
    assert rule not in {i.rule for i in h.all()}
    for second in range(40, 70):  # BE busy meanwhile
        tick(second, 1.5)
    [stall] = [i for i in h.all() if i.rule == rule]
    assert stall.state == FIRING and stall.policy == policy


@pytest.mark.parametrize(("file", "rule", "resource"), [
    ("node-pressure.yaml", "LSCpuStall", "cpu"),
    ("io-and-memory.yaml", "LSMemoryStall", "memory")])
def test_shipped_ls_stall_rules_end_with_the_be_work(tmp_path, file, rule, resource):
    """Issue #23: no firing after the antagonist stopped, and the incident (so the levers it
    holds) ended soon after. The lab (2026-12-07) had LSCpuStall fire 0.8 s after a cpu
    antagonist's end, on a VM whose own stalls kept the LS cgroup's CPU PSI high: its BE-busy
    condition was a maximum over 5 s, still true after BE had stopped, and its 30 s
    recover_for kept the levers on into the next episode. (The 8 s of busy BE below are
    under the rules' 10 s `for`.)"""
    from pathlib import Path

    shipped = Path(__file__).resolve().parent.parent / "rules" / file
    h = _Harness(tmp_path, shipped.read_text())

    tick = functools.partial(_ls_stalled_tick, h, resource)  # LS stalls throughout

    for second in range(8):  # BE busy for 8 s: pending, not yet `for`
        tick(second, 1.5)
    for second in range(8, 40):  # BE stopped
        tick(second, 0.0)
        assert not any(i.rule == rule and i.state == FIRING for i in h.all()), second
    for second in range(40, 70):  # BE busy long enough: it fires
        tick(second, 1.5)
    [stall] = [i for i in h.all() if i.rule == rule and i.state == FIRING]
    for second in range(70, 82):  # BE stopped: resolved within 12 s, LS still stalling
        tick(second, 0.0)
    assert h.incidents.get(stall.id).state == RESOLVED


def test_the_agents_own_events_are_incidents_of_the_engine(tmp_path):
    """RulesInvalid is made, saved, handed on (firing) and ended by the engine like a rule's
    incident, and a restarted engine continues the one left open instead of opening another
    (alerting once found these by polling the store)."""
    from sloguard.core.incidents import AGENT_GROUP

    def engine(store):
        return Engine(RecentWindows(), store, RuleSet([]), "node-a", DryRunActuator("node-a"))

    store = IncidentStore(tmp_path / "i.db")
    first = engine(store)
    assert first.event("RulesInvalid", T0) is None  # nothing wrong, nothing made
    made = first.event("RulesInvalid", T0, problem="r.yaml:3: bad", value=1.0,
                       summary="1 rule file rejected")
    assert made.group == AGENT_GROUP and made.state == FIRING
    assert [i.id for i in first.firing()] == [made.id]
    assert store.get(made.id).summary == "1 rule file rejected"

    again = engine(store)  # a restart
    same = again.event("RulesInvalid", T0 + 10**9, problem="r.yaml:3: bad", value=1.0,
                       summary="1 rule file rejected")
    assert same.id == made.id and len(same.evidence) == 1  # the same problem: no new evidence
    assert [i.id for i in again.firing()] == [made.id]
    ended = again.event("RulesInvalid", T0 + 2 * 10**9, ended="all rule files load")
    assert ended.state == RESOLVED and again.firing() == []
    assert store.get(made.id).state == RESOLVED
    store.close()


def test_the_agents_group_name_is_reserved(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text(RULES.replace("name: ls", "name: sloguard"))
    with pytest.raises(RuleFileError, match="reserved for the incidents the agent raises"):
        load_rule_file(path)


def test_closing_the_engine_ends_its_detector_thread(tmp_path):
    """An idle worker waits on its queue: abandoning it used to set a flag it never looked at
    again, so every engine left its thread behind (80 in one test process)."""
    h = _Harness(tmp_path)
    h.at(0, 30.0)  # the rule's detector ran on the worker
    thread = h.engine._worker._thread
    assert thread.is_alive()
    h.engine.close()
    thread.join(5)
    assert not thread.is_alive()
    h.engine.close()  # twice is harmless


def test_a_worker_that_cannot_be_started_fails_the_rules_not_the_evaluation(tmp_path,
                                                                            monkeypatch):
    """A new detector worker is a thread, and a node's pids limit (or memory) can refuse one:
    that is every rule's error for this evaluation (judged, counted), as it was when each rule
    was handed over on its own, not an exception out of `evaluate` that left every rule
    unjudged and the tick failed."""
    from sloguard.detector import engine as engine_module

    real = engine_module.DetectorWorker

    class Refused:
        def __init__(self):
            raise RuntimeError("can't start new thread")

    h = _Harness(tmp_path)
    monkeypatch.setattr(engine_module, "DetectorWorker", Refused)
    h.at(0, 30.0)  # must not raise
    status = h.engine.status["ls/LSSlow"]
    assert status.evaluations == 1 and "can't start new thread" in status.error
    monkeypatch.setattr(engine_module, "DetectorWorker", real)
    for second in range(1, 4):
        h.at(second, 30.0)
    assert status.error == "" and [i.state for i in h.all()] == [FIRING]
    h.engine.close()
