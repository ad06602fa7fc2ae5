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

import http.server
import os
import re
import secrets
import subprocess
import threading
import time
from types import SimpleNamespace
from typing import Any

import pytest
from support.alerting import Incidents, incident, make, resolve
from support.alertmanager import make_pki, slack_config
from support.slack_server import SlackServer
from test_agent_e2e import RULES, AgentProcess

from sloguard.actuators.alerting.am_http import AlertmanagerClient, Answer
from sloguard.actuators.alerting.config import AlertingConfig, AlertmanagerConfig
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
        # Alertmanager HA is at-least-once: a peer killed before its notification log has
        # gossiped makes the survivor notify too, one peer-timeout later (CI met it once).
        # What this test checks is the resolve, so the kill comes after the survivor's own
        # flush of the firing has been deduplicated.
        ticking(alerting, incidents, PEER_TIMEOUT + 2)
        assert [t.split("]")[0] for t in titles(slack)] == ["[FIRING:1"], titles(slack)
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
        assert urls[primary.url]["failure"] == "unreachable"
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


# -- authentication and TLS -------------------------------------------------------------------


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_pki(tmp_path_factory.mktemp("pki"))


def receiver_state(alerting: Any, name: str, url: str) -> dict[str, Any]:
    return alerting.status().details["receivers"][name]["urls"][url]


def test_basic_auth_a_wrong_password_is_an_auth_failure_until_the_secret_is_fixed(
        tmp_path, alertmanagers, slack, caplog):
    import bcrypt  # a test dependency: missing, this fails (a skip would hide the check)
    password = "pw-" + secrets.token_hex(12)
    hashed = bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=4)).decode()
    hook = slack.add_webhook("C0AMALERTS", HOOK_PATH)
    [peer] = alertmanagers(1, slack_config(hook, ["alertname", "pod"]),
                           web_config={"basic_auth_users": {"sloguard": hashed}},
                           credentials=("sloguard", password), clustered=False)
    peer.credentials = None
    assert peer.post_alerts([])[0] == 401  # it does want them
    peer.credentials = ("sloguard", password)
    secret = tmp_path / "password"  # a mounted Secret's key
    secret.write_text(password + "\n")
    incidents = Incidents()
    alerting = make(config(am_receiver([peer], basic_auth={
        "username": "sloguard", "password_file": str(secret)})), tmp_path, incidents)
    alerting.start()
    try:
        incidents.add(incident(1, at=time.time_ns()))
        wait(alerting, incidents, lambda: titles(slack), "the notification, through basic auth")
        assert alerting.status().ok, alerting.status().reason

        secret.write_text("not-the-password\n")  # a bad rotation
        incidents.add(incident(2, pod="web-2", at=time.time_ns()))
        wait(alerting, incidents,
             lambda: receiver_state(alerting, "am", peer.url)["failure"] == "auth",
             "the auth failure reported")
        status = alerting.status()
        assert not status.ok
        assert f"{peer.url}: authentication refused: HTTP 401" in status.reason, status.reason
        ticking(alerting, incidents, 2)  # retried meanwhile (backoff 0.2 s to 1 s), refused
        assert alerting.pending()["am"] == 1  # kept, not dropped
        assert set(active(peer)) == {"web-1"}
        assert len(titles(slack)) == 1

        secret.write_text(password)  # fixed: used at the next retry, no restart
        wait(alerting, incidents, lambda: set(active(peer)) == {"web-1", "web-2"},
             "the second alert, once the password is right")
        wait(alerting, incidents, lambda: len(titles(slack)) == 2, "its notification")
        wait(alerting, incidents, lambda: alerting.status().ok, "the receiver healthy again")
        assert receiver_state(alerting, "am", peer.url)["failure"] == ""
        assert alerting.pending()["am"] == 0
        shown = f"{alerting.status()}{caplog.text}"
        assert password not in shown and "not-the-password" not in shown
    finally:
        alerting.stop()


def tls_receivers(peer: Any, **receivers: dict[str, Any]) -> AlertingConfig:
    """One alertmanager receiver per keyword (its tls_config), every alert routed to each."""
    names = list(receivers)
    return AlertingConfig.model_validate({
        "receivers": [am_receiver([peer], name, tls_config=tls)
                      for name, tls in receivers.items()],
        "route": {"receiver": names[0], "routes": [{"receiver": name, "continue": True}
                                                   for name in names]}})


