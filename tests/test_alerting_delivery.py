"""Nothing lost, nothing doubled: delivery through Slack outages, rate limits, slow responses,
bad messages, revoked credentials, and a sender killed in the middle of a send.

The server is the local Slack-contract server; the clients are slack-sdk's. Message counts
are asserted once the outbox has drained (everything decided has been delivered).
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.alerting import (
    T0,
    Incidents,
    S,
    alerting_config,
    alerting_dict,
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
SECRET_PATH = "/services/T000/B000/XXXXSECRETXXXX"
SUPPORT = Path(__file__).parent / "support"


@pytest.fixture
def slack():
    with SlackServer() as server:
        server.add_channel(CHANNEL, "alerts")
        yield server


@pytest.fixture
def pipelines(tmp_path):
    made = []

    def build(config, incidents=None, start=True, **kwargs):
        alerting = make(config, tmp_path, incidents, **kwargs)
        if start:
            alerting.start()
        made.append(alerting)
        return alerting

    yield build
    for alerting in made:
        alerting.stop()
        alerting.db.close()


def fire(alerting, incidents, *numbers, at=T0, **kwargs):
    for n in numbers:
        incidents.add(incident(n, at=at, **kwargs))
    return run(alerting, incidents, at, at + 10 * S)


def problem(alerting):
    """The pipeline's status once it reports a problem, else None."""
    status = alerting.status()
    return None if status.ok else status


def test_outage_then_recovery_delivers_each_message_once_in_order(slack, pipelines):
    incidents = Incidents()
    alerting = pipelines(alerting_config([bot_receiver(slack)]), incidents)
    slack.fault("chat.postMessage", status=500, count=3)
    slack.fault("chat.update", status=503, count=2)
    fire(alerting, incidents, 1, rule="A")  # group A's post
    fire(alerting, incidents, 2, rule="B", at=T0 + 20 * S)  # queued behind it
    resolve(incidents.get("inc-001"), T0 + 40 * S)
    run(alerting, incidents, T0 + 40 * S, T0 + 100 * S, 5 * S)  # A: update + reply
    drained(alerting, 40)
    assert [m.text.split("] ")[1] for m in slack.top_level()] == ["A on worker-7",
                                                                    "B on worker-7"]
    [a, b] = slack.top_level()
    assert a.text.startswith(":white_check_mark:") and len(a.updates) == 1
    assert len(slack.replies(a.ts)) == 1 and slack.replies(b.ts) == []
    # what Slack accepted, in the order it was decided: A's post, B's post, A's update, reply
    accepted = [(r.endpoint, r.params.get("thread_ts") is not None) for r in slack.requests
                if r.status == 200 and r.endpoint.startswith("chat.")]
    assert accepted == [("chat.postMessage", False), ("chat.postMessage", False),
                        ("chat.update", False), ("chat.postMessage", True)]
    # before re-posting after a 5xx, the sender looked for an earlier attempt
    assert len(slack.calls("conversations.history")) >= 3
    slack.wait_for(lambda: alerting.status().ok, what="the receiver's health to recover")


def test_webhook_outage_retries_without_marking_repeats(slack, pipelines):
    incidents = Incidents()
    alerting = pipelines(alerting_config([webhook_receiver(slack)]), incidents)
    slack.fault("webhook", status=500, count=3)
    fire(alerting, incidents, 1)
    drained(alerting, 30)
    assert len(slack.calls("webhook")) == 4
    [message] = slack.webhook_messages  # a 500 means Slack did not post: no repeat note
    assert "possibly repeated" not in message["text"]


