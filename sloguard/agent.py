"""The node agent: collect -> store -> detect -> act, once per tick, plus its health.

This module only composes the parts; each part lives in its own package. The loop runs in one
thread so that collection, the write and the evaluation of a tick see the same instant; the web
UI/API serves from uvicorn's threads and reads through the stores' own connections.
"""

from __future__ import annotations

import gc
import logging
import math
import queue
import threading
import time
from collections import deque
from concurrent.futures import Future
from typing import Any

from prometheus_client import CollectorRegistry

from sloguard.actuators.env import ActuatorEnv
from sloguard.actuators.guard_cost import MAX_STEP_S, GuardCost
from sloguard.actuators.kinds import BUILTIN_STEPS, StepFactory
from sloguard.actuators.ladder import Ladder
from sloguard.actuators.ledger import Ledger
from sloguard.actuators.policy import PolicySet
from sloguard.actuators.standing import STANDING, is_standing
from sloguard.collectors.base import CollectorContext
from sloguard.collectors.cgroups import CgroupCollector
from sloguard.collectors.registry import CollectorPlugins
from sloguard.core import failpoints
from sloguard.core.clock import SYSTEM, Clock
from sloguard.core.health import ComponentStatus
from sloguard.core.incidents import Incident
from sloguard.core.samples import Sample
from sloguard.core.selfmetrics import (
    AgentMetrics,
    GuardCostMetrics,
    forward_metrics,
    forward_skipped_metric,
)
from sloguard.core.units import format_duration
from sloguard.detector.attribution.attributor import Attributor
from sloguard.detector.attribution.case import as_reader
from sloguard.detector.engine import Engine
from sloguard.detector.recent import RecentWindows
from sloguard.detector.registry import DetectorRegistry
from sloguard.detector.rules import RuleSet
from sloguard.settings import Settings
from sloguard.store import MAINTAIN_EVERY_S, StoreError
from sloguard.store.factory import open_configured_store
from sloguard.store.incidents_db import IncidentStore
from sloguard.supervisor import Supervisor

log = logging.getLogger(__name__)
ARRIVAL = object()  # in the loop's call queue: data has arrived for the on_arrival rules
WAKE = object()  # in the loop's call queue: stop() wakes the loop from its wait at once
CONFIRM_S = 0.1  # confirm_interference: BE's fresh sample covers at least this long
# evaluation on arrival: a held-back rule's cgroups are read again when one's CPU has risen
# this much (cores) since the last collection; under the shipped "BE busy" bar (0.2)
CPU_RISE = 0.1
# A read on arrival that left every rule it judged held back raises that bar to this many times
# the rise it read, and the raise halves every RISE_HALF_LIFE_S: BE cgroups swinging just under
# the rule's own bar read every cgroup on 81 of 96 pushes (agent_overhead.py --swinging 8).
# Never over RISE_BAR_MAX, just over the shipped "BE busy" bar: a larger rise that changed
# nothing was held back by something the look does not see (an `unless:` on BE's I/O, a
# pressure condition), and a BE that starts with that much CPU is read at once whatever came
# before (a BE pod could otherwise raise the bar for everyone with bursts while it stalls on I/O)
RISE_AFTER_NOTHING = 1.5
RISE_HALF_LIFE_S = 10.0
RISE_BAR_MAX = 0.3
SETTLE_AFTER_TICKS = 5  # the heap is settled (Agent.settle_heap) after this many ticks

RULE_RELOAD_S = 10.0


