"""The alerting configuration: Alertmanager's shape, errors that name file, line and field,
secrets from a file or the environment that never show; routes, matchers and inhibition."""

from __future__ import annotations

import json
import subprocess

import pytest

from sloguard.actuators.alerting.config import (
    AlertingConfig,
    InhibitRuleConfig,
    RouteConfig,
    SlackConfig,
)
from sloguard.actuators.alerting.inhibition import Inhibitor
from sloguard.actuators.alerting.routing import build_route
from sloguard.core.config import ConfigError, SecretUnavailable, read_secret
from sloguard.core.selectors import parse_matchers
from sloguard.settings import load_settings

HOOK = "https://hooks.slack.com/services/T0/B0/SECRETSECRETSECRET"

GOOD = f"""\
ui:
  external_url: https://sloguard.example
  token: ui-SECRET-token
alerting:
  receivers:
    - name: sre
      slack: {{webhook_url: "{HOOK}"}}
    - name: oncall
      slack: {{bot_token: xoxb-SECRET-bot, channel: C0123ABCD}}
    - name: devnull
  route:
    receiver: sre
    group_by: [alertname, node]
    group_wait: 30s
    routes:
      - matchers: ['severity="critical"', 'node=~"w-.*"']
        receiver: oncall
        continue: true
        group_interval: 1m
        routes:
          - matchers: [pod=web-1]
            group_by: ['...']
  inhibit_rules:
    - source_matchers: [alertname=NodeMemoryPressure]
      target_matchers: ['level=~"pod|container"']
      equal: [node]
"""


def test_a_full_config_loads_with_alertmanager_defaults_and_inheritance(tmp_path):
    cfg = tmp_path / "sloguard.yaml"
    cfg.write_text(GOOD)
    settings = load_settings(cfg).settings
    root = build_route(settings.alerting.route)
    assert (root.receiver, root.group_by, root.group_wait, root.group_interval,
            root.repeat_interval) == ("sre", ("alertname", "node"), 30, 300, 4 * 3600)
    critical = root.routes[0]
    assert (critical.receiver, critical.group_by, critical.group_wait,
            critical.group_interval) == ("oncall", ("alertname", "node"), 30, 60)
    leaf = critical.routes[0]
    assert (leaf.receiver, leaf.group_all, leaf.group_interval) == ("oncall", True, 60)
    labels = {"alertname": "X", "severity": "critical", "node": "w-1", "pod": "web-1"}
    assert [r.id for r in root.match(labels)] == ["root.0.0"]
    assert [r.id for r in root.match({**labels, "pod": "db"})] == ["root.0"]
    assert [r.id for r in root.match({**labels, "severity": "info"})] == ["root"]
    assert leaf.group_labels(labels) == dict(sorted(labels.items()))
    assert settings.alerting.send_in_dry_run is True


@pytest.mark.parametrize(("text", "expected"), [
    (f"alerting:\n  receivers:\n    - name: a\n      slack:\n        webhook_url: {HOOK}\n"
     "        bot_token_file: /x\n  route: {receiver: a}\n",
     ":4: alerting.receivers.0.slack: give exactly one of webhook_url"),
    ("alerting:\n  receivers:\n    - name: a\n      slack: {bot_token_env: T}\n"
     "  route: {receiver: a}\n",
     ":4: alerting.receivers.0.slack: a bot token needs `channel`"),
    (f"alerting:\n  receivers:\n    - name: a\n      slack: {{webhook_url: {HOOK}, channel: C1}}"
     "\n  route: {receiver: a}\n",
     ":4: alerting.receivers.0.slack: an incoming webhook posts to the channel"),
    ("alerting:\n  receivers:\n    - name: a\n  route:\n    receiver: a\n    routes:\n"
     "      - matchers: ['severity=~\"(\"']\n",
     ":7: alerting.route.routes.0.matchers: invalid regex"),
    ("alerting:\n  receivers:\n    - name: a\n  route:\n    receiver: a\n    routes:\n"
     "      - receiver: b\n",
     ":4: alerting.route: routes.0.receiver: no receiver named 'b' (receivers: a)"),
    ("alerting:\n  receivers:\n    - name: a\n    - name: a\n  route: {receiver: a}\n",
     ":2: alerting.receivers: receiver names must be unique: a"),
    ("alerting:\n  receivers:\n    - name: a\n", ":1: alerting: receivers need a `route`"),
    ("alerting:\n  route: {matchers: [a=b], receiver: x}\n",
     ":2: alerting.route: the top-level route matches every alert"),
    ("alerting:\n  inhibit_rules:\n    - source_matchers: ['a']\n      target_matchers: []\n",
     ":3: alerting.inhibit_rules.0.source_matchers: expected"),
    ("alerting:\n  route:\n    receiver: a\n    group_intervall: 1m\n",
     ":4: alerting.route.group_intervall: unknown setting"),
])
def test_errors_name_file_line_and_field(tmp_path, text, expected):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_settings(cfg)
    assert f"{cfg}{expected}" in str(err.value), str(err.value)
    assert "SECRET" not in str(err.value)  # never echoed, not even in a rejected section


