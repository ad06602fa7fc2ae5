"""Every metric sloguard exposes about itself (/metrics, for the Prometheus that watches the
watcher): the agent's loop, the stores, alerting, forwarding, the application-latency targets
and the cluster server. The one place their names, help texts and labels are defined, so that
a dashboard author reads one file; the parts hold the objects these return and count on them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector


class AgentMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.collection_duration = Histogram(
            "sloguard_collection_duration_seconds", "Time one collector took for one tick",
            ["collector"], registry=registry,
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
        )
        self.collector_errors = Counter(
            "sloguard_collector_errors_total", "Ticks on which a collector raised",
            ["collector"], registry=registry,
        )
        self.samples_collected = Counter(
            "sloguard_samples_collected_total", "Samples produced by collectors",
            ["collector"], registry=registry,
        )
        self.samples_written = Counter(
            "sloguard_samples_written_total", "Samples persisted by the store", ["store"],
            registry=registry,
        )
        self.samples_buffered = Gauge(
            "sloguard_samples_buffered", "Samples held in memory while the store is failing",
            registry=registry,
        )
        self.samples_dropped = Counter(
            "sloguard_samples_dropped_total",
            "Samples dropped because the in-memory buffer was full while the store failed",
            registry=registry,
        )
        self.store_errors = Counter(
            "sloguard_store_errors_total", "Store operations that failed", ["store", "operation"],
            registry=registry,
        )
        self.rule_evaluations = Counter(
            "sloguard_rule_evaluations_total", "Rule evaluations by result", ["rule", "result"],
            registry=registry,
        )
        self.tick_duration = Histogram(
            "sloguard_tick_duration_seconds", "Time of one collect-store-evaluate tick",
            registry=registry,
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5),
        )
        self.tick_overruns = Counter(
            "sloguard_tick_overruns_total", "Ticks that took longer than the interval",
            registry=registry,
        )
        # a failed lever is otherwise seen only in the audit and the incident's actions: the
        # node stays unprotected while the ladder retries, and nobody looks there unasked
        self.actions = Counter(
            "sloguard_actions_total", "Ladder steps recorded in the audit, by step kind, "
            "action (apply, undo) and status (done, failed, skipped, proposed, ...)",
            ["kind", "action", "status"], registry=registry,
        )

    def expect_failures(self, store: str, step_kinds: Iterable[str]) -> None:
        """The failure series at 0 from the start: `increase()` sees no rise in a series whose
        first sample is already 1, so an alert on it would miss the first failure (and a store
        or a lever that fails once and then for good)."""
        self.store_errors.labels(store, "write")
        for kind in step_kinds:
            for action in ("apply", "undo"):
                self.actions.labels(kind, action, "failed")

    def influx(self) -> InfluxMetrics:
        """The InfluxDB writer's metrics, registered only when that store is used."""
        return InfluxMetrics(self.registry)

    def gauge_callback(
        self, name: str, doc: str, label: str, read: Callable[[], dict[str, float]]
    ) -> None:
        """A gauge family computed at scrape time (e.g. incidents by state from the database)."""
        self.registry.register(_CallbackCollector(name, doc, label, read))


    def counter_callback(
        self, name: str, doc: str, label: str, read: Callable[[], dict[str, float]]
    ) -> None:
        """A counter family read at scrape time from a count its owner keeps."""
        self.registry.register(_CallbackCounter(name, doc, label, read))


def alerting_metrics(registry: CollectorRegistry,
                     pending: Callable[[], dict[str, float]]) -> Counter:
    """The alert pipeline's: Slack requests by result (the counter returned), and the outbox's
    messages waiting, by receiver (read at scrape time)."""
    registry.register(_CallbackCollector(
        "sloguard_alert_outbox_pending", "Messages waiting in the outbox", "receiver", pending))
    return Counter(
        "sloguard_alert_messages", "Slack requests by receiver, kind and result "
        "(sent, retry, rate_limited, receiver_error, found_earlier_attempt, "
        "possibly_repeated, superseded, failed)",
        ["receiver", "kind", "result"], registry=registry)


def forward_metrics(registry: CollectorRegistry) -> Counter:
    """What the cluster server accepted from this agent's forwarder."""
    return Counter("sloguard_forward_sent_total",
                   "Incidents (changes), withdrawals and audit entries the cluster server "
                   "accepted", ["kind"], registry=registry)


