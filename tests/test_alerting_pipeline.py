"""Alertmanager semantics through the real senders to the local Slack-contract server:
grouping, group_interval updates, repeats, resolves, silences, inhibition, routing, policy
hand-over, and what the messages say. Every assertion counts the messages Slack received."""

from __future__ import annotations

import json

import pytest
from support.alerting import (
    T0,
    Incidents,
    S,
    act,
    alerting_config,
    bot_receiver,
    drained,
    incident,
    make,
    resolve,
    run,
    webhook_receiver,
)
from support.slack_server import SlackServer

CHANNEL = "C0ALERTS01"


@pytest.fixture
def slack():
    with SlackServer() as server:
        server.add_channel(CHANNEL, "alerts")
        server.add_channel("C0ONCALL01", "oncall")
        yield server


@pytest.fixture
def pipelines(tmp_path):
    made = []

    def build(config, incidents=None, **kwargs):
        alerting = make(config, tmp_path, incidents, **kwargs)
        alerting.start()
        made.append(alerting)
        return alerting

    yield build
    for alerting in made:
        alerting.stop()
        alerting.db.close()


def texts(messages) -> list[str]:
    return [m["text"] if isinstance(m, dict) else m.text for m in messages]


def test_group_wait_gathers_incidents_into_one_message_then_updates_and_resolves(
        slack, pipelines):
    incidents = Incidents()
    alerting = pipelines(alerting_config([bot_receiver(slack)]), incidents)
    for n in range(3):  # three pods hit within group_wait (10s): one message
        incidents.add(incident(n, pod=f"web-{n}", at=T0 + n * S))
        alerting.tick(T0 + n * S, incidents.firing())
    run(alerting, incidents, T0 + 3 * S, T0 + 9 * S)
    drained(alerting)
    assert slack.messages == []  # nothing before group_wait has passed
    alerting.tick(T0 + 10 * S, incidents.firing())
    drained(alerting)
    [post] = slack.top_level(CHANNEL)
    assert post.text.startswith(":large_orange_circle: [FIRING:3] LSCpuStall on worker-7")
    body = json.dumps(post.blocks)
    assert all(f"web-{n}" in body for n in range(3))
    assert post.metadata["event_type"] == "sloguard_alert"

    # nothing new: no message on the next group_interval flushes (dedup)
    run(alerting, incidents, T0 + 11 * S, T0 + 130 * S, 5 * S)
    drained(alerting)
    assert len(slack.messages) == 1 and post.updates == []

    # an escalation: the message is updated in place, the timeline gets a thread reply
    act(incidents.get("inc-001"), T0 + 131 * S, "cordon")
    run(alerting, incidents, T0 + 131 * S, T0 + 190 * S, 5 * S)
    drained(alerting)
    assert len(slack.top_level()) == 1 and len(post.updates) == 1
    [reply] = slack.replies(post.ts)
    assert "cordon proposed (dry-run)" in reply.text and "web-1" in reply.text
    assert "cordon proposed (dry-run) node/worker-7" in json.dumps(post.updates[-1]["blocks"])

    # a new pod joins the group at the next flush (group_interval), not at once
    [group] = alerting.dispatcher.groups.values()
    due = group.next_flush_ns
    incidents.add(incident(3, pod="web-3", at=due - 20 * S))
    run(alerting, incidents, due - 20 * S, due - S)
    drained(alerting)
    assert len(post.updates) == 1
    alerting.tick(due, incidents.firing())
    drained(alerting)
    assert len(post.updates) == 2 and post.text.startswith(":large_orange_circle: [FIRING:4]")
    assert "web-3" in slack.replies(post.ts)[-1].text

    # all resolved: one last update (RESOLVED) and "all resolved" in the thread
    for item in incidents.firing():
        resolve(item, due + S)
    run(alerting, incidents, due + S, due + 200 * S, 5 * S)
    drained(alerting)
    assert len(slack.top_level()) == 1 and len(post.updates) == 3
    assert post.text.startswith(":white_check_mark: [RESOLVED] LSCpuStall on worker-7")
    last = slack.replies(post.ts)[-1]
    assert last.text.startswith(":white_check_mark: All resolved")
    assert len(slack.replies(post.ts)) == 3
    assert alerting.dispatcher.groups == {}

    # the next episode is a new message, not an update of the old one
    incidents.add(incident(9, pod="web-9", at=T0 + 500 * S))
    run(alerting, incidents, T0 + 500 * S, T0 + 512 * S)
    drained(alerting)
    assert len(slack.top_level()) == 2 and len(post.updates) == 3