def test_429_retry_after_is_honoured(slack, pipelines):
    incidents = Incidents()
    receivers = [bot_receiver(slack), webhook_receiver(slack)]
    config = alerting_config(receivers, {"receiver": "sre", "routes": [
        {"receiver": "hook", "continue": True}, {"receiver": "sre"}]})
    alerting = pipelines(config, incidents)
    slack.fault("chat.postMessage", status=429, retry_after=2)
    slack.fault("webhook", status=429, retry_after=2)
    fire(alerting, incidents, 1)
    drained(alerting, 30)
    for endpoint in ("chat.postMessage", "webhook"):
        first, second = slack.calls(endpoint)
        assert (first.status, second.status) == (429, 200)
        waited = second.at - first.at
        assert 1.9 <= waited < 15, f"{endpoint}: waited {waited:.2f}s after Retry-After: 2"
    assert len(slack.top_level()) == 2
    assert slack.calls("conversations.history") == []  # a 429 is a refusal: nothing to check


def test_a_retry_wait_is_not_stretched_by_the_wall_clock_stepping_back(slack, pipelines,
                                                                       monkeypatch):
    """Issue #19: a retry was due at a wall time; the wall clock stepped back an hour during
    the wait and the message waited an hour more. The wait runs on the monotonic clock."""
    incidents = Incidents()
    alerting = pipelines(alerting_config([webhook_receiver(slack)]), incidents)
    slack.fault("webhook", status=429, retry_after=2)
    real, stepped = time.time_ns, []
    monkeypatch.setattr(time, "time_ns", lambda: real() - (3600 * S if stepped else 0))
    fire(alerting, incidents, 1)
    deadline = time.monotonic() + 10
    while not alerting.db.rows("SELECT 1 FROM outbox WHERE not_before_ns > 0"):
        assert time.monotonic() < deadline, "the 429 was never recorded"
        time.sleep(0.01)
    stepped.append(True)  # the wall clock steps an hour back while the retry waits
    drained(alerting, 15)
    first, second = slack.calls("webhook")
    assert (first.status, second.status) == (429, 200)
    assert 1.9 <= second.at - first.at < 10


def test_slow_slack_that_did_post_is_not_posted_twice(slack, pipelines):
    incidents = Incidents()
    alerting = pipelines(alerting_config([bot_receiver(slack, timeout=1)]), incidents)
    slack.fault("chat.postMessage", delay=3)  # posted, but the answer comes after the timeout
    fire(alerting, incidents, 1)
    drained(alerting, 30)
    assert len(slack.top_level()) == 1 and len(slack.calls("chat.postMessage")) == 1
    assert slack.calls("conversations.history")  # found it there instead of posting again
    # the thread continues on that message: its ts was adopted
    [post] = slack.top_level()
    resolve(incidents.get("inc-001"), T0 + 20 * S)
    run(alerting, incidents, T0 + 20 * S, T0 + 80 * S, 5 * S)
    drained(alerting, 30)
    assert len(post.updates) == 1 and len(slack.replies(post.ts)) == 1


def test_slow_webhook_is_sent_again_marked_possibly_repeated(slack, pipelines):
    incidents = Incidents()
    alerting = pipelines(alerting_config([webhook_receiver(slack, timeout=1)]), incidents)
    slack.fault("webhook", delay=3)
    fire(alerting, incidents, 1)
    drained(alerting, 30)
    # an incoming webhook cannot be asked whether it posted: the one honest option is to
    # deliver again and say so (a bot token avoids this; see docs/alerting.md)
    first, second = slack.webhook_messages
    assert "possibly repeated" not in json.dumps(first)
    assert second["text"].startswith("(possibly repeated)")
    assert "could not tell whether Slack received" in json.dumps(second["blocks"])


def test_channel_by_name_cannot_be_checked_before_its_id_is_known(slack, pipelines):
    incidents = Incidents()
    alerting = pipelines(alerting_config([bot_receiver(slack, channel="#alerts", timeout=1)]),
                         incidents)
    slack.fault("chat.postMessage", delay=3)
    fire(alerting, incidents, 1)
    drained(alerting, 30)
    _first, second = slack.top_level()
    assert second.text.startswith("(possibly repeated)")
    # once a post has told the channel's ID, an unknown outcome is checked again
    slack.fault("chat.postMessage", delay=3)
    fire(alerting, incidents, 2, rule="Other", at=T0 + 100 * S)
    drained(alerting, 30)
    assert len(slack.top_level()) == 3


