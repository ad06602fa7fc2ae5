"""The agent's loop between ticks: asleep until the next tick, a call or stop(), never polling.

It once woke ten times a second to look for a stop, and a timed wait's wake-up costs ~90 us
of CPU on this project's VM (sloguard/agent.py, `_wait_or_call`)."""

from __future__ import annotations

import time


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
