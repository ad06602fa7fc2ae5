"""The `alertmanager` receiver against real Alertmanagers: Debian's prometheus-alertmanager
0.25, two peers of one HA cluster started by the test, notifying a local server that speaks
Slack's incoming-webhook contract (support/slack_server.py).

The agent's pipeline (actuators/alerting/) posts to both peers; the Slack server must hear one
notification per group, the resolve must arrive when the peer that notified is killed in the
middle of the episode (and nothing doubles when it comes back), a silence made through
Alertmanager's API must mute sloguard's alert, and sizes and label names must be ones
Alertmanager accepts. Plus the configuration's errors, which name the field.
"""

from __future__ import annotations

import os
import time
from typing import Any

import pytest
from support.alerting import Incidents, incident, make, resolve
from support.alertmanager import slack_config
from support.slack_server import SlackServer
from test_agent_e2e import RULES, AgentProcess

from sloguard.actuators.alerting.config import AlertingConfig
from sloguard.core.config import ConfigError
from sloguard.settings import load_settings

PEER_TIMEOUT = 2.0  # the Alertmanagers' --cluster.peer-timeout (a peer at position n waits n)
GROUP_INTERVAL = 5.0  # their routes' (support/alertmanager.py: well above the peer timeout)
QUIET = 2 * PEER_TIMEOUT + GROUP_INTERVAL + 2  # long enough for a second notification to come
HOOK_PATH = "/services/T000/B000/AMSECRETHOOK"


def am_receiver(peers: list[Any], name: str = "am", **options: Any) -> dict[str, Any]:
    return {"name": name, "alertmanager": {"urls": [p.url for p in peers], "timeout": 5,
                                           "resend_interval": "3s", **options}}


def config(receiver: dict[str, Any]) -> AlertingConfig:
    return AlertingConfig.model_validate({"receivers": [receiver],
                                          "route": {"receiver": receiver["name"]}})


def titles(slack: SlackServer) -> list[str]:
    """Every notification Alertmanager posted: its attachment's title."""
    return [a.get("title", "") for m in list(slack.webhook_messages)
            for a in m.get("attachments") or []]