def test_tls_with_a_ca_and_server_name_delivers_and_a_wrong_ca_or_name_is_refused(
        tmp_path, alertmanagers, slack, pki):
    hook = slack.add_webhook("C0AMALERTS", HOOK_PATH)
    [peer] = alertmanagers(1, slack_config(hook, ["alertname"]), web_config={
        "tls_server_config": {"cert_file": pki["server_cert"], "key_file": pki["server_key"]}},
        clustered=False)
    assert peer.url.startswith("https://127.0.0.1:")  # the certificate names alertmanager.test
    incidents = Incidents()
    alerting = make(tls_receivers(
        peer,
        good={"ca_file": pki["ca"], "server_name": "alertmanager.test"},
        other_ca={"ca_file": pki["other_ca"], "server_name": "alertmanager.test"},
        no_name={"ca_file": pki["ca"]},
        system_ca={"server_name": "alertmanager.test"},
    ), tmp_path, incidents)
    alerting.start()
    try:
        incidents.add(incident(1, at=time.time_ns()))
        wait(alerting, incidents, lambda: titles(slack), "the notification, over TLS")
        wait(alerting, incidents, lambda: all(
            receiver_state(alerting, name, peer.url)["failure"] == "tls"
            for name in ("other_ca", "no_name", "system_ca")), "the three refusals")
        state = {name: receiver_state(alerting, name, peer.url)
                 for name in ("good", "other_ca", "no_name", "system_ca")}
        assert state["good"]["problem"] == "" and state["good"]["delivered"] >= 1, state
        assert "certificate not trusted: unable to get local issuer certificate" in \
            state["other_ca"]["problem"], state
        assert "certificate not trusted: IP address mismatch" in state["no_name"]["problem"]
        assert "certificate not trusted" in state["system_ca"]["problem"]
        assert alerting.pending() == {"good": 0, "other_ca": 1, "no_name": 1, "system_ca": 1}
    finally:
        alerting.stop()


