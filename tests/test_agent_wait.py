"""The agent's loop between ticks: asleep until the next tick, a call or stop(), never polling.

It once woke ten times a second to look for a stop, and a timed wait's wake-up costs ~90 us
of CPU on this project's VM (sloguard/agent.py, `_wait_or_call`)."""

from __future__ import annotations

import time
import weakref


def test_the_loop_sleeps_between_ticks_and_stop_wakes_it_at_once(tmp_path):
    from sloguard.agent import Agent
    from sloguard.settings import load_settings

    config = tmp_path / "c.yaml"
    config.write_text(f"node_name: quiet\ndata_dir: {tmp_path / 'data'}\ninterval: 30s\n"
                      "collectors: {node: {enabled: false}, cgroups: {enabled: false}}\n")
    agent = Agent(load_settings(config).settings)
    waits: list[float | None] = []
    calls = agent._calls

    class Watched:  # the loop's call queue, recording each wait the loop makes on it
        def get(self, timeout=None):
            waits.append(timeout)
            return calls.get(timeout=timeout)

        def __getattr__(self, name):
            return getattr(calls, name)

    agent._calls = Watched()
    agent.start()
    try:
        time.sleep(1.5)
        assert agent.call_on_loop(lambda: "served") == "served"  # a call wakes it
        time.sleep(0.5)
    finally:
        began = time.monotonic()
        agent.stop()
        stopped = time.monotonic() - began
    # one wait before the call, one after it: not one every 100 ms
    assert len(waits) <= 3 and all(w is None or w > 20 for w in waits), waits
    assert stopped < 5.0  # not the 30 s left of its wait


def _settling(config):
    """An agent that settles its heap, a cycle made before it does (only the cyclic GC frees
    it: the caller holds it until then), and a weak reference to it."""
    from sloguard.agent import Agent
    from sloguard.settings import load_settings

    class Held:
        pass

    agent = Agent(load_settings(config).settings)
    agent.settle_heap = True
    held = Held()
    held.me = held
    return agent, held, weakref.ref(held)


def test_the_agent_alone_in_its_process_settles_its_heap_and_again_after_a_rule_reload(
        tmp_path):
    """`sloguard run` freezes what the first ticks built out of the cyclic GC's full
    collections (Agent._settle_heap); a rule reload settles it again, so what the old rules
    held can be collected. An agent in a test's process leaves the GC alone."""
    import gc

    from sloguard.agent import SETTLE_AFTER_TICKS, Agent
    from sloguard.settings import load_settings

    rules = tmp_path / "rules"
    rules.mkdir()
    rule = ("groups:\n  - name: g\n    rules:\n      - alert: A\n        expr: lat\n"
            "        field: p99\n        params: {above: %d}\n")
    (rules / "r.yaml").write_text(rule % 10)
    config = tmp_path / "c.yaml"
    config.write_text(f"node_name: quiet\ndata_dir: {tmp_path / 'data'}\n"
                      f"rules: {{paths: ['{rules}']}}\n"
                      "collectors: {node: {enabled: false}, cgroups: {enabled: false}}\n")
    assert gc.get_freeze_count() == 0
    plain = Agent(load_settings(config).settings)
    for _ in range(SETTLE_AFTER_TICKS + 1):
        plain.tick()
    assert gc.get_freeze_count() == 0  # not asked to
    plain.stop()

    agent, held, gone = _settling(config)
    try:
        for _ in range(SETTLE_AFTER_TICKS - 1):
            agent.tick()
        assert gc.get_freeze_count() == 0
        agent.tick()
        assert gc.get_freeze_count() > 0  # settled
        del held
        gc.collect()
        assert gone() is not None  # frozen with the heap: out of the collector's sight
        (rules / "r.yaml").write_text(rule % 20)
        agent._reload_rules()
        assert agent.rules.rules[0].spec.params == {"above": 20}
        assert gone() is not None  # settled again at the end of the next tick
        agent.tick()
        assert gone() is None and gc.get_freeze_count() > 0  # settled again, garbage freed
    finally:
        agent.stop()
        gc.unfreeze()


def test_a_rule_reload_settles_the_heap_after_the_engine_has_let_go_of_the_old_rules(
        tmp_path):
    """The engine drops what it held for a rule gone (its detectors, batches, status) in the
    evaluation after the reload, not in the reload: a heap settled in the reload froze those
    and, once dropped, any cycle among them stayed out of the collector's sight until the
    next rule change."""
    import gc

    from detector.signals import SignalKey
    from sloguard.agent import SETTLE_AFTER_TICKS, Agent
    from sloguard.settings import load_settings

    rules = tmp_path / "rules"
    rules.mkdir()
    rule = ("groups:\n  - name: g\n    rules:\n      - alert: %s\n        expr: lat\n"
            "        field: p99\n        params: {above: 10}\n")
    (rules / "r.yaml").write_text(rule % "A")
    config = tmp_path / "c.yaml"
    config.write_text(f"node_name: quiet\ndata_dir: {tmp_path / 'data'}\n"
                      f"rules: {{paths: ['{rules}']}}\n"
                      "collectors: {node: {enabled: false}, cgroups: {enabled: false}}\n")

    class Detector:  # a detector of rule A's, holding a cycle (as plugin objects may)
        pass

    agent = Agent(load_settings(config).settings)
    agent.settle_heap = True
    try:
        for _ in range(SETTLE_AFTER_TICKS - 1):
            agent.tick()
        detector = Detector()
        detector.me = detector
        agent.engine._detectors[SignalKey("g/A")] = {(("pod", "p"),): (None, detector)}
        gone = weakref.ref(detector)
        del detector
        agent.tick()
        assert gc.get_freeze_count() > 0  # settled, with rule A's detector in the heap
        (rules / "r.yaml").write_text(rule % "B")  # A gone: its detector goes with it
        agent._next_reload = 0.0
        agent.tick()
        assert SignalKey("g/A") not in agent.engine._detectors
        gc.collect()
        assert gone() is None  # not frozen again before the engine let go of it
    finally:
        agent.stop()
        gc.unfreeze()


def test_a_reload_that_changes_only_the_policies_settles_the_heap_again(tmp_path):
    """The policies are reloaded with the rules, and what the replaced ones held was frozen
    with the heap as much as the rules' was: a cycle there stayed out of the collector's sight
    until some rule file changed."""
    import gc
    import os

    from sloguard.agent import SETTLE_AFTER_TICKS

    policy = tmp_path / "policy.yaml"
    policy.write_text("policies:\n  - name: guard\n    steps:\n      - step: notify\n")
    config = tmp_path / "c.yaml"
    config.write_text(f"node_name: quiet\ndata_dir: {tmp_path / 'data'}\n"
                      f"actuators: {{policies: ['{policy}']}}\n"
                      "collectors: {node: {enabled: false}, cgroups: {enabled: false}}\n")

    agent, held, gone = _settling(config)
    try:
        for _ in range(SETTLE_AFTER_TICKS):
            agent.tick()
        assert gc.get_freeze_count() > 0
        del held
        policy.write_text("policies:\n  - name: guard2\n    steps:\n      - step: notify\n")
        os.utime(policy, (1, 1))
        agent._next_reload = 0.0
        agent.tick()
        assert agent.policies.get("guard2") is not None
        gc.collect()
        assert gone() is None  # settled again
    finally:
        agent.stop()
        gc.unfreeze()
