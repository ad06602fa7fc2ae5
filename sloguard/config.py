"""The agent's configuration: one YAML file plus environment overrides.

Precedence (highest first): command-line flags, environment (SLOGUARD_ prefix, `__` between
nested keys, e.g. SLOGUARD_STORE__RETENTION=2h), the YAML file, built-in defaults. Every value
remembers where it came from, so `sloguard config show` can answer "why is it set to that?", and
every error names the file and line (or the environment variable) and the field.
"""

from __future__ import annotations

import os
import re
import socket
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    ValidationInfo,
    WithJsonSchema,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from sloguard.core.units import parse_duration, parse_size
from sloguard.core.yamlfile import YamlFileError, read_yaml

# Settings whose values never appear in output, logs or errors (pydantic's SecretStr prints
# them as '**********'; errors about them leave the given value out).
SECRET_FIELDS = frozenset({"token", "password"})
ENV_PREFIX = "SLOGUARD_"
ENV_NESTED = "__"
PROJECT_ROOT = Path(__file__).resolve().parent.parent

Duration = Annotated[
    float, BeforeValidator(parse_duration), Field(ge=0),
    WithJsonSchema({"anyOf": [
        {"type": "number", "minimum": 0, "description": "seconds"},
        {"type": "string", "pattern": r"^(\d+(\.\d+)?(ms|s|m|h|d|w))+$",
         "examples": ["500ms", "10s", "1m30s", "6h"]},
    ]}),
]
Size = Annotated[
    int, BeforeValidator(parse_size), Field(ge=0),
    WithJsonSchema({"anyOf": [
        {"type": "integer", "minimum": 0, "description": "bytes"},
        {"type": "string", "examples": ["512MiB", "1GiB", "100MB"]},
    ]}),
]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class StoreConfig(_Section):
    kind: Literal["embedded", "influxdb"] = "embedded"
    retention: Duration = Field(6 * 3600, description="drop samples older than this (embedded)")
    max_size: Size = Field(
        1024**3, description="drop the oldest samples above this size (embedded)")
    buffer_samples: int = Field(
        200_000, ge=1000, description="samples kept in memory while the store cannot be written"
    )
    # kind: influxdb. The server's version (/ping) picks the write path unless `api` says.
    url: str | None = Field(
        None, validate_default=True, description="InfluxDB base URL, e.g. http://influx:8086")
    api: Literal["auto", "v1", "v2"] = Field(
        "auto", description="auto: v2 write API on 1.8+, 2.x, 3.x; 1.x /write before 1.8")
    token: SecretStr | None = Field(None, description="v2 API token")
    org: str | None = Field(None, description="v2 API organisation")
    bucket: str | None = Field(None, description="v2 API bucket")
    database: str | None = Field(
        None, validate_default=True,
        description="1.x database; also the database /query reads (default: the bucket)")
    retention_policy: str | None = Field(None, description="1.x retention policy")
    username: str | None = Field(None, description="1.x user")
    password: SecretStr | None = Field(None, description="1.x password")
    batch_size: int = Field(5000, ge=1, le=1_000_000, description="points per write request")
    flush_interval: Duration = Field(1.0, gt=0, description="longest a point waits for a batch")
    timeout: Duration = Field(10.0, gt=0, description="HTTP timeout of one request")
    gzip: bool | Literal["auto"] = Field(
        "auto", description="compress write requests; auto: unless the server is on loopback")
    verify_tls: bool = True
    max_backoff: Duration = Field(30.0, gt=0, description="longest wait between retries")
    spool_max_size: Size = Field(
        256 * 1024**2, ge=1024, description="bound of the on-disk spool (data_dir/influx-spool)")
    spool_full: Literal["drop_oldest", "drop_newest"] = Field(
        "drop_oldest", description="which batches go when the spool is full (counted, logged)")
    max_series: int = Field(
        20_000, ge=1, description="distinct series written per hour; new ones beyond are refused")

    @field_validator("url")
    @classmethod
    def _url(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is None:
            if info.data.get("kind") == "influxdb":
                raise ValueError("required with kind: influxdb (e.g. http://127.0.0.1:8086)")
            return value
        from urllib.parse import urlsplit

        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("must be an http:// or https:// URL")
        if parts.password:
            raise ValueError("put the password in store.password (or the token in store.token),"
                             " not in the URL")
        return value

    @field_validator("database")
    @classmethod
    def _database(cls, value: str | None, info: ValidationInfo) -> str | None:
        if info.data.get("kind") == "influxdb" and not value and not info.data.get("bucket"):
            raise ValueError("set database (InfluxDB 1.x) or bucket (v2 API): where samples go")
        return value


class NodeCollectorConfig(_Section):
    enabled: bool = True
    proc_root: str = "/proc"


class CgroupDeclaration(_Section):
    """Declares cgroups outside Kubernetes (or overrides a pod's class) by path glob."""

    path: str = Field(description="glob over cgroup paths relative to the hierarchy root")
    class_: Literal["LS", "BE"] = Field(alias="class")
    name: str | None = Field(None, description="workload name used as the `workload` tag")


class CgroupCollectorConfig(_Section):
    enabled: bool = True
    root: str | None = Field(None, description="cgroup mount root; auto-detected when unset")
    include: list[str] = Field(
        default_factory=lambda: ["kubepods", "kubepods.slice"],
        description="subtrees (relative paths) whose cgroups are collected",
    )
    declare: list[CgroupDeclaration] = Field(default_factory=list)
    max_depth: int = Field(6, ge=1)
    rediscover: Duration = Field(10.0, description="how often the hierarchy is walked again")
    class_label: str = "koordinator.sh/qosClass"
    trusted_namespaces: list[Annotated[str, Field(min_length=1, max_length=63)]] | None = Field(
        None, max_length=1000,
        description="namespaces whose pods' class label may say LS; elsewhere an LS label is "
                    "ignored and the QoS tier decides. Unset: every namespace is trusted")


class EbpfCollectorConfig(_Section):
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


class CpiCollectorConfig(_Section):
    enabled: bool = Field(True, description="cycles per instruction via perf_event_open")


class IncidentsConfig(_Section):
    retention: Duration = Field(
        30 * 86400, gt=0,
        description="resolved incidents resolved longer ago than this are deleted (open "
                    "ones are kept however old)")


class CollectorsConfig(_Section):
    node: NodeCollectorConfig = Field(default_factory=NodeCollectorConfig)
    cgroups: CgroupCollectorConfig = Field(default_factory=CgroupCollectorConfig)
    ebpf: EbpfCollectorConfig = Field(default_factory=EbpfCollectorConfig)
    cpi: CpiCollectorConfig = Field(default_factory=CpiCollectorConfig)


class KubernetesConfig(_Section):
    enabled: bool = False
    kubeconfig: str | None = Field(None, description="unset: in-cluster service account")
    refresh: Duration = 30.0
    timeout: Duration = Field(5.0, gt=0, description="one API request of a step (cordon, "
                                                     "capacity, evict): slower fails the step, "
                                                     "retried with backoff")


def _default_rule_paths() -> list[str]:
    """The rules shipped with sloguard: the repository's rules/ in a source checkout (editable
    install), the package's default_rules/ in an installed wheel."""
    for shipped in (Path(__file__).resolve().parent / "default_rules", PROJECT_ROOT / "rules"):
        if shipped.is_dir():
            return [str(shipped)]
    return []


class RulesConfig(_Section):
    paths: list[str] = Field(
        default_factory=_default_rule_paths, description="rule files or directories of *.yaml"
    )


class DetectorsConfig(_Section):
    plugins: list[str] = Field(
        default_factory=list, description="extra plugin modules to load (import paths)")
    entry_points: bool = Field(True, description="load plugins of the sloguard.plugins group")
    timeout: Duration = Field(1.0, gt=0, description="longest one rule's detectors may take")


def default_policy_paths() -> list[str]:
    """The escalation policies shipped with sloguard: policies/ beside the default rules."""
    return [str(Path(path) / "policies") for path in _default_rule_paths()]


class ActuatorsConfig(_Section):
    dry_run: bool = Field(True, description="shadow mode: record every step, take none")
    policies: list[str] = Field(
        default_factory=default_policy_paths,
        description="escalation policy files or directories of *.yaml")
    audit_retention: Duration = Field(
        90 * 86400, ge=3600,
        description="audit entries older than this are deleted (at least 1h: the eviction "
                    "budgets look back an hour)")


def _loopback(host: str) -> bool:
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


# -- secrets --------------------------------------------------------------------------------
# A secret setting NAME may be given as NAME (inline; masked by `config show`, never echoed in
# errors), NAME_file (a path, e.g. a mounted Kubernetes Secret, read when it is needed, so a
# rotated secret is picked up) or NAME_env (the environment variable holding it). Only one.
SECRET_NAMES = frozenset({"webhook_url", "bot_token", "token", "ingest_token"})


class SecretUnavailable(Exception):
    """The secret's file cannot be read or its variable is unset (the message has no secret)."""


def secret_sources(section: Any, name: str) -> list[str]:
    """The ways `name` is given on `section` (a model or its raw dict)."""
    get = section.get if isinstance(section, dict) else lambda key: getattr(section, key, None)
    return [key for key in (name, f"{name}_file", f"{name}_env") if get(key)]


def read_secret(section: Any, name: str) -> str | None:
    """The secret `name` of a config section, or None when it is not configured."""
    value = getattr(section, name, None)
    if value is not None:
        return value.get_secret_value()
    path = getattr(section, f"{name}_file", None)
    if path:
        try:
            text = Path(path).read_text().strip()
        except OSError as exc:
            raise SecretUnavailable(f"{name}_file {path}: {exc.strerror}") from None
        if not text:
            raise SecretUnavailable(f"{name}_file {path} is empty")
        return text
    variable = getattr(section, f"{name}_env", None)
    if variable:
        text = os.environ.get(variable, "").strip()
        if not text:
            raise SecretUnavailable(f"{name}_env: the variable {variable} is not set")
        return text
    return None


def _mentions_secret(value: Any) -> bool:
    if isinstance(value, dict):
        return any(key in SECRET_NAMES or _mentions_secret(v) for key, v in value.items())
    if isinstance(value, list | tuple):
        return any(_mentions_secret(v) for v in value)
    return False


# -- UI and alerting ------------------------------------------------------------------------


class UiConfig(_Section):
    external_url: str | None = Field(
        None, description="the UI's address as Slack readers reach it (links in messages); "
                          "default http://<listen>")
    token: SecretStr | None = Field(
        None, description="bearer token for changes (and for reading when not on loopback); "
                          "prefer token_file (a mounted Secret) or token_env")
    token_file: str | None = None
    token_env: str | None = None
    session_hours: float = Field(12.0, gt=0, description="how long a browser login lasts")
    tls_cert_file: str | None = Field(
        None, description="PEM certificate (chain) to serve the UI/API over HTTPS; with "
                          "tls_key_file. Session cookies are then Secure")
    tls_key_file: str | None = Field(None, description="PEM private key of tls_cert_file")
    allowed_hosts: list[Annotated[str, Field(min_length=1, max_length=253)]] = Field(
        default_factory=list, max_length=100,
        description="Host header names accepted besides loopback ones (on loopback always "
                    "checked, against DNS rebinding; beyond loopback checked when set)")
    auth_failures_per_minute: int = Field(
        10, ge=1, le=10_000,
        description="wrong tokens a client address may send in a minute before its "
                    "credentials are refused (429) for the rest of the minute")

    @model_validator(mode="after")
    def _one_token(self) -> UiConfig:
        if len(secret_sources(self, "token")) > 1:
            raise ValueError("give only one of token, token_file, token_env")
        if bool(self.tls_cert_file) != bool(self.tls_key_file):
            raise ValueError("give tls_cert_file and tls_key_file together (or neither)")
        for name in ("tls_cert_file", "tls_key_file"):
            path = getattr(self, name)
            if path and not os.access(path, os.R_OK):
                raise ValueError(f"{name} {path} cannot be read")
        return self

    def resolved_token(self) -> str | None:
        """The token, read when asked (a rotated Secret is picked up); None when none is
        configured or it cannot be read (changes are then refused, with the reason logged)."""
        try:
            return read_secret(self, "token")
        except SecretUnavailable as exc:
            import logging

            logging.getLogger(__name__).error("ui token unavailable: %s", exc)
            return None


class ForwardConfig(_Section):
    """Send this node's incidents and actions to a cluster server (`sloguard server`). Off
    while `url` is unset. The local stores are the buffer: nothing is lost while it is away."""

    url: str | None = Field(None, description="the cluster server, e.g. http://sloguard:8080")
    token: SecretStr | None = Field(
        None, description="the server's server.ingest_token (not its ui.token); prefer "
                          "token_file (a mounted Secret) or token_env")
    token_file: str | None = None
    token_env: str | None = None
    interval: Duration = Field(5.0, gt=0, description="how often to send what changed")
    batch: int = Field(200, ge=1, le=1000, description="most incidents (and actions) a request")
    timeout: Duration = Field(10.0, gt=0, description="of one request")

    @field_validator("url")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        return _http_url(value).rstrip("/") if value else None

    @model_validator(mode="after")
    def _one_token(self) -> ForwardConfig:
        sources = secret_sources(self, "token")
        if len(sources) > 1:
            raise ValueError("give only one of token, token_file, token_env")
        if self.url and not sources:
            raise ValueError("url is set without a token: set token, token_file or token_env "
                             "(the server's server.ingest_token)")
        return self


class ServerConfig(_Section):
    """`sloguard server`: the cluster view. Agents authenticate with the ingest token, which is
    separate from ui.token so that an agent's credential cannot read or change the UI."""

    ingest_token: SecretStr | None = Field(
        None, description="bearer token agents present on POST /api/v1/ingest")
    ingest_token_file: str | None = None
    ingest_token_env: str | None = None
    max_body: Size = Field(8 * 1024**2, ge=1024, description="largest ingest body accepted")
    stale_after: Duration = Field(
        60.0, gt=0, description="a node not heard from for this long is shown as not ok")

    @model_validator(mode="after")
    def _one_token(self) -> ServerConfig:
        if len(secret_sources(self, "ingest_token")) > 1:
            raise ValueError("give only one of ingest_token, ingest_token_file, "
                             "ingest_token_env")
        return self


def _matchers(items: list[str]) -> list[str]:
    from sloguard.core.selectors import parse_matchers

    for item in items:
        parse_matchers([item])
    return items


Matchers = Annotated[list[str], AfterValidator(_matchers)]


class SlackConfig(_Section):
    """One Slack destination: an incoming webhook, or a bot token and a channel (Web API:
    one message per alert group, updated in place, with the timeline in its thread)."""

    webhook_url: SecretStr | None = None
    webhook_url_file: str | None = None
    webhook_url_env: str | None = None
    bot_token: SecretStr | None = None
    bot_token_file: str | None = None
    bot_token_env: str | None = None
    channel: str | None = Field(None, description="bot token only: channel ID (best) or #name")
    api_url: str = Field("https://slack.com/api/", description="Web API base URL")
    send_resolved: bool = True
    timeout: Duration = Field(10.0, gt=0, description="one HTTP request")
    min_interval: Duration = Field(1.0, description="rate limit: least time between messages")

    @model_validator(mode="after")
    def _one_destination(self) -> SlackConfig:
        webhook, bot = secret_sources(self, "webhook_url"), secret_sources(self, "bot_token")
        if len(webhook) + len(bot) != 1:
            raise ValueError("give exactly one of webhook_url, webhook_url_file, webhook_url_env"
                             ", bot_token, bot_token_file, bot_token_env")
        if bot and not self.channel:
            raise ValueError("a bot token needs `channel` (its ID, e.g. C0123ABCD, or #name)")
        if webhook and self.channel:
            raise ValueError("an incoming webhook posts to the channel it was created for: "
                             "remove `channel`, or use a bot token")
        return self


class ReceiverConfig(_Section):
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$")
    slack: SlackConfig | None = Field(None, description="none: notifications are dropped")


class RouteConfig(_Section):
    """Alertmanager's route: children inherit what they do not set."""

    receiver: str | None = None
    matchers: Matchers = Field(default_factory=list)
    continue_: bool = Field(False, alias="continue")
    group_by: list[str] | None = Field(None, description="['...']: every label")
    group_wait: Duration | None = None
    group_interval: Duration | None = Field(None, gt=0)
    repeat_interval: Duration | None = Field(None, gt=0)
    routes: list[RouteConfig] = Field(default_factory=list)


class InhibitRuleConfig(_Section):
    source_matchers: Matchers
    target_matchers: Matchers
    equal: list[str] = Field(default_factory=list)


class AlertingConfig(_Section):
    receivers: list[ReceiverConfig] = Field(default_factory=list)
    route: RouteConfig | None = None
    inhibit_rules: list[InhibitRuleConfig] = Field(default_factory=list)
    send_in_dry_run: bool = Field(
        True, description="the notify rung notifies in dry-run too (a message changes nothing "
                          "on the node; readers see what would be done)")

    @field_validator("receivers")
    @classmethod
    def _unique(cls, receivers: list[ReceiverConfig]) -> list[ReceiverConfig]:
        names = [r.name for r in receivers]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"receiver names must be unique: {', '.join(duplicates)}")
        return receivers

    @field_validator("route")
    @classmethod
    def _route(cls, route: RouteConfig | None, info: ValidationInfo) -> RouteConfig | None:
        if route is None:
            return route
        if not route.receiver:
            raise ValueError("the top-level route needs a `receiver`")
        if route.matchers:
            raise ValueError("the top-level route matches every alert: no `matchers`")
        if "receivers" not in info.data:
            return route  # the receivers are invalid: that error is the one to read
        names = [r.name for r in info.data["receivers"]]

        def check(node: RouteConfig, where: str) -> None:
            if node.receiver and node.receiver not in names:
                raise ValueError(f"{where}receiver: no receiver named {node.receiver!r} "
                                 f"(receivers: {', '.join(names) or 'none'})")
            for index, child in enumerate(node.routes):
                check(child, f"{where}routes.{index}.")

        check(route, "")
        return route

    @model_validator(mode="after")
    def _routed(self) -> AlertingConfig:
        if self.receivers and self.route is None:
            raise ValueError("receivers need a `route` (at least `route: {receiver: NAME}`)")
        return self


