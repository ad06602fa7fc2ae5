"""The application-latency collector: the LS services' own latency, scraped, probed and received.

Interference matters only as far as LS services feel it; their tail latency is what every
escalation should be anchored to. This collector gathers it three ways (Prometheus/OpenMetrics
scrapes, blackbox-style probes, pushes to the agent's receive endpoint) and hands it to the
agent's loop as samples: `app_latency` per target and interval, `probe` per probe, and `app_slo`
per service with an objective (see docs/app-latency.md).

Targets are scraped and probed on a thread of their own running an asyncio loop: each target has
its own schedule (spread over the interval, jittered), its own timeout, and a shared bound on
concurrency, so a target that hangs costs only its own slot. The agent's loop never waits for
the network: `collect` only hands over what has arrived since the last tick. A target that is
down, slow or malformed is reported (per target, in /readyz, /metrics and the UI) and tried
again at its next round.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import random
import ssl
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from sloguard.collectors.app_probe import ProbeResult, describe, probe_http, probe_tcp
from sloguard.collectors.app_scrape import ScrapeError, scrape
from sloguard.collectors.app_targets import Target, targets_from_config, targets_from_pods
from sloguard.collectors.base import CollectorBase, CollectorContext
from sloguard.collectors.exposition import ExpositionError, Reading, interval
from sloguard.collectors.hookspecs import hookimpl
from sloguard.collectors.http_client import networks
from sloguard.collectors.latency import LatencyBatch
from sloguard.collectors.slo_window import SloTracker
from sloguard.core.health import ComponentStatus
from sloguard.core.samples import Sample
from sloguard.core.selfmetrics import TargetMetrics

log = logging.getLogger(__name__)

RESOLVE_S = 1.0  # how often the target list is rebuilt (pods come and go)
MAX_PENDING = 200_000  # samples waiting for the agent's loop; beyond, the oldest are dropped


class Overloaded(Exception):
    """The agent's loop is not taking samples as fast as they arrive: push later."""


@dataclass
class TargetStatus:
    target: Target
    up: bool | None = None  # None: not tried yet
    last_error: str = ""
    last_duration_s: float | None = None
    last_ns: int = 0
    last_success_ns: int = 0
    attempts: int = 0
    failures: int = 0
    resets: int = 0
    note: str = ""  # e.g. which family and error counter a scrape reads

    def as_dict(self) -> dict[str, Any]:
        t = self.target
        return {
            "target": t.url, "kind": t.kind, "service": t.service, "namespace": t.namespace,
            "pod": t.pod, "source": t.source, "interval_s": t.interval, "timeout_s": t.timeout,
            "up": self.up, "last_error": self.last_error,
            "last_duration_s": self.last_duration_s, "last_ns": self.last_ns,
            "last_success_ns": self.last_success_ns, "attempts": self.attempts,
            "failures": self.failures, "resets": self.resets, "reads": self.note,
        }


@dataclass
class _Received:
    observations: int = 0
    points: int = 0
    rejected: dict[str, int] = field(default_factory=dict)


def app_latency_wanted(settings: Any) -> bool:
    """Whether the application-latency collector has anything to do (it costs a thread and the
    HTTP client's memory otherwise)."""
    app = settings.app_latency
    return app.enabled and bool(
        app.targets or app.probes or app.receive.enabled or settings.slos
        or (settings.kubernetes.enabled and app.pods.enabled))