def _sender_process(data: Path, config: dict, log: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(SUPPORT.parent)}
    with open(log, "ab") as out:
        return subprocess.Popen(
            [sys.executable, str(SUPPORT / "alerting_sender.py"), str(data), json.dumps(config)],
            stdout=out, stderr=subprocess.STDOUT, env=env)


@pytest.mark.parametrize("kind", ["api", "webhook"])
def test_sender_killed_mid_send_does_not_double_post(slack, tmp_path, kind):
    receiver = bot_receiver(slack) if kind == "api" else webhook_receiver(slack)
    raw = alerting_dict([receiver])
    incidents = Incidents()
    decider = make(alerting_config([receiver]), tmp_path, incidents)  # decides, never sends
    fire(decider, incidents, 1)
    decider.db.close()
    endpoint = "chat.postMessage" if kind == "api" else "webhook"
    slack.fault(endpoint, hold=True)
    process = _sender_process(tmp_path, raw, tmp_path / "sender.log")
    try:
        assert slack.held.wait(30), (tmp_path / "sender.log").read_text()
        assert len(slack.messages) == 1  # Slack has the message; the sender has no answer
        os.kill(process.pid, signal.SIGKILL)  # dies before it can record the outcome
        process.wait(10)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)
        slack.release()
    restarted = make(alerting_config([receiver]), tmp_path, incidents)
    restarted.start()
    try:
        drained(restarted, 30)
        if kind == "api":
            [post] = slack.messages  # found by its metadata, adopted, not posted again
            assert len(slack.calls("chat.postMessage")) == 1
            assert slack.calls("conversations.history")
            resolve(incidents.get("inc-001"), T0 + 20 * S)
            run(restarted, incidents, T0 + 20 * S, T0 + 80 * S, 5 * S)
            drained(restarted, 30)
            assert len(slack.top_level()) == 1 and len(post.updates) == 1
            assert post.text.startswith(":white_check_mark:")
        else:
            _first, second = slack.webhook_messages
            assert second["text"].startswith("(possibly repeated)")
    finally:
        restarted.stop()
        restarted.db.close()


def test_a_crash_before_the_request_left_sends_once_unmarked(slack, tmp_path):
    receiver = bot_receiver(slack)
    incidents = Incidents()
    decider = make(alerting_config([receiver]), tmp_path, incidents)
    fire(decider, incidents, 1)
    decider.db.close()  # the agent died with the message queued
    restarted = make(alerting_config([receiver]), tmp_path, incidents)
    restarted.start()
    try:
        drained(restarted)
        [post] = slack.messages
        assert not post.text.startswith("(possibly") and not slack.calls("conversations.history")
    finally:
        restarted.stop()
        restarted.db.close()


def test_revoked_token_waits_and_never_shows_the_secret(slack, pipelines, tmp_path, caplog):
    caplog.set_level(logging.DEBUG)
    token_file = tmp_path / "token"
    token_file.write_text("xoxb-revoked-SECRET-0001\n")
    receiver = bot_receiver(slack)
    del receiver["slack"]["bot_token"]
    receiver["slack"]["bot_token_file"] = str(token_file)
    incidents = Incidents()
    alerting = pipelines(alerting_config([receiver]), incidents)
    fire(alerting, incidents, 1)
    slack.wait_for(lambda: slack.calls("chat.postMessage"), what="a post attempt")
    status = slack.wait_for(lambda: problem(alerting), what="the receiver's problem")
    assert "receiver sre: HTTP 200 invalid_auth" in status.reason
    assert slack.messages == [] and alerting.outbox.pending() == {"sre": 1}  # kept, not lost
    token_file.write_text(slack.token)  # the secret is rotated: picked up on the next attempt
    drained(alerting, 30)
    assert len(slack.messages) == 1
    # the ts is on disk before anything else happens; the health follows right after
    slack.wait_for(lambda: alerting.status().ok, what="the receiver's health to recover")
    seen = json.dumps(status.details) + status.reason + caplog.text
    assert "SECRET" not in seen and slack.token not in seen


