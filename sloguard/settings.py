"""The agent's and the server's configuration: every part's section, put together.

One YAML file plus environment overrides (sloguard/core/config.py has the precedence and the
loader). Each section's model lives with the part it configures; this module only composes
them and checks what spans sections (an exposed listener needs a token).
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, field_validator, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from sloguard.actuators.alerting.config import AlertingConfig
from sloguard.actuators.config import ActuatorsConfig
from sloguard.collectors.config import (
    AppLatencyConfig,
    CollectorsConfig,
    KubernetesConfig,
    SloConfig,
    unique_slos,
)
from sloguard.core.config import (
    ENV_NESTED,
    ENV_PREFIX,
    Duration,
    LoadedSettings,
    is_loopback,
    load_model,
    secret_sources,
    yaml_source,
)
from sloguard.detector.config import AttributionConfig, DetectorsConfig, RulesConfig
from sloguard.forwarder import ForwardConfig
from sloguard.store.config import IncidentsConfig, StoreConfig
from sloguard.ui.config import ServerConfig, UiConfig


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, env_nested_delimiter=ENV_NESTED, extra="forbid"
    )

    node_name: str = Field(default_factory=socket.gethostname)
    data_dir: Path = Path("data")
    listen: str = "127.0.0.1:8080"
    interval: Duration = Field(1.0, gt=0, description="collection and evaluation tick")
    arrival_floor: Duration = Field(
        0.1, ge=0, description="rules with `on_arrival` are evaluated when new data for them "
                               "arrives (a push, a scrape), at most this often; 0: only on "
                               "the tick")
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    store: StoreConfig = Field(default_factory=StoreConfig)
    incidents: IncidentsConfig = Field(default_factory=IncidentsConfig)
    collectors: CollectorsConfig = Field(default_factory=CollectorsConfig)
    kubernetes: KubernetesConfig = Field(default_factory=KubernetesConfig)
    rules: RulesConfig = Field(default_factory=RulesConfig)
    detectors: DetectorsConfig = Field(default_factory=DetectorsConfig)
    attribution: AttributionConfig = Field(default_factory=AttributionConfig)
    actuators: ActuatorsConfig = Field(default_factory=ActuatorsConfig)
    app_latency: AppLatencyConfig = Field(default_factory=AppLatencyConfig)
    slos: Annotated[list[SloConfig], AfterValidator(unique_slos)] = Field(default_factory=list)
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
        if not is_loopback(host) and not secret_sources(self.ui, "token"):
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
        return init_settings, env_settings, yaml_source(settings_cls)



def load_settings(
    config_file: Path | None = None, cli_overrides: dict[str, tuple[str, Any]] | None = None
) -> LoadedSettings:
    """Build the effective settings; raise ConfigError naming file, line and field on problems.

    `cli_overrides` maps a top-level field to (flag name, value) for flags that were given.
    """
    return load_model(Settings, config_file, cli_overrides)