# -- application latency (issue #6): scrape, probe and receive the LS services' own latency --


def _http_url(value: str) -> str:
    from urllib.parse import urlsplit

    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"must be an http:// or https:// URL, got {value!r}")
    return value


def _host_port(value: str) -> str:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"must be HOST:PORT, e.g. 127.0.0.1:6379, got {value!r}")
    return value


class ErrorCounting(_Section):
    """Which requests count as errors: a counter (or the histogram) with a status label."""

    metric: str | None = Field(
        None, description="counter family; unset: the first counter with `label`, else the "
                          "latency histogram's own label")
    label: str = Field("code", description="label holding the status code")
    match: str = Field("5..", description="anchored regex on the label value meaning an error")

    @field_validator("match")
    @classmethod
    def _regex(cls, value: str) -> str:
        import re

        try:
            re.compile(value)
        except re.error as exc:
            raise ValueError(f"not a regular expression: {exc}") from None
        return value


class AppScrapeTarget(_Section):
    """A Prometheus/OpenMetrics endpoint of an LS service, named in the config."""

    service: str = Field(min_length=1)
    url: Annotated[str, BeforeValidator(_http_url)]
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


class AppProbe(_Section):
    """An active probe, as the Prometheus blackbox exporter does it."""

    service: str = Field(min_length=1)
    kind: Literal["http", "tcp"]
    url: Annotated[str, BeforeValidator(_http_url)] | None = Field(
        None, description="http: the URL to request")
    address: Annotated[str, BeforeValidator(_host_port)] | None = Field(
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


class PodDiscovery(_Section):
    enabled: bool = Field(
        True, description="scrape pods annotated sloguard.io/scrape (needs kubernetes.enabled)")
    interval: Duration | None = Field(None, gt=0, description="unset: scrape_interval")
    tls_verify: bool = Field(True, description="for pods annotated sloguard.io/scheme: https")
    ca_file: str | None = None


class ReceiveConfig(_Section):
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


class AppLatencyConfig(_Section):
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


def percentile_quantile(value: str) -> float:
    """0.99 from "p99", 0.999 from "p999" or "p99.9": the spelling of rules and dashboards."""
    text = str(value).strip().lower()
    digits = text[1:]
    # ASCII digits only: str.isdigit() accepts "²", which float() then refuses
    if not text.startswith("p") or not re.fullmatch(r"(?=.*[0-9])[0-9]*\.?[0-9]*", digits):
        raise ValueError(f"not a percentile: {value!r} (use e.g. p50, p99, p999 or p99.9)")
    quantile = float(digits) / 100 if "." in digits else float(f"0.{digits}")
    if not 0 < quantile < 1:
        raise ValueError(f"not a percentile: {value!r}")
    return quantile


class SloConfig(_Section):
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
        percentile_quantile(value)
        return value.strip().lower()

    @property
    def quantile(self) -> float:
        return percentile_quantile(self.percentile)


def _unique_slos(slos: list[SloConfig]) -> list[SloConfig]:
    seen: dict[tuple[str, str | None], int] = {}
    for index, slo in enumerate(slos):
        key = (slo.service, slo.namespace)
        if key in seen:
            raise ValueError(f"slos.{seen[key]} and slos.{index} are both for service "
                             f"{slo.service!r} (namespace {slo.namespace or 'any'}); give each "
                             "service one SLO")
        seen[key] = index
    return slos


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, env_nested_delimiter=ENV_NESTED, extra="forbid"
    )

    node_name: str = Field(default_factory=socket.gethostname)
    data_dir: Path = Path("data")
    listen: str = "127.0.0.1:8080"
    interval: Duration = Field(1.0, gt=0, description="collection and evaluation tick")
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    store: StoreConfig = Field(default_factory=StoreConfig)
    incidents: IncidentsConfig = Field(default_factory=IncidentsConfig)
    collectors: CollectorsConfig = Field(default_factory=CollectorsConfig)
    kubernetes: KubernetesConfig = Field(default_factory=KubernetesConfig)
    rules: RulesConfig = Field(default_factory=RulesConfig)
    detectors: DetectorsConfig = Field(default_factory=DetectorsConfig)
    actuators: ActuatorsConfig = Field(default_factory=ActuatorsConfig)
    app_latency: AppLatencyConfig = Field(default_factory=AppLatencyConfig)
    slos: Annotated[list[SloConfig], AfterValidator(_unique_slos)] = Field(default_factory=list)
    ui: UiConfig = Field(default_factory=UiConfig)
    alerting: AlertingConfig = Field(default_factory=AlertingConfig)
    forward: ForwardConfig = Field(default_factory=ForwardConfig)
    server: ServerConfig = Field(default_factory=ServerConfig)

    @field_validator("listen")
    @classmethod
    def _listen(cls, value: str) -> str:
        host, sep, port = value.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"must be HOST:PORT, e.g. 127.0.0.1:8080, got {value!r}")
        return value

    @model_validator(mode="after")
    def _exposed_needs_a_token(self) -> Settings:
        host = self.listen_host_port[0]
        if not _loopback(host) and not secret_sources(self.ui, "token"):
            raise ValueError(
                f"listen: {host} is not loopback, so ui.token (or token_file, token_env) is "
                "required: the "
                "incidents and the node's workloads must not be readable by anyone on the network")
        return self

    @property
    def listen_host_port(self) -> tuple[str, int]:
        host, _, port = self.listen.rpartition(":")
        return host.strip("[]") or "127.0.0.1", int(port)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return init_settings, env_settings, _YamlSource(settings_cls)


