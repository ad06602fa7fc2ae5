"""Where the agent's tick goes: the 100-cgroup agent's tick in-process, CPU per phase.

`agent_overhead.py` measures the whole `sloguard run` process from outside, which says whether
the node budget is met but not what to change. This one builds the same agent (the same real
cgroups, one LS in ten, the shipped rules and policies, the embedded store) in this process and
runs its tick back to back on a simulated 1 s clock (each tick stamped one second after the
last, so every window holds what it would at a 1 s interval), timing each phase with this
thread's CPU clock. The detector worker's CPU is in "evaluate" (its caller waits on it).

Printed: CPU ms per tick by phase, the tick against the yardstick of `agent_overhead.py`
(a fixed pure-Python workload timed in the same run: machines here are noisy, compare ratios),
a standing lever's full check (every 5 s on the real clock, so timed apart), and evaluation
on arrival's look at BE's CPU against the fresh read of every cgroup it spares.

    sudo .venv/bin/python benchmarks/agent_tick.py [--cgroups 100] [--ticks 300]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

from agent_overhead import BenchCgroups, _yardstick

from sloguard.actuators.standing import STANDING_CHECK_NS
from sloguard.agent import Agent
from sloguard.settings import load_settings

S = 10**9


def _timed(spent: dict[str, float], phase: str, fn: Callable[..., Any],
           clock: Callable[[], float] = time.process_time,
           counting: list[bool] | None = None) -> Callable[..., Any]:
    """`fn`, its CPU (by `clock`) added to `phase`; with `counting`, only while
    `counting[0]` (agent_arrival.py: in an arrival, not in the tick between two)."""
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if counting is not None and not counting[0]:
            return fn(*args, **kwargs)
        start = clock()
        try:
            return fn(*args, **kwargs)
        finally:
            spent[phase] += clock() - start
    return wrapper


def print_phases(phases: dict[str, float], count: int, unit: str, rest: str,
                 digits: int = 2) -> float:
    """The table of CPU ms per `unit`: `phases` are seconds over `count` units, the whole
    under the key "**total**"; what no phase covers is printed as `rest`. Returns ms per
    unit."""
    per = 1000 * phases.pop("**total**") / count
    print(f"| phase | CPU ms per {unit} | share |")
    print("|---|---|---|")
    for phase, seconds in sorted(phases.items(), key=lambda kv: -kv[1]):
        ms = 1000 * seconds / count
        print(f"| {phase} | {ms:.{digits}f} | {100 * ms / per:.0f}% |")
    left = per - 1000 * sum(phases.values()) / count
    print(f"| {rest} | {left:.{digits}f} | {100 * left / per:.0f}% |")
    print(f"| **{unit}** | **{per:.{digits}f}** | |")
    return per


def bench_agent(work: Path, cgroups: BenchCgroups, extra: str = "") -> Agent:
    """The agent of agent_overhead.py on `cgroups` (one LS in ten, the rest BE, the shipped
    rules and policies, the embedded store in `work`), built in this process, its collectors
    started and its rules loaded; `extra` is more of its config."""
    config = work / "agent.yaml"
    config.write_text(
        f"data_dir: {work / 'data'}\n"
        "collectors:\n  cgroups:\n" + cgroups.declare() + extra)
    agent = Agent(load_settings(config).settings)
    for collector in agent.collectors:
        collector.start()
    agent._reload_rules()
    return agent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cgroups", type=int, default=100)
    parser.add_argument("--ticks", type=int, default=300)
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("creating cgroups needs root")
    work = Path(tempfile.mkdtemp(prefix="sloguard-tick-"))
    print(f"creating {args.cgroups} cgroups", file=sys.stderr, flush=True)
    cgroups = BenchCgroups(args.cgroups, name="tick")
    try:
        agent = bench_agent(work, cgroups)
        spent: dict[str, float] = defaultdict(float)
        for collector in agent.collectors:
            collector.collect = _timed(spent, f"collect {collector.name}", collector.collect)
        agent.windows.add = _timed(spent, "windows", agent.windows.add)
        agent._flush = _timed(spent, "store", agent._flush)
        agent.engine.evaluate = _timed(spent, "evaluate", agent.engine.evaluate)
        agent.attributor.tick = _timed(spent, "attribute", agent.attributor.tick)
        agent.ladder.tick = _timed(spent, "ladder", agent.ladder.tick)
        agent.guard_cost.observe = _timed(spent, "guard cost", agent.guard_cost.observe)
        agent.guard_cost.tick = _timed(spent, "guard cost", agent.guard_cost.tick)
        base = time.time_ns()
        warm = 15
        simulated = [0]  # the tick being run: the store's fold is due by this clock too
        if hasattr(agent.store, "clock"):
            agent.store.clock = lambda: float(simulated[0])
        for i in range(warm):  # windows filled, discovery and first applies done
            agent.tick(base + i * S)
            time.sleep(0.05)
        spent.clear()
        print(f"{args.ticks} ticks", file=sys.stderr, flush=True)
        start = time.process_time()
        for i in range(warm, warm + args.ticks):
            simulated[0] = i
            agent.tick(base + i * S)
            time.sleep(0.001)  # let the kernel's counters move between reads
        total = time.process_time() - start
        # A standing lever is checked in full every STANDING_CHECK_NS (a reset value put
        # back), not on every tick: on the real clock a few hundred simulated ticks hold one or
        # two, so its cost is timed apart, each check forced.
        checks = 20
        started = time.process_time()
        for _ in range(checks):
            agent.ladder._standing_checked.clear()
            agent.ladder._stand(time.monotonic_ns())
        full_check = (time.process_time() - started) / checks
        phases = dict(spent)
        # Evaluation on arrival, a rule held back (LS over its objective, BE idle): each
        # arrival looks at the CPU of the cgroups the rule's `and:` conditions select
        # (cpu_rise), and reads all of them afresh (_collect_fresh) only when it has risen
        selectors = [s for found in agent.cgroup_conditions(
            [rule for rule in agent.rules.rules if rule.spec.on_arrival]).values()
            for s in found]
        looks = 200
        started = time.process_time()
        for _ in range(looks):
            agent.cgroups.cpu_rise(selectors)
        look = (time.process_time() - started) / looks
        reads = 20
        started = time.process_time()
        for _ in range(reads):
            agent._collect_fresh()  # waits 100 ms after the last: not on this CPU clock
        fresh = (time.process_time() - started) / reads
        yard = _yardstick()
        agent.stop()
    finally:
        cgroups.remove()
        shutil.rmtree(work, ignore_errors=True)
    print(f"\n{args.cgroups} cgroups, {args.ticks} ticks on a simulated 1 s clock\n")
    per_tick = print_phases({**phases, "**total**": total}, args.ticks, "tick",
                            "the rest of the tick")
    print(f"\ntick / yardstick ({1000 * yard:.1f} ms): {per_tick / 1000 / yard:.3f}")
    every = STANDING_CHECK_NS / 1e9
    print(f"a standing lever's full check, every {every:g} s: {1000 * full_check:.2f} ms "
          f"({1000 * full_check / every:.2f} ms a second)")
    print(f"a held-back arrival's look at BE's CPU (cpu_rise): {1000 * look:.3f} ms, against "
          f"{1000 * fresh:.2f} ms for the fresh read of every cgroup it spares "
          f"({look / fresh:.3f} of it)")


if __name__ == "__main__":
    main()