class Agent:
    def __init__(self, settings: Settings, registry: CollectorRegistry | None = None,
                 clock: Clock = SYSTEM) -> None:
        self.settings = settings
        self.clock = clock
        self.node = settings.node_name
        self.registry = registry or CollectorRegistry()
        self.metrics = AgentMetrics(self.registry)
        data_dir = settings.data_dir
        try:
            data_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"data_dir {data_dir}: cannot create it: {exc.strerror}") from exc
        self.store = open_configured_store(settings.store, settings.data_dir, self.metrics)
        # a firing incident with only more evidence is a change every forward.refresh
        self.incidents = IncidentStore(data_dir / "incidents.db",
                                       refresh_s=settings.forward.refresh)
        self.pods: Any = None
        self._kube_error = ""
        if settings.kubernetes.enabled:
            self._start_kubernetes()
        # every collector the config asks for, built-ins first (collectors/registry.py)
        self.collector_plugins = CollectorPlugins()
        self.collectors, self._build_errors = self.collector_plugins.build(CollectorContext(
            self.node, settings, pods=self.pods, metrics=self.registry))
        built = {collector.name: collector for collector in self.collectors}
        self.cgroups: CgroupCollector | None = built.get("cgroups")
        self.app_latency: Any = built.get("app_latency")  # the UI's receiver pushes into it
        # evaluation on arrival: a push or a scrape wakes the loop between ticks (_on_arrival)
        self._arrival_pending = threading.Event()
        self._last_arrival = -math.inf
        self.arrival_evaluations = 0
        self.arrival_reads = 0  # of them, those that read the cgroups afresh
        # the rise that brought the last read on arrival that changed nothing, and when
        # (monotonic): _rise_bar
        self._rise_for_nothing = (0.0, -math.inf)
        # confirm_interference: when the cgroups were last collected (monotonic), and each
        # policy's last answer for that collection
        self._cgroups_mono = -math.inf
        self._confirmed: dict[str, float] = {}
        self._confirmed_as: dict[str, bool] = {}
        if self.app_latency is not None and settings.arrival_floor > 0:
            self.app_latency.on_arrival = self._data_arrived
        self._collector_errors: dict[str, str] = {}
        self.detectors = DetectorRegistry.from_config(settings.detectors)
        self.rules = RuleSet(list(settings.rules.paths), validate_params=self.detectors.check)
        self.windows = RecentWindows()
        self.ladder = self._build_ladder(data_dir)
        self.metrics.expect_failures(self.store.name, BUILTIN_STEPS)
        self.engine = Engine(
            windows=self.windows,
            incidents=self.incidents,
            rules=self.rules,
            node=self.node,
            actuator=self.ladder,
            registry=self.detectors,
            timeout_s=settings.detectors.timeout,
            inventory=self.cgroups.workloads if self.cgroups else (lambda: []),
            on_evaluation=lambda rule, result: self.metrics.rule_evaluations.labels(
                rule, result).inc(),
            # the cgroups can be read again before a firing on BE conditions (_confirm_firings)
            confirm_firing=self.cgroups is not None,
            reread=frozenset(self.cgroups.measurements if self.cgroups else ()),
        )
        self.attributor = Attributor(
            settings.attribution, as_reader(self.store),
            self.cgroups.workloads if self.cgroups else (lambda: []), self.engine.save)
        self.guard_cost = GuardCost(
            data_dir / "guard_cost.db", self._per_workload,
            max_step_s=max(MAX_STEP_S, 3 * settings.interval),  # a slow tick is still counted
            audit_start=self.ledger.last_audit_id())
        self.registry.register(GuardCostMetrics(self.guard_cost.costs,
                                                lambda: self.guard_cost.dropped))
        self._calls: queue.SimpleQueue[tuple[Any, Future]] = queue.SimpleQueue()
        self.alerting = self._build_alerting(data_dir)
        self.silences = self.alerting.silences
        self.forwarder = self._build_forwarder(data_dir)
        self._buffer: deque[Sample] = deque()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.last_tick_mono = 0.0
        self.ticks = 0
        # `sloguard run` sets it: the agent alone in its process (not a test's agent) settles
        # its heap once the first ticks have built what it keeps (_settle_heap)
        self.settle_heap = False
        self._heap_settled = False
        self._settle_due = False  # rules changed since the heap was settled (_settle_heap)
        self.tick_failures = 0  # consecutive ticks that raised
        self.tick_error = ""  # why the last failed tick raised
        self._failed_at: deque[float] = deque(maxlen=1000)  # monotonic times of failed ticks
        self.supervisor = Supervisor()
        self._store_error = ""
        self._next_reload = 0.0
        self._next_maintain = clock.mono_ns() / 1e9 + MAINTAIN_EVERY_S  # the clock's, in seconds
        self.metrics.gauge_callback(
            "sloguard_incidents", "Incidents by state", "state", self.incidents.counts_by_state
        )
        self.metrics.gauge_callback(
            "sloguard_rules_loaded", "Active rules", "", lambda: {"": len(self.rules.rules)}
        )
        self.metrics.gauge_callback(
            "sloguard_rule_file_errors", "Rule files rejected on their last load", "",
            lambda: {"": len(self.rules.errors)},
        )
        rejected = getattr(self.store, "rejected", None)
        if isinstance(rejected, dict):  # the embedded store's; InfluxDB counts its own
            self.metrics.counter_callback(
                "sloguard_store_samples_rejected",
                "Samples the store dropped because it cannot hold them (time or value out of "
                "range, too many fields), by reason", "reason", lambda: dict(rejected))
        if self.cgroups is not None:
            cg = self.cgroups
            self.metrics.gauge_callback(
                "sloguard_cgroups", "Cgroups tracked and vanished mid-read", "kind",
                lambda: {"tracked": cg.tracked, "vanished_total": cg.vanished_total},
            )

    def _build_ladder(self, data_dir: Any) -> Ladder:
        """The escalation ladder and what its steps act through (actuators/)."""
        self.ledger = Ledger(data_dir / "actuators.db")
        kube, kube_error = None, ""
        if self.settings.kubernetes.enabled:
            from sloguard.collectors.kube_pods import load_api_client

            kubeconfig = self.settings.kubernetes.kubeconfig
            clients: list[Any] = []

            def kube() -> Any:  # built on first use, then shared by every step
                if not clients:  # its changing calls pass failpoints (crash sweep)
                    clients.append(failpoints.watch_api_client(load_api_client(kubeconfig)))
                return clients[0]
        else:
            kube_error = "Kubernetes is not configured (kubernetes.enabled: false)"
        self.actuator_env = ActuatorEnv(
            self.node, self.ledger, kube=kube, kube_error=kube_error,
            usage=self.cgroups.usage if self.cgroups else None,
            request_timeout_s=self.settings.kubernetes.timeout)
        self.steps = StepFactory(self.actuator_env)
        self.policies = PolicySet(list(self.settings.actuators.policies),
                                  validate_step=self.steps.check,
                                  cannot_stand=self.steps.cannot_stand)
        return Ladder(
            self.node, self.policies, self.ledger, self.steps.make,
            save_incident=lambda incident: self.engine.save(incident),
            load_incident=self.incidents.get,
            inventory=self.cgroups.workloads if self.cgroups else (lambda: []),
            dry_run=self.settings.actuators.dry_run,
            open_incidents=self.incidents.open_incidents,
            background=True,  # API calls never hold up collection and evaluation
            # BE still busy after an episode: its levers stay (the engine is built after)
            cause_present=lambda policy: self.engine.cause_present(policy),
            confirm=self.confirm_interference,
            on_audit=lambda entry: self.metrics.actions.labels(
                entry.kind, entry.action, entry.status).inc(),
        )

    def _per_workload(self, kind: str) -> bool:
        """Whether a step kind acts on BE workloads' own cgroups (what guarding costs them)."""
        try:
            return bool(getattr(self.steps.type_of(kind), "per_workload", False))
        except (ValueError, ImportError, AttributeError):
            return False

    def _build_alerting(self, data_dir: Any) -> Any:
        """Silences always (the API and CLI manage them); Slack when receivers are configured,
        and then the ladder's notify rung hands incidents to it (actuators/alerting/)."""
        from sloguard.actuators.alerting.db import AlertDB
        from sloguard.actuators.alerting.pipeline import Alerting, ladder_plan

        settings = self.settings
        alerting = Alerting(
            settings.alerting, AlertDB(data_dir / "alerting.db"), self.incidents, self.node,
            settings.ui.external_url or (
                f"{'https' if settings.ui.tls_cert_file else 'http'}://{settings.listen}"),
            policy_known=lambda name: self.policies.get(name) is not None,
            planned=ladder_plan(self.policies, self.ledger), registry=self.registry)
        if alerting.enabled:
            self.actuator_env.notifier = alerting
        return alerting

    def _build_forwarder(self, data_dir: Any) -> Any:
        """Incidents and actions to the cluster server, when `forward.url` is set."""
        cfg = self.settings.forward
        if not cfg.url:
            return None
        from sloguard.forwarder import Forwarder

        sent = forward_metrics(self.registry)
        forwarder = Forwarder(cfg, self.node, self.incidents, self.ledger, data_dir, sent,
                              forward_skipped_metric(self.registry))
        self.metrics.gauge_callback(
            "sloguard_forward_backlog", "Incidents (changes) and audit entries not yet sent",
            "kind", forwarder.backlog)
        self.metrics.gauge_callback(
            "sloguard_forward_last_success_seconds",
            "When the cluster server last took everything (Unix time; 0: never)", "",
            lambda: {"": forwarder.last_success_ns / 1e9})
        return forwarder

    def _start_kubernetes(self) -> None:
        from sloguard.collectors.kube_pods import PodMetadataCache, load_api_client

        k8s = self.settings.kubernetes
        try:
            client = load_api_client(k8s.kubeconfig)
        except Exception as exc:  # no kubeconfig or service account: keep collecting without
            self._kube_error = f"cannot configure the Kubernetes client: {exc}"
            log.error("%s", self._kube_error)
            return
        self.pods = PodMetadataCache(client, self.node, k8s.refresh)

    # -- lifecycle -----------------------------------------------------------------------

    def start(self) -> None:
        for collector in self.collectors:  # loading eBPF programs happens here, not in __init__
            collector.start()
        self._reload_rules()
        if self.pods is not None:
            self.pods.start()
        self._start_loop()
        self.alerting.start()
        if self.forwarder is not None:
            self.forwarder.start()
        self._supervise()
        log.info("agent started on node %s, tick %.3gs", self.node, self.settings.interval)

    def _start_loop(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="agent-loop", daemon=True)
        self._thread.start()

    def _supervise(self) -> None:
        """Watch every long-lived thread started above (sloguard/supervisor.py)."""
        sup = self.supervisor
        sup.watch("agent-loop", lambda: self._thread, self._start_loop, "loop")
        if self.app_latency is not None:
            app = self.app_latency
            sup.watch("app-latency", lambda: app.thread, app.start, app.name)
        if self.pods is not None:
            pods = self.pods
            sup.watch("pod-metadata", lambda: pods._thread, pods.start, "kubernetes")
        for sender in self.alerting.senders.values():
            for name, thread, restart in sender.watched():
                sup.watch(name, thread, restart, "alerting")
        if self.forwarder is not None:
            fwd = self.forwarder
            sup.watch("forwarder", lambda: fwd._thread, fwd.start, "forward")
        writer = getattr(self.store, "_thread", None)
        if isinstance(writer, threading.Thread):  # the InfluxDB writer: its state is its own,
            store = self.store  # so a dead one is reported, not restarted from outside
            sup.watch(writer.name, lambda: store._thread, None, f"store:{store.name}")
        sup.start()

    def stop(self) -> None:
        """Stop the loop, write what is buffered, close the stores (SIGTERM path)."""
        self.supervisor.stop()  # first: threads that stop now are not restarted
        self._stop.set()
        self._calls.put((WAKE, None))
        if self._thread is not None:
            self._thread.join(timeout=30)
        if self._thread is None or not self._thread.is_alive():  # the loop's alone till then
            try:
                self.ladder.release_standing(self.clock.wall_ns())
            except Exception:
                log.exception("lifting the standing levers at stop failed")
        if self.pods is not None:
            self.pods.stop()
        for collector in self.collectors:  # detaches eBPF programs, closes held files, joins
            collector.close()
        self._flush()
        if self._buffer:
            log.error("exiting with %d samples unwritten: %s", len(self._buffer),
                      self._store_error)
        if self.forwarder is not None:  # what it did not send is sent by the next run
            self.forwarder.stop()
        self.alerting.stop()  # what is not yet delivered stays in the outbox for the next run
        self.store.close()
        self.ladder.close()  # an API call under way ends within its timeout
        self.attributor.close()
        self.engine.close()
        self.guard_cost.close()
        self.incidents.close()
        self.ledger.close()
        self.alerting.db.close()
        log.info("agent stopped")

    def _loop(self) -> None:
        interval = self.settings.interval
        deadline = time.monotonic()
        while not self._stop.is_set():
            try:
                self.tick()
            except Exception as exc:  # the loop must survive anything one tick does
                self.tick_failures += 1
                self.tick_error = f"{exc.__class__.__name__}: {exc}"[:500]
                self._failed_at.append(time.monotonic())
                log.exception("tick failed")
            else:
                self.tick_failures = 0
            self.supervisor.ensure_running()
            deadline += interval
            now = time.monotonic()
            if now > deadline:
                self.metrics.tick_overruns.inc()
                deadline = now
            self._wait_or_call(deadline - now)

    def _wait_or_call(self, seconds: float) -> None:
        """Sleep until the next tick, but serve calls (an acknowledge from the UI) at once,
        and evaluate the `on_arrival` rules when data has arrived, at most every
        `arrival_floor`."""
        end = time.monotonic() + seconds
        arrival_at: float | None = None
        while not self._stop.is_set():
            now = time.monotonic()
            if arrival_at is not None and now >= arrival_at:
                arrival_at = None
                try:
                    self._on_arrival()
                except Exception:  # the loop must survive it, as it survives a tick
                    log.exception("evaluation on arrival failed")
                continue
            left = end - now
            if left <= 0:
                return  # an arrival still waiting for its floor: the tick evaluates it
            # no polling: stop() and every caller wake the loop through the queue. It woke ten
            # times a second, and a timed wait's wake-up costs ~90 us of CPU on this VM (200 of
            # them in a 20 s loop of timed waits: 18.4 ms, against 0.2 ms for 2): ~0.09% of a
            # core, a twenty-fifth of the 100-cgroup agent's (agent_overhead.py)
            timeout = left if arrival_at is None else min(left, arrival_at - now)
            try:
                work, future = self._calls.get(timeout=max(timeout, 0.0))
            except queue.Empty:
                continue
            if work is WAKE:
                continue
            if work is ARRIVAL:
                arrival_at = max(now, self._last_arrival + self.settings.arrival_floor)
                continue
            _run_one(work, future)

    def _data_arrived(self) -> None:
        """From the receiver's or the scraper's thread: wake the loop once per arrival spell
        (a flag, so a burst of pushes queues one wake-up, not one each)."""
        if not self._arrival_pending.is_set():
            self._arrival_pending.set()
            self._calls.put((ARRIVAL, None))

    def _collect_fresh(self) -> tuple[int, int]:
        """The cgroups collected again, at least CONFIRM_S after their last collection, so
        that the new sample covers no time before it; into the store and the windows. Returns
        the (wall, monotonic) time the rules are to be judged at."""
        wait = self._cgroups_mono + CONFIRM_S - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        now_ns, mono_ns = self.clock.wall_ns(), self.clock.mono_ns()
        samples = self.cgroups.collect(now_ns)
        self._cgroups_mono = time.monotonic()
        self._enqueue(samples)
        self.windows.add(samples, now_ns=now_ns)
        return now_ns, mono_ns

    def _policy_held(self, policy: str) -> bool:
        """A policy's incident fires, not quiet, and the cause its levers answer is not gone,
        on the fresh read's newest samples too (a lever is about to go on)."""
        return any(i.policy == policy and i.quiet_since_ns is None
                   for i in self.engine.firing()) and \
            self.engine.cause_present(policy, now=True) is not False

    def confirm_interference(self, policy: str) -> bool:
        """Right before a lever goes on: the cgroups collected again (at least 100 ms after
        the last collection, so the sample covers no second before it) and the rules driving
        the policy judged on them. The tick's BE samples cover the second before; an
        antagonist that stopped within it still looked busy, and the ladder acted 0.8 s after
        its end (docs/lab.md). Once per tick and policy at most; a rung every 10 s at most."""
        if self.cgroups is None:
            return True
        if self._confirmed.get(policy) == self._cgroups_mono:
            return self._confirmed_as.get(policy, True)
        now_ns, mono_ns = self._collect_fresh()
        driving = frozenset(rule.spec.selector.measurement for rule in self.rules.rules
                            if rule.spec.policy == policy and rule.spec.on_arrival)
        if driving:
            # fresh: a firing this evaluation allows goes ahead (nothing is left awaiting)
            self.engine.evaluate(now_ns, mono_ns, arrived=driving, fresh=True)
        held = self._policy_held(policy)
        self._confirmed[policy], self._confirmed_as[policy] = self._cgroups_mono, held
        return held

    def _confirm_firings(self) -> None:
        """The firings the last evaluation held back (Engine.confirm_firing): their rules
        judged again on cgroups collected afresh; they fire only if their `and:` conditions
        still hold. The answer stands for the ladder's own confirmation of those policies
        (confirm_interference), which would otherwise collect once more."""
        waiting = frozenset(self.engine.awaiting_fresh)
        if not waiting or self.cgroups is None:
            return
        now_ns, mono_ns = self._collect_fresh()
        self.engine.evaluate(now_ns, mono_ns, fresh=True, only=waiting)
        for policy in {rule.spec.policy for rule in self.rules.rules
                       if rule.key in waiting and rule.spec.policy}:
            self._confirmed[policy] = self._cgroups_mono
            self._confirmed_as[policy] = self._policy_held(policy)

    def cgroup_conditions(self, rules: list[Any]) -> dict[str, list[Any]]:
        """Rule key -> the selectors of its `and:` conditions on what the cgroup collector
        writes: a rule held back on other signals has nothing to gain from reading cgroups."""
        written = set(self.cgroups.measurements) if self.cgroups is not None else set()
        return {rule.key: [c.selector for kind, _, c in rule.spec.conditions
                           if kind == "and" and c.selector.measurement in written]
                for rule in rules}

    def _read_on_arrival(self, rules: frozenset[str]) -> None:
        """LS over its objective, BE not busy on the tick's samples (up to a second old): the
        cgroups read afresh and these held-back rules judged again, so that a BE that has just
        started is seen now, not at the next tick (the lab's first lever came 0.8 s after the
        antagonist's start, most of it waiting for that sample). On the arrival that holds a
        rule back, and on a later one only if the CPU of a cgroup its conditions select has
        risen since (CgroupCollector.cpu_rise): a service over its objective with BE idle read
        every cgroup at every push, 3.75% of a core against 1.90% tick only with pushes every
        0.5 s (docs/performance.md, "Evaluation on arrival"). A read that changed nothing
        raises the bar for the next (_rise_bar)."""
        self.arrival_reads += 1
        now_ns, mono_ns = self._collect_fresh()
        self.engine.evaluate(now_ns, mono_ns, fresh=True, only=rules)

    def _rise_bar(self) -> float:
        """How much a held-back rule's cgroups' CPU must rise for a read on arrival. A read
        that changed nothing saw a rise its rules do not count as busy; the same rise again
        would read again for nothing, so the bar goes over it, and comes back down with time
        (a BE that starts while it is up is seen at the next tick, as without evaluation on
        arrival)."""
        rise, at = self._rise_for_nothing
        return min(RISE_BAR_MAX, max(CPU_RISE, RISE_AFTER_NOTHING * rise *
                                     0.5 ** ((time.monotonic() - at) / RISE_HALF_LIFE_S)))

    def _on_arrival(self) -> None:
        """The `on_arrival` rules on what has just arrived, and the ladder in the same step:
        a push every 0.5 s no longer waits up to a second for the tick (docs/app-latency.md,
        "How fast"). The rest (collection, other rules, accounts) stays on the tick."""
        self._arrival_pending.clear()
        self._last_arrival = time.monotonic()
        now_ns, mono_ns = self.clock.wall_ns(), self.clock.mono_ns()
        try:
            samples = self.app_latency.collect(now_ns)
        except Exception as exc:
            self._collector_errors["app_latency"] = f"{exc.__class__.__name__}: {exc}"
            log.warning("collector app_latency failed: %s", exc)
            return
        if not samples:
            return
        self._enqueue(samples)
        self.windows.add(samples, now_ns=now_ns)
        self.arrival_evaluations += 1
        arrived = frozenset(s.measurement for s in samples)
        held_before = frozenset(self.engine.held_back)
        self.engine.evaluate(now_ns, mono_ns, arrived=arrived)
        held = [rule for rule in self.rules.rules
                if rule.spec.on_arrival and rule.key in self.engine.held_back]
        if not held:
            self._rise_for_nothing = (0.0, -math.inf)
        elif self.cgroups is not None and time.monotonic() - self._cgroups_mono >= CONFIRM_S:
            selectors = self.cgroup_conditions(held)
            newly_held = any(selectors[rule.key] and rule.key not in held_before
                             for rule in held)
            rise = 0.0 if newly_held else \
                self.cgroups.cpu_rise(s for found in selectors.values() for s in found)
            if newly_held or rise >= self._rise_bar():
                judged = frozenset(k for k, found in selectors.items() if found)
                self._read_on_arrival(judged)
                if not newly_held and judged <= self.engine.held_back:
                    self._rise_for_nothing = (rise, time.monotonic())
        self._confirm_firings()
        firing = self.engine.firing()
        if not any(i.policy for i in firing):
            return  # nothing for the ladder to climb (or to hold): the tick does the rest
        try:
            self.attributor.tick(now_ns, firing)
        except Exception:
            log.exception("attribution failed")
        try:
            self.ladder.tick(now_ns, firing, mono_ns)
        except Exception:
            log.exception("escalation ladder failed")

    # -- one tick ------------------------------------------------------------------------

    # -- what the web UI/API reads (ui/view.py) ------------------------------------------

    cluster = False

    def rules_view(self) -> tuple[list[tuple[Any, Any]], dict[str, str]]:
        status = self.engine.status
        return [(rule, status.get(rule.key)) for rule in self.rules.rules], dict(self.rules.errors)

    def policies_view(self) -> tuple[list[Any], dict[str, str], dict[str, str]]:
        loaded = [p for p in (self.policies.get(n) for n in self.policies.names) if p]
        return loaded, dict(self.policies.errors), dict(self.ladder.errors)

    def change_incident(self, incident_id: str, what: str, author: str,
                        comment: str) -> Incident:
        """Acknowledge or resolve by hand, on the loop thread (the engine is the loop's)."""
        act = self.engine.acknowledge if what == "ack" else self.engine.resolve_by_hand
        return self.call_on_loop(lambda: act(incident_id, author, comment, time.time_ns()))

    def workloads(self) -> list[dict[str, Any]]:
        return self.cgroups.workloads() if self.cgroups is not None else []

    def guard_costs(self) -> list[dict[str, Any]]:
        return self.guard_cost.costs()

    def app_targets(self) -> list[dict[str, Any]]:
        return self.app_latency.target_status() if self.app_latency is not None else []

    def receiver(self) -> Any:
        return self.app_latency

    def ingest_router(self) -> None:
        return None

    def fleet_summary(self, since_ns: int, until_ns: int, buckets: int,
                      limit: int) -> None:
        return None  # one node: its incident list is the whole story

    def call_on_loop(self, work: Any, timeout_s: float = 10.0) -> Any:
        """Run `work()` on the agent's loop thread between ticks (the engine and the ladder
        are the loop's alone), and return its result or raise its exception. Before the loop
        runs (tests, start-up), it runs here."""
        if self._thread is None or not self._thread.is_alive():
            return work()
        future: Future = Future()
        self._calls.put((work, future))
        return future.result(timeout=timeout_s)

    def _run_calls(self) -> None:
        while True:
            try:
                work, future = self._calls.get_nowait()
            except queue.Empty:
                return
            if work is ARRIVAL or work is WAKE:
                continue  # this tick collects and evaluates it
            _run_one(work, future)

    def tick(self, now_ns: int | None = None) -> None:
        started = time.perf_counter()
        # what has arrived so far is this tick's: the next arrival wakes the loop again (the
        # flag must never stay set with no wake-up queued, or arrivals stop waking it)
        self._arrival_pending.clear()
        self._run_calls()
        now_ns = now_ns or self.clock.wall_ns()
        mono_ns = self.clock.mono_ns()
        for collector in self.collectors:
            t0 = time.perf_counter()
            try:
                samples = collector.collect(now_ns)
            except Exception as exc:
                self._collector_errors[collector.name] = f"{exc.__class__.__name__}: {exc}"
                self.metrics.collector_errors.labels(collector.name).inc()
                log.warning("collector %s failed: %s", collector.name, exc)
                continue
            self._collector_errors.pop(collector.name, None)
            if collector is self.cgroups:
                self._cgroups_mono = time.monotonic()
            self.metrics.collection_duration.labels(collector.name).observe(
                time.perf_counter() - t0)
            self.metrics.samples_collected.labels(collector.name).inc(len(samples))
            self._enqueue(samples)
            self.windows.add(samples, now_ns=now_ns)  # detection goes on while the store fails
            try:  # an account's failure never holds up detection
                self.guard_cost.observe(samples)
            except Exception:
                log.exception("the guard-cost account failed")
        self._flush()
        mono = mono_ns / 1e9
        if mono >= self._next_reload:
            self._reload_rules()
        self.engine.evaluate(now_ns, mono_ns)
        self._confirm_firings()
        try:  # before the ladder: a rung that targets suspects acts on this tick's
            self.attributor.tick(now_ns, self.engine.firing())
        except Exception:
            log.exception("attribution failed")
        try:
            self.ladder.tick(now_ns, self.engine.firing(), mono_ns)
        except Exception:  # recorded per step; this is the ladder's own bug, never the loop's
            log.exception("escalation ladder failed")
        try:
            self.guard_cost.tick(now_ns, mono, self.workloads(), self.ledger.rungs(),
                                 self.engine.firing(), self.ledger.audit_after)
        except Exception:
            log.exception("the guard-cost account failed")
        if self.alerting.enabled:
            try:  # decides and enqueues only; Slack is spoken to by the senders' threads
                self.alerting.tick(now_ns, self.engine.firing(), mono_ns)
            except Exception:
                log.exception("alerting failed")
        if mono >= self._next_maintain:
            self._next_maintain = mono + MAINTAIN_EVERY_S
            try:
                self.store.maintain(now_ns)
            except StoreError as exc:
                self.metrics.store_errors.labels(self.store.name, "maintain").inc()
                log.warning("store retention failed: %s", exc)
            self._prune_incidents(now_ns)
            self._prune_audit(now_ns)
        self.ticks += 1
        self.last_tick_mono = time.monotonic()
        self.metrics.tick_duration.observe(time.perf_counter() - started)
        if self.settle_heap and (self.ticks == SETTLE_AFTER_TICKS or self._settle_due):
            self._settle_heap()

    def _settle_heap(self) -> None:
        """What the agent has built by now (modules, the app, rules, windows, caches) lives
        as long as it does: moved out of the cyclic GC's sight (gc.freeze), the full
        collections that walked all of it every few seconds walk only what is new. They were
        0.21 ms of CPU a tick over 300 ticks of the 100-cgroup agent, 0.001 ms settled
        (benchmarks/agent_tick.py's agent with gc callbacks timed; docs/performance.md). After
        a reload that changed rules or policies the heap is settled again, at the end of the
        tick after it: the engine lets go of what it held for the rules replaced (detectors,
        batches) in that tick's evaluation; settled before, a cycle among those stayed
        frozen once dropped."""
        if self._heap_settled:
            gc.unfreeze()
        gc.collect()
        gc.freeze()
        self._heap_settled = True
        self._settle_due = False

    def _prune_incidents(self, now_ns: int) -> None:
        """Resolved incidents past `incidents.retention` go (the table would grow forever)."""
        cutoff = now_ns - int(self.settings.incidents.retention * 1e9)
        try:
            pruned = self.incidents.prune(cutoff)
        except Exception as exc:  # retried at the next maintenance
            log.warning("incident retention failed: %s", exc)
            return
        if pruned:
            log.info("deleted %d incidents resolved more than %s ago", pruned,
                     format_duration(self.settings.incidents.retention))

    def _prune_audit(self, now_ns: int) -> None:
        """The actuators' audit past `actuators.audit_retention` goes (eviction budgets look
        back an hour at most; the retention is at least that)."""
        retention = self.settings.actuators.audit_retention
        try:
            pruned = self.ledger.prune_audit(now_ns - int(retention * 1e9))
        except Exception as exc:  # retried at the next maintenance
            log.warning("audit retention failed: %s", exc)
            return
        if pruned:
            log.info("deleted %d audit entries older than %s", pruned,
                     format_duration(retention))

    def _reload_rules(self) -> None:
        policies_changed = self.policies.reload().changed
        changed = self.rules.reload().changed
        self._rules_invalid_event(self.clock.wall_ns())
        if (changed or policies_changed) and self._heap_settled:
            self._settle_due = True  # at the end of the next tick (_settle_heap)
        if changed or not self.ticks:
            backfilled = self.engine.sync_windows(self.store, self.clock.wall_ns())
            if backfilled:
                log.info("backfilled %d samples of new rules' windows from the store",
                         backfilled)
            restored = self.engine.restore()  # incidents whose rule is (again) loaded
            if restored:
                log.info("continuing %d open incidents from before the restart", restored)
        self._next_reload = self.clock.mono_ns() / 1e9 + RULE_RELOAD_S

    def _rules_invalid_event(self, now_ns: int) -> None:
        """A rejected rule file is an incident of its own: visible in the UI, the API and (with
        alerting) Slack, not only in a log line. It resolves when the files load again."""
        errors = self.rules.errors
        text = "; ".join(sorted(errors.values()))
        self.engine.event(
            "RulesInvalid", now_ns, problem=text, value=float(len(errors)),
            summary=f"{len(errors)} rule file(s) or path(s) rejected; the previous rules stay "
                    f"active: {text[:300]}", ended="all rule files load")

    def _enqueue(self, samples: list[Sample]) -> None:
        limit = self.settings.store.buffer_samples
        self._buffer.extend(samples)
        overflow = len(self._buffer) - limit
        if overflow > 0:
            for _ in range(overflow):
                self._buffer.popleft()
            self.metrics.samples_dropped.inc(overflow)
            log.error("store unavailable and buffer full: dropped the %d oldest samples",
                      overflow)

    def _flush(self) -> None:
        """Write everything buffered; on failure keep it (bounded) for the next tick."""
        if not self._buffer:
            return
        batch = list(self._buffer)
        try:
            self.store.write(batch)
        except Exception as exc:  # a store's bug, too, must not end the tick before detection
            self._store_error = str(exc) if isinstance(exc, StoreError) else (
                f"{exc.__class__.__name__}: {exc}")
            self.metrics.store_errors.labels(self.store.name, "write").inc()
            log.warning("store write failed, keeping %d samples for retry: %s", len(batch),
                        self._store_error)
        else:
            self._buffer.clear()
            self._store_error = ""
            self.metrics.samples_written.labels(self.store.name).inc(len(batch))
        self.metrics.samples_buffered.set(len(self._buffer))

    # -- health --------------------------------------------------------------------------

    def alive(self) -> bool:
        """The loop has ticked recently (liveness: restart the agent when this is false)."""
        return not self.liveness_problem()

    def _limit_s(self) -> float:
        return max(5 * self.settings.interval, 10.0)

    def liveness_problem(self) -> str:
        """Why the loop is not keeping its beat ("" while it is): /healthz says it."""
        limit = self._limit_s()
        if self._thread is None:
            return "the loop has not started"
        age = time.monotonic() - self.last_tick_mono
        if age < limit:
            return ""
        why = f"no tick completed for {age:.3g}s (limit {limit:g}s)" if self.ticks else (
            "no tick has completed yet")
        if self.tick_failures:
            why += f"; the last {self.tick_failures} ticks failed: {self.tick_error}"
        elif not self._thread.is_alive():
            why += "; the loop thread is down, its restart is pending"
        return why

    def tick_problem(self) -> str:
        """Ticks that failed lately, even between ones that did not: /readyz says it."""
        now, limit = time.monotonic(), self._limit_s()
        recent = sum(1 for at in self._failed_at if now - at < limit)
        if not recent:
            return ""
        return f"{recent} ticks failed in the last {limit:g}s; the last: {self.tick_error}"

    def components(self) -> list[ComponentStatus]:
        out = [self._loop_status()]
        for collector in self.collectors:
            status = collector.status()
            error = self._collector_errors.get(collector.name)
            if error:
                status.ok, status.reason = False, error
            self._thread_fields(status)
            out.append(status)
        for name, error in self._build_errors.items():
            out.append(ComponentStatus(name, ok=False, reason=error[:2000]))
        if self.collector_plugins.errors:
            out.append(ComponentStatus(
                "collector-plugins", ok=False,
                reason="; ".join(self.collector_plugins.errors.values())[:2000],
                details={"available": self.collector_plugins.names()}))
        store = self.store.status()
        if self._store_error:
            store.ok, store.reason = False, self._store_error
        store.details["buffered_samples"] = len(self._buffer)
        self._thread_fields(store)
        out.append(store)
        out.append(self.attributor.status())
        unsaved = self.engine.unsaved
        out.append(ComponentStatus(
            "incidents", ok=not unsaved,
            reason=(f"{unsaved} incident changes wait to be saved: "
                    f"{self.engine.save_error}")[:2000] if unsaved else "",
            details={"unsaved": unsaved, "path": str(self.incidents.path)}))
        rule_errors = self.rules.errors
        loaded = len(self.rules.rules)
        reason = "; ".join(rule_errors.values())[:2000] or (
            "" if loaded else f"no rules loaded from {', '.join(self.rules.paths) or '(none)'}")
        out.append(ComponentStatus(
            "rules", ok=not rule_errors and loaded > 0, reason=reason,
            details={"loaded": loaded, "paths": list(self.rules.paths),
                     "unsaved_incidents": self.engine.unsaved},
        ))
        out.append(ComponentStatus(
            "detectors", ok=not self.detectors.errors,
            reason="; ".join(self.detectors.errors.values())[:2000],
            details={"available": sorted(self.detectors.types),
                     "providers": dict(self.detectors.providers),
                     "stuck_workers": self.engine.stuck_workers},
        ))
        if self.settings.kubernetes.enabled:
            if self.pods is not None:
                out.append(self._thread_fields(self.pods.status()))
            else:
                out.append(ComponentStatus("kubernetes", ok=False, reason=self._kube_error))
        problems = {**self.policies.errors, **self.ladder.errors}
        rungs = self.ledger.rungs()
        dry_run = self.settings.actuators.dry_run
        out.append(ComponentStatus(
            "actuators", ok=not problems,
            reason="; ".join(problems.values())[:2000] or (
                "dry-run: actions are recorded, not taken" if dry_run else ""),
            details={"dry_run": dry_run, "policies": self.policies.names,
                     "paths": list(self.policies.paths),
                     "in_force": [f"{r.policy}#{r.rung + 1} {r.kind} ({r.status})"
                                  for r in rungs if not is_standing(r.policy)],
                     "standing": [f"{r.policy[len(STANDING):]}: {r.kind} ({r.status})"
                                  for r in rungs if is_standing(r.policy)]},
        ))
        if self.alerting.enabled:
            out.append(self._thread_fields(self.alerting.status()))
        if self.forwarder is not None:
            out.append(self._thread_fields(self.forwarder.status()))
        out.append(self.supervisor.status())
        return out

    def _loop_status(self) -> ComponentStatus:
        problem = self.liveness_problem() or self.tick_problem()
        age = time.monotonic() - self.last_tick_mono if self.ticks else None
        return self._thread_fields(ComponentStatus(
            "loop", ok=not problem, reason=problem,
            details={"ticks": self.ticks, "interval_s": self.settings.interval,
                     "last_tick_age_s": None if age is None else round(age, 3),
                     "consecutive_failures": self.tick_failures,
                     "arrival_evaluations": self.arrival_evaluations,
                     "arrival_reads": self.arrival_reads}))

    def _thread_fields(self, status: ComponentStatus) -> ComponentStatus:
        """The supervisor's view of the threads behind a component: down means not ok."""
        threads = {w.name: w for w in self.supervisor.watched.values()
                   if w.component == status.name}
        if not threads:
            return status
        status.details["threads"] = {name: w.as_dict() for name, w in threads.items()}
        down = [w for w in threads.values() if w.down_since is not None]
        if down:
            status.ok = False
            why = "; ".join(f"thread {w.name} is down ({w.restarts} restarts so far): "
                            f"{w.last_reason}" for w in down)
            status.reason = "; ".join(filter(None, [why, status.reason]))[:2000]
        return status

    def ready(self) -> bool:
        """Ready when the loop keeps its beat, the stores take writes and the rules loaded
        cleanly.

        Collectors and Kubernetes report separately: a node without PSI still guards.
        """
        essential = [c.ok for c in self.components()
                     if c.name.startswith("store:") or c.name in ("rules", "loop", "incidents")]
        return self.alive() and all(essential)


def _run_one(work: Any, future: Future) -> None:
    if future.set_running_or_notify_cancel():
        try:
            future.set_result(work())
        except BaseException as exc:  # handed to the caller
            future.set_exception(exc)
