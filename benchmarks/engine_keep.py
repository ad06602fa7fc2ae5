"""What one rule costs per evaluation as rules are added (issue #19: the `keep` scan).

Per-series detectors (the path every plugin without a batch form takes). The engine once
scanned every rule's detectors after each rule's evaluation to forget series gone, because
`len(engine._detectors) > len(self.inputs)` is true as soon as there are two rules: a tick cost
rules x all detectors. This prints the cost of one rule's evaluation with R rules as a ratio to
its cost with one rule, measured in the same run (the fastest of the steady ticks, as shared
machines are noisy); flat means linear, growing with R quadratic.

    python benchmarks/engine_keep.py [--series 200] [--rules 1,5,20,50]
"""

from __future__ import annotations

import argparse
import tempfile
import textwrap
import time
from pathlib import Path

from sloguard.actuators.dryrun import DryRunActuator
from sloguard.core.samples import Sample
from sloguard.detector.engine import Engine
from sloguard.detector.recent import RecentWindows
from sloguard.detector.registry import DetectorRegistry
from sloguard.detector.rules import RuleSet
from sloguard.store.incidents_db import IncidentStore

S = 10**9
T0 = 1_800_000_000 * S
RULE = """\
      - alert: R{n}
        expr: lat{{class="LS"}}
        field: p99
        aggregate: last
        window: 3s
        detector: ewma
        params: {{warmup: 1000}}
"""


def per_rule_ms(rules: int, series: int, ticks: int, workdir: Path) -> float:
    (workdir / "rules").mkdir(parents=True)
    text = "groups:\n  - name: bench\n    rules:\n" + "".join(
        textwrap.dedent(RULE).replace("- alert", "      - alert").format(n=n)
        .replace("\n  ", "\n        ") for n in range(rules))
    (workdir / "rules" / "r.yaml").write_text(text)
    ruleset = RuleSet([str(workdir / "rules")])
    ruleset.reload()
    assert len(ruleset.rules) == rules, ruleset.errors
    windows = RecentWindows()
    engine = Engine(windows, IncidentStore(workdir / "incidents.db"), ruleset, "node-a",
                    DryRunActuator("node-a"), registry=DetectorRegistry(), batches=False,
                    timeout_s=30.0)
    engine.sync_windows(None, T0)
    best = float("inf")
    for tick in range(ticks):
        now = T0 + tick * S
        windows.add([Sample("lat", {"class": "LS", "pod": f"p{i}"}, {"p99": 1.0 + i % 7}, now)
                     for i in range(series)])
        started = time.perf_counter()
        engine.evaluate(now)
        if tick >= 2:  # detectors built: steady state; the fastest tick, as the machine is
            best = min(best, time.perf_counter() - started)  # shared and noisy
    return best / rules * 1000


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--series", type=int, default=200)
    parser.add_argument("--rules", default="1,5,20,50")
    parser.add_argument("--ticks", type=int, default=15)
    args = parser.parse_args()
    counts = [int(n) for n in args.rules.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        costs = {n: per_rule_ms(n, args.series, args.ticks, Path(tmp) / str(n)) for n in counts}
    base = costs[counts[0]]
    print(f"{args.series} series per rule, per-series detectors (ewma)")
    for n, ms in costs.items():
        print(f"  {n:3d} rules: {ms:7.3f} ms per rule per tick, {ms / base:5.2f}x the cost "
              f"with {counts[0]} rule")


if __name__ == "__main__":
    main()