def forward_skipped_metric(registry: CollectorRegistry) -> Counter:
    """Items the cluster server refused even alone as too large (413), passed over so that
    they block nothing behind them: each one is also logged with its id."""
    return Counter("sloguard_forward_skipped_total",
                   "Items the cluster server refused alone as too large, passed over",
                   ["kind"], registry=registry)


class ClusterMetrics:
    """The cluster server's: what agents sent it, and what it refused."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.received = Counter("sloguard_ingested_total",
                                "Incidents (changes) and audit entries taken from agents",
                                ["kind", "outcome"], registry=registry)
        self.refused = Counter("sloguard_ingest_refused_total", "Ingest requests refused",
                               ["reason"], registry=registry)


class TargetMetrics(Collector):
    """The application-latency targets' health and the receiver's counts, computed when
    Prometheus scrapes the agent from what the collector keeps (collectors/app_latency.py):
    `targets()` gives each target's status, `received` its counts of pushed data."""

    def __init__(self, targets: Callable[[], list[Any]], received: Any) -> None:
        self.targets, self.received = targets, received

    def collect(self) -> Iterable[Any]:
        labels = ["target", "kind", "service"]
        up = GaugeMetricFamily("sloguard_target_up", "1 if the last scrape or probe succeeded",
                               labels=labels)
        duration = GaugeMetricFamily("sloguard_target_scrape_duration_seconds",
                                     "How long the last scrape or probe took", labels=labels)
        attempts = CounterMetricFamily("sloguard_target_attempts",
                                       "Scrapes and probes made", labels=labels)
        failures = CounterMetricFamily("sloguard_target_failures",
                                       "Scrapes and probes that failed", labels=labels)
        for status in self.targets():
            values = [status.target.url, status.target.kind, status.target.service]
            if status.up is not None:
                up.add_metric(values, 1.0 if status.up else 0.0)
            if status.last_duration_s is not None:
                duration.add_metric(values, status.last_duration_s)
            attempts.add_metric(values, status.attempts)
            failures.add_metric(values, status.failures)
        received = CounterMetricFamily("sloguard_received",
                                       "Observations and line-protocol points received",
                                       labels=["kind"])
        received.add_metric(["observations"], self.received.observations)
        received.add_metric(["points"], self.received.points)
        rejected = CounterMetricFamily("sloguard_receive_rejected",
                                       "Receive requests refused", labels=["endpoint", "reason"])
        for key, count in sorted(self.received.rejected.items()):
            endpoint, _, reason = key.partition(" ")
            rejected.add_metric([endpoint, reason], count)
        yield from (up, duration, attempts, failures, received, rejected)


class GuardCostMetrics(Collector):
    """What guarding costs each BE workload (actuators/guard_cost.py), computed when
    Prometheus scrapes: `costs()` gives each workload's account (at most a bounded number, so
    the label set is bounded whatever pod names a node sees)."""

    def __init__(self, costs: Callable[[], list[dict[str, Any]]],
                 dropped: Callable[[], int]) -> None:
        self.costs, self.dropped = costs, dropped

    def collect(self) -> Iterable[Any]:
        lever = CounterMetricFamily("sloguard_be_lever_seconds",
                                    "Seconds a BE workload spent under each lever kind",
                                    labels=["workload", "lever"])
        held = CounterMetricFamily("sloguard_be_held_seconds",
                                   "Seconds a BE workload spent under any lever",
                                   labels=["workload"])
        got = CounterMetricFamily("sloguard_be_cpu_got_seconds",
                                  "CPU seconds a BE workload got, while held or free",
                                  labels=["workload", "held"])
        wanted = CounterMetricFamily("sloguard_be_cpu_wanted_seconds",
                                     "CPU seconds a BE workload wanted (got + run-queue wait; "
                                     "only where the eBPF run-queue program runs)",
                                     labels=["workload", "held"])
        evicted = CounterMetricFamily("sloguard_be_evictions",
                                      "Times a BE workload was evicted by the agent",
                                      labels=["workload"])
        named = CounterMetricFamily("sloguard_be_named_first_suspect",
                                    "Incidents that ended with the workload ranked first suspect",
                                    labels=["workload"])
        for cost in self.costs():
            name = cost["workload"]
            for kind, seconds in cost["lever_seconds"].items():
                lever.add_metric([name, kind], seconds)
            held.add_metric([name], cost["held_seconds"])
            for state, key in (("true", "cpu_held"), ("false", "cpu_free")):
                got.add_metric([name, state], cost[key]["got"])
                if cost[key]["wanted"] is not None:
                    wanted.add_metric([name, state], cost[key]["wanted"])
            evicted.add_metric([name], cost["evictions"])
            named.add_metric([name], cost["named_first"])
        dropped = CounterMetricFamily("sloguard_be_cost_accounts_dropped",
                                      "BE workload accounts dropped, least recently seen "
                                      "first, to keep the number of accounts bounded")
        dropped.add_metric([], self.dropped())
        yield from (lever, held, got, wanted, evicted, named, dropped)


