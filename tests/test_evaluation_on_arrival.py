"""Evaluation on arrival (docs/app-latency.md, "How fast"): a rule marked `on_arrival` is
evaluated as pushed data lands, at most every `arrival_floor`, and its policy acts in that same
evaluation; the agent process is real, its tick 30 s apart so that only the arrival path can
have acted in the seconds the test waits."""

from __future__ import annotations

import json
import math
import time

import httpx
import pytest
from test_agent_e2e import AgentProcess
from test_app_latency_e2e import stop

from sloguard.detector.registry import DetectorRegistry
from sloguard.detector.rules import RuleFileError, load_rule_file

TOKEN = "arrival-token-7c2e"
RULE = """\
      - alert: {name}
        expr: app_slo
        field: latency_ratio
        aggregate: last
        window: 1m
        detector: slo_latency
        params: {{target: 1}}
        for: 0s
        severity: warning
        policy: guard{extra}
"""
RULES = "groups:\n  - name: fast\n    rules:\n" + RULE.format(
    name="OnArrival", extra="\n        on_arrival: true") + RULE.format(name="OnTick", extra="")
POLICY = "policies:\n  - name: guard\n    steps:\n      - step: notify\n"


def test_a_push_is_judged_and_acted_on_before_the_next_tick(tmp_path, sloguard_bin):
    (tmp_path / "token").write_text(TOKEN)
    (tmp_path / "rules.yaml").write_text(RULES)
    (tmp_path / "policy.yaml").write_text(POLICY)
    config = tmp_path / "sloguard.yaml"
    config.write_text(
        "node_name: arrival\n"
        "interval: 30s\n"
        "arrival_floor: 100ms\n"
        "collectors: {cgroups: {enabled: false}}\n"
        f"rules: {{paths: ['{tmp_path / 'rules.yaml'}']}}\n"
        f"actuators: {{policies: ['{tmp_path / 'policy.yaml'}']}}\n"
        f"app_latency: {{receive: {{enabled: true, token_file: '{tmp_path / 'token'}'}}}}\n"
        "slos:\n  - {service: web, latency_ms: 100, window: 5s}\n")
    agent = AgentProcess(sloguard_bin, config, tmp_path / "data", tmp_path / "agent.log")
    auth = {"Authorization": f"Bearer {TOKEN}"}
    slow = json.dumps({"observations": [{"service": "web", "latency_ms": [300.0] * 20}]})
    try:
        agent.wait_for(lambda: agent.get("/readyz").json()["components"], 30, "ready")
        started = time.monotonic()
        pushes = 0
        while time.monotonic() - started < 2.0:  # pushed as fast as one client can
            assert httpx.post(f"{agent.url}/api/v1/observations", content=slow,
                              headers=auth, timeout=10).status_code == 200
            pushes += 1
        [fired] = agent.wait_for(lambda: agent.incidents(state="firing"), 3,
                                 "the on_arrival rule never fired between ticks")
        elapsed = time.monotonic() - started
        assert fired["rule"] == "OnArrival"  # OnTick waits for the tick, 30 s away
        actions = agent.get("/api/actions").json()["actions"]
        assert [a["kind"] for a in actions] == ["notify"]  # the ladder acted in that step
        loop = next(c for c in agent.get("/readyz").json()["components"]
                    if c["name"] == "loop")
        evaluations = loop["details"]["arrival_evaluations"]
        print(f"\n{pushes} pushes in 2 s, {evaluations} evaluations on arrival")
        assert pushes > 25  # many more pushes than the floor lets through
        assert 1 <= evaluations <= elapsed / 0.1 + 2  # at most one per 100 ms
    finally:
        stop(agent)


@pytest.mark.parametrize("change, message", [
    (("detector: slo_latency\n        params: {target: 1}",
      "detector: ewma\n        params: {fading_factor: 0.1}"),
     "on_arrival: detector 'ewma' learns from each evaluation"),
    (("for: 0s\n        severity: warning\n        policy: guard\n        on_arrival",
      "for: 0s\n        for_evaluations: {crossed: 2, of: 3}\n        severity: warning\n"
      "        policy: guard\n        on_arrival"),
     "for_evaluations \\(a count of evaluations\\) would mean something else"),
    (("  - name: fast\n", "  - name: fast\n    interval: 10s\n"),
     "the group is evaluated every 10s, not on each tick"),
])
def test_on_arrival_is_refused_where_it_would_change_what_a_rule_means(tmp_path, change,
                                                                        message):
    path = tmp_path / "r.yaml"
    assert change[0] in RULES
    path.write_text(RULES.replace(*change))
    with pytest.raises(RuleFileError, match=message):
        load_rule_file(path, DetectorRegistry(use_entry_points=False).check)