def test_webhook_secret_never_in_logs_or_status(slack, pipelines, caplog):
    caplog.set_level(logging.DEBUG)
    incidents = Incidents()
    receiver = webhook_receiver(slack)
    slack.webhooks.clear()  # the webhook was revoked: 404 no_service
    alerting = pipelines(alerting_config([receiver]), incidents)
    fire(alerting, incidents, 1)
    status = slack.wait_for(lambda: problem(alerting), what="the receiver's problem")
    assert "HTTP 404 no_service" in status.reason
    slack.httpd.server_close()  # and then Slack is unreachable
    time.sleep(1.5)
    seen = caplog.text + json.dumps(alerting.status().details) + alerting.status().reason
    seen += json.dumps([r for r in alerting.db.rows("SELECT error FROM outbox")])
    assert "XXXXSECRETXXXX" not in seen and slack.url + SECRET_PATH not in seen


def test_refused_blocks_fall_back_to_text(slack, pipelines):
    incidents = Incidents()
    alerting = pipelines(alerting_config([bot_receiver(slack)]), incidents)
    slack.fault("chat.postMessage", status=200, error="invalid_blocks")
    fire(alerting, incidents, 1)
    drained(alerting)
    [post] = slack.messages
    assert post.blocks is None and "LSCpuStall" in post.text and "Evidence" in post.text


def test_deleted_message_is_posted_anew(slack, pipelines):
    incidents = Incidents()
    alerting = pipelines(alerting_config([bot_receiver(slack)]), incidents)
    fire(alerting, incidents, 1)
    drained(alerting)
    slack.messages.clear()  # someone deleted it
    resolve(incidents.get("inc-001"), T0 + 20 * S)
    run(alerting, incidents, T0 + 20 * S, T0 + 80 * S, 5 * S)
    drained(alerting)
    [again] = slack.top_level()  # the update became a new message; the reply went under it
    assert again.text.startswith(":white_check_mark:") and len(slack.replies(again.ts)) == 1


def test_per_receiver_rate_limit(slack, pipelines):
    incidents = Incidents()
    alerting = pipelines(alerting_config([bot_receiver(slack, min_interval="700ms")]),
                         incidents)
    for n, rule in enumerate("ABC"):
        incidents.add(incident(n, rule=rule))
    run(alerting, incidents, T0, T0 + 10 * S)
    drained(alerting)
    times = [r.at for r in slack.calls("chat.postMessage")]
    assert len(times) == 3
    assert all(b - a >= 0.69 for a, b in itertools.pairwise(times)), times


def test_outbox_pending_survives_an_outage_across_restarts(slack, tmp_path):
    receiver = bot_receiver(slack)
    incidents = Incidents()
    first = make(alerting_config([receiver]), tmp_path, incidents)
    slack.fault("chat.postMessage", status=500, count=1000)
    slack.fault("conversations.history", status=500, count=1000)
    first.start()
    fire(first, incidents, 1)
    # after a 500 the post may exist: the sender keeps checking (with growing backoff), and
    # never posts again blindly
    slack.wait_for(lambda: len(slack.calls("conversations.history")) >= 3, what="checks")
    assert len(slack.calls("chat.postMessage")) == 1
    checks = [r.at for r in slack.calls("conversations.history")]
    assert checks[2] - checks[1] >= 0.6  # backoff 0.2 s doubling per attempt: 0.8 s -20%
    first.stop()
    first.db.close()
    assert slack.messages == []
    slack.faults.clear()  # Slack is back; so is the agent
    second = make(alerting_config([receiver]), tmp_path, incidents)
    second.start()
    try:
        drained(second, 30)
        assert len(slack.messages) == 1
    finally:
        second.stop()
        second.db.close()