def test_group_by_separates_groups(slack, pipelines):
    incidents = Incidents()
    alerting = pipelines(alerting_config([bot_receiver(slack)]), incidents)
    incidents.add(incident(1, node="worker-7"))
    incidents.add(incident(2, node="worker-8"))
    incidents.add(incident(3, rule="LSMemoryStall", node="worker-7"))
    incidents.add(incident(4, node="worker-7", pod="web-2"))
    run(alerting, incidents, T0, T0 + 10 * S)
    drained(alerting)
    titles = sorted(texts(slack.top_level()))
    assert titles == [":large_orange_circle: [FIRING:1] LSCpuStall on worker-8",
                      ":large_orange_circle: [FIRING:1] LSMemoryStall on worker-7",
                      ":large_orange_circle: [FIRING:2] LSCpuStall on worker-7"]


def test_repeat_interval_renotifies_in_the_thread_and_the_channel(slack, pipelines):
    incidents = Incidents()
    config = alerting_config([bot_receiver(slack)], {
        "receiver": "sre", "group_interval": "1m", "repeat_interval": "10m"})
    alerting = pipelines(config, incidents)
    incidents.add(incident(1))
    run(alerting, incidents, T0, T0 + 10 * S)
    drained(alerting)
    [post] = slack.top_level()
    run(alerting, incidents, T0 + 11 * S, T0 + 590 * S, 10 * S)  # < repeat_interval
    drained(alerting)
    assert slack.replies(post.ts) == []
    run(alerting, incidents, T0 + 600 * S, T0 + 680 * S, 10 * S)
    drained(alerting)
    [repeat] = slack.replies(post.ts)
    assert repeat.text.startswith(":alarm_clock: Still firing: 1 alert(s), last notified 10m")
    assert repeat.reply_broadcast  # a repeat reaches the channel, not only the thread
    run(alerting, incidents, T0 + 690 * S, T0 + 1300 * S, 10 * S)
    drained(alerting)
    assert len(slack.replies(post.ts)) == 2 and len(slack.top_level()) == 1


def test_webhook_each_notification_is_a_message(slack, pipelines):
    incidents = Incidents()
    alerting = pipelines(alerting_config([webhook_receiver(slack)]), incidents)
    incidents.add(incident(1))
    incidents.add(incident(2, pod="web-2"))
    run(alerting, incidents, T0, T0 + 10 * S)
    drained(alerting)
    assert texts(slack.webhook_messages) == [
        ":large_orange_circle: [FIRING:2] LSCpuStall on worker-7"]
    resolve(incidents.get("inc-001"), T0 + 20 * S)
    run(alerting, incidents, T0 + 11 * S, T0 + 75 * S, 5 * S)
    drained(alerting)
    assert texts(slack.webhook_messages)[1:] == [
        ":large_orange_circle: [FIRING:1, 1 resolved] LSCpuStall on worker-7"]
    resolve(incidents.get("inc-002"), T0 + 80 * S)
    run(alerting, incidents, T0 + 80 * S, T0 + 200 * S, 5 * S)
    drained(alerting)
    assert texts(slack.webhook_messages)[2:] == [
        ":white_check_mark: [RESOLVED] LSCpuStall on worker-7"]
    assert len(slack.webhook_messages) == 3