def app_latency_wanted(settings: Settings) -> bool:
    """Whether the application-latency collector has anything to do (it costs a thread and the
    HTTP client's memory otherwise)."""
    app = settings.app_latency
    return app.enabled and bool(
        app.targets or app.probes or app.receive.enabled or settings.slos
        or (settings.kubernetes.enabled and app.pods.enabled))


# The YAML document `load_settings` is building from. A context variable, not a class attribute:
# each thread (and task) has its own, so two loads at once cannot see each other's file.
_DOCUMENT: ContextVar[dict[str, Any] | None] = ContextVar("sloguard_config_document",
                                                          default=None)


class _YamlSource(PydanticBaseSettingsSource):
    """Feeds the already-parsed YAML document (set by `load_settings`) to pydantic-settings."""

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
        return (_DOCUMENT.get() or {}).get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        return dict(_DOCUMENT.get() or {})


class ConfigError(Exception):
    """A configuration problem, already phrased for the person who wrote the file."""


@dataclass
class LoadedSettings:
    settings: Settings
    file: Path | None
    yaml_lines: dict[tuple[str, ...], tuple[int, int]]
    env_keys: dict[tuple[str, ...], str]
    cli_keys: dict[tuple[str, ...], str]

    def source_of(self, path: tuple[str, ...], nearest: bool = False) -> str:
        """Where the value at `path` came from.

        With `nearest`, the closest enclosing key counts too (for errors about a key that is
        missing or malformed deeper inside what a file or variable gave).
        """
        sizes = range(len(path), 0, -1) if nearest else (len(path),)
        for size in sizes:
            prefix = path[:size]
            if prefix in self.cli_keys:
                return f"command line {self.cli_keys[prefix]}"
            if prefix in self.env_keys:
                return f"environment {self.env_keys[prefix]}"
            if prefix in self.yaml_lines:
                return f"{self.file}:{self.yaml_lines[prefix][0]}"
        if not nearest:
            for size in range(len(path) - 1, 0, -1):
                if path[:size] in self.env_keys:  # a whole section given as JSON
                    return f"environment {self.env_keys[path[:size]]}"
        return "default"

    def effective(self) -> list[tuple[str, Any, str]]:
        """(dotted key, value, source) for every leaf setting."""
        rows: list[tuple[str, Any, str]] = []

        def walk(value: Any, path: tuple[str, ...]) -> None:
            if isinstance(value, BaseModel):
                for name, info in type(value).model_fields.items():
                    walk(getattr(value, name), (*path, info.alias or name))
            else:
                if isinstance(value, list):
                    value = [v.model_dump(by_alias=True) if isinstance(v, BaseModel) else v
                             for v in value]
                rows.append((".".join(path), value, self.source_of(path)))

        walk(self.settings, ())
        return rows