CONFIRM_RULES = """\
groups:
  - name: fast
    rules:
      - alert: Slow
        expr: lat
        field: p99
        aggregate: last
        window: 10s
        params: {above: 10}
        on_arrival: true
        policy: guard
        and:
          - expr: container_cpu{class="BE"}
            field: usage_cores
            aggregate: last
            window: 3s
            params: {above: 0.2, recover_below: 0.1}
"""


def _cgroup_agent(tmp_path, real_cgroups, node: str, extra: str = "", rules: str = CONFIRM_RULES):
    """An agent in this process on real BE and LS cgroups, CONFIRM_RULES and POLICY loaded;
    the BE cgroup's path beside it."""
    from sloguard.agent import Agent
    from sloguard.settings import load_settings

    be = real_cgroups.create("be")
    real_cgroups.create("ls")
    (tmp_path / "rules").mkdir()
    (tmp_path / "rules" / "r.yaml").write_text(rules)
    (tmp_path / "policy.yaml").write_text(POLICY)
    config = tmp_path / "c.yaml"
    config.write_text(
        f"node_name: {node}\ndata_dir: {tmp_path / 'data'}\n"
        f"rules: {{paths: ['{tmp_path / 'rules'}']}}\n"
        f"actuators: {{policies: ['{tmp_path / 'policy.yaml'}']}}\n" + extra +
        "collectors:\n  node: {enabled: false}\n"
        f"  cgroups:\n    include: [{real_cgroups.prefix}]\n    declare:\n"
        f"      - {{path: '{be}', class: BE}}\n"
        f"      - {{path: '{real_cgroups.prefix}/ls', class: LS}}\n")
    agent = Agent(load_settings(config).settings)
    agent._reload_rules()
    return agent, be


def test_a_lever_waits_for_be_busy_on_a_sample_taken_after_the_last_tick(tmp_path, real_cgroups):
    """Agent.confirm_interference on this machine's real cgroups: the tick's BE sample still
    shows a BE that has just stopped as busy; the sample taken at least 100 ms later does not,
    and the rule judged on it no longer crosses (the ladder then holds its next rung)."""
    from sloguard.core.samples import Sample

    agent, be = _cgroup_agent(tmp_path, real_cgroups, "confirm")
    try:
        hog = real_cgroups.spawn(be)

        def tick() -> None:
            now = time.time_ns()
            agent.windows.add([Sample("lat", {"node": "confirm"}, {"p99": 50.0}, now)])
            agent.tick(now)

        for _ in range(3):  # BE's CPU needs two readings for a rate
            tick()
            time.sleep(0.3)
        assert [i.rule for i in agent.engine.firing()] == ["Slow"]
        assert agent.confirm_interference("guard") is True  # BE still busy, read afresh
        # the tick's BE rate spans the time since that fresh read: give it a busy stretch (CI
        # ran the tick at once, a rate over a few ms in which the hog had not been scheduled)
        time.sleep(0.3)
        tick()
        hog.kill()
        hog.wait()
        # the tick's sample still covers BE's last busy moments...
        assert agent.engine.cause_present("guard") is True
        # ...the one taken now does not
        assert agent.confirm_interference("guard") is False
        # judged on it, the rule no longer crosses (here, without recover_for, it resolved)
        assert not [i for i in agent.engine.firing() if i.quiet_since_ns is None]
    finally:
        agent.stop()


def _arrival_agent(tmp_path, real_cgroups, rules: str = CONFIRM_RULES):
    """_cgroup_agent with a push receiver, and a function handing it one push of LS p99."""
    from sloguard.core.samples import Sample

    agent, be = _cgroup_agent(tmp_path, real_cgroups, "arrival",
                              f"app_latency: {{receive: {{enabled: true, token: {TOKEN}}}}}\n",
                              rules)

    def push(p99: float) -> None:  # as the receiver hands a push over
        agent.app_latency._push([Sample("lat", {"node": "arrival"}, {"p99": p99},
                                        time.time_ns())])
    return agent, be, push


