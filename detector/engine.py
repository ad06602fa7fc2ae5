"""Rule evaluation and the incident lifecycle: evaluate -> pending -> firing -> resolved.

Each tick, every loaded rule due takes its window from the recent in-memory windows (backfilled
from the store at start), reduces each matching series to one value (signals.py), has each
signal judged (batching.py: one batch call, or a detector per series, on the worker under the
rule's deadline), and moves the series' alert through the Prometheus-style states
(lifecycle.py); incidents are made in incident_making.py, for rules and for the agent's own
events alike. Incidents are persisted on every transition (a failed save is retried) so a
restarted agent continues the incidents it had instead of opening duplicates. A rule that
fails (bad data, a detector error) is recorded on that rule and the others go on.
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from sloguard.core.incidents import (
    AGENT_GROUP,
    FIRING,
    PENDING,
    ActionRecord,
    Incident,
)
from sloguard.detector.api import Verdict
from sloguard.detector.batching import Batch, Judged, PerSeries, Slots
from sloguard.detector.lifecycle import AlertLifecycle, AlertState
from sloguard.detector.recent import RecentWindows
from sloguard.detector.registry import DetectorRegistry
from sloguard.detector.rules import LoadedRule, RuleSet
from sloguard.detector.signals import (
    SeriesKey,
    SignalKey,
    aggregate,
    orderless,
    signal_keys,
)
from sloguard.detector.worker import DetectorWorker
from sloguard.store import WindowQuery
from sloguard.store.incidents_db import IncidentStore

log = logging.getLogger(__name__)

HUNG_BACKOFF_S = 60.0

class IncidentActuator(Protocol):
    def on_firing(self, incident: Incident, now_ns: int) -> list[ActionRecord]: ...

    def on_resolved(self, incident: Incident, now_ns: int) -> list[ActionRecord]: ...


@dataclass
class RuleStatus:
    key: str
    source: str
    last_eval_ns: int = 0
    last_duration_s: float = 0.0
    series: int = 0
    error: str = ""
    evaluations: int = 0


@dataclass
class Engine(AlertLifecycle):
    windows: RecentWindows
    incidents: IncidentStore
    rules: RuleSet
    node: str
    actuator: IncidentActuator
    registry: DetectorRegistry = field(default_factory=DetectorRegistry)
    timeout_s: float = 1.0
    inventory: Callable[[], list[dict[str, str]]] = lambda: []
    on_evaluation: Callable[[str, str], None] = lambda rule, result: None
    batches: bool = True  # use a detector's batch form when it has one (False: per series)
    states: dict[tuple[str, SeriesKey], AlertState] = field(default_factory=dict)
    status: dict[str, RuleStatus] = field(default_factory=dict)
    _due: dict[str, int] = field(default_factory=dict)
    # signal -> series -> (the rule spec it was built from, detector): per signal, so that
    # forgetting the series one signal lost looks at that signal's detectors only
    _detectors: dict[SignalKey, dict[SeriesKey, tuple[Any, Any]]] = field(default_factory=dict)
    _unsaved: dict[str, Incident] = field(default_factory=dict)
    # rule key -> (spec that ran over its deadline, when it may be tried again (monotonic),
    # the worker it was cut off on)
    _hung: dict[str, tuple[Any, int, DetectorWorker]] = field(default_factory=dict)
    # (rule key, series) -> whether each of the last M evaluations crossed (for_evaluations)
    _history: dict[tuple[str, SeriesKey], deque[bool]] = field(default_factory=dict)
    _worker: DetectorWorker | None = None
    _series_errors: dict[str, str] = field(default_factory=dict)  # rule key -> last failure
    _swept_keys: set[str] | None = None  # rule keys when stored incidents were last swept
    _batches: dict[SignalKey, Slots] = field(default_factory=dict)  # signal -> batch, slots
    _mono_ns: int = 0  # the monotonic time of the evaluation in progress
    save_error: str = ""  # why the last save failed, while incidents wait to be saved
    # the agent's own open events by name (RulesInvalid); None until read from the store
    _events: dict[str, Incident] | None = None
    # rule key -> (its policy, whether its `and:` conditions hold now, None: no data): the
    # cause its policy's levers answer (cause_present)
    _causes: dict[str, tuple[str, bool | None]] = field(default_factory=dict)
    # rule keys whose own signal crossed at their last evaluation while an `and:` condition
    # did not hold (LS over its objective, BE not yet seen busy): the agent's evaluation on
    # arrival reads those conditions' signals afresh then (Agent._on_arrival)
    held_back: set[str] = field(default_factory=set)
    # held-back rule key -> (its spec, what its conditions' subscriptions had been given when
    # it was held back), for a rule with no open alert and no evaluations counted: on arrival
    # it is not judged again until one of them is given more (_unchanged_since_held)
    _held_on: dict[str, tuple[Any, tuple[tuple[Any, int], ...]]] = field(default_factory=dict)
    unchanged_on_arrival: int = 0  # rules not judged again so (agent_arrival.py, tests)
    # A new firing of a rule with `and:` conditions waits for those conditions judged on
    # samples collected after the evaluation that would fire it (Agent._confirm_firings): the
    # tick's BE sample covers the second before it, and one that spans an antagonist's end
    # still reads busy (the lab fired LSLatencyInterference 0.1-1.0 s after two ends,
    # docs/lab.md). Off for an engine nobody feeds fresh samples (a backtest, a replay).
    confirm_firing: bool = False
    # rule keys whose firing waits for that evaluation on fresh samples
    awaiting_fresh: set[str] = field(default_factory=set)
    _fresh: bool = False  # the evaluation in progress judges conditions read afresh
    # the measurements a fresh read collects (the agent's cgroup collector's), stamped at the
    # fresh evaluation's time: the newest sample of one of their series is that read's, or
    # the series is gone (_newest)
    reread: frozenset[str] = frozenset()
    # what the last fresh evaluation's newest samples say of each rule's cause (its window's
    # cause and theirs): a lever about to go on asks it (cause_present(now=True))
    _causes_now: dict[str, tuple[str, bool | None]] = field(default_factory=dict)

    def cause_present(self, policy: str, now: bool = False) -> bool | None:
        """Whether the cause a policy's levers answer is still there: the `and:` conditions
        (BE busy, BE stalled on I/O) of a rule that drives it hold at its last evaluation.
        None when no loaded rule driving it has such a condition: nothing tells "the lever
        works" from "the cause is gone" then (docs/actuators.md, "The end of an episode").
        `now`: right after a fresh evaluation, a lever about to go on asks also the newest
        samples (a condition's window remembers BE busy after it stopped); a lever comes off
        on the window alone, never on one 100 ms read that caught BE idle between bursts."""
        held = [holds for name, holds in self._causes_now.values() if name == policy] \
            if now else []
        if not held:  # (the rules judged afresh answer alone: the others' is the tick's)
            held = [holds for name, holds in self._causes.values() if name == policy]
        if any(held):
            return True
        return False if held and all(h is False for h in held) else None

    def close(self) -> None:
        """End the detector worker's thread (an agent stopped in-process, a backtest done)."""
        if self._worker is not None:
            self._worker.abandon()
            self._worker = None

    def restore(self) -> int:
        """Adopt this node's open incidents from before a restart, once their rule is loaded.

        Incidents whose rule is not loaded stay open untouched (a rule file may be broken right
        now); `evaluate` resolves them only when the rules loaded cleanly without that rule.
        Pending incidents are dropped: their `for` clock would span the downtime.
        """
        restored = 0
        by_key = {rule.key: rule for rule in self.rules.rules}
        adopted = {state.incident.id for state in self.states.values()}
        for incident in self.incidents.open_incidents():
            if incident.node != self.node or incident.id in adopted:
                continue
            key = f"{incident.group}/{incident.rule}"
            if key not in by_key:
                continue
            if incident.state == PENDING:
                self.incidents.delete(incident.id)
                continue
            series = tuple(sorted(incident.series.items()))
            self.states[(key, series)] = AlertState(incident, self._mono_ns)
            restored += 1
        return restored

    def evaluate(self, now_ns: int, mono_ns: int | None = None,
                 arrived: frozenset[str] | None = None, fresh: bool = False,
                 only: frozenset[str] | None = None) -> None:
        """One evaluation of every rule due. `now_ns` (wall time) selects the windows, as the
        samples are stamped with it, and labels what is recorded; `mono_ns` (monotonic) runs
        every timer: `for`, `recover_for`, rule intervals and the back-off of a hung rule.
        Without `mono_ns` (a replay, a test stepping simulated time) the two are one clock.
        With `arrived` (measurements that just arrived between ticks): only the `on_arrival`
        rules whose own signal is one of them. `fresh`: the samples the rules' conditions read
        were collected after the last evaluation (a firing held for them may go ahead); with
        `only`, just those rules, due or not (the firings `awaiting_fresh`)."""
        mono = self._mono_ns = now_ns if mono_ns is None else mono_ns
        self._fresh = fresh
        self._causes_now = {}
        self._retry_saves()
        active_rules = self.rules.rules
        keys = {rule.key for rule in active_rules}
        steps: list[tuple[LoadedRule, RuleStatus, int, _Step, float]] = []
        for rule in active_rules:
            if arrived is not None and not (
                    rule.spec.on_arrival and rule.spec.selector.measurement in arrived):
                continue
            if arrived is not None and not fresh and self._unchanged_since_held(rule):
                self.unchanged_on_arrival += 1
                continue
            if only is not None:
                if rule.key not in only:
                    continue
                self._due.pop(rule.key, None)  # judged again now: its interval is no bar
            status = self.status.setdefault(rule.key, RuleStatus(rule.key, rule.source))
            status.source = rule.source
            interval = int((rule.interval or 0) * 1e9)
            if interval and mono < self._due.get(rule.key, mono):
                continue
            hung = self._hung.get(rule.key)
            if hung is not None and hung[0] == rule.spec and (mono < hung[1] or hung[2].stuck):
                self._causes.pop(rule.key, None)  # not judged: it tells nothing of the cause
                self._causes_now.pop(rule.key, None)
                self.held_back.discard(rule.key)
                self._held_on.pop(rule.key, None)
                continue  # cut off recently, or its code still runs: not tried meanwhile
            self._due[rule.key] = mono + interval
            # what this evaluation decides (held back again only if judged: _step_rule)
            self.awaiting_fresh.discard(rule.key)
            self.held_back.discard(rule.key)
            self._held_on.pop(rule.key, None)
            started = time.perf_counter()
            try:
                values = self._values(rule, now_ns)
                step = self._prepare(rule, values, now_ns)
            except Exception as exc:  # one broken rule must not stop the others
                self._judged(rule, status, now_ns, started, exc)
                continue
            steps.append((rule, status, len(values), step, time.perf_counter() - started))
        # Every rule's detector code in one hand-over to the worker (DetectorWorker.run_each),
        # then each rule's alerts stepped in the rules' order, as one rule at a time did.
        outcomes = self._guarded([(rule, step) for rule, _, _, step, _ in steps if step.run])
        for rule, status, series, step, spent in steps:
            outcome = outcomes.get(rule.key)
            started = time.perf_counter() - spent - (outcome[2] if outcome else 0.0)
            try:
                self._step_rule(rule, step, outcome, now_ns)
            except Exception as exc:  # one broken rule must not stop the others
                self._judged(rule, status, now_ns, started, exc)
            else:
                self._judged(rule, status, now_ns, started, None, series)
        if arrived is not None or only is not None:
            return  # the tick's own evaluation, within a second, does the bookkeeping
        if not self.rules.errors:  # a rule gone from cleanly loaded files: end its incidents
            for (rule_key, series), state in list(self.states.items()):
                if rule_key not in keys:
                    del self.states[(rule_key, series)]
                    self._resolve(state.incident, now_ns, "rule no longer loaded")
            if keys != self._swept_keys:  # stored incidents of rules gone (once per change)
                for incident in self.incidents.open_incidents():
                    if incident.group == AGENT_GROUP:
                        continue  # the agent's own events (e.g. RulesInvalid) end themselves
                    if incident.node == self.node and (
                            f"{incident.group}/{incident.rule}" not in keys):
                        self._resolve(incident, now_ns, "rule no longer loaded")
                self._swept_keys = keys
        for key in list(self.status):
            if key not in keys:
                del self.status[key]
        for key in [k for k in self._due if k not in keys]:
            del self._due[key]
        for key in [k for k in self._hung if k not in keys]:
            del self._hung[key]
        for key in [k for k in self._causes if k not in keys]:
            del self._causes[key]
        self.awaiting_fresh &= keys
        self.held_back &= keys  # a rule reloaded away: held back again, it is held anew
        for key in [k for k in self._held_on if k not in keys]:
            del self._held_on[key]
        signals = {signal for rule in active_rules for signal in signal_keys(rule)}
        for key in [k for k in self._detectors if k not in signals]:
            del self._detectors[key]  # a rule gone, or a condition taken out of one
        for key in [k for k in self._batches if k not in signals]:
            del self._batches[key]
        for key in [k for k in self._history if k[0] not in keys]:
            del self._history[key]

    def _values(self, rule: LoadedRule, now_ns: int, spec: Any = None) -> dict[SeriesKey, float]:
        """One aggregate per series of the rule's signal (or of one of its conditions)."""
        spec = spec or rule.spec
        subscription, _ = self.windows.subscribe(spec.selector, spec.field, spec.window)
        start_ns = now_ns - int(spec.window * 1e9)
        if spec.aggregate == "last":  # the common gauge case, without copying any window
            return subscription.last(start_ns, now_ns + 1)
        if orderless(spec.aggregate):  # max, mean, p99...: nor this one
            return subscription.reduce(start_ns, now_ns + 1, spec.aggregate)
        window = subscription.window(start_ns, now_ns + 1)
        return {key: aggregate(times, values, spec.aggregate)
                for key, (times, values) in window.items()}

    def _newest(self, now_ns: int, spec: Any) -> dict[SeriesKey, float]:
        """An `and:` condition's newest sample per series (a rate: over its last two), for a
        firing or a lever confirmed on fresh samples; a sum or count is what happened in the
        whole window, which no single sample tells, and keeps the window. For a measurement
        read afresh, a series without a sample of that read has gone (its pod exited): its
        newest would be the tick's, which spans the antagonist's end and reads busy."""
        subscription, _ = self.windows.subscribe(spec.selector, spec.field, spec.window)
        start_ns = now_ns - int(spec.window * 1e9)
        if spec.aggregate in ("sum", "count"):
            return subscription.reduce(start_ns, now_ns + 1, spec.aggregate)
        since = now_ns if spec.selector.measurement in self.reread else start_ns
        newest: dict[SeriesKey, float] = {}
        wanted = 2 if spec.aggregate == "rate" else 1
        for key, (times, values) in subscription.window(start_ns, now_ns + 1).items():
            kept = []  # the newest `wanted` numbers (NaN is no data), newest first
            for at in range(len(values) - 1, -1, -1):
                if values[at] == values[at]:
                    kept.append((times[at], values[at]))
                    if len(kept) == wanted:
                        break
            if not kept or kept[0][0] < since:
                continue
            if wanted == 2:
                newest[key] = aggregate([t for t, _ in kept[::-1]], [v for _, v in kept[::-1]],
                                        "rate")
            else:
                newest[key] = kept[0][1]
        return newest

    def sync_windows(self, store: Any, now_ns: int) -> int:
        """Subscribe the loaded rules to recent data; backfill new subscriptions from the store.

        Backfill is best effort: a store that cannot be read leaves the window to fill from
        live data. Returns the number of samples backfilled.
        """
        subscriptions, loaded = [], 0
        signals = [(rule, spec) for rule in self.rules.rules
                   for spec in rule.spec.signals]
        for rule, spec in signals:
            subscription, new = self.windows.subscribe(spec.selector, spec.field, spec.window)
            subscriptions.append(subscription)
            if not new or store is None:
                continue
            try:
                samples = store.read_samples(WindowQuery(
                    spec.selector.measurement, now_ns - int(spec.window * 1e9), now_ns + 1,
                    fields=(spec.field,), matchers=spec.selector.matchers))
            except Exception as exc:
                log.warning("backfill of %s from the store failed: %s", rule.key, exc)
                continue
            self.windows.add(samples, only=subscription, now_ns=now_ns)
            loaded += len(samples)
        self.windows.retain(subscriptions)
        return loaded

    def _judged(self, rule: LoadedRule, status: RuleStatus, now_ns: int, started: float,
                exc: Exception | None, series: int = 0) -> None:
        """A rule's evaluation done: its status, and the evaluation counted ok or error."""
        if exc is not None:
            self._causes.pop(rule.key, None)
            self._causes_now.pop(rule.key, None)
            status.error = f"{exc.__class__.__name__}: {exc}"
            log.warning("rule %s failed: %s", rule.key, status.error)
            self.on_evaluation(rule.key, "error")
        else:
            self._hung.pop(rule.key, None)
            status.error = self._series_errors.pop(rule.key, "")
            status.series = series
            self.on_evaluation(rule.key, "error" if status.error else "ok")
        status.evaluations += 1
        status.last_eval_ns = now_ns
        status.last_duration_s = time.perf_counter() - started

    def _prepare(self, rule: LoadedRule, values: dict[SeriesKey, float],
                 now_ns: int) -> _Step:
        """What the rule's detectors are to judge this evaluation, and the code that judges it
        (on the worker), before any of it runs."""
        open_series = {s for (k, s) in self.states if k == rule.key}
        silent = open_series - values.keys()  # open alerts whose series sent nothing: NaN
        inputs = {**values, **dict.fromkeys(silent, math.nan)} if silent else values
        main, *others = signal_keys(rule)
        jobs = [(main, rule.spec, inputs)]
        for key, (_, _, condition) in zip(others, rule.spec.conditions, strict=True):
            jobs.append((key, condition, self._values(rule, now_ns, condition)))
        # Plugin code (constructors included) runs on the worker, under the deadline; what it
        # builds is kept only once the run has succeeded.
        plans = [self._plan(key, spec, inputs) for key, spec, inputs in jobs]
        # On a fresh read, the `and:` conditions judged once more on their newest samples, by
        # detectors made for it and thrown away (each judges a value on its own: per_value)
        newest: list[tuple[int, PerSeries]] = []
        if self._fresh and rule.spec.and_ and self._judged_again(rule):
            for at, (key, (kind, _, condition)) in enumerate(
                    zip(others, rule.spec.conditions, strict=True), start=1):
                if kind == "and":
                    values = self._newest(now_ns, condition)
                    newest.append((at, PerSeries(key, condition, values, {}, set(values))))

        def run() -> list[tuple[Any, Any, list[str]]]:
            return [plan.run(self.registry, now_ns)
                    for plan in [*plans, *(plan for _, plan in newest)]]

        # No series in any of its signals: no detector code to run, so nothing for the worker
        # (most shipped rules have no series on a node without LS pods or eBPF:
        # `benchmarks/agent_tick.py --cgroups 0`)
        needed = any(inputs for _, _, inputs in jobs)
        return _Step(jobs, plans, open_series, run if needed else None, newest)

    def _step_rule(self, rule: LoadedRule, step: _Step,
                   outcome: tuple[bool, Any, float] | None, now_ns: int) -> None:
        """The rule's alerts stepped on what its detectors judged (`outcome` of `step.run` on
        the worker: (True, results, seconds), or (False, the exception, seconds))."""
        jobs, plans, open_series = step.jobs, step.plans, step.open_series
        if step.run is None:
            results = [plan.without_series()
                       for plan in [*plans, *(plan for _, plan in step.newest)]]
        else:
            if outcome is None:  # the hand-over ended before it (Engine.close meanwhile)
                raise RuntimeError("its detector code did not run")
            ok, results, _ = outcome
            if not ok:
                # A batch, or a series' detector, may have been left half-updated, and a worker
                # cut off at its deadline may still be updating them: start those afresh.
                for key, _, _ in jobs:
                    self._batches.pop(key, None)
                    self._detectors.pop(key, None)
                raise results
        judged_all: list[Judged] = []
        failures: list[str] = []
        for plan, (built, judged, failed) in zip(plans, results[:len(plans)], strict=True):
            plan.keep(self, built)
            judged_all.append(judged)
            failures.extend(failed)
        newest = results[len(plans):]
        for _, _, failed in newest:
            failures.extend(failed)
        if failures:
            self._series_errors[rule.key] = (f"{len(failures)} series failed, e.g. "
                                             f"{failures[0]}")[:500]
        holds, notes = True, []
        cause: bool | None = True
        for (kind, _, condition), judged in zip(rule.spec.conditions, judged_all[1:],
                                                strict=True):
            crossed = len(judged.crossed)
            holds = holds and (crossed > 0 if kind == "and" else crossed == 0)
            if kind == "and":
                cause = _and(cause, _still_there(judged))
            notes.append(f"{'unless ' if kind == 'unless' else ''}{condition.expr} "
                         f"{condition.field}: {crossed} of {len(judged.inputs)} series crossed")
        if rule.spec.policy and rule.spec.and_:
            self._causes[rule.key] = (rule.spec.policy, cause)
        else:
            self._causes.pop(rule.key, None)
        # A fresh read's newest samples can only hold back: a firing goes ahead, and a lever
        # goes on, when each `and:` condition holds on a series both in its window and in its
        # newest sample (a maximum over 5 s still held 5 s after BE stopped; the newest alone
        # would let `min` or `mean` fire on one busy read). Alerts already firing, and the
        # cause a lever comes off on, stay the window's.
        confirmed = True
        if step.newest:
            cause_now = cause
            for (at, plan), (_, judged, _) in zip(step.newest, newest, strict=True):
                confirmed = confirmed and bool(judged_all[at].crossed & judged.crossed)
                there = _still_there(judged)
                if there is None and judged_all[at].inputs and (
                        plan.spec.selector.measurement in self.reread):
                    there = False  # every series of the window gone from the fresh read
                cause_now = _and(cause_now, there)
            if rule.spec.policy:
                self._causes_now[rule.key] = (rule.spec.policy, cause_now)
        main = judged_all[0]
        if main.crossed and not holds and rule.spec.and_:
            self.held_back.add(rule.key)
        else:
            self.held_back.discard(rule.key)
        # Only series that crossed, have an alert, or count evaluations can change state: the
        # thousands that are quiet are not stepped one by one.
        counting = {s for (k, s) in self._history if k == rule.key}
        if counting and (rule.spec.for_evaluations is None or not counting <= main.inputs.keys()):
            # Counts of a rule that no longer counts, or of series gone from the data (their
            # detector, and with it their history, may have been dropped with a batch rebuilt
            # for new parameters): forget them, as the per-series path always did.
            for series in list(counting):
                if rule.spec.for_evaluations is None or series not in main.inputs:
                    del self._history[(rule.key, series)]
                    counting.discard(series)
        if rule.key in self.held_back and not open_series and not counting and all(
                getattr(self.registry.types.get(c.detector), "per_value", False)
                for _, _, c in rule.spec.conditions):
            given = self._conditions_given(rule)
            if given is not None:
                self._held_on[rule.key] = (rule.spec, given)
        for series in (main.crossed if holds else set()) | open_series | counting:
            verdict = main.verdict(series)
            if jobs[1:]:
                if verdict.crossed and holds and not confirmed and \
                        not self._firing_series(rule.key, series):
                    # held back by the newest samples: not fired, not dropped either (its
                    # `for` clock runs on; the next evaluation asks again)
                    continue
                verdict = Verdict(verdict.crossed and holds, verdict.recovered or not holds,
                                  verdict.threshold, "; ".join(filter(None, [verdict.note,
                                                                             *notes])))
            self._step(rule, series, main.inputs[series], verdict, now_ns)

    def _conditions_given(self, rule: LoadedRule) -> tuple[tuple[Any, int], ...] | None:
        """Each condition's subscription (compared as the object: one made again starts its
        count again) and the points it has been given; None when one has none."""
        given = []
        for _, _, c in rule.spec.conditions:
            sub = self.windows.find(c.selector, c.field, c.window)
            if sub is None:
                return None
            given.append((sub, sub.added))
        return tuple(given)

    def _unchanged_since_held(self, rule: LoadedRule) -> bool:
        """The rule was held back by its conditions, and nothing has reached them since: judged
        again on arrival, it would be held back again, at the cost of every condition's
        series (the pushed-to agent's two held-back rules on 100 cgroups: 0.88 ms of the loop
        thread and 0.42 ms of the detector worker an arrival, benchmarks/agent_arrival.py).
        Only for conditions whose detectors judge each value on their own (per_value): one that
        learns from each evaluation would judge the same window differently the next time.
        What can change meanwhile waits for the tick, at most one interval, as without
        evaluation on arrival: its own signal falling back under its bar (the rule stays in
        `held_back` until then, so that LS over its objective again on a later arrival is not
        a new hold, and gets the look, not a fresh read), and what the window's bounds moving
        with time changes (a condition's samples leaving it; one stamped ahead entering it). A
        BE that starts is what arrivals are for: the agent's look at BE's CPU reads the cgroups
        afresh, and that evaluation (`fresh`) judges the rule again."""
        held = self._held_on.get(rule.key)
        return held is not None and held[0] is rule.spec and \
            held[1] == self._conditions_given(rule)

    def _firing_series(self, rule_key: str, series: SeriesKey) -> bool:
        state = self.states.get((rule_key, series))
        return state is not None and state.incident.state == FIRING

    def _plan(self, key: SignalKey, spec: Any,
              inputs: dict[SeriesKey, float]) -> PerSeries | Batch:
        """How one signal of a rule is judged this tick: by its batch (one numpy call for every
        series) when the detector type offers one, else by one detector per series."""
        if self.batches and self.registry.batch_type(spec.detector) is not None:
            # numpy is imported here, on the engine's thread: its first import (~0.2 s, much
            # more on a busy node) inside the worker's deadline got rules cut off at start-up
            import numpy  # noqa: F401
            slots = self._batches.get(key)
            if slots is None or (slots.spec is not spec and slots.spec != spec):
                slots = Slots(spec)
                self._detectors.pop(key, None)  # per-series detectors of an earlier type
            gone = slots.arrange(inputs)
            if not key.condition:  # only the rule's own signal counts evaluations
                for series in gone:
                    self._history.pop((key.rule, series), None)
            return Batch(key, spec, inputs, slots)
        self._batches.pop(key, None)  # a batch of an earlier detector type
        mine = self._detectors.get(key, {})
        known = {s: mine.get(s) for s in inputs}
        build = {s for s, entry in known.items()
                 if entry is None or (entry[0] is not spec and entry[0] != spec)}
        return PerSeries(key, spec, inputs, known, build)

    def _guarded(self, steps: list[tuple[LoadedRule, _Step]]
                 ) -> dict[str, tuple[bool, Any, float]]:
        """Run the rules' detector code on the worker, each rule's cut off after `timeout_s`:
        rule key -> (True, results, seconds) or (False, exception, seconds).

        A rule cut off is backed off for HUNG_BACKOFF_S and then tried again (an agent starved
        of CPU once must not lose a rule for good); its worker is abandoned, and the rules
        after it go to a new one.
        """
        outcomes: dict[str, tuple[bool, Any, float]] = {}
        while steps:
            if self._worker is None:
                try:
                    self._worker = DetectorWorker()
                except Exception as exc:  # a thread refused (pids limit, memory): each rule's
                    # error, as when every rule was handed over on its own, not the tick's
                    outcomes.update((rule.key, (False, exc, 0.0)) for rule, _ in steps)
                    break
            worker = self._worker
            done, cut = worker.run_each([step.run for _, step in steps], self.timeout_s)
            for (rule, _), outcome in zip(steps, done, strict=False):
                outcomes[rule.key] = outcome
            if cut is None:
                break
            self._worker = None  # run_each abandoned it
            rule = steps[cut][0]
            retry = self._mono_ns + int(HUNG_BACKOFF_S * 1e9)
            self._hung[rule.key] = (rule.spec, retry, worker)
            outcomes[rule.key] = (False, TimeoutError(
                f"detector {rule.spec.detector!r} took longer than {self.timeout_s:g}s; "
                f"rule skipped for {HUNG_BACKOFF_S:g}s, then tried again once that code "
                "has returned"), self.timeout_s)
            steps = steps[cut + 1:]
        return outcomes

    @property
    def stuck_workers(self) -> int:
        """Detector workers cut off at their deadline whose plugin code has not returned."""
        return sum(1 for _, _, worker in self._hung.values() if worker.stuck)


@dataclass(slots=True)
class _Step:
    """One rule's evaluation between its preparation and its alerts' step: `run` is its
    detector code for the worker (None: no series, nothing to run)."""

    jobs: list[tuple[SignalKey, Any, dict[SeriesKey, float]]]
    plans: list[Any]
    open_series: set[SeriesKey]
    run: Callable[[], list[tuple[Any, Any, list[str]]]] | None
    # `and:` conditions judged on their newest samples (a fresh read): (their place in
    # `plans`, the plan); their results follow the plans' in what `run` returns
    newest: list[tuple[int, PerSeries]] = field(default_factory=list)


def _still_there(judged: Judged) -> bool | None:
    """Whether a condition's cause is still there: a series not yet back past its recover
    bound (the hysteresis: BE at 0.15 cores, between `recover_below: 0.1` and `above: 0.2`,
    still runs); None when no series had a value (a collector down is not "BE stopped")."""
    if judged.still_there is not None:
        return judged.still_there()
    values = [v for v in judged.inputs.values() if not math.isnan(v)]
    if not values:
        return None
    return any(not judged.verdict(s).recovered for s, v in judged.inputs.items()
               if not math.isnan(v))


def _and(a: bool | None, b: bool | None) -> bool | None:
    """Three-valued and: gone when any part is gone, unknown when any is unknown."""
    if a is False or b is False:
        return False
    return None if a is None or b is None else True