def test_config_show_masks_every_secret(tmp_path, sloguard_bin):
    cfg = tmp_path / "sloguard.yaml"
    cfg.write_text(GOOD)
    for args in ([], ["--json"]):
        shown = subprocess.run([sloguard_bin, "config", "show", "-c", str(cfg), *args],
                               capture_output=True, text=True, check=True).stdout
        assert "SECRET" not in shown and "**********" in shown
        assert "alerting.receivers" in shown
    rows = json.loads(shown)
    ui = {r["key"]: r["value"] for r in rows if r["key"].startswith("ui.")}
    assert ui["ui.token"] == "**********" and ui["ui.external_url"] == "https://sloguard.example"


def test_secrets_from_a_file_or_the_environment(tmp_path, monkeypatch):
    secret = tmp_path / "hook"
    secret.write_text(HOOK + "\n")
    config = SlackConfig(webhook_url_file=str(secret))
    assert read_secret(config, "webhook_url") == HOOK
    secret.write_text(HOOK + "-rotated")
    assert read_secret(config, "webhook_url") == HOOK + "-rotated"  # read when needed
    secret.unlink()
    with pytest.raises(SecretUnavailable, match=r"webhook_url_file .*: No such file"):
        read_secret(config, "webhook_url")
    env = SlackConfig(bot_token_env="SLOGUARD_TEST_SLACK_TOKEN", channel="C1")
    monkeypatch.delenv("SLOGUARD_TEST_SLACK_TOKEN", raising=False)
    with pytest.raises(SecretUnavailable, match="SLOGUARD_TEST_SLACK_TOKEN is not set"):
        read_secret(env, "bot_token")
    monkeypatch.setenv("SLOGUARD_TEST_SLACK_TOKEN", "xoxb-from-env")
    assert read_secret(env, "bot_token") == "xoxb-from-env"
    assert read_secret(env, "webhook_url") is None
    assert "xoxb" not in repr(SlackConfig(bot_token="xoxb-inline", channel="C1"))


def test_matchers_in_the_selector_syntax():
    assert [str(m) for m in parse_matchers(["alertname=LSCpuStall", 'node=~"w-.*"',
                                            '{pod!="a", ns!~"kube-.*"}'])] == [
        'alertname="LSCpuStall"', 'node=~"w-.*"', 'pod!="a"', 'ns!~"kube-.*"']
    assert parse_matchers('a="x, y"')[0].value == "x, y"
    for bad in ("a", "a==b", 'a=~"("', 'a="b" c'):
        with pytest.raises(ValueError, match="matcher"):
            parse_matchers([bad])


def test_route_match_follows_alertmanager():
    root = build_route(RouteConfig.model_validate({"receiver": "default", "routes": [
        {"matchers": ["team=db"], "receiver": "db", "continue": True},
        {"matchers": ["team=db"], "receiver": "db2"},
        {"matchers": ["team=db"], "receiver": "never"},  # the previous one did not continue
        {"matchers": ["team=web"], "receiver": "web", "group_by": ["pod"]},
    ]}))
    assert [r.receiver for r in root.match({"team": "db"})] == ["db", "db2"]
    assert [r.receiver for r in root.match({"team": "web"})] == ["web"]
    assert [r.receiver for r in root.match({"team": "x"})] == ["default"]
    assert root.match({"team": "web"})[0].group_labels({"pod": "p", "x": "y"}) == {"pod": "p"}
    assert root.group_labels({"a": "b"}) == {}  # no group_by: one group for the route


def test_inhibition_rules():
    inhibitor = Inhibitor([InhibitRuleConfig(source_matchers=["severity=critical"],
                                             target_matchers=["severity=warning"],
                                             equal=["node"])])
    target = {"severity": "warning", "node": "a"}
    assert inhibitor.inhibited_by("t", target, [("s", {"severity": "critical", "node": "a"})]) \
        == "s"
    assert inhibitor.inhibited_by("t", target, [("s", {"severity": "critical", "node": "b"})]) \
        is None
    assert inhibitor.inhibited_by("t", target, [("t", target)]) is None
    both = Inhibitor([InhibitRuleConfig(source_matchers=["x=1"], target_matchers=["x=1"])])
    # an alert matching both sides is never muted by another that also matches both
    assert both.inhibited_by("a", {"x": "1"}, [("b", {"x": "1"})]) is None


def test_alerting_defaults_are_off():
    assert AlertingConfig().receivers == [] and AlertingConfig().route is None