def _yaml_document(path: Path) -> tuple[dict[str, Any], dict[tuple[str, ...], tuple[int, int]]]:
    try:
        document, lines = read_yaml(path)
    except YamlFileError as exc:
        raise ConfigError(str(exc).replace(": cannot read:", ": cannot read config file:")) \
            from exc
    if document is None:
        return {}, {}
    if not isinstance(document, dict):
        raise ConfigError(f"{path}:1: the config file must be a mapping of settings")
    return document, lines


def _env_keys() -> dict[tuple[str, ...], str]:
    keys = {}
    for name in os.environ:
        if name.startswith(ENV_PREFIX) and name != f"{ENV_PREFIX}CONFIG":
            path = tuple(part.lower() for part in name[len(ENV_PREFIX):].split(ENV_NESTED))
            keys[path] = name
    return keys


def load_settings(
    config_file: Path | None = None, cli_overrides: dict[str, tuple[str, Any]] | None = None
) -> LoadedSettings:
    """Build the effective settings; raise ConfigError naming file, line and field on problems.

    `cli_overrides` maps a top-level field to (flag name, value) for flags that were given.
    """
    if config_file is None and os.environ.get(f"{ENV_PREFIX}CONFIG"):
        config_file = Path(os.environ[f"{ENV_PREFIX}CONFIG"])
    document, lines = _yaml_document(config_file) if config_file else ({}, {})
    cli_overrides = cli_overrides or {}
    env_keys = _env_keys()
    cli_keys = {(key,): flag for key, (flag, _) in cli_overrides.items()}
    token = _DOCUMENT.set(document)
    try:
        settings = Settings(**{key: value for key, (_, value) in cli_overrides.items()})
    except ValidationError as exc:
        loaded = LoadedSettings(Settings.model_construct(), config_file, lines, env_keys, cli_keys)
        raise ConfigError(_describe(exc, loaded)) from exc
    finally:
        _DOCUMENT.reset(token)
    return LoadedSettings(settings, config_file, lines, env_keys, cli_keys)