def test_send_resolved_false_updates_silently(slack, pipelines):
    incidents = Incidents()
    receivers = [bot_receiver(slack, send_resolved=False),
                 webhook_receiver(slack, send_resolved=False)]
    config = alerting_config(receivers, {"receiver": "sre", "routes": [
        {"receiver": "hook", "continue": True}, {"receiver": "sre"}]})
    alerting = pipelines(config, incidents)
    incidents.add(incident(1))
    run(alerting, incidents, T0, T0 + 10 * S)
    resolve(incidents.get("inc-001"), T0 + 20 * S)
    run(alerting, incidents, T0 + 20 * S, T0 + 100 * S, 5 * S)
    drained(alerting)
    [post] = slack.top_level(CHANNEL)
    assert len(slack.webhook_messages) == 1  # the webhook is not told
    assert post.text.startswith(":white_check_mark:") and slack.replies(post.ts) == []


def test_routing_by_labels_and_continue(slack, pipelines):
    incidents = Incidents()
    receivers = [bot_receiver(slack), bot_receiver(slack, "oncall", "C0ONCALL01"),
                 {"name": "blackhole"}]
    config = alerting_config(receivers, {"receiver": "sre", "routes": [
        {"matchers": ['severity="critical"'], "receiver": "oncall", "continue": True},
        {"matchers": ["rulegroup=noise"], "receiver": "blackhole"},
        {"receiver": "sre"},  # as in Alertmanager: the parent takes only what no child took
    ]})
    alerting = pipelines(config, incidents)
    incidents.add(incident(1, severity="critical"))
    incidents.add(incident(2, rule="NodeCpuPressure", severity="info"))
    noisy = incidents.add(incident(3, rule="Chatty"))
    noisy.group = "noise"
    run(alerting, incidents, T0, T0 + 10 * S)
    drained(alerting)
    oncall = slack.top_level("C0ONCALL01")
    sre = slack.top_level(CHANNEL)
    assert texts(oncall) == [":red_circle: [FIRING:1] LSCpuStall on worker-7"]
    # `continue`: the critical alert also reaches the default route; the noise nobody
    assert sorted(texts(sre)) == [":large_blue_circle: [FIRING:1] NodeCpuPressure on worker-7",
                                  ":red_circle: [FIRING:1] LSCpuStall on worker-7"]
    assert "Chatty" not in json.dumps([m.blocks for m in slack.messages])


def test_silence_mutes_until_it_expires(slack, pipelines):
    incidents = Incidents()
    alerting = pipelines(alerting_config([bot_receiver(slack)]), incidents)
    silence = alerting.silences.add(['alertname="LSCpuStall"', 'pod=~"web-.*"'],
                                    T0 + 300 * S, "alice", "deploying web", now_ns=T0 - S)
    incidents.add(incident(1, pod="web-1"))
    incidents.add(incident(2, pod="db-1", rule="LSMemoryStall"))
    run(alerting, incidents, T0, T0 + 200 * S, 5 * S)
    drained(alerting)
    assert texts(slack.top_level()) == [
        ":large_orange_circle: [FIRING:1] LSMemoryStall on worker-7"]
    alerting.silences.expire(silence.id, now_ns=T0 + 201 * S)
    run(alerting, incidents, T0 + 201 * S, T0 + 280 * S, 5 * S)
    drained(alerting)
    titles = sorted(texts(slack.top_level()))
    assert titles == [":large_orange_circle: [FIRING:1] LSCpuStall on worker-7",
                      ":large_orange_circle: [FIRING:1] LSMemoryStall on worker-7"]
    # and a silence that simply runs out does the same
    alerting.silences.add(["pod=db-2"], T0 + 400 * S, "bob", "maintenance", now_ns=T0 + 280 * S)
    incidents.add(incident(3, pod="db-2", rule="Disk"))
    run(alerting, incidents, T0 + 285 * S, T0 + 395 * S, 5 * S)
    drained(alerting)
    assert len(slack.top_level()) == 2
    run(alerting, incidents, T0 + 400 * S, T0 + 470 * S, 5 * S)
    drained(alerting)
    assert len(slack.top_level()) == 3


