"""The `alerting` section, as Alertmanager's: receivers (Slack, or a real Alertmanager), the
routing tree, and inhibition rules.
"""

from __future__ import annotations

import re
from typing import Annotated
from urllib.parse import urlsplit

from pydantic import (
    AfterValidator,
    Field,
    SecretStr,
    ValidationInfo,
    field_validator,
    model_validator,
)

from sloguard.core.config import Duration, Matchers, Section, http_url, secret_sources

# Alertmanager 0.25's label names (model.LabelName.IsValid in its classic mode)
LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")



def _repeated(values: list[str]) -> list[str]:
    """The values named more than once, sorted (for an error that names them)."""
    return sorted({v for v in values if values.count(v) > 1})

class SlackConfig(Section):
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


def _alertmanager_url(url: str) -> str:
    http_url(url)
    parts = urlsplit(url)
    if parts.username or parts.password:
        raise ValueError("no credentials in the URL: they would show in logs and "
                         "`config show`")
    if parts.query or parts.fragment:
        raise ValueError("the base URL only, without ?query or #fragment")
    if parts.path.rstrip("/").endswith("/api/v2/alerts"):
        raise ValueError("the base URL: /api/v2/alerts is added")
    return url.rstrip("/")


AlertmanagerURL = Annotated[str, AfterValidator(_alertmanager_url)]

_IN_FILE = ("a secret written in the config file shows wherever the file goes (a ConfigMap, "
            "git): use {name}_file (a mounted Secret, re-read when it changes) or {name}_env")


def _one_source(section: Section, name: str) -> None:
    """Exactly one of NAME_file, NAME_env; an inline NAME is refused, saying why."""
    if getattr(section, name, None) is not None:
        raise ValueError(_IN_FILE.format(name=name))
    sources = secret_sources(section, name)
    if len(sources) != 1:
        raise ValueError(f"give exactly one of {name}_file, {name}_env")


class BasicAuthConfig(Section):
    """HTTP basic auth, as Prometheus' `basic_auth` (Alertmanager's --web.config.file
    `basic_auth_users`, or a proxy in front of it)."""

    username: str = Field(min_length=1)
    password: SecretStr | None = Field(None, description="refused: use password_file or _env")
    password_file: str | None = Field(None, description="re-read on every request")
    password_env: str | None = None

    @field_validator("username")
    @classmethod
    def _username(cls, value: str) -> str:
        if ":" in value or not value.isprintable():
            raise ValueError("no ':' (basic auth joins the username to the password with one) "
                             "and no control characters")
        return value

    @model_validator(mode="after")
    def _password(self) -> BasicAuthConfig:
        _one_source(self, "password")
        return self


class AuthorizationConfig(Section):
    """An Authorization header, as Prometheus' `authorization` (a bearer token for a proxy
    such as kube-rbac-proxy or oauth2-proxy in front of Alertmanager)."""

    type: str = Field("Bearer", pattern=r"^[A-Za-z][A-Za-z0-9!#$%&'*+.^_`|~-]*$",
                      description="the scheme: Authorization: <type> <credentials>")
    credentials: SecretStr | None = Field(
        None, description="refused: use credentials_file or _env")
    credentials_file: str | None = Field(None, description="re-read on every request")
    credentials_env: str | None = None

    @field_validator("type")
    @classmethod
    def _not_basic(cls, value: str) -> str:
        if value.lower() == "basic":
            raise ValueError("use `basic_auth` for Basic (it encodes username and password)")
        return value

    @model_validator(mode="after")
    def _credentials(self) -> AuthorizationConfig:
        _one_source(self, "credentials")
        return self


class TLSConfig(Section):
    """How to check the Alertmanager's certificate and which one to show it, as Prometheus'
    `tls_config`. The files are read again when they change (cert-manager rotates them)."""

    ca_file: str | None = Field(None, description="CA to verify the server; default: the "
                                                  "system's")
    cert_file: str | None = Field(None, description="client certificate (with key_file), for "
                                                    "Alertmanager's client_auth_type")
    key_file: str | None = None
    server_name: str | None = Field(
        None, min_length=1, description="the name the server's certificate must carry (and "
                                        "SNI); default: the URL's host")
    insecure_skip_verify: bool = Field(
        False, description="do not verify the server's certificate (anyone on the path can "
                           "read the alerts and the credentials)")

    @model_validator(mode="after")
    def _pair(self) -> TLSConfig:
        if bool(self.cert_file) != bool(self.key_file):
            raise ValueError("cert_file and key_file go together (the client certificate and "
                             "its private key)")
        return self