def test_a_client_certificate_is_what_alertmanager_requires(tmp_path, alertmanagers, slack,
                                                            pki):
    hook = slack.add_webhook("C0AMALERTS", HOOK_PATH)
    [peer] = alertmanagers(
        1, slack_config(hook, ["alertname"]),
        web_config={"tls_server_config": {
            "cert_file": pki["server_cert"], "key_file": pki["server_key"],
            "client_auth_type": "RequireAndVerifyClientCert", "client_ca_file": pki["ca"]}},
        client_cert=(pki["client_cert"], pki["client_key"]), clustered=False)
    server = {"ca_file": pki["ca"], "server_name": "alertmanager.test"}
    incidents = Incidents()
    alerting = make(tls_receivers(
        peer, with_cert={**server, "cert_file": pki["client_cert"],
                         "key_file": pki["client_key"]},
        without=server), tmp_path, incidents)
    alerting.start()
    try:
        incidents.add(incident(1, at=time.time_ns()))
        wait(alerting, incidents, lambda: titles(slack), "the notification, with the cert")
        wait(alerting, incidents,
             lambda: receiver_state(alerting, "without", peer.url)["failure"] == "tls",
             "the refusal without a client certificate")
        assert receiver_state(alerting, "with_cert", peer.url)["problem"] == ""
        assert alerting.pending() == {"with_cert": 0, "without": 1}
        problem = receiver_state(alerting, "without", peer.url)["problem"]
        # Go's alert, or the connection closed before the client read it (a race)
        assert re.search(r"^TLS: the server (refused the handshake: bad certificate|closed "
                         r"the connection during TLS) \(does it want a client certificate\? "
                         r"tls_config.cert_file, key_file\)", problem), problem
    finally:
        alerting.stop()


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
    (AM + "        urls: [http://am:9093]\n        basic_auth: {username: u, password: SECRET}\n"
     "  route: {receiver: am}\n",
     ":6: alerting.receivers.0.alertmanager.basic_auth: a secret written in the config file "
     "shows wherever the file goes (a ConfigMap, git): use password_file"),
    (AM + "        urls: [http://am:9093]\n        basic_auth: {username: u}\n"
     "  route: {receiver: am}\n",
     ":6: alerting.receivers.0.alertmanager.basic_auth: give exactly one of password_file, "
     "password_env"),
    (AM + "        urls: [http://am:9093]\n        basic_auth: {username: 'a:b', password_env: P}"
     "\n  route: {receiver: am}\n",
     ":6: alerting.receivers.0.alertmanager.basic_auth.username: no ':' (basic auth joins"),
    (AM + "        urls: [http://am:9093]\n        basic_auth: {password_env: P}\n"
     "  route: {receiver: am}\n",
     ":6: alerting.receivers.0.alertmanager.basic_auth.username: Field required"),
    (AM + "        urls: [http://am:9093]\n        basic_auth: {username: u, password_env: P}\n"
     "        authorization: {credentials_file: /t}\n  route: {receiver: am}\n",
     ":4: alerting.receivers.0.alertmanager: give basic_auth or authorization, not both"),
    (AM + "        urls: [http://am:9093]\n        authorization: {credentials: SECRET}\n"
     "  route: {receiver: am}\n",
     ":6: alerting.receivers.0.alertmanager.authorization: a secret written in the config file"),
    (AM + "        urls: [http://am:9093]\n        authorization:\n          type: Basic\n"
     "          credentials_env: T\n  route: {receiver: am}\n",
     ":7: alerting.receivers.0.alertmanager.authorization.type: use `basic_auth` for Basic"),
    (AM + "        urls: [https://am:9093]\n        tls_config: {cert_file: /c.pem}\n"
     "  route: {receiver: am}\n",
     ":6: alerting.receivers.0.alertmanager.tls_config: cert_file and key_file go together"),
    (AM + "        urls: [https://am:9093]\n        tls_config:\n          ca_file: /ca.pem\n"
     "          insecure: true\n  route: {receiver: am}\n",
     ":8: alerting.receivers.0.alertmanager.tls_config.insecure: unknown setting"),
    (AM + "        urls: [http://am:9093]\n        tls_config: {ca_file: /ca.pem}\n"
     "  route: {receiver: am}\n",
     ":4: alerting.receivers.0.alertmanager: tls_config is set but no URL is https://"),
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


def test_auth_and_tls_settings_load_and_config_show_shows_no_secret(tmp_path, sloguard_bin,
                                                                   monkeypatch):
    password = tmp_path / "password"
    password.write_text("SECRET-in-the-file")
    monkeypatch.setenv("AM_TOKEN", "SECRET-in-the-env")
    cfg = tmp_path / "good.yaml"
    cfg.write_text(
        AM + "        urls: [https://am-0:9093]\n"
        f"        basic_auth: {{username: sloguard, password_file: {password}}}\n"
        "        tls_config: {ca_file: /ca.pem, cert_file: /c.pem, key_file: /c.key, "
        "server_name: am.example}\n"
        "    - name: proxied\n      alertmanager:\n        urls: [http://127.0.0.1:9094]\n"
        "        authorization: {credentials_env: AM_TOKEN}\n"
        "  route: {receiver: am, routes: [{receiver: proxied}]}\n")
    receivers = load_settings(cfg).settings.alerting.receivers
    am, proxied = receivers[0].alertmanager, receivers[1].alertmanager
    assert (am.basic_auth.username, am.basic_auth.password_file) == ("sloguard", str(password))
    assert (am.tls_config.server_name, am.tls_config.insecure_skip_verify) == (
        "am.example", False)
    assert (proxied.authorization.type, proxied.authorization.credentials_env) == (
        "Bearer", "AM_TOKEN")
    for args in ([], ["--json"]):
        shown = subprocess.run([sloguard_bin, "config", "show", "-c", str(cfg), *args],
                               capture_output=True, text=True, check=True).stdout
        assert "SECRET" not in shown
        assert "basic_auth" in shown and str(password) in shown  # where, not what


class _Proxy(http.server.BaseHTTPRequestHandler):
    """A proxy in front of Alertmanager that wants a bearer token (kube-rbac-proxy's role),
    or redirects (the credentials must not follow)."""

    token = ""
    posts: list[str] = []  # noqa: RUF012 - the test's record

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        self.posts.append(self.path)
        if self.path.startswith("/moved"):
            self.send_response(307)
            self.send_header("Location", f"http://127.0.0.1:{self.server.server_port}/elsewhere")
        elif self.headers.get("Authorization") != f"Bearer {self.token}":
            self.send_response(403)
        else:
            self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


