"""One engine tick over many series: what a rule costs end to end, not just its detector.

An `ewma` rule and a `threshold` rule over N series (one sample per series per second, a 5 s
window), evaluated by the real Engine on real RecentWindows: routing the tick's samples, each
series' aggregate, the detectors (their batch form, and one object per series for comparison),
and the alert states. Printed against a plain per-series river loop over the same N series
measured in the same run (machines here are noisy: read the ratios).

    .venv/bin/python benchmarks/engine_tick.py [--series 100000] [--ticks 12]
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from river import stats

from sloguard.actuators.dryrun import DryRunActuator
from sloguard.core.samples import Sample
from sloguard.detector.engine import Engine
from sloguard.detector.recent import RecentWindows
from sloguard.detector.registry import DetectorRegistry
from sloguard.detector.rules import RuleSet
from sloguard.store.incidents_db import IncidentStore

S = 10**9
T0 = 1_800_000_000 * S
RULES = """\
groups:
  - name: bench
    rules:
      - alert: Unusual
        expr: m
        field: v
        aggregate: last
        window: 5s
        detector: ewma
        params: {warmup: 5, band: 6, min_std: 1}
      - alert: High
        expr: m
        field: v
        aggregate: max
        window: 5s
        params: {above: 50}
"""


def river_loop(n: int, ticks: np.ndarray) -> float:
    """Median ms of a bare per-series loop: EWMean + EWVar + a band and a bound per series."""
    means = [stats.EWMean(fading_factor=0.1) for _ in range(n)]
    variances = [stats.EWVar(fading_factor=0.1) for _ in range(n)]
    took = []
    for values in ticks:
        started = time.perf_counter()
        for i in range(n):
            x = float(values[i])
            mean, var = means[i], variances[i]
            m, v = mean.get(), var.get()
            _ = (v > 0 and (x - m) / v**0.5 > 6) or x > 50
            mean.update(x)
            var.update(x)
        took.append(time.perf_counter() - started)
    return statistics.median(took[2:]) * 1000


def engine_ticks(n: int, ticks: np.ndarray, batches: bool) -> tuple[float, float]:
    """Median ms of routing one tick's samples, and of evaluating both rules."""
    tmp = Path(tempfile.mkdtemp(prefix="sloguard-bench-"))
    (tmp / "rules").mkdir()
    (tmp / "rules" / "r.yaml").write_text(RULES)
    rules = RuleSet([str(tmp / "rules")])
    rules.reload()
    windows = RecentWindows()
    engine = Engine(windows, IncidentStore(tmp / "incidents.db"), rules, "bench",
                    DryRunActuator("bench"), registry=DetectorRegistry(), timeout_s=600,
                    batches=batches)
    engine.sync_windows(None, T0)
    tags = [{"node": "bench", "pod": f"pod-{i}"} for i in range(n)]
    added, evaluated = [], []
    for tick, values in enumerate(ticks):
        now = T0 + tick * S
        samples = [Sample("m", tags[i], {"v": float(values[i])}, now) for i in range(n)]
        started = time.perf_counter()
        windows.add(samples)
        middle = time.perf_counter()
        engine.evaluate(now)
        added.append(middle - started)
        evaluated.append(time.perf_counter() - middle)
    errors = {k: s.error for k, s in engine.status.items() if s.error}
    if errors:
        raise SystemExit(f"rules failed: {errors}")
    warm = slice(8, None)  # after the EWMA warm-up and the first prunes
    return (statistics.median(added[warm]) * 1000, statistics.median(evaluated[warm]) * 1000)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--series", type=int, default=100_000)
    parser.add_argument("--ticks", type=int, default=12)
    args = parser.parse_args()
    logging.disable(logging.WARNING)
    n = args.series
    ticks = np.random.default_rng(0).normal(10, 1, (args.ticks + 8, n))
    print(f"[1/3] plain per-series river loop over {n} series", file=sys.stderr, flush=True)
    river_ms = river_loop(n, ticks[:8])
    print(f"[2/3] engine, batch detectors, {len(ticks)} ticks", file=sys.stderr, flush=True)
    add_ms, batch_ms = engine_ticks(n, ticks, batches=True)
    print(f"[3/3] engine, one detector per series, {len(ticks)} ticks", file=sys.stderr,
          flush=True)
    _, series_ms = engine_ticks(n, ticks, batches=False)
    print(f"\n{n} series, two rules (ewma + threshold), one tick (median); reference: a plain "
          f"per-series river loop, {river_ms:.0f} ms\n")
    print("| what | ms | x the river loop |")
    print("|---|---|---|")
    print(f"| plain per-series river loop (one signal) | {river_ms:.0f} | 1.00 |")
    print(f"| routing the tick's samples to the rules' windows | {add_ms:.0f} | "
          f"{add_ms / river_ms:.2f} |")
    print(f"| engine evaluation, batch detectors | {batch_ms:.0f} | {batch_ms / river_ms:.2f} |")
    print(f"| engine evaluation, one detector per series | {series_ms:.0f} | "
          f"{series_ms / river_ms:.2f} |")


if __name__ == "__main__":
    main()