def test_a_silenced_alert_that_was_notified_still_reports_its_resolve(slack, pipelines):
    incidents = Incidents()
    alerting = pipelines(alerting_config([bot_receiver(slack)]), incidents)
    incidents.add(incident(1))
    run(alerting, incidents, T0, T0 + 10 * S)
    alerting.silences.add(["pod=web-1"], T0 + 3600 * S, "alice", "known", now_ns=T0 + 11 * S)
    run(alerting, incidents, T0 + 11 * S, T0 + 200 * S, 10 * S)
    drained(alerting)
    [post] = slack.top_level()
    assert post.updates == []  # muting is not news
    resolve(incidents.get("inc-001"), T0 + 210 * S)
    run(alerting, incidents, T0 + 210 * S, T0 + 300 * S, 10 * S)
    drained(alerting)
    assert post.text.startswith(":white_check_mark:") and len(slack.top_level()) == 1


def test_inhibition_node_level_mutes_pod_level_on_that_node(slack, pipelines):
    incidents = Incidents()
    config = alerting_config([bot_receiver(slack)], inhibit_rules=[{
        "source_matchers": ["alertname=NodeMemoryPressure"],
        "target_matchers": ['level=~"pod|container"'], "equal": ["node"]}])
    alerting = pipelines(config, incidents)
    node_level = incidents.add(incident(1, rule="NodeMemoryPressure", pod="", level="node"))
    incidents.add(incident(2, rule="LSMemoryStall", pod="web-1"))  # same node: muted
    incidents.add(incident(3, rule="LSMemoryStall", pod="web-2", node="worker-8"))
    run(alerting, incidents, T0, T0 + 70 * S, 5 * S)
    drained(alerting)
    assert sorted(texts(slack.top_level())) == [
        ":large_orange_circle: [FIRING:1] LSMemoryStall on worker-8",
        ":large_orange_circle: [FIRING:1] NodeMemoryPressure on worker-7"]
    resolve(node_level, T0 + 80 * S)  # the source ends: the pod-level alert is told
    run(alerting, incidents, T0 + 80 * S, T0 + 200 * S, 5 * S)
    drained(alerting)
    assert ":large_orange_circle: [FIRING:1] LSMemoryStall on worker-7" in texts(
        slack.top_level())
    assert len(slack.top_level()) == 3


def test_policy_incidents_wait_for_the_notify_rung(slack, pipelines):
    incidents = Incidents()
    alerting = pipelines(alerting_config([bot_receiver(slack)]), incidents,
                         policy_known=lambda name: name == "ls-interference")
    guarded = incidents.add(incident(1, policy="ls-interference"))
    incidents.add(incident(2, pod="web-2", policy="not-loaded"))  # no ladder will hand it over
    run(alerting, incidents, T0, T0 + 30 * S)
    drained(alerting)
    [post] = slack.top_level()
    assert "web-2" in json.dumps(post.blocks) and "web-1" not in json.dumps(post.blocks)
    alerting.notify(guarded.id, T0 + 31 * S)
    run(alerting, incidents, T0 + 31 * S, T0 + 100 * S, 5 * S)
    drained(alerting)
    assert "web-1" in json.dumps(post.updates[-1]["blocks"]) and len(slack.top_level()) == 1