class AlertmanagerConfig(Section):
    """A real Alertmanager (API v2): every alert routed here is posted to each URL, as
    Prometheus does. Alertmanager then groups, silences, inhibits and notifies; an HA cluster's
    peers each get every alert and agree among themselves who notifies."""

    urls: list[AlertmanagerURL] = Field(
        min_length=1, description="each peer's base URL, e.g. http://alertmanager-0:9093 "
                                  "(with its --web.route-prefix, if any); /api/v2/alerts is added")
    resend_interval: Duration = Field(
        60.0, gt=0, le=3600, description="firing alerts are posted again this often; each "
                                         "post is valid for 4 intervals (Prometheus' rule)")
    timeout: Duration = Field(10.0, gt=0, description="one HTTP request")
    labels: dict[str, str] = Field(
        default_factory=dict, description="added to every alert (e.g. cluster: prod), as "
                                          "Prometheus' external_labels; the alert's own win")
    max_batch: int = Field(64, ge=1, le=1000, description="alerts per request at most")
    basic_auth: BasicAuthConfig | None = None
    authorization: AuthorizationConfig | None = None
    tls_config: TLSConfig | None = Field(None, description="for https URLs")

    @model_validator(mode="after")
    def _auth(self) -> AlertmanagerConfig:
        if self.basic_auth is not None and self.authorization is not None:
            raise ValueError("give basic_auth or authorization, not both (one Authorization "
                             "header)")
        if self.tls_config is not None and not any(u.startswith("https:") for u in self.urls):
            raise ValueError("tls_config is set but no URL is https://")
        return self

    @field_validator("urls")
    @classmethod
    def _urls(cls, urls: list[str]) -> list[str]:
        if duplicates := _repeated(urls):
            raise ValueError(f"each Alertmanager once: {', '.join(duplicates)}")
        return urls

    @field_validator("labels")
    @classmethod
    def _labels(cls, labels: dict[str, str]) -> dict[str, str]:
        for name, value in labels.items():
            if not LABEL_NAME.match(name):
                raise ValueError(f"{name!r} is not a label name Alertmanager takes "
                                 "([a-zA-Z_][a-zA-Z0-9_]*)")
            if not value:
                raise ValueError(f"{name!r} is empty (an empty label is no label)")
        return labels


class ReceiverConfig(Section):
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$")
    slack: SlackConfig | None = Field(None, description="none: notifications are dropped")
    alertmanager: AlertmanagerConfig | None = Field(
        None, description="post the alerts to Alertmanager, which notifies")

    @model_validator(mode="after")
    def _one_integration(self) -> ReceiverConfig:
        if self.slack is not None and self.alertmanager is not None:
            raise ValueError("one integration per receiver: `slack` or `alertmanager` (make "
                             "two receivers and route to both with `continue: true`)")
        return self


class RouteConfig(Section):
    """Alertmanager's route: children inherit what they do not set."""

    receiver: str | None = None
    matchers: Matchers = Field(default_factory=list)
    continue_: bool = Field(False, alias="continue")
    group_by: list[str] | None = Field(None, description="['...']: every label")
    group_wait: Duration | None = None
    group_interval: Duration | None = Field(None, gt=0)
    repeat_interval: Duration | None = Field(None, gt=0)
    routes: list[RouteConfig] = Field(default_factory=list)


GROUPING = ("group_by", "group_wait", "group_interval", "repeat_interval")


class InhibitRuleConfig(Section):
    source_matchers: Matchers
    target_matchers: Matchers
    equal: list[str] = Field(default_factory=list)


class AlertingConfig(Section):
    receivers: list[ReceiverConfig] = Field(default_factory=list)
    route: RouteConfig | None = None
    inhibit_rules: list[InhibitRuleConfig] = Field(default_factory=list)
    send_in_dry_run: bool = Field(
        True, description="the notify rung notifies in dry-run too (a message changes nothing "
                          "on the node; readers see what would be done)")

    @field_validator("receivers")
    @classmethod
    def _unique(cls, receivers: list[ReceiverConfig]) -> list[ReceiverConfig]:
        if duplicates := _repeated([r.name for r in receivers]):
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
        forwarded = {r.name for r in info.data["receivers"] if r.alertmanager is not None}

        def check(node: RouteConfig, where: str) -> None:
            if node.receiver and node.receiver not in names:
                raise ValueError(f"{where}receiver: no receiver named {node.receiver!r} "
                                 f"(receivers: {', '.join(names) or 'none'})")
            if node.receiver in forwarded and not node.routes:
                for setting in GROUPING:
                    if getattr(node, setting) is not None:
                        raise ValueError(
                            f"{where}{setting}: receiver {node.receiver!r} is an Alertmanager,"
                            f" which groups and repeats by its own route: set {setting} there")
            for index, child in enumerate(node.routes):
                check(child, f"{where}routes.{index}.")

        check(route, "")
        return route

    @model_validator(mode="after")
    def _routed(self) -> AlertingConfig:
        if self.receivers and self.route is None:
            raise ValueError("receivers need a `route` (at least `route: {receiver: NAME}`)")
        return self