class AppLatencyCollector(CollectorBase):
    name = "app_latency"

    @classmethod
    def create(cls, ctx: CollectorContext) -> AppLatencyCollector | None:
        """Its config is the top-level `app_latency` and `slos` sections (issue #6)."""
        settings = ctx.settings
        if not app_latency_wanted(settings):
            return None
        cgroups = settings.collectors.cgroups
        return cls(ctx.node, settings.app_latency, settings.slos, pods=ctx.pods,
                   class_label=cgroups.class_label, registry=ctx.metrics,
                   trusted_namespaces=cgroups.trusted_namespaces)

    def __init__(self, node: str, cfg: Any, slos: list[Any], pods: Any = None,
                 class_label: str = "koordinator.sh/qosClass", registry: Any = None,
                 trusted_namespaces: list[str] | None = None) -> None:
        self.node = node
        self.cfg = cfg
        self.slo = SloTracker(slos)
        self.pods = pods if cfg.pods.enabled else None
        self.class_label = class_label
        self.trusted_namespaces = trusted_namespaces
        self.static = targets_from_config(cfg)
        self.allowed = networks(getattr(cfg, "allow_addresses", ()) or ())
        self._lock = threading.Lock()
        self._pending: deque[Sample] = deque()
        self._status: dict[str, TargetStatus] = {}
        self._discovery: list[str] = []
        self._readings: dict[str, tuple[Reading, float]] = {}  # the asyncio thread's own
        self.received = _Received()
        self.dropped = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        # called (from the API's or the scraper's thread) when data has arrived: the agent
        # evaluates the `on_arrival` rules then, not only at its next tick
        self.on_arrival: Callable[[], None] = lambda: None
        for target in self.static:  # listed (not tried yet) from the start
            self._status[target.key] = TargetStatus(target)
        if registry is not None:
            registry.register(TargetMetrics(self.target_status, self.received))

    # -- lifecycle -----------------------------------------------------------------------

    def start(self) -> None:
        """Start the scraper thread, unless it runs: two of them once shared one wake-up
        event, and the second `asyncio.run` left the first waiting on an event bound to a
        foreign loop (it died a second later, while /readyz still said ok)."""
        if self._thread is not None and self._thread.is_alive():
            return
        self._thread = threading.Thread(target=self._run_loop, name="app-latency", daemon=True)
        self._thread.start()

    @property
    def thread(self) -> threading.Thread | None:
        return self._thread

    def close(self) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        loop, wake = self._loop, self._wake
        if loop is not None and wake is not None:
            with contextlib.suppress(RuntimeError):  # the loop already ended
                loop.call_soon_threadsafe(wake.set)
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _run_loop(self) -> None:
        try:
            asyncio.run(self._main())
        except Exception:  # never expected: the status says so, the agent's supervisor
            with self._lock:  # reports the exception and starts the thread again
                self._discovery = ["the scraper thread stopped; see the agent's log"]
            raise

    # -- the agent's side ----------------------------------------------------------------

    def collect(self, now_ns: int) -> list[Sample]:
        """What arrived since the last tick, and the SLO signals it moved. Never waits."""
        with self._lock:
            out = list(self._pending)
            self._pending.clear()
        out.extend(self.slo.samples(self.node, now_ns))
        return out

    def receive(self, samples: list[Sample],
                batches: Iterable[tuple[str, str, LatencyBatch, int]],
                observations: int = 0, points: int = 0) -> None:
        """Pushed data into the same pipeline as scraped data (raises Overloaded when full)."""
        with self._lock:
            if len(self._pending) + len(samples) > MAX_PENDING:
                raise Overloaded(f"{len(self._pending)} samples wait for the agent's loop")
            self._pending.extend(samples)
            self.received.observations += observations
            self.received.points += points
        for service, namespace, batch, time_ns in batches:
            self.slo.add(service, namespace, batch, time_ns)
        self.on_arrival()

    def reject(self, endpoint: str, reason: str) -> None:
        with self._lock:
            key = f"{endpoint} {reason}"
            self.received.rejected[key] = self.received.rejected.get(key, 0) + 1

    def _push(self, samples: list[Sample]) -> None:
        with self._lock:
            self._pending.extend(samples)
            overflow = len(self._pending) - MAX_PENDING
            for _ in range(max(0, overflow)):
                self._pending.popleft()
            if overflow > 0:
                self.dropped += overflow
        self.on_arrival()

    # -- status --------------------------------------------------------------------------

    def target_status(self) -> list[TargetStatus]:
        with self._lock:
            return sorted(self._status.values(), key=lambda s: s.target.key)

    def status(self) -> ComponentStatus:
        targets = self.target_status()
        with self._lock:
            problems = list(self._discovery)
            received = {"observations": self.received.observations,
                        "points": self.received.points,
                        "rejected": dict(self.received.rejected)}
            dropped = self.dropped
        down = [s for s in targets if s.up is False]
        reasons = [f"{s.target.kind} {s.target.url} ({s.target.service}): {s.last_error}"
                   for s in down]
        if down:
            reasons.insert(0, f"{len(down)} of {len(targets)} targets down")
        reasons.extend(problems)
        return ComponentStatus(
            self.name, ok=not down and not problems, reason="; ".join(reasons)[:2000],
            details={"targets": [s.as_dict() for s in targets], "discovery": problems,
                     "slos": len(self.slo.slos), "received": received,
                     "dropped_samples": dropped},
        )

    # -- the scraper thread --------------------------------------------------------------

    def _targets(self) -> list[Target]:
        targets = list(self.static)
        problems: list[str] = []
        if self.pods is not None:
            found, problems = targets_from_pods(self.pods.pods(), self.cfg, self.class_label,
                                                self.trusted_namespaces)
            targets.extend(found)
        with self._lock:
            self._discovery = problems
        unique: dict[str, Target] = {}
        for target in targets:
            unique.setdefault(target.key, target)  # the config wins over a pod's annotations
        return list(unique.values())

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        wake = self._wake = asyncio.Event()  # this run's own: `stop` sets whichever is current
        semaphore = asyncio.Semaphore(self.cfg.concurrency)
        pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="app-parse")
        tasks: dict[Target, asyncio.Task] = {}
        try:
            while not self._stop.is_set():
                try:
                    wanted = set(self._targets())
                except Exception as exc:  # discovery must not end scraping of the others
                    log.warning("app-latency target discovery failed: %s", exc)
                    wanted = set(tasks)
                for target in [t for t in tasks if t not in wanted]:
                    tasks.pop(target).cancel()
                    self._readings.pop(target.key, None)
                    with self._lock:
                        self._status.pop(target.key, None)
                for target in wanted - tasks.keys():
                    with self._lock:
                        self._status.setdefault(target.key, TargetStatus(target))
                    tasks[target] = asyncio.create_task(
                        self._schedule(target, semaphore, pool), name=target.key)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(wake.wait(), RESOLVE_S)
        finally:
            for task in tasks.values():
                task.cancel()
            await asyncio.gather(*tasks.values(), return_exceptions=True)
            pool.shutdown(wait=False, cancel_futures=True)

    async def _schedule(self, target: Target, semaphore: asyncio.Semaphore,
                        pool: ThreadPoolExecutor) -> None:
        """Rounds at a fixed rate from a random phase (so targets spread over the interval),
        each delayed by up to `jitter` of the interval; a round that could not start in time is
        skipped, not made up."""
        loop = asyncio.get_running_loop()
        period = target.interval
        next_at = loop.time() + random.uniform(0, period)
        while True:
            delay = next_at - loop.time() + random.uniform(0, self.cfg.jitter * period)
            await asyncio.sleep(max(0.0, delay))
            async with semaphore:
                try:
                    if target.kind == "scrape":
                        await self._scrape(target, pool)
                    else:
                        await self._probe(target)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # a bug for one target must not end its schedule
                    log.exception("app-latency %s failed", target.key)
                    self._record(target, f"internal error: {exc}", None)
            next_at += period
            now = loop.time()
            if next_at < now:
                next_at += math.ceil((now - next_at) / period) * period

    def _record(self, target: Target, error: str, seconds: float | None,
                note: str | None = None, resets: int = 0) -> None:
        now_ns = time.time_ns()
        with self._lock:
            status = self._status.get(target.key)
            if status is None:  # removed meanwhile
                return
            was_up = status.up
            status.attempts += 1
            status.up = not error
            status.last_error = error
            status.last_duration_s = seconds
            status.last_ns = now_ns
            status.resets += resets
            if error:
                status.failures += 1
            else:
                status.last_success_ns = now_ns
            if note is not None:
                status.note = note
        if error and was_up is not False:  # transitions only: a target down for an hour is
            log.warning("app-latency target down: %s %s (%s): %s",  # one line, not 360
                        target.kind, target.url, target.service, error)
        elif not error and was_up is False:
            log.info("app-latency target up again: %s %s (%s)", target.kind, target.url,
                     target.service)

    async def _scrape(self, target: Target, pool: ThreadPoolExecutor) -> None:
        started = time.perf_counter()
        error = ""
        try:
            async with asyncio.timeout(target.timeout):
                reading = await scrape(target, self.cfg.max_response, pool, self.allowed)
        except TimeoutError:
            error = f"timed out after {target.timeout:g}s"
        except (ScrapeError, ExpositionError) as exc:
            error = str(exc)
        except (OSError, ssl.SSLError) as exc:
            error = describe(exc)
        seconds = time.perf_counter() - started
        if error:
            self._record(target, error, seconds)
            return
        now_ns, mono = time.time_ns(), time.monotonic()
        previous = self._readings.get(target.key)
        self._readings[target.key] = (reading, mono)
        batch, resets = interval(previous[0] if previous else None, reading,
                                 mono - previous[1] if previous else None)
        source = f"{reading.kind} {reading.metric}"
        if reading.error_source:
            source += f"; errors from {reading.error_source}"
        self._record(target, "", seconds, note=source, resets=resets)
        if batch is None:
            return
        fields = batch.fields()
        from_pod = target.source != "config"  # a pod's annotations: its own namespace only
        slo = self.slo.find(target.service, target.namespace, from_pod)
        if slo is not None:
            fields["slo_latency_ms"] = float(slo.latency_ms)
        # the SLO tracker first: `_push` tells the agent that data arrived (on_arrival)
        self.slo.add(target.service, target.namespace, batch, now_ns, from_pod)
        self._push([Sample("app_latency", target.tags(self.node), fields, now_ns)])

    async def _probe(self, target: Target) -> None:
        if target.kind == "http":
            result = await probe_http(target, allowed=self.allowed)
        else:
            result = await probe_tcp(target, self.allowed)
        self._record(target, result.error, result.seconds)
        with self._lock:
            status = self._status.get(target.key)
            failures = status.failures if status else 0
        self._push([Sample("probe", target.tags(self.node), _probe_fields(result, failures),
                           time.time_ns())])


def _probe_fields(result: ProbeResult, failures: int) -> dict[str, float]:
    fields = {"latency_ms": result.seconds * 1000.0, "success": 1.0 if result.success else 0.0,
              "failures": float(failures)}
    if result.status_code is not None:
        fields["status_code"] = float(result.status_code)
    return fields


@hookimpl
def sloguard_collectors() -> list[type]:
    return [AppLatencyCollector]
