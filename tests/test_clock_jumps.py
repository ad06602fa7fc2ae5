"""The wall clock steps an hour back or forward (NTP, a VM resumed, `date -s`): the timers do not.

One in-process agent on its real stores, rules and alert pipeline, with its clock injected (the
machine's clock is shared with other tests and is never touched). A test collector feeds one LS
latency series; the same scenario runs with no jump and with the wall clock stepped +-1 h
three times: while the incident is pending (its `for`), while its alert group waits and
repeats (`group_wait`, `group_interval`, `repeat_interval`), and while it recovers
(`recover_for`). Every timer must end on the same tick of the monotonic clock.
"""

from __future__ import annotations

from support.slack_server import SlackServer

from sloguard.agent import Agent
from sloguard.collectors.base import CollectorBase
from sloguard.core.health import ComponentStatus
from sloguard.core.incidents import FIRING, RESOLVED
from sloguard.core.samples import Sample
from sloguard.settings import load_settings

S = 10**9
HOUR = 3600

RULES = """\
groups:
  - name: ls
    rules:
      - alert: LSSlow
        expr: lat{class="LS"}
        field: p99
        aggregate: last
        window: 3s
        params: {above: 10, recover_below: 5}
        for: 10s
        recover_for: 5s
        severity: critical
"""


class SteppedClock:
    """Monotonic time advances only when the test says; wall time is it plus an offset that
    the test may step."""

    def __init__(self) -> None:
        self.mono = 5_000 * S
        self.offset = 1_800_000_000 * S - self.mono

    def wall_ns(self) -> int:
        return self.mono + self.offset

    def mono_ns(self) -> int:
        return self.mono


class Feed(CollectorBase):
    """A collector whose one LS series the test sets."""

    name = "feed"

    def __init__(self) -> None:
        self.value = 1.0

    def collect(self, now_ns: int) -> list[Sample]:
        return [Sample("lat", {"node": "jump-node", "class": "LS", "pod": "web-1"},
                       {"p99": self.value}, now_ns)]

    def status(self) -> ComponentStatus:
        return ComponentStatus(self.name, ok=True)


def _run(tmp_path, slack, jump_s: int) -> dict[str, object]:
    (tmp_path / "rules").mkdir(parents=True)
    (tmp_path / "rules" / "r.yaml").write_text(RULES)
    hook = slack.add_webhook(slack.add_channel("C0JUMP0001", "jumps"), f"/services/T/B/{jump_s}")
    config = tmp_path / "c.yaml"
    config.write_text(
        "node_name: jump-node\n"
        "collectors: {node: {enabled: false}, cgroups: {enabled: false}}\n"
        f"rules: {{paths: [{tmp_path / 'rules'}]}}\n"
        "alerting:\n"
        f"  receivers: [{{name: sre, slack: {{webhook_url: '{hook}', min_interval: 0}}}}]\n"
        "  route: {receiver: sre, group_by: [alertname], group_wait: 5s,"
        " group_interval: 30s, repeat_interval: 60s}\n")
    clock = SteppedClock()
    settings = load_settings(config, {"data_dir": ("--data-dir", tmp_path / "d")}).settings
    agent = Agent(settings, clock=clock)
    feed = Feed()
    agent.collectors.append(feed)
    seen: dict[str, object] = {"messages": []}
    try:
        for second in range(100):  # the agent is not started: each tick is one second here
            if second in (3, 40, 92):  # pending / between group flushes / recovering
                clock.offset += jump_s * S
            feed.value = 30.0 if second < 88 else 1.0
            agent.tick()
            state = next((i.state for i in agent.incidents.query(limit=5)), None)
            if state == FIRING and "fired" not in seen:
                seen["fired"] = second
            if state == RESOLVED and "resolved" not in seen:
                seen["resolved"] = second
            queued = agent.alerting.db.rows("SELECT count(*) FROM outbox")[0][0]
            if queued > len(seen["messages"]):
                seen["messages"] += [second] * (queued - len(seen["messages"]))
            clock.mono += S
    finally:
        agent.stop()
    return seen


def test_timers_ignore_wall_clock_steps(tmp_path):
    with SlackServer() as slack:
        runs = {jump: _run(tmp_path / f"jump{jump}", slack, jump)
                for jump in (0, HOUR, -HOUR)}
    steady = runs[0]
    # `for: 10s` from the first crossing at 0; group_wait 5 s after firing, then group flushes
    # every 30 s, a repeat 60 s after the first notice; recover_for 5 s from 88
    assert steady["fired"] == 10 and steady["resolved"] == 93
    assert steady["messages"][:2] == [15, 75]
    assert runs[HOUR] == steady, "the wall clock stepped an hour forward"
    assert runs[-HOUR] == steady, "the wall clock stepped an hour back"
