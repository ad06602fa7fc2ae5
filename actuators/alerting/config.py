"""The `alerting` section, as Alertmanager's: receivers (one folder each, Slack today), the
routing tree, and inhibition rules.
"""

from __future__ import annotations

from pydantic import Field, SecretStr, ValidationInfo, field_validator, model_validator

from sloguard.core.config import Duration, Matchers, Section, secret_sources


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


class ReceiverConfig(Section):
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$")
    slack: SlackConfig | None = Field(None, description="none: notifications are dropped")


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