def test_a_be_that_starts_between_ticks_is_seen_on_arrival(tmp_path, real_cgroups):
    """LS goes over its objective on a push, BE is not busy on the tick's samples: the
    cgroups are read afresh in that same evaluation, and a BE that has just started makes the
    rule fire there, not at the next tick."""
    agent, be, push = _arrival_agent(tmp_path, real_cgroups)
    try:
        for _ in range(2):  # LS within its objective, BE idle
            push(5.0)
            agent.tick()
            time.sleep(0.2)
        assert agent.engine.firing() == [] and agent.engine.held_back == set()
        real_cgroups.prioritise(be)
        hog = real_cgroups.spawn(be)
        time.sleep(0.3)
        push(50.0)
        agent._on_arrival()
        assert [i.rule for i in agent.engine.firing()] == ["Slow"]
        hog.kill()
    finally:
        agent.stop()


def test_a_rule_held_back_reads_the_cgroups_again_only_when_be_cpu_rises(tmp_path,
                                                                         real_cgroups):
    """The bound on that read's cost: LS over its objective with BE idle holds the rule back
    on every push. The push that first holds it back reads the cgroups afresh; later ones only
    look at the CPU of the BE cgroups (cpu_rise) and read them again once it has risen (reading
    them on each push cost more than the rest of the agent, docs/performance.md), so a BE that
    starts while the rule is held back is still seen before the next tick."""
    agent, be, push = _arrival_agent(tmp_path, real_cgroups)
    try:
        push(5.0)
        agent.tick()
        time.sleep(0.2)
        collected = agent._cgroups_mono
        push(50.0)
        agent._on_arrival()  # held back here, BE read afresh: idle
        assert agent.engine.held_back == {"fast/Slow"} and agent._cgroups_mono > collected
        for _ in range(2):  # held back on each push, BE idle: no read
            time.sleep(0.2)
            collected = agent._cgroups_mono
            push(50.0)
            agent._on_arrival()
            assert agent._cgroups_mono == collected
            assert agent.engine.held_back == {"fast/Slow"}
        real_cgroups.prioritise(be)  # its core even on a loaded machine
        hog = real_cgroups.spawn(be)
        selector = agent.rules.rules[0].spec.and_[0].selector
        deadline = time.monotonic() + 5
        while agent.cgroups.cpu_rise([selector]) < 0.4 and time.monotonic() < deadline:
            time.sleep(0.05)  # until BE's rate since the last read is well over the bar
        push(50.0)
        agent._on_arrival()  # BE's CPU rose: read again, and the rule fires on it
        assert agent._cgroups_mono > collected
        assert (agent.arrival_evaluations, agent.arrival_reads) == (4, 2)  # /readyz's loop
        assert [i.rule for i in agent.engine.firing()] == ["Slow"]
        hog.kill()
    finally:
        agent.stop()


def test_the_raised_bar_comes_down_with_time_and_stays_under_its_ceiling():
    """Agent._rise_bar on its own: 1.5 times the rise that changed nothing, halving every 10 s,
    never under CPU_RISE nor over RISE_BAR_MAX (a BE pod whose I/O holds the rule back by an
    `unless:` could otherwise raise it with CPU bursts, for everyone)."""
    from types import SimpleNamespace

    from sloguard.agent import CPU_RISE, RISE_BAR_MAX, Agent

    def bar(rise: float, ago: float) -> float:
        return Agent._rise_bar(SimpleNamespace(_rise_for_nothing=(rise, time.monotonic() - ago)))

    assert bar(0.0, math.inf) == CPU_RISE  # nothing read for nothing yet
    assert bar(0.15, 0) == pytest.approx(0.225, rel=1e-3)
    assert bar(0.15, 10) == pytest.approx(0.1125, rel=1e-2)  # halved after 10 s
    assert bar(0.15, 60) == CPU_RISE
    assert bar(2.0, 0) == RISE_BAR_MAX == 0.3  # a large rise raises it no further