def test_a_bearer_token_from_the_environment_is_read_again_and_redirects_are_not_followed(
        tmp_path, monkeypatch, caplog):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Proxy)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_port}"
    _Proxy.token, _Proxy.posts = "SECRET-token-2", []
    monkeypatch.setenv("SLOGUARD_TEST_AM_TOKEN", "SECRET-token-1")
    incidents = Incidents()
    alerting = make(AlertingConfig.model_validate({
        "receivers": [am_receiver([SimpleNamespace(url=base)], "proxied", authorization={
            "credentials_env": "SLOGUARD_TEST_AM_TOKEN"}),
            am_receiver([SimpleNamespace(url=base + "/moved")], "moved")],
        "route": {"receiver": "proxied", "routes": [{"receiver": "proxied", "continue": True},
                                                    {"receiver": "moved"}]}}),
        tmp_path, incidents)
    alerting.start()
    try:
        incidents.add(incident(1, at=time.time_ns()))
        wait(alerting, incidents, lambda: receiver_state(
            alerting, "proxied", base)["failure"] == "auth", "the 403 as an auth failure")
        assert "authentication refused: HTTP 403" in alerting.status().reason
        monkeypatch.setenv("SLOGUARD_TEST_AM_TOKEN", "SECRET-token-2")  # rotated
        wait(alerting, incidents, lambda: alerting.pending()["proxied"] == 0,
             "delivered with the new token")
        moved = wait(alerting, incidents, lambda: receiver_state(
            alerting, "moved", base + "/moved")["failure"] == "http" and receiver_state(
            alerting, "moved", base + "/moved"), "the redirect as an http failure")
        assert "HTTP 307" in moved["problem"], moved
        assert "redirects are not followed" in moved["problem"]
        assert "/elsewhere" not in _Proxy.posts
        assert "SECRET" not in f"{alerting.status()}{caplog.text}"
    finally:
        alerting.stop()
        server.shutdown()
        server.server_close()


def test_unreadable_credentials_and_tls_files_are_named_failures(tmp_path, monkeypatch):
    """What /readyz says before any server answers: the setting and the path to fix."""
    def post(**settings: Any) -> Any:
        client = AlertmanagerClient(AlertmanagerConfig(urls=["https://127.0.0.1:1"],
                                                       **settings), "test")
        return client.post("https://127.0.0.1:1/api/v2/alerts", b"[]", 1.0)

    not_pem = tmp_path / "not.pem"
    not_pem.write_text("no certificate here\n")
    monkeypatch.delenv("SLOGUARD_TEST_AM_PW", raising=False)
    assert post(basic_auth={"username": "u", "password_file": str(tmp_path / "gone")}) == \
        Answer(0, f"authentication: cannot read the credentials: password_file "
                  f"{tmp_path / 'gone'}: No such file or directory", "auth")
    assert post(basic_auth={"username": "u", "password_env": "SLOGUARD_TEST_AM_PW"}).text == \
        ("authentication: cannot read the credentials: password_env: the variable "
         "SLOGUARD_TEST_AM_PW is not set")
    two_lines = tmp_path / "token"
    two_lines.write_text("SECRET-line-1\nSECRET-line-2\n")
    answer = post(authorization={"credentials_file": str(two_lines)})
    assert answer.failure == "auth" and "a line break" in answer.text
    assert "SECRET" not in answer.text
    assert post(tls_config={"ca_file": str(tmp_path / "gone")}) == Answer(
        0, f"tls_config.ca_file {tmp_path / 'gone'}: No such file or directory", "tls")
    answer = post(tls_config={"ca_file": str(not_pem)})
    assert answer.failure == "tls" and answer.text.startswith(f"tls_config.ca_file {not_pem}: ")
    answer = post(tls_config={"cert_file": str(not_pem), "key_file": str(not_pem)})
    assert answer.failure == "tls" and "cert_file" in answer.text
    assert post().failure == "unreachable"  # nothing listens on port 1