def test_message_content_evidence_actions_plan_link_and_escaping(slack, pipelines):
    incidents = Incidents()
    alerting = pipelines(alerting_config([bot_receiver(slack)]), incidents,
                         planned=lambda i: ["suppress after 15s more", "evict after 1m more"])
    item = incidents.add(incident(1, pod="<!channel> web&<b>", severity="critical"))
    item.annotations["runbook"] = "x"
    from sloguard.core.suspects import Clue, Suspect

    item.suspects = [Suspect("/kubepods/besteffort/podx", 0.91, 1, "cpu",
                             {"pod": "<@U1> etl", "namespace": "batch"},
                             [Clue("runqueue_blame", 0.9, "cpu", "LS waited 40 ms <b>")]
                             ).to_dict(),
                     Suspect("/be/b", 0.2, 2, "io", {"workload": "backup"}).to_dict()]
    act(item, T0 + 5 * S, "notify", "done")  # the hand-over is the message itself: not shown
    act(item, T0 + 6 * S, "cordon")
    run(alerting, incidents, T0, T0 + 10 * S)
    drained(alerting)
    [post] = slack.top_level()
    section = next(b["text"]["text"] for b in post.blocks
                   if b["type"] == "section" and "Evidence" in b["text"]["text"])
    assert "*LSCpuStall* · critical · node `worker-7` · firing" in section
    assert "*Evidence:* 34.2 against threshold 20 · peak 34.2 · firing since " in section
    assert "*Actions:* cordon proposed (dry-run) node/worker-7 at" in section
    assert "notify" not in section
    assert "*Planned:* suppress after 15s more; evict after 1m more" in section
    assert ("*Suspects:* 1. `batch/&lt;@U1&gt; etl` 0.91 cpu (LS waited 40 ms &lt;b&gt;); "
            "2. `backup` 0.20 io") in section
    assert "<https://sloguard.example/incidents/inc-001|Open incident inc-001>" in section
    assert "&lt;!channel&gt; web&amp;&lt;b&gt;" in section and "<!channel>" not in section
    context = post.blocks[-1]["elements"][0]["text"]
    assert "`sloguard silence add alertname=LSCpuStall node=worker-7 --duration 2h -m '…'`" \
        in context
    assert post.blocks[0]["type"] == "header" and len(post.blocks) <= 50


def test_many_alerts_stay_within_slack_limits(slack, pipelines):
    incidents = Incidents()
    alerting = pipelines(alerting_config([bot_receiver(slack)]), incidents)
    for n in range(120):
        incidents.add(incident(n, pod=f"web-{n}-" + "x" * 200))
    run(alerting, incidents, T0, T0 + 10 * S)
    drained(alerting)
    [post] = slack.top_level()
    assert len(post.blocks) <= 50 and "…and 112 more" in json.dumps(post.blocks, ensure_ascii=False)
    assert all(len(b["text"]["text"]) <= 3000 for b in post.blocks if b["type"] == "section")


def test_group_state_survives_a_restart(slack, tmp_path):
    incidents = Incidents()
    config = alerting_config([bot_receiver(slack)])
    first = make(config, tmp_path, incidents)
    first.start()
    incidents.add(incident(1))
    run(first, incidents, T0, T0 + 10 * S)
    drained(first)
    first.stop()
    first.db.close()
    second = make(config, tmp_path, incidents)  # the restarted agent
    second.start()
    try:
        run(second, incidents, T0 + 11 * S, T0 + 300 * S, 10 * S)  # nothing new: no message
        drained(second)
        [post] = slack.top_level()
        assert post.updates == []
        resolve(incidents.get("inc-001"), T0 + 310 * S)
        run(second, incidents, T0 + 310 * S, T0 + 400 * S, 10 * S)
        drained(second)
        assert len(slack.top_level()) == 1 and post.text.startswith(":white_check_mark:")
    finally:
        second.stop()
        second.db.close()


def test_housekeeping_forgets_what_is_over(slack, pipelines):
    incidents = Incidents()
    alerting = pipelines(alerting_config([bot_receiver(slack)]), incidents,
                         policy_known=lambda name: True)
    item = incidents.add(incident(1, policy="p"))
    alerting.notify(item.id, T0)
    run(alerting, incidents, T0, T0 + 10 * S)
    resolve(item, T0 + 20 * S)
    run(alerting, incidents, T0 + 20 * S, T0 + 80 * S, 5 * S)
    drained(alerting)
    silence = alerting.silences.add(["pod=x"], T0 + 100 * S, "a", "b", now_ns=T0)
    rows = alerting.db.rows
    assert rows("SELECT COUNT(*) FROM outbox")[0][0] == 3 and rows("SELECT * FROM threads")
    alerting._next_gc = 0  # due now; a month later
    alerting.tick(T0 + 30 * 86400 * S, incidents.firing())
    assert rows("SELECT COUNT(*) FROM outbox")[0][0] == 0
    assert rows("SELECT * FROM threads") == [] and rows("SELECT * FROM handed") == []
    assert alerting.handed == set() and alerting.silences.get(silence.id) is None