def test_a_rise_that_changed_nothing_raises_the_bar_for_the_next_read(tmp_path, real_cgroups,
                                                                       monkeypatch):
    """The worst case of that bound: BE cgroups that start and stop just under the rule's own
    bar (0.2 core) rose past CPU_RISE again and again, and every cgroup was read for nothing
    on most pushes. A read that leaves its rules held back raises the bar over the rise it
    read: the same rise again reads nothing, a BE that starts in earnest still reads at once."""
    import sloguard.agent
    from sloguard.agent import CPU_RISE

    monkeypatch.setattr(sloguard.agent, "RISE_HALF_LIFE_S", 1e6)  # no decay: the test's pace
    agent, be, push = _arrival_agent(tmp_path, real_cgroups)
    real_cgroups.prioritise(be)  # its share even on a loaded machine (capped below)
    selector = agent.rules.rules[0].spec.and_[0].selector

    def rise_over(bar: float) -> float:
        deadline = time.monotonic() + 5
        while (rise := agent.cgroups.cpu_rise([selector])) < bar and \
                time.monotonic() < deadline:
            time.sleep(0.05)
        return rise

    try:
        push(5.0)
        agent.tick()
        time.sleep(0.2)
        push(50.0)
        agent._on_arrival()  # held back here, BE read afresh: idle
        assert agent.engine.held_back == {"fast/Slow"} and agent.arrival_reads == 1
        real_cgroups.limit(be, 0.15)  # under the rule's 0.2, over CPU_RISE
        hog = real_cgroups.spawn(be)
        time.sleep(0.2)  # past CONFIRM_S since the last read
        rise_over(0.12)
        push(50.0)
        agent._on_arrival()  # read for nothing: BE at 0.15 is not busy to this rule
        assert agent.arrival_reads == 2 and agent.engine.held_back == {"fast/Slow"}
        assert agent._rise_for_nothing[0] >= 0.12
        assert agent._rise_bar() == pytest.approx(1.5 * agent._rise_for_nothing[0])
        hog.kill()
        hog.wait()
        time.sleep(0.2)
        agent.tick()  # BE idle on the tick's sample again; the rule still held back
        assert agent.engine.held_back == {"fast/Slow"}
        hog = real_cgroups.spawn(be)  # the same swing once more
        time.sleep(0.2)
        assert 0.1 <= rise_over(0.12) < agent._rise_bar()
        push(50.0)
        agent._on_arrival()
        assert agent.arrival_reads == 2  # not read again
        hog.kill()
        hog.wait()
        real_cgroups.limit(be, 1.0)
        hog = real_cgroups.spawn(be)
        rise_over(agent._rise_bar() + 0.2)
        push(50.0)
        agent._on_arrival()  # BE busy in earnest: read, and the rule fires on it
        assert agent.arrival_reads == 3
        assert [i.rule for i in agent.engine.firing()] == ["Slow"]
        time.sleep(0.2)
        push(50.0)
        agent._on_arrival()  # firing, held back no more: the bar is down again
        assert agent.engine.held_back == set() and agent._rise_bar() == CPU_RISE
        hog.kill()
    finally:
        agent.stop()


def test_a_rule_held_back_on_other_signals_reads_no_cgroup(tmp_path, real_cgroups):
    """Held back on a condition the cgroup collector does not write, a rule has nothing to
    gain from a fresh cgroup read: the arrival that holds it back reads none."""
    rules = CONFIRM_RULES.replace('container_cpu{class="BE"}', "queue").replace(
        "usage_cores", "depth")
    assert "queue" in rules
    agent, _, push = _arrival_agent(tmp_path, real_cgroups, rules)
    try:
        push(5.0)
        agent.tick()
        time.sleep(0.2)
        push(50.0)
        agent._on_arrival()
        assert agent.engine.held_back == {"fast/Slow"} and agent.arrival_reads == 0
    finally:
        agent.stop()


def test_a_firing_waits_for_be_busy_on_a_sample_taken_after_the_tick(tmp_path, real_cgroups):
    """Engine.confirm_firing on this machine's real cgroups: LS goes over its objective just as
    BE stops. The tick's BE sample covers BE's last busy moments, and the rule would fire on it
    (the lab fired LSLatencyInterference 0.1-1.0 s after two antagonists had stopped); the
    sample read at least 100 ms later says BE is idle, so nothing fires and no pending
    incident is left. With BE still busy, the same tick fires."""
    from sloguard.core.samples import Sample

    agent, be = _cgroup_agent(tmp_path, real_cgroups, "end")
    try:
        def tick(p99: float) -> None:
            now = time.time_ns()
            agent.windows.add([Sample("lat", {"node": "end"}, {"p99": p99}, now)])
            agent.tick(now)

        hog = real_cgroups.spawn(be)
        for _ in range(3):  # BE busy, LS within its objective: nothing to fire
            tick(5.0)
            time.sleep(0.3)
        hog.kill()
        hog.wait()
        tick(50.0)  # LS over, on the tick's sample BE still busy
        assert agent.engine.firing() == []
        assert agent.engine.cause_present("guard") is False  # judged on the fresh sample
        assert agent.engine.awaiting_fresh == set()
        assert [i for i in agent.incidents.open_incidents() if i.rule == "Slow"] == []
        # BE busy through the tick and after it: the same tick fires
        hog = real_cgroups.spawn(be)
        for _ in range(2):
            tick(5.0)
            time.sleep(0.3)
        tick(50.0)
        assert [i.rule for i in agent.engine.firing()] == ["Slow"]
        hog.kill()
    finally:
        agent.stop()
