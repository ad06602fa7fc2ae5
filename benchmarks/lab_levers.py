"""Each suppression lever held in force, against each lab antagonist: what the levers can reach
when they are in place from the start, apart from how fast the guardrail puts them there.

The shipped policy's lever order comes from these figures (docs/lab.md). Per cell: fresh lab
cgroups, redis on the LS core under the lab's open-loop client (off the LS core, SCHED_FIFO),
the levers applied to the BE cgroup before the antagonist starts (by the agent's own lever
classes, with the shipped policy's params: the cpuset lever reserves half the CPUs, lowest
first, for LS, which is the LS core `0` on a 2-CPU machine), then `--quiet` seconds without BE
and `--seconds` of the antagonist. The LS p99 is over the antagonist's seconds;
ratios are against the same repeat's `base` cell (no BE) and BE throughput against the same
repeat's `none` cell (BE, no lever): machines here are noisy, read the ratios. Repeats go round
the cells, so a drift of the machine spreads over all of them. Root, redis-server, stress-ng.

    sudo .venv/bin/python benchmarks/lab_levers.py [--antagonists cpu cache io] [--repeats 2]
        [--cells base none cpu_idle cpuset cpu_idle+cpuset] [--plot lab-levers.png]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from sloguard.actuators.cpu_idle import CpuIdle
from sloguard.actuators.cpu_quota import CpuQuota
from sloguard.actuators.cpuset import Cpuset
from sloguard.actuators.env import ActuatorEnv
from sloguard.actuators.ledger import Ledger
from sloguard.actuators.memory_limit import MemoryLimit
from sloguard.actuators.step import DONE, Step, StepContext
from sloguard.lab.agent import BE_CGROUP, LS_CGROUP
from sloguard.lab.antagonists import Antagonist
from sloguard.lab.scenario import BeSpec, LsSpec
from sloguard.lab.way import LabStage

# the shipped policy's levers with its params (none); and the memory antagonist's candidates
# (#23): a CFS quota leaving BE 70% of the node minus what LS uses, with the default 100 ms
# period and a finer 10 ms one, and a hard memory limit below the vm workers' 2 GiB (v1 has no
# memory.high: the limit makes the kernel reclaim BE's pages as it churns)
LEVERS: dict[str, tuple[type, dict[str, Any]]] = {
    "cpu_idle": (CpuIdle, {}),
    "cpuset": (Cpuset, {}),
    "quota": (CpuQuota, {"threshold_percent": 70, "min_cores": 0.5}),
    "quota_fine": (CpuQuota, {"threshold_percent": 70, "min_cores": 0.5, "period_us": 10_000}),
    "memory_limit": (MemoryLimit, {"min_bytes": "1536MiB"}),
}
NODE = "sloguard-lab"
Held = list[tuple[Step, StepContext, dict[str, Any]]]


def hold(levers: list[str], workdir: Path) -> Held:
    """Each lever applied to the lab's BE cgroup by the agent's own lever class, as the
    ladder would; SystemExit when one cannot be held here as named (a fallback, such as the
    minimum weight for a missing cpu.idle, would measure another lever). What undo needs."""
    env = ActuatorEnv(NODE, Ledger(workdir / "actuators.db"))
    inventory = [{"cgroup": "/" + LS_CGROUP, "class": "LS", "level": "cgroup",
                  "workload": "redis"},
                 {"cgroup": "/" + BE_CGROUP, "class": "BE", "level": "cgroup",
                  "workload": "stress-ng"}]
    held: Held = []
    for name in levers:
        kind, params = LEVERS[name]
        step = kind(dict(params), env)
        if (why := step.available()) is not None:
            raise SystemExit(f"{name} cannot be held here: {why}")
        ctx = StepContext(NODE, time.time_ns(), False, "lab-levers",
                          "held in force for the whole cell", lambda: inventory)
        result = step.apply(ctx)
        print(f"  {name}: {result.status}: {result.detail}", file=sys.stderr, flush=True)
        if result.status != DONE or "not done:" in result.detail or "instead" in result.detail:
            raise SystemExit(f"{name} was not held as named ({result.status}): {result.detail}")
        held.append((step, ctx, result.undo))
    env.ledger.close()  # the undo records are in `held`; the levers do not need it again
    return held


def release(held: Held) -> None:
    """Undo in reverse order, as the ladder does; SystemExit when an undo fails (the next
    cell would start with a lever still in force)."""
    for step, ctx, undo in reversed(held):
        result = step.undo(ctx, undo)
        if result.status != DONE:
            raise SystemExit(f"{step.kind} was not undone ({result.status}): {result.detail}")


def cell(antagonist: str, levers: list[str], with_be: bool, workdir: Path, ls: LsSpec,
         quiet: float, seconds: float) -> dict[str, float]:
    with LabStage(ls, workdir) as stage:
        held = hold(levers, workdir)
        stage.start_ls()
        start_ns = time.time_ns() + int(2e9)
        relay = stage.start_client(quiet + seconds + 1, start_ns)
        time.sleep(max(0.0, (start_ns - time.time_ns()) / 1e9) + quiet)
        bogo_per_s = 0.0
        if with_be:
            running = Antagonist(antagonist, seconds, BeSpec(), stage.be_cgroup, workdir)
            stage.running.append(running)
            run = running.finish(timeout=seconds + 10)
            stage.running.remove(running)
            bogo_per_s = run.bogo_ops / run.seconds
        stage.finish_client(timeout=seconds + 60)
        release(held)
        records = relay.records()
        due_s = (records[:, 0] - start_ns) / 1e9
        inside = (records[:, 2] >= 0) & (due_s >= quiet) & (due_s < quiet + seconds)
        latency_ms = (records[inside, 2] - records[inside, 0]) / 1e6
        return {"p99_ms": float(np.percentile(latency_ms, 99)), "be_ops_per_s": bogo_per_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--antagonists", nargs="+", default=["cpu", "cache", "io"])
    parser.add_argument("--cells", nargs="+",
                        default=["base", "none", "cpu_idle", "cpuset", "cpu_idle+cpuset"],
                        help="base: no BE; none: BE, no lever; else levers joined by +")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--quiet", type=float, default=5.0)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--json", type=Path, help="every cell's figures, one JSON per line")
    parser.add_argument("--plot", type=Path, help="a PNG of the ratios")
    args = parser.parse_args()
    for name in args.cells:
        unknown = [lever for lever in name.split("+") if name not in ("base", "none")
                   and lever not in LEVERS]
        if unknown:
            parser.error(f"cell {name}: unknown lever {unknown[0]} (known: {', '.join(LEVERS)})")
    ls = LsSpec()
    rows: list[dict] = []
    total = len(args.antagonists) * len(args.cells) * args.repeats
    with tempfile.TemporaryDirectory(prefix="lab-levers-") as tmp:
        for antagonist in args.antagonists:
            for repeat in range(1, args.repeats + 1):
                for name in args.cells:
                    levers = [] if name in ("base", "none") else name.split("+")
                    print(f"[{len(rows) + 1}/{total}] {antagonist} repeat {repeat}: {name}",
                          file=sys.stderr, flush=True)
                    figures = cell(antagonist, levers, name != "base",
                                   Path(tmp) / f"{antagonist}-{repeat}-{name}", ls,
                                   args.quiet, args.seconds)
                    rows.append({"antagonist": antagonist, "repeat": repeat, "cell": name,
                                 **figures})
                    if args.json:
                        with args.json.open("a") as out:
                            out.write(json.dumps(rows[-1]) + "\n")
    table = ratios(rows)
    print(f"{'antagonist':10s} {'cell':18s} {'LS p99 vs base':>16s} {'BE vs none':>12s}  "
          "(median of repeats; each repeat's in brackets)")
    for (antagonist, name), (p99, be) in table.items():
        print(f"{antagonist:10s} {name:18s} {_fmt(p99):>16s} {_fmt(be):>12s}  "
              f"[{', '.join(f'{v:.2f}' for v in p99)}] [{', '.join(f'{v:.2f}' for v in be)}]")
    if args.plot:
        plot(table, args.plot)
        print(f"plot: {args.plot}")


def ratios(rows: list[dict]) -> dict[tuple[str, str], tuple[list[float], list[float]]]:
    """(antagonist, cell) -> (LS p99 / base p99, BE ops / none ops), one per repeat."""
    by = {(r["antagonist"], r["repeat"], r["cell"]): r for r in rows}
    table: dict[tuple[str, str], tuple[list[float], list[float]]] = {}
    for (antagonist, repeat, name), row in by.items():
        base = by.get((antagonist, repeat, "base"))
        none = by.get((antagonist, repeat, "none"))
        p99, be = table.setdefault((antagonist, name), ([], []))
        if base:
            p99.append(row["p99_ms"] / base["p99_ms"])
        if none and name != "base" and none["be_ops_per_s"]:
            be.append(row["be_ops_per_s"] / none["be_ops_per_s"])
    return table


def _fmt(values: list[float]) -> str:
    return f"{statistics.median(values):.2f}x" if values else "-"


def plot(table: dict[tuple[str, str], tuple[list[float], list[float]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=110)
    for (antagonist, name), (p99, be) in table.items():
        if name == "base" or not p99 or not be:
            continue
        ax.scatter(statistics.median(be), statistics.median(p99), s=30)
        ax.annotate(f"{antagonist}: {name}", (statistics.median(be), statistics.median(p99)),
                    fontsize=7, xytext=(4, 2), textcoords="offset points")
    ax.axhline(1.25, color="black", ls="--", lw=0.8, label="LS p99 target (1.25x baseline)")
    ax.axvline(0.5, color="grey", ls=":", lw=0.8, label="BE floor (50% of unguarded)")
    ax.set_yscale("log")
    ax.set_xlabel("BE throughput vs no lever")
    ax.set_ylabel("LS p99 vs no BE (log)")
    ax.set_title("levers held in force, per antagonist (median of repeats)")
    ax.legend(fontsize=7)
    ax.grid(True, which="both", alpha=0.25)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


if __name__ == "__main__":
    main()
