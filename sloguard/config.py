"""The agent's configuration: one YAML file plus environment overrides.

Precedence (highest first): command-line flags, environment (SLOGUARD_ prefix, `__` between
nested keys, e.g. SLOGUARD_STORE__RETENTION=2h), the YAML file, built-in defaults. Every value
remembers where it came from, so `sloguard config show` can answer "why is it set to that?", and
every error names the file and line (or the environment variable) and the field.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    ValidationInfo,
    WithJsonSchema,
    field_validator,
)
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from sloguard.units import parse_duration, parse_size
from sloguard.yamlfile import YamlFileError, read_yaml

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


class ActuatorsConfig(_Section):
    dry_run: bool = True


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

    @field_validator("listen")
    @classmethod
    def _listen(cls, value: str) -> str:
        host, sep, port = value.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"must be HOST:PORT, e.g. 127.0.0.1:8080, got {value!r}")
        return value

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


class _YamlSource(PydanticBaseSettingsSource):
    """Feeds the already-parsed YAML document (set by `load_settings`) to pydantic-settings."""

    document: ClassVar[dict[str, Any]] = {}

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
        return self.document.get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        return dict(self.document)


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
    _YamlSource.document = document
    try:
        settings = Settings(**{key: value for key, (_, value) in cli_overrides.items()})
    except ValidationError as exc:
        loaded = LoadedSettings(Settings.model_construct(), config_file, lines, env_keys, cli_keys)
        raise ConfigError(_describe(exc, loaded)) from exc
    finally:
        _YamlSource.document = {}
    return LoadedSettings(settings, config_file, lines, env_keys, cli_keys)


def _describe(exc: ValidationError, loaded: LoadedSettings) -> str:
    messages = []
    for error in exc.errors():
        path = tuple(str(part) for part in error["loc"])
        field = ".".join(path) or "(top level)"
        where = loaded.source_of(path, nearest=True)
        if where == "default" and loaded.file:
            where = str(loaded.file)
        message = error["msg"].removeprefix("Value error, ")
        given = error.get("input")
        if any(part in SECRET_FIELDS for part in path) or (
                isinstance(given, dict) and SECRET_FIELDS & set(given)):
            given = None  # never echo a secret back
        elif isinstance(given, str) and "@" in given and path and path[-1] == "url":
            given = None  # user:password@host
        if error["type"] == "extra_forbidden":
            message = "unknown setting (check the spelling; `sloguard config show` lists them)"
        elif given is not None and error["type"] != "missing" and repr(given) not in message:
            message = f"{message} (got {given!r})"
        messages.append(f"{where}: {field}: {message}")
    return "\n".join(messages)