def _describe(exc: ValidationError, loaded: LoadedSettings) -> str:
    messages = []
    for error in exc.errors():
        path = tuple(str(part) for part in error["loc"])
        message = error["msg"].removeprefix("Value error, ")
        given = error.get("input")
        cross = re.match(r"^([a-z_][a-z0-9_.]*): (.*)$", message, re.S) if not path else None
        if cross:  # a check across fields names the field to fix first
            path, message, given = tuple(cross.group(1).split(".")), cross.group(2), None
        field = ".".join(path) or "(top level)"
        where = loaded.source_of(path, nearest=True)
        if where == "default" and loaded.file:
            where = str(loaded.file)
        if (SECRET_NAMES | SECRET_FIELDS) & set(path) or _mentions_secret(given) or (
                isinstance(given, dict)):
            given = None  # never echo a secret back (nor a whole section)
        elif isinstance(given, str) and "@" in given and path and path[-1] == "url":
            given = None  # user:password@host
        if error["type"] == "extra_forbidden":
            message = "unknown setting (check the spelling; `sloguard config show` lists them)"
        elif given is not None and error["type"] != "missing" and repr(given) not in message:
            message = f"{message} (got {given!r})"
        messages.append(f"{where}: {field}: {message}")
    return "\n".join(messages)
