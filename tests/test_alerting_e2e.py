"""The agent as users run it, alerting to the local Slack-contract server.

An LS cgroup under CPU load fires an incident whose policy's notify rung hands it to Slack: one
message, updated as the ladder escalates and when it resolves, with the timeline in its thread.
And an agent killed with SIGKILL while Slack holds its post's answer does not post twice.
"""

from __future__ import annotations

import json
import os
import signal

from support.slack_server import SlackServer
from test_agent_e2e import RULES, AgentProcess

CHANNEL = "C0E2E00001"
POLICY = """\
policies:
  - name: e2e
    undo_hold: 1s
    steps:
      - step: notify
      - step: cordon
        after: 2s
"""


def _config(tmp_path, slack, extra: str = "") -> str:
    token = tmp_path / "slack-token"
    token.write_text(slack.token + "\n")
    return (
        f"node_name: e2e-node\n"
        f"interval: 500ms\n"
        f"rules:\n  paths: [{tmp_path / 'rules'}]\n"
        f"actuators:\n  policies: [{tmp_path / 'policies'}]\n"
        f"ui:\n  external_url: https://sloguard.example\n"
        f"alerting:\n"
        f"  receivers:\n"
        f"    - name: sre\n"
        f"      slack: {{bot_token_file: {token}, channel: {CHANNEL}, api_url: {slack.api_url},"
        f" min_interval: 0, timeout: 3}}\n"
        f"  route: {{receiver: sre, group_by: [alertname, node], group_wait: 1s,"
        f" group_interval: 2s}}\n"
        f"{extra}")


def _files(tmp_path, rules: str) -> None:
    (tmp_path / "rules").mkdir()
    (tmp_path / "rules" / "e2e.yaml").write_text(rules)
    (tmp_path / "policies").mkdir()
    (tmp_path / "policies" / "e2e.yaml").write_text(POLICY)


def test_incident_fires_escalates_and_resolves_in_one_slack_message(
        tmp_path, real_cgroups, sloguard_bin):
    svc = real_cgroups.create("svc")
    _files(tmp_path, RULES.replace("policy: ls-interference", "policy: e2e"))
    config = tmp_path / "sloguard.yaml"
    with SlackServer() as slack:
        slack.add_channel(CHANNEL, "alerts")
        config.write_text(_config(tmp_path, slack) + (
            f"collectors:\n  cgroups:\n    include: []\n    rediscover: 1s\n"
            f"    declare:\n      - {{path: '{svc}', class: LS, name: svc}}\n"))
        agent = AgentProcess(sloguard_bin, config, tmp_path / "data", tmp_path / "agent.log")
        try:
            ready = agent.get("/readyz").json()
            alerting = next(c for c in ready["components"] if c["name"] == "alerting")
            assert alerting["ok"] and alerting["details"]["receivers"]["sre"]["mode"] == "web api"
            assert slack.token not in json.dumps(ready)

            hog = real_cgroups.spawn(svc)
            [post] = agent.wait_for(lambda: slack.top_level(CHANNEL), 40, "no Slack message")
            [incident] = agent.incidents(state="firing")
            assert post.text == ":large_orange_circle: [FIRING:1] LSBusy on e2e-node"
            body = json.dumps(post.blocks, ensure_ascii=False)
            assert "*LSBusy* · warning · node `e2e-node` · firing" in body
            assert "against threshold 0.5" in body and "firing since" in body
            assert f"https://sloguard.example/incidents/{incident['id']}" in body
            notify = next(a for a in incident["actions"] if a["step"] == "notify")
            assert (notify["status"], notify["dry_run"]) == ("done", True)

            # the next rung (cordon: skipped, no Kubernetes here) updates the same message
            agent.wait_for(lambda: post.updates, 30, "no update after the cordon rung")
            reply = agent.wait_for(lambda: slack.replies(post.ts), 10, "no thread reply")
            assert "cordon skipped" in reply[0].text

            hog.kill()
            hog.wait()
            agent.wait_for(lambda: agent.incidents(state="resolved"), 30, "never resolved")
            agent.wait_for(lambda: post.text.startswith(":white_check_mark: [RESOLVED]"), 20,
                           "the message never showed the resolve")
            agent.wait_for(lambda: slack.replies(post.ts)[-1].text.startswith(
                ":white_check_mark: All resolved"), 10, "no resolve in the thread")
            assert len(slack.top_level()) == 1  # one message for the whole episode
            metrics = agent.get("/metrics").text
            assert 'sloguard_alert_messages_total{kind="post",receiver="sre",result="sent"} 1.0' \
                in metrics
        finally:
            agent.terminate()
        assert slack.token not in (tmp_path / "agent.log").read_text()


def test_agent_killed_mid_send_does_not_post_twice(tmp_path, sloguard_bin):
    _files(tmp_path, RULES)
    with SlackServer() as slack:
        slack.add_channel(CHANNEL, "alerts")
        config = tmp_path / "sloguard.yaml"
        config.write_text(_config(tmp_path, slack) + "collectors:\n  cgroups:\n    include: []\n")
        log = tmp_path / "agent.log"
        agent = AgentProcess(sloguard_bin, config, tmp_path / "data", log)
        rule_file = tmp_path / "rules" / "e2e.yaml"
        slack.fault("chat.postMessage", hold=True)
        try:
            rule_file.write_text(RULES.replace("window: 2s", "window: two"))  # RulesInvalid
            os.utime(rule_file, (1, 1))
            assert slack.held.wait(60), log.read_text()[-3000:]
            assert len(slack.messages) == 1  # Slack posted; the agent never got the answer
            agent.proc.send_signal(signal.SIGKILL)
            agent.proc.wait(10)
        finally:
            if agent.proc.poll() is None:
                agent.proc.kill()
            slack.release()
        agent = AgentProcess(sloguard_bin, config, tmp_path / "data", log)
        try:
            agent.wait_for(lambda: slack.calls("conversations.history"), 30,
                           "the restarted agent never checked for its earlier post")
            [post] = slack.messages
            assert post.text == ":large_orange_circle: [FIRING:1] RulesInvalid on e2e-node"
            rule_file.write_text(RULES)  # fixed: the incident resolves, on the same message
            os.utime(rule_file, (2, 2))
            agent.wait_for(lambda: post.text.startswith(":white_check_mark:"), 40,
                           "the resolve never reached the message")
            # The thread reply is its own outbox entry, sent after the update.
            agent.wait_for(lambda: len(slack.calls("chat.postMessage")) >= 2, 20,
                           "the resolve's thread reply never came")
            assert len(slack.top_level()) == 1
            assert len(slack.calls("chat.postMessage")) == 2  # the post, and the thread reply
        finally:
            agent.terminate()
