"""Where an evaluation on arrival goes: the pushed-to 100-cgroup agent's `_on_arrival` in-process.

`agent_overhead.py --push-every` says whether the agent with a service pushing stays in the
node budget (it did not, in any run of 2026-12-07); this one says what to change. It builds
the agent of that benchmark's pushed run (the same real cgroups, one LS in ten, the shipped
rules and policies, the embedded store, an SLO and the push receiver) in this process, pushes
the same 50 observations through the real receive route (the app on a TestClient), and times
each phase of the arrival that follows with the CPU clock of the loop's thread; the detector
worker's CPU is timed on its own thread. The service is over its objective and BE idle, so the
interference rules are held back on each arrival: the expensive case, as in agent_overhead.

    sudo .venv/bin/python benchmarks/agent_arrival.py [--cgroups 100] [--arrivals 60] [--grouped]
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

sys.path.insert(0, str(Path(__file__).parent))

from agent_overhead import PUSH_BODY, PUSH_HEADERS, PUSH_TOKEN, BenchCgroups, _yardstick
from agent_tick import _timed, bench_agent, print_phases


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cgroups", type=int, default=100)
    parser.add_argument("--arrivals", type=int, default=60)
    parser.add_argument("--grouped", action="store_true",
                        help="the BE cgroups under one parent and the LS ones under another, "
                        "as the kubelet's QoS cgroups (the look reads the BE parent alone)")
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("creating cgroups needs root")
    from fastapi.testclient import TestClient

    from sloguard.ui.app import create_app

    work = Path(tempfile.mkdtemp(prefix="sloguard-arrival-"))
    print(f"creating {args.cgroups} cgroups", file=sys.stderr, flush=True)
    cgroups = BenchCgroups(args.cgroups, name="arrival", grouped=args.grouped)
    try:
        (work / "token").write_text(PUSH_TOKEN)
        agent = bench_agent(
            work, cgroups,
            f"app_latency: {{receive: {{enabled: true, token_file: '{work / 'token'}'}}}}\n"
            "slos:\n  - {service: bench, latency_ms: 100, window: 2s}\n")
        client = TestClient(create_app(agent, manage_lifecycle=False),
                            base_url="http://127.0.0.1")

        def push() -> None:
            answer = client.post("/api/v1/observations", content=PUSH_BODY,
                                 headers=PUSH_HEADERS)
            if answer.status_code != 200:
                raise SystemExit(f"the push was refused: {answer.status_code} {answer.text}")

        def arrivals(count: int, each: Callable[[], None]) -> None:
            """Two pushes a tick, as at pushes every 0.5 s, each followed by its arrival."""
            for i in range(count):
                if i % 2 == 0:
                    agent.tick()
                push()
                time.sleep(0.2)  # past CONFIRM_S after the tick's collection
                each()
                time.sleep(0.25)

        print("warming up", file=sys.stderr, flush=True)
        arrivals(20, agent._on_arrival)
        spent: dict[str, float] = defaultdict(float)
        counting = [False]
        for owner, name, phase in (
                (agent.app_latency, "collect", "take what arrived (SLO window)"),
                (agent.windows, "add", "windows"),
                (agent.engine, "evaluate", "evaluate (the loop thread's part)"),
                (agent.cgroups, "cpu_rise", "look at BE's CPU (cpu_rise)"),
                (agent, "_collect_fresh", "fresh read of every cgroup")):
            setattr(owner, name, _timed(spent, phase, getattr(owner, name), time.thread_time,
                                        counting))
        worker = agent.engine._worker
        # the detector worker's own CPU clock (the loop thread waits on it while it runs)
        worker_clock = (time.pthread_getcpuclockid(worker._thread.ident)
                        if worker is not None and worker._thread.ident else None)
        total = [0.0, 0.0]  # the loop thread's CPU in arrivals, the worker's

        def timed_arrival() -> None:
            counting[0] = True
            start = time.thread_time()
            worker_start = time.clock_gettime(worker_clock) if worker_clock is not None else 0.0
            try:
                agent._on_arrival()
            finally:
                total[0] += time.thread_time() - start
                if worker_clock is not None:
                    total[1] += time.clock_gettime(worker_clock) - worker_start
                counting[0] = False

        before = (agent.arrival_evaluations, agent.arrival_reads,
                  agent.engine.unchanged_on_arrival)
        print(f"{args.arrivals} arrivals", file=sys.stderr, flush=True)
        arrivals(args.arrivals, timed_arrival)
        evaluations = agent.arrival_evaluations - before[0]
        reads = agent.arrival_reads - before[1]
        unchanged = agent.engine.unchanged_on_arrival - before[2]
        worker_cpu = total[1] if worker_clock is not None else None
        yard = _yardstick()
        agent.stop()
    finally:
        cgroups.remove()
        shutil.rmtree(work, ignore_errors=True)
    layout = "BE and LS under a parent each" if args.grouped else "side by side"
    print(f"\n{args.cgroups} cgroups ({layout}), {args.arrivals} arrivals ({evaluations} "
          f"evaluated, {reads} read the cgroups afresh; {unchanged} held-back rules not judged "
          "again, nothing new for their conditions)\n")
    print("the loop thread's CPU:\n")
    per = print_phases({**spent, "**total**": total[0]}, args.arrivals, "arrival",
                       "the rest (ladder, attribution, bookkeeping)", digits=3)
    if worker_cpu is not None:
        print(f"\nthe detector worker's thread: {1000 * worker_cpu / args.arrivals:.3f} ms "
              "per arrival")
    print(f"arrival / yardstick ({1000 * yard:.1f} ms): {per / 1000 / yard:.4f}")


if __name__ == "__main__":
    main()
