"""The `collectors`, `kubernetes`, `app_latency` and `slos` sections: what the collectors
read, and the objectives the LS services' latency is judged against.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import (
    BeforeValidator,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)

from sloguard.core.config import Duration, Section, Size, host_port, http_url
from sloguard.core.percentiles import parse_percentile


class NodeCollectorConfig(Section):
    enabled: bool = True
    proc_root: str = "/proc"


class CgroupDeclaration(Section):
    """Declares cgroups outside Kubernetes (or overrides a pod's class) by path glob."""

    path: str = Field(description="glob over cgroup paths relative to the hierarchy root")
    class_: Literal["LS", "BE"] = Field(alias="class")
    name: str | None = Field(None, description="workload name used as the `workload` tag")


class CgroupCollectorConfig(Section):
    enabled: bool = True
    root: str | None = Field(None, description="cgroup mount root; auto-detected when unset")
    include: list[str] = Field(
        default_factory=lambda: ["kubepods", "kubepods.slice"],
        description="subtrees (relative paths) whose cgroups are collected",
    )
    declare: list[CgroupDeclaration] = Field(default_factory=list)
    max_depth: int = Field(6, ge=1)
    rediscover: Duration = Field(10.0, description="how often the hierarchy is walked again")
    memory_stat_every: Duration = Field(
        5.0, ge=0, description="how often each cgroup's memory.stat is read (rss, cache, and the "
        "inactive file cache the working set subtracts); usage is read every tick. 0: every "
        "tick")
    class_label: str = "koordinator.sh/qosClass"
    trusted_namespaces: list[Annotated[str, Field(min_length=1, max_length=63)]] | None = Field(
        None, max_length=1000,
        description="namespaces whose pods' class label may say LS; elsewhere an LS label is "
                    "ignored and the QoS tier decides. Unset: every namespace is trusted")


class EbpfCollectorConfig(Section):
    """Per-cgroup kernel latencies from BCC programs (collectors/ebpf.py, docs/ebpf.md)."""

    enabled: bool = Field(True, description="try to load the programs (needs root and BCC)")
    kernel_source: str | None = Field(
        None, description="BCC_KERNEL_SOURCE; unset: $BCC_KERNEL_SOURCE, else the tree "
        "scripts/bcc-setup.sh builds in /var/cache/sloguard/bcc-kernel when present")
    runqueue: bool = True
    block_io: bool = True
    reclaim: bool = True
    syscall: bool = Field(False, description="costs every syscall on the node: off by default")
    key: Literal["auto", "cgroup", "pid"] = Field(
        "auto", description="attribute by cgroup v2 id, or by process (v1 hosts); auto: pid "
        "only when no cgroup v2 hierarchy is mounted")
    fallback: bool = Field(
        True, description="when run-queue latency is unavailable, read run-queue wait from "
        "/proc/PID/schedstat instead (measurement container_runqueue)")


class CpiCollectorConfig(Section):
    enabled: bool = Field(True, description="cycles per instruction via perf_event_open")


class CollectorsConfig(Section):
    """The built-ins' sections, and one per collector plugin that has settings (validated
    against the plugin's `Config` model, so its typos are errors with file and line too)."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    node: NodeCollectorConfig = Field(default_factory=NodeCollectorConfig)
    cgroups: CgroupCollectorConfig = Field(default_factory=CgroupCollectorConfig)
    ebpf: EbpfCollectorConfig = Field(default_factory=EbpfCollectorConfig)
    cpi: CpiCollectorConfig = Field(default_factory=CpiCollectorConfig)

    @model_validator(mode="after")
    def _plugin_sections(self) -> CollectorsConfig:
        extra = self.model_extra or {}
        if not extra:
            return self
        from sloguard.collectors.registry import CollectorPlugins

        plugins = CollectorPlugins()
        for name, value in extra.items():
            kind = plugins.types.get(name)
            if kind is None:
                raise ValueError(f"collectors.{name}: unknown setting: no collector of that "
                                 f"name (collectors: {', '.join(plugins.names())})")
            model = getattr(kind, "Config", None)
            if model is None:
                raise ValueError(f"collectors.{name}: the {name} collector takes no settings "
                                 "here")
            try:
                extra[name] = model.model_validate(value if value is not None else {})
            except ValidationError as exc:
                first = exc.errors()[0]
                where = ".".join(str(part) for part in first["loc"])
                raise ValueError(f"collectors.{name}{'.' + where if where else ''}: "
                                 f"{first['msg'].removeprefix('Value error, ')}") from None
        return self


class KubernetesConfig(Section):
    enabled: bool = False
    kubeconfig: str | None = Field(None, description="unset: in-cluster service account")
    refresh: Duration = 30.0
    timeout: Duration = Field(5.0, gt=0, description="one API request of a step (cordon, "
                                                     "capacity, evict): slower fails the step, "
                                                     "retried with backoff")


class ErrorCounting(Section):
    """Which requests count as errors: a counter (or the histogram) with a status label."""

    metric: str | None = Field(
        None, description="counter family; unset: the first counter with `label`, else the "
                          "latency histogram's own label")
    label: str = Field("code", description="label holding the status code")
    match: str = Field("5..", description="anchored regex on the label value meaning an error")

    @field_validator("match")
    @classmethod
    def _regex(cls, value: str) -> str:
        try:
            re.compile(value)
        except re.error as exc:
            raise ValueError(f"not a regular expression: {exc}") from None
        return value


class AppScrapeTarget(Section):
    """A Prometheus/OpenMetrics endpoint of an LS service, named in the config."""

    service: str = Field(min_length=1)
    url: Annotated[str, BeforeValidator(http_url)]
    namespace: str | None = None
    pod: str | None = None
    class_: Literal["LS", "BE"] = Field("LS", alias="class")
    interval: Duration | None = Field(None, gt=0, description="unset: scrape_interval")
    timeout: Duration | None = Field(None, gt=0, description="unset: app_latency.timeout")
    metric: str | None = Field(
        None, description="histogram or summary family; unset: the first latency histogram")
    labels: dict[str, str] = Field(
        default_factory=dict, description="only series with these label values count")
    unit: Literal["auto", "s", "ms"] = Field(
        "auto", description="unit of the metric; auto: from its name (_seconds, _ms, ...)")
    errors: ErrorCounting | None = Field(None, description="unset: app_latency.errors")
    tls_verify: bool = True
    ca_file: str | None = Field(None, description="CA bundle that verifies the target")


class AppProbe(Section):
    """An active probe, as the Prometheus blackbox exporter does it."""

    service: str = Field(min_length=1)
    kind: Literal["http", "tcp"]
    url: Annotated[str, BeforeValidator(http_url)] | None = Field(
        None, description="http: the URL to request")
    address: Annotated[str, BeforeValidator(host_port)] | None = Field(
        None, description="tcp: HOST:PORT to connect to")
    namespace: str | None = None
    interval: Duration | None = Field(None, gt=0, description="unset: probe_interval")
    timeout: Duration | None = Field(None, gt=0, description="unset: app_latency.timeout")
    method: str = "GET"
    expect_status: list[int] = Field(
        default_factory=list, description="status codes that succeed; empty: 200-399")
    tls_verify: bool = True
    ca_file: str | None = Field(None, description="CA bundle that verifies the server")

    @model_validator(mode="after")
    def _where(self) -> AppProbe:
        if self.kind == "http" and not self.url:
            raise ValueError("an http probe needs `url`")
        if self.kind == "tcp" and not self.address:
            raise ValueError("a tcp probe needs `address` (HOST:PORT)")
        return self


class PodDiscovery(Section):
    enabled: bool = Field(
        True, description="scrape pods annotated sloguard.io/scrape (needs kubernetes.enabled)")
    interval: Duration | None = Field(None, gt=0, description="unset: scrape_interval")
    tls_verify: bool = Field(True, description="for pods annotated sloguard.io/scheme: https")
    ca_file: str | None = None


class ReceiveConfig(Section):
    enabled: bool = Field(False, description="POST /api/v1/observations and /api/v1/write")
    token: SecretStr | None = Field(None, description="bearer token pushers must present")
    token_file: str | None = Field(
        None, description="file holding the token (a mounted Secret); re-read when it changes")
    max_body: Size = Field(1024**2, ge=1024, description="largest request body accepted")
    measurements: list[str] = Field(
        default_factory=lambda: ["app_latency"],
        description="measurements /api/v1/write accepts")
    # Pushed data is outside input: a point stamped far ahead would otherwise end every rule's
    # window, and unbounded tags would grow the store and the rule windows without end.
    max_past: Duration = Field(
        300.0, gt=0, description="oldest timestamp accepted, before the agent's clock (400)")
    max_future: Duration = Field(
        30.0, ge=0, description="newest timestamp accepted, after the agent's clock (400)")
    max_series: int = Field(
        10_000, ge=1, description="distinct series pushed per hour; new ones beyond get 400")
    max_tags: int = Field(16, ge=1, le=256, description="tags per pushed point (400 beyond)")
    max_label_length: int = Field(
        256, ge=16, le=65536, description="characters of a pushed tag key or value (400)")
    max_fields: int = Field(64, ge=1, le=1000, description="fields per pushed point (400)")

    @model_validator(mode="after")
    def _token(self) -> ReceiveConfig:
        if self.enabled and self.token is None and not self.token_file:
            raise ValueError("enabled without a token: set token (or SLOGUARD_APP_LATENCY__"
                             "RECEIVE__TOKEN) or token_file")
        return self


class AppLatencyConfig(Section):
    enabled: bool = True
    scrape_interval: Duration = Field(10.0, gt=0, description="default scrape interval")
    probe_interval: Duration = Field(5.0, gt=0, description="default probe interval")
    timeout: Duration = Field(3.0, gt=0, description="default per-target timeout")
    concurrency: int = Field(16, ge=1, le=1000, description="scrapes and probes at once")
    jitter: float = Field(
        0.05, ge=0, le=0.5, description="random delay per round, fraction of the interval")
    max_response: Size = Field(
        10 * 1024**2, ge=1024, description="largest exposition body read from a target")
    max_series: int = Field(
        10_000, ge=1, description="series on one scraped page; a page with more is an error")
    max_labels: int = Field(
        32, ge=1, le=1000, description="labels of one scraped series; more is an error")
    max_label_length: int = Field(
        1024, ge=16, le=65536, description="characters of a scraped label name or value")
    errors: ErrorCounting = Field(default_factory=ErrorCounting)
    targets: list[AppScrapeTarget] = Field(default_factory=list)
    probes: list[AppProbe] = Field(default_factory=list)
    pods: PodDiscovery = Field(default_factory=PodDiscovery)
    receive: ReceiveConfig = Field(default_factory=ReceiveConfig)
    allow_addresses: list[str] = Field(
        default_factory=list, max_length=100,
        description="addresses or networks (CIDR) scrapes and probes may reach although "
                    "link-local or a cloud metadata service (refused otherwise)")

    @field_validator("allow_addresses")
    @classmethod
    def _networks(cls, value: list[str]) -> list[str]:
        from sloguard.collectors.http_client import networks

        networks(value)
        return value


class SloConfig(Section):
    """One service's objectives; the collector turns them into the `app_slo` signals."""

    service: str = Field(min_length=1)
    namespace: str | None = Field(None, description="unset: the service in any namespace")
    percentile: str = Field("p99", description="p50, p90, p95, p99, p999 or p99.9")
    latency_ms: float = Field(gt=0, description="the percentile must stay at or under this")
    error_rate: float | None = Field(
        None, gt=0, lt=1, description="allowed fraction of failed requests, e.g. 0.001")
    window: Duration = Field(
        60.0, gt=0, description="requests of this recent window make the percentile and ratio")

    @field_validator("percentile")
    @classmethod
    def _percentile(cls, value: str) -> str:
        parse_percentile(value)
        return value.strip().lower()

    @property
    def quantile(self) -> float:
        return parse_percentile(self.percentile)


def unique_slos(slos: list[SloConfig]) -> list[SloConfig]:
    seen: dict[tuple[str, str | None], int] = {}
    for index, slo in enumerate(slos):
        key = (slo.service, slo.namespace)
        if key in seen:
            raise ValueError(f"slos.{seen[key]} and slos.{index} are both for service "
                             f"{slo.service!r} (namespace {slo.namespace or 'any'}); give each "
                             "service one SLO")
        seen[key] = index
    return slos