def ticking(alerting: Any, incidents: Incidents, seconds: float) -> None:
    """Run the agent's ticks for a while (1 s apart, as the agent does)."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        alerting.tick(time.time_ns(), incidents.firing())
        time.sleep(0.25)


def wait(alerting: Any, incidents: Incidents, check: Any, what: str,
         timeout: float = 40.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        alerting.tick(time.time_ns(), incidents.firing())
        result = check()
        if result:
            return result
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}; alerting: {alerting.status()}")


def active(peer: Any) -> dict[str, dict[str, Any]]:
    """The alerts a peer holds as active (firing, silenced included), by pod."""
    return {a["labels"].get("pod", ""): a for a in peer.alerts() if a["status"]["state"] !=
            "unprocessed"}


@pytest.fixture
def slack():
    with SlackServer() as server:
        server.add_channel("C0AMALERTS", "alerts")
        yield server


def test_both_peers_get_every_alert_and_slack_hears_once_per_group(tmp_path, alertmanagers,
                                                                    slack):
    hook = slack.add_webhook("C0AMALERTS", HOOK_PATH)
    peers = alertmanagers(2, slack_config(hook, ["alertname", "node"]),
                          peer_timeout=f"{PEER_TIMEOUT:g}s")
    incidents = Incidents()
    alerting = make(config(am_receiver(peers, labels={"cluster": "lab"})), tmp_path, incidents)
    alerting.start()
    try:
        now = time.time_ns()
        first = incidents.add(incident(1, at=now))
        second = incidents.add(incident(2, pod="web-2", at=now))
        for peer in peers:
            wait(alerting, incidents, lambda p=peer: len(active(p)) == 2,
                 f"both alerts on {peer.url}")
        for peer in peers:
            alert = active(peer)["web-1"]
            assert alert["labels"] == {
                "alertname": "LSCpuStall", "severity": "warning", "node": "worker-7",
                "pod": "web-1", "class": "LS", "level": "pod", "rulegroup": "ls-protection",
                "cluster": "lab"}
            assert alert["generatorURL"] == "https://sloguard.example/incidents/inc-001"
            assert alert["annotations"]["summary"] == first.summary
            assert alert["annotations"]["incident"] == "inc-001"
            assert alert["startsAt"].startswith(time.strftime(
                "%Y-%m-%dT%H:%M", time.gmtime(first.fired_ns / 1e9)))
            assert alert["status"]["state"] == "active"
        wait(alerting, incidents, lambda: titles(slack), "the firing notification")
        ticking(alerting, incidents, QUIET)  # re-sent every 3 s meanwhile: no new notification
        assert [t.split("]")[0] for t in titles(slack)] == ["[FIRING:2"], titles(slack)
        assert "LSCpuStall worker-7" in titles(slack)[0]
        assert alerting.status().ok, alerting.status().reason

        end = time.time_ns()
        resolve(first, end)
        resolve(second, end)
        wait(alerting, incidents, lambda: len(titles(slack)) >= 2, "the resolve notification")
        for peer in peers:
            wait(alerting, incidents, lambda p=peer: not active(p), f"no alert left on {peer.url}")
        ticking(alerting, incidents, QUIET)
        assert [t.split("]")[0] for t in titles(slack)] == ["[FIRING:2", "[RESOLVED"]
        assert alerting.pending()["am"] == 0
    finally:
        alerting.stop()


def test_the_peer_that_notified_killed_mid_episode_the_resolve_still_arrives_once(
        tmp_path, alertmanagers, slack):
    hook = slack.add_webhook("C0AMALERTS", HOOK_PATH)
    peers = alertmanagers(2, slack_config(hook, ["alertname", "node"]),
                          peer_timeout=f"{PEER_TIMEOUT:g}s")
    incidents = Incidents()
    alerting = make(config(am_receiver(peers)), tmp_path, incidents)
    alerting.start()
    try:
        item = incidents.add(incident(1, at=time.time_ns()))
        wait(alerting, incidents, lambda: titles(slack), "the firing notification")
        primary = next(p for p in peers if p.position() == 0)  # the one that notified
        survivor = next(p for p in peers if p is not primary)
        primary.kill()

        resolve(item, time.time_ns())
        wait(alerting, incidents, lambda: len(titles(slack)) >= 2, "the resolve, from the survivor")
        assert not active(survivor)
        status = alerting.status()
        assert not status.ok
        assert primary.url in status.reason and survivor.url not in status.reason, status.reason
        urls = status.details["receivers"]["am"]["urls"]
        assert urls[survivor.url]["problem"] == ""
        assert alerting.pending()["am"] == 1  # the dead peer has not taken the resolve

        primary.start()  # back, with no alert in memory: the agent's retry tells it the end
        wait(alerting, incidents, lambda: alerting.pending()["am"] == 0,
             "the resolve accepted by the peer that came back")
        wait(alerting, incidents, lambda: alerting.status().ok, "the receiver healthy again")
        assert not active(primary)
        ticking(alerting, incidents, QUIET)
        assert [t.split("]")[0] for t in titles(slack)] == ["[FIRING:1", "[RESOLVED"], \
            titles(slack)
    finally:
        alerting.stop()


def test_a_silence_made_in_alertmanager_mutes_sloguards_alert(tmp_path, alertmanagers, slack):
    hook = slack.add_webhook("C0AMALERTS", HOOK_PATH)
    peers = alertmanagers(2, slack_config(hook, ["alertname"]),
                          peer_timeout=f"{PEER_TIMEOUT:g}s")
    silence = peers[0].add_silence(
        [{"name": "alertname", "value": "LSCpuStall", "isRegex": False, "isEqual": True}],
        comment="deploying web")
    incidents = Incidents()
    alerting = make(config(am_receiver(peers)), tmp_path, incidents)
    alerting.start()
    try:
        wait(alerting, incidents,
             lambda: any(s["id"] == silence for s in peers[1].silences()),
             "the silence gossiped to the other peer")
        now = time.time_ns()
        incidents.add(incident(1, at=now))  # silenced
        incidents.add(incident(2, rule="LSMemoryStall", pod="db-1", at=now))  # the control
        wait(alerting, incidents, lambda: titles(slack), "the control's notification")
        for peer in peers:
            alert = wait(alerting, incidents, lambda p=peer: active(p).get("web-1"),
                         f"the silenced alert on {peer.url}")
            assert alert["status"]["state"] == "suppressed"
            assert alert["status"]["silencedBy"] == [silence]
        ticking(alerting, incidents, QUIET)
        assert len(titles(slack)) == 1 and "LSMemoryStall" in titles(slack)[0], titles(slack)
        assert not any("LSCpuStall" in t for t in titles(slack))
    finally:
        alerting.stop()


def test_sizes_and_label_names_are_ones_alertmanager_takes(tmp_path, alertmanagers, slack):
    hook = slack.add_webhook("C0AMALERTS", HOOK_PATH)
    peers = alertmanagers(1, slack_config(hook, ["alertname"]))
    incidents = Incidents()
    alerting = make(config(am_receiver(peers, max_batch=64)), tmp_path, incidents)
    alerting.start()
    try:
        now = time.time_ns()
        odd = incident(0, at=now, **{"app.kubernetes.io/name": "web", "2fa": "x", "empty": ""})
        odd.annotations = {"description": "x" * 100_000, "runbook-url": "https://runbooks/1"}
        incidents.add(odd)
        for n in range(1, 150):
            incidents.add(incident(n, pod=f"web-{n}", at=now))
        wait(alerting, incidents, lambda: len(peers[0].alerts()) == 150, "150 alerts",
             timeout=60)
        assert alerting.status().ok, alerting.status().reason
        assert alerting.pending()["am"] == 0
        sent = alerting.senders["am"].peers[0].delivered
        assert sent >= 150
        got = next(a for a in peers[0].alerts() if a["labels"]["pod"] == "web-1" and
                   "app_kubernetes_io_name" in a["labels"])
        assert got["labels"]["app_kubernetes_io_name"] == "web"
        assert got["labels"]["_2fa"] == "x"
        assert "empty" not in got["labels"]
        assert len(got["annotations"]["description"]) == 4096
        assert got["annotations"]["runbook_url"] == "https://runbooks/1"
    finally:
        alerting.stop()


def test_the_agent_posts_its_incidents_and_their_resolve(tmp_path, alertmanagers, slack,
                                                        sloguard_bin):
    """The agent as users run it: its own RulesInvalid incident reaches Alertmanager, which
    notifies; fixing the rule file resolves it there too."""
    hook = slack.add_webhook("C0AMALERTS", HOOK_PATH)
    [peer] = alertmanagers(1, slack_config(hook, ["alertname"]))
    (tmp_path / "rules").mkdir()
    rule_file = tmp_path / "rules" / "e2e.yaml"
    rule_file.write_text(RULES)
    config = tmp_path / "sloguard.yaml"
    config.write_text(
        f"node_name: e2e-node\ninterval: 500ms\nrules:\n  paths: [{tmp_path / 'rules'}]\n"
        f"ui:\n  external_url: https://sloguard.example\n"
        f"alerting:\n  receivers:\n    - name: am\n"
        f"      alertmanager: {{urls: [{peer.url}], resend_interval: 2s, timeout: 3s}}\n"
        f"  route: {{receiver: am}}\n"
        f"collectors:\n  cgroups:\n    include: []\n")
    agent = AgentProcess(sloguard_bin, config, tmp_path / "data", tmp_path / "agent.log")
    try:
        ready = agent.get("/readyz").json()
        component = next(c for c in ready["components"] if c["name"] == "alerting")
        assert component["ok"], component
        assert component["details"]["receivers"]["am"]["mode"] == "alertmanager"

        rule_file.write_text(RULES.replace("window: 2s", "window: two"))
        os.utime(rule_file, (1, 1))
        [alert] = agent.wait_for(
            lambda: [a for a in peer.alerts() if a["labels"]["alertname"] == "RulesInvalid"],
            60, "RulesInvalid never reached Alertmanager")
        [incident] = agent.incidents(state="firing")
        assert alert["labels"]["node"] == "e2e-node"
        assert alert["generatorURL"] == f"https://sloguard.example/incidents/{incident['id']}"
        agent.wait_for(lambda: titles(slack), 30, "Alertmanager never notified")
        assert titles(slack)[0].startswith("[FIRING:1] RulesInvalid")

        rule_file.write_text(RULES)
        os.utime(rule_file, (2, 2))
        agent.wait_for(lambda: not peer.alerts(), 60, "the resolve never reached Alertmanager")
        agent.wait_for(lambda: len(titles(slack)) == 2, 30, "no resolve notification")
        assert titles(slack)[1].startswith("[RESOLVED] RulesInvalid")
        metrics = agent.get("/metrics").text
        assert 'sloguard_alert_messages_total{kind="alertmanager",receiver="am",result="sent"}' \
            in metrics
    finally:
        agent.terminate()


AM = "alerting:\n  receivers:\n    - name: am\n      alertmanager:\n"


@pytest.mark.parametrize(("text", "expected"), [
    (AM + "        urls: []\n  route: {receiver: am}\n",
     ":5: alerting.receivers.0.alertmanager.urls: List should have at least 1 item"),
    (AM + "        urls: [ftp://am:9093]\n  route: {receiver: am}\n",
     ":5: alerting.receivers.0.alertmanager.urls.0: must be an http:// or https:// URL"),
    (AM + "        urls: ['http://admin:SECRET@am:9093']\n  route: {receiver: am}\n",
     ":5: alerting.receivers.0.alertmanager.urls.0: no credentials in the URL"),
    (AM + "        urls: [http://am:9093/api/v2/alerts]\n  route: {receiver: am}\n",
     ":5: alerting.receivers.0.alertmanager.urls.0: the base URL: /api/v2/alerts is added"),
    (AM + "        urls: [http://am:9093, 'http://am:9093/']\n  route: {receiver: am}\n",
     ":5: alerting.receivers.0.alertmanager.urls: each Alertmanager once: http://am:9093"),
    (AM + "        urls: [http://am:9093]\n        labels: {k8s.cluster: prod}\n"
     "  route: {receiver: am}\n",
     ":6: alerting.receivers.0.alertmanager.labels: 'k8s.cluster' is not a label name"),
    (AM + "        urls: [http://am:9093]\n        resend_interval: 0s\n"
     "  route: {receiver: am}\n",
     ":6: alerting.receivers.0.alertmanager.resend_interval: Input should be greater than 0"),
    (AM + "        url: http://am:9093\n  route: {receiver: am}\n",
     ":5: alerting.receivers.0.alertmanager.url: unknown setting"),
    (AM + "        urls: [http://am:9093]\n      slack: {webhook_url_env: HOOK}\n"
     "  route: {receiver: am}\n",
     ":3: alerting.receivers.0: one integration per receiver: `slack` or `alertmanager`"),
    (AM + "        urls: [http://am:9093]\n  route: {receiver: am, group_wait: 10s}\n",
     ":6: alerting.route: group_wait: receiver 'am' is an Alertmanager, which groups"),
    (AM + "        urls: [http://am:9093]\n    - name: sre\n      slack: {webhook_url_env: H}\n"
     "  route:\n    receiver: sre\n    routes:\n      - receiver: am\n        group_by: [node]\n",
     ":8: alerting.route: routes.0.group_by: receiver 'am' is an Alertmanager"),
])
def test_configuration_errors_name_the_field(tmp_path, text, expected):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_settings(cfg)
    assert f"{cfg}{expected}" in str(err.value), str(err.value)
    assert "SECRET" not in str(err.value)


def test_a_good_alertmanager_receiver_loads_with_its_defaults(tmp_path):
    cfg = tmp_path / "good.yaml"
    cfg.write_text(AM + "        urls: ['http://am-0:9093/', https://am-1.example/am]\n"
                   "    - name: sre\n      slack: {webhook_url_env: H}\n"
                   "  route:\n    receiver: am\n    group_by: [alertname]\n    routes:\n"
                   "      - {matchers: [severity=info], receiver: sre}\n")
    am = load_settings(cfg).settings.alerting.receivers[0].alertmanager
    assert am.urls == ["http://am-0:9093", "https://am-1.example/am"]
    assert (am.resend_interval, am.timeout, am.max_batch, am.labels) == (60.0, 10.0, 64, {})
