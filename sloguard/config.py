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
    WithJsonSchema,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from sloguard.units import parse_duration, parse_size
from sloguard.yamlfile import YamlFileError, read_yaml

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
    kind: Literal["embedded"] = "embedded"
    retention: Duration = Field(6 * 3600, description="drop samples older than this")
    max_size: Size = Field(1024**3, description="drop the oldest samples above this size")
    buffer_samples: int = Field(
        200_000, ge=1000, description="samples kept in memory while the store cannot be written"
    )


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


class CollectorsConfig(_Section):
    node: NodeCollectorConfig = Field(default_factory=NodeCollectorConfig)
    cgroups: CgroupCollectorConfig = Field(default_factory=CgroupCollectorConfig)


class KubernetesConfig(_Section):
    enabled: bool = False
    kubeconfig: str | None = Field(None, description="unset: in-cluster service account")
    refresh: Duration = 30.0


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


def _default_policy_paths() -> list[str]:
    """The escalation policies shipped with sloguard: policies/ beside the default rules."""
    return [str(Path(path) / "policies") for path in _default_rule_paths()]


class ActuatorsConfig(_Section):
    dry_run: bool = Field(True, description="shadow mode: record every step, take none")
    policies: list[str] = Field(
        default_factory=_default_policy_paths,
        description="escalation policy files or directories of *.yaml")


def _loopback(host: str) -> bool:
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class UiConfig(_Section):
    token: SecretStr | None = Field(
        None, description="bearer token for changes (and for reading when not on loopback); "
                          "prefer token_file or SLOGUARD_UI__TOKEN")
    token_file: Path | None = Field(None, description="file holding the token (a Secret)")
    session_hours: float = Field(12.0, gt=0, description="how long a browser login lasts")

    def resolved_token(self) -> str | None:
        """The token from `token`, else from `token_file` (read when asked, so a rotated
        Secret is picked up); None when neither is set."""
        if self.token is not None and self.token.get_secret_value():
            return self.token.get_secret_value()
        if self.token_file is not None:
            try:
                text = self.token_file.read_text().strip()
            except OSError:
                return None
            return text or None
        return None


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
    errors: ErrorCounting = Field(default_factory=ErrorCounting)
    targets: list[AppScrapeTarget] = Field(default_factory=list)
    probes: list[AppProbe] = Field(default_factory=list)
    pods: PodDiscovery = Field(default_factory=PodDiscovery)
    receive: ReceiveConfig = Field(default_factory=ReceiveConfig)


def percentile_quantile(value: str) -> float:
    """0.99 from "p99", 0.999 from "p999" or "p99.9": the spelling of rules and dashboards."""
    text = str(value).strip().lower()
    digits = text[1:]
    if not text.startswith("p") or not digits or not digits.replace(".", "", 1).isdigit():
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
    collectors: CollectorsConfig = Field(default_factory=CollectorsConfig)
    kubernetes: KubernetesConfig = Field(default_factory=KubernetesConfig)
    rules: RulesConfig = Field(default_factory=RulesConfig)
    detectors: DetectorsConfig = Field(default_factory=DetectorsConfig)
    actuators: ActuatorsConfig = Field(default_factory=ActuatorsConfig)
    app_latency: AppLatencyConfig = Field(default_factory=AppLatencyConfig)
    slos: Annotated[list[SloConfig], AfterValidator(_unique_slos)] = Field(default_factory=list)
    ui: UiConfig = Field(default_factory=UiConfig)

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
        if not _loopback(host) and self.ui.token is None and self.ui.token_file is None:
            raise ValueError(
                f"listen: {host} is not loopback, so ui.token or ui.token_file is required: the "
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
        if error["type"] == "extra_forbidden":
            message = "unknown setting (check the spelling; `sloguard config show` lists them)"
        elif given is not None and error["type"] != "missing" and repr(given) not in message:
            message = f"{message} (got {given!r})"
        messages.append(f"{where}: {field}: {message}")
    return "\n".join(messages)
