"""What ranking an incident's suspects costs the agent, with 100 BE cgroups on the node.

Target (issue #22): attribution under 0.2% of a core with 100 cgroups. It runs only while an
incident under a policy fires: once at firing, then every `attribution.every` (10 s). The
benchmark fills a real embedded store with what the collectors would have written over the
window (CPU, I/O and memory pressure, block I/O, reclaim and the run-queue blame of 100 BE
cgroups, and the LS signal), ranks one firing incident repeatedly with the shipped scorers,
and reports the CPU time per ranking, its share of a core at `every`, and, as a machine-speed
reference measured in the same run, the same ratio for a fixed pure-Python yardstick.

    .venv/bin/python benchmarks/attribution_cost.py [--cgroups 100] [--rounds 20]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
from agent_overhead import _yardstick  # the same CPU-speed reference (benchmarks/ on the path)

from sloguard.core.incidents import FIRING, Incident
from sloguard.core.samples import Sample
from sloguard.detector.attribution.attributor import Attributor
from sloguard.detector.attribution.case import as_reader
from sloguard.detector.config import AttributionConfig
from sloguard.store.embedded import open_store

S = 10**9


def fill(store, cgroups: int, start_ns: int, seconds: int) -> list[dict[str, str]]:
    rng = np.random.default_rng(1)
    workloads = [{"node": "n", "cgroup": f"/bench/be{i:03d}", "class": "BE", "level": "cgroup",
                  "workload": f"be{i:03d}"} for i in range(cgroups)]
    ls = {"node": "n", "cgroup": "/bench/ls", "class": "LS", "level": "cgroup",
          "workload": "ls"}
    onset = seconds // 2
    for t in range(seconds):
        at = start_ns + t * S
        batch = [Sample("app_slo", {"node": "n", "slo": "ls"},
                        {"latency_ratio": (3.0 if t >= onset else 1.0) + rng.normal(0, .1)}, at)]
        for n, w in enumerate(workloads):
            busy = 1.9 if (n == 0 and t >= onset) else 0.02 + rng.random() * 0.01
            batch += [
                Sample("container_cpu", w, {"usage_cores": busy}, at),
                Sample("container_pressure", {**w, "resource": "io"}, {"some_rate": 0.1}, at),
                Sample("container_pressure", {**w, "resource": "memory"},
                       {"some_rate": 0.0}, at),
                Sample("ebpf_block_io", {**w, "device": "vda", "op": "write"},
                       {"count": int(rng.integers(0, 5))}, at),
                Sample("ebpf_reclaim", {**w, "kind": "memcg"}, {"total_us": 0.0}, at)]
            batch.append(Sample("ebpf_runqueue_blame", {**ls, "culprit": w["cgroup"],
                                                         "culprit_class": "BE"},
                                {"wait_us": 900.0 if busy > 1 else 2.0, "count": 5}, at))
        store.write(batch)
    return workloads


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cgroups", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--window", type=int, default=0,
                        help="seconds ranked (default 2 x lookback: an incident firing for a "
                             "minute; the longest is 4 x lookback)")
    args = parser.parse_args()
    config = AttributionConfig()
    seconds = args.window or int(config.lookback) * 2
    with tempfile.TemporaryDirectory() as tmp:
        store = open_store(Path(tmp), 86400, 2**32)
        start = (time.time_ns() // S - seconds - 5) * S
        print(f"filling the store: {args.cgroups} BE cgroups x {seconds} s ...", flush=True)
        workloads = fill(store, args.cgroups, start, seconds)
        onset = start + seconds // 2 * S
        incident = Incident("bench", "f", "LSLatencyInterference", "ls", "warning", "n",
                            FIRING, {"node": "n", "slo": "ls"}, onset, onset, fired_ns=onset,
                            policy="ls-interference", labels={"resource": "cpu"},
                            signal={"measurement": "app_slo", "field": "latency_ratio",
                                    "expr": "app_slo"})
        attributor = Attributor(config, as_reader(store), lambda: workloads, lambda i: None)
        now = start + seconds * S
        cpu = []
        for n in range(args.rounds):
            t0 = time.process_time()
            suspects = attributor.attribute(incident, now)
            cpu.append(time.process_time() - t0)
            print(f"\rranking {n + 1}/{args.rounds}", end="", flush=True)
        print()
        attributor.close()
        store.close()
    assert suspects and suspects[0].cgroup == "/bench/be000", suspects[:2]
    per_ranking = statistics.median(cpu)
    share = per_ranking / config.every
    yardstick = statistics.median(_yardstick() for _ in range(5))
    print(f"one ranking ({args.cgroups} BE cgroups, {seconds} s window, "
          f"{len(config.scorers)} scorers): {per_ranking * 1000:.1f} ms CPU (median of "
          f"{args.rounds}; min {min(cpu) * 1000:.1f}, max {max(cpu) * 1000:.1f})")
    print(f"at attribution.every = {config.every:g}s while an incident fires: "
          f"{share * 100:.3f}% of a core (target < 0.2%)")
    print(f"yardstick (fixed pure-Python work, same run): {yardstick * 1000:.1f} ms; one "
          f"ranking = {per_ranking / yardstick:.2f} yardsticks")
    print(f"first suspect {suspects[0].cgroup} score {suspects[0].score:.2f}; "
          f"{len(suspects)} suspects")


if __name__ == "__main__":
    main()