class EbpfMetrics(Collector):
    """Whether each enabled eBPF program family is feeding the agent, read when Prometheus
    scrapes: a family that failed to load or whose map cannot be read leaves the rules on the
    procfs fallback (or on nothing), which /readyz says but no alert would otherwise see.
    `attached()` gives {family: attached?} for the families the config wants, {} when eBPF is
    off or not started yet."""

    def __init__(self, attached: Callable[[], dict[str, bool]]) -> None:
        self.attached = attached

    def collect(self) -> Iterable[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            "sloguard_ebpf_attached", "1 while an enabled eBPF program family is attached and "
            "its map is read; 0 when it failed to load, is unavailable, or its map reads fail",
            labels=["family"])
        for name, attached in sorted(self.attached().items()):
            family.add_metric([name], 1.0 if attached else 0.0)
        yield family


class InfluxMetrics:
    """What the InfluxDB writer did: sent, refused, retried, spooled, dropped."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.points_sent = Counter(
            "sloguard_influx_points_sent_total", "Points InfluxDB acknowledged", ["path"],
            registry=registry,
        )
        self.batches_sent = Counter(
            "sloguard_influx_batches_sent_total", "Write requests InfluxDB acknowledged",
            ["path"], registry=registry,
        )
        self.points_rejected = Counter(
            "sloguard_influx_points_rejected_total",
            "Points not written because line protocol cannot carry them (newline, trailing "
            "backslash, ...), the series bound was reached, or the server refused them (4xx)",
            ["reason"], registry=registry,
        )
        self.write_failures = Counter(
            "sloguard_influx_write_failures_total",
            "Write requests that failed and will be retried (unreachable, 5xx, 429, 401/403/404)",
            registry=registry,
        )
        self.spool_dropped_batches = Counter(
            "sloguard_influx_spool_dropped_batches_total",
            "Batches dropped because the spool was full (store.spool_full says which)",
            registry=registry,
        )
        self.spool_dropped_points = Counter(
            "sloguard_influx_spool_dropped_points_total",
            "Points in batches dropped because the spool was full", registry=registry,
        )
        self.write_seconds = Histogram(
            "sloguard_influx_write_seconds", "Time of one write request", registry=registry,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
        )

    def spool_callback(self, read: Callable[[], dict[str, float]]) -> None:
        """Spool bytes, batches, points and bound, read at scrape time."""
        self.registry.register(_FlatGaugeCollector("sloguard_influx_spool", read))


class _FlatGaugeCollector(Collector):
    """One gauge per key: `{prefix}_{key}`."""

    def __init__(self, prefix: str, read: Callable[[], dict[str, float]]) -> None:
        self.prefix, self.read = prefix, read

    def collect(self) -> Iterable[GaugeMetricFamily]:
        for key, value in self.read().items():
            family = GaugeMetricFamily(f"{self.prefix}_{key}", f"InfluxDB spool: {key}")
            family.add_metric([], value)
            yield family


class _CallbackCollector(Collector):
    def __init__(
        self, name: str, doc: str, label: str, read: Callable[[], dict[str, float]]
    ) -> None:
        self.name, self.doc, self.label, self.read = name, doc, label, read

    def collect(self) -> Iterable[GaugeMetricFamily]:
        family = GaugeMetricFamily(self.name, self.doc, labels=[self.label] if self.label else [])
        for key, value in self.read().items():
            family.add_metric([key] if self.label else [], value)
        yield family


class _CallbackCounter(Collector):
    def __init__(
        self, name: str, doc: str, label: str, read: Callable[[], dict[str, float]]
    ) -> None:
        self.name, self.doc, self.label, self.read = name, doc, label, read

    def collect(self) -> Iterable[CounterMetricFamily]:
        family = CounterMetricFamily(self.name, self.doc, labels=[self.label])
        for key, value in sorted(self.read().items()):
            family.add_metric([key], value)
        yield family
