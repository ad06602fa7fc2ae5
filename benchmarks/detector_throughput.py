"""Detector throughput per tick: EWMA + threshold and anomaly_likelihood over 100k series,
change-point on 1k points.

Targets (issue #3): EWMA + threshold for 100,000 series in one tick under 10 ms; change-point on
a 1,000-point window under 5 ms. Each is printed against a plain per-series river loop over the
same 100,000 series, measured in the same run (machines here are noisy: read the ratios).
Issue #25: the batch form of anomaly_likelihood, the same target, printed against its
per-series detectors over the same 100,000 series in the same run; its median tick, its mean
over 200 ticks (one pruning of every slot: every `memory` / 10 values), its slowest tick there,
the tick that ends the warm-up of every slot at once, and its memory per series. The same for
the batch form of anomaly_channels (its per-series detectors measured on a tenth of the series:
100,000 of them would hold gigabytes), with the ticks at a segment boundary, where every slot
takes the prototype step, apart from the others.

    .venv/bin/python benchmarks/detector_throughput.py [--series 100000] [--only channels]

`--only channels` measures the anomaly_channels part alone (its per-series detectors and its
batch form), printing its rows against the per-series detectors.
"""

from __future__ import annotations

import argparse
import copy
import pickle
import statistics
import sys
import time

import numpy as np
from river import stats

from sloguard.detector.registry import DetectorRegistry
from sloguard.plugins.anomaly_channels import AnomalyChannelsBatch
from sloguard.plugins.anomaly_likelihood import AnomalyLikelihoodBatch
from sloguard.plugins.changepoint import make_algorithm, penalty
from sloguard.plugins.ewma import EWMABatch
from sloguard.plugins.threshold import ThresholdBatch


def timed(run, repeats: int) -> float:
    """Median milliseconds of `run()` over `repeats` calls."""
    samples = []
    for _ in range(repeats):
        started = time.perf_counter()
        run()
        samples.append((time.perf_counter() - started) * 1000)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--series", type=int, default=100_000)
    parser.add_argument("--only", choices=["channels"],
                        help="measure only this part (its rows against its per-series "
                             "detectors)")
    args = parser.parse_args()
    n = args.series
    rng = np.random.default_rng(0)
    if args.only == "channels":
        print_channels(anomaly_channels(n, rng), n)
        return
    ticks = rng.normal(10, 1, (40, n))
    params = {"warmup": 5, "band": 3}

    print(f"[1/8] plain river loop over {n} series", file=sys.stderr, flush=True)
    means = [stats.EWMean(fading_factor=0.1) for _ in range(n)]
    variances = [stats.EWVar(fading_factor=0.1) for _ in range(n)]
    row = iter(ticks)

    def river_loop() -> None:
        values = next(row)
        for i in range(n):
            x = float(values[i])
            mean, var = means[i], variances[i]
            m, v = mean.get(), var.get()
            _ = (v > 0 and (x - m) / v**0.5 > 3) or x > 50  # EWMA band + a threshold
            mean.update(x)
            var.update(x)

    river_ms = timed(river_loop, 5)

    print(f"[2/8] sloguard's per-series detectors over {n} series", file=sys.stderr, flush=True)
    registry = DetectorRegistry()
    detectors = [registry.make("ewma", params) for _ in range(n)]
    thresholds = [registry.make("threshold", {"above": 50}) for _ in range(n)]
    row = iter(ticks)

    def per_series() -> None:
        values = next(row)
        for i in range(n):
            x = float(values[i])
            detectors[i].update(x, 0)
            thresholds[i].update(x, 0)

    per_series_ms = timed(per_series, 5)

    print(f"[3/8] vectorised EWMA + threshold over {n} series", file=sys.stderr, flush=True)
    batch = EWMABatch(params)
    bound = ThresholdBatch({"above": 50})
    for values in ticks[:10]:
        batch.update(values, 0)
    row = iter(ticks[10:])

    def vectorised() -> None:
        values = next(row)
        batch.update(values, 0)
        bound.update(values, 0)

    vector_ms = timed(vectorised, 25)

    print("[4/8] change-point on a 1,000-point window", file=sys.stderr, flush=True)
    window = np.concatenate([rng.normal(0, 1, 400), rng.normal(3, 1, 300),
                             rng.normal(1, 1, 300)]).reshape(-1, 1)
    default = make_algorithm("grid", 5, "linear")  # the detector's default segmentation
    cpd_ms = timed(lambda: default.fit(window).predict(pen=penalty(window, 3.0, "linear")), 20)
    binseg = make_algorithm("binseg", 5, "linear")  # the default before the grid search
    binseg_ms = timed(lambda: binseg.fit(window).predict(pen=penalty(window, 3.0, "linear")), 20)

    likelihood = anomaly_likelihood(n, rng)
    channels = anomaly_channels(n, rng)

    print(f"\n{n} series, one tick (median); reference: a plain per-series river loop, "
          f"{river_ms:.1f} ms\n")
    print("| what | ms | x the river loop | target |")
    print("|---|---|---|---|")
    print(f"| plain per-series river loop (EWMean + EWVar + bound) | {river_ms:.1f} | 1.00 | |")
    print(f"| sloguard per-series `ewma` + `threshold` detectors | {per_series_ms:.1f} | "
          f"{per_series_ms / river_ms:.2f} | |")
    print(f"| batch EWMA + threshold (EWMABatch, ThresholdBatch) | {vector_ms:.2f} | "
          f"{vector_ms / river_ms:.4f} | < 10 ms: {'met' if vector_ms < 10 else 'NOT met'} |")
    print(f"| change-point, default (grid, linear cost) on 1,000 points | {cpd_ms:.2f} | "
          f"{cpd_ms / river_ms:.4f} | "
          f"< 5 ms: {'met' if cpd_ms < 5 else 'NOT met'} ({cpd_ms / binseg_ms:.1f}x binseg) |")
    print(f"| change-point, binseg (linear cost) on 1,000 points | {binseg_ms:.2f} | "
          f"{binseg_ms / river_ms:.4f} | |")
    single, batch_ms = likelihood["per-series"], likelihood["median"]
    print(f"| sloguard per-series `anomaly_likelihood` detectors | {single:.1f} | "
          f"{single / river_ms:.2f} | |")
    print(f"| batch anomaly_likelihood (AnomalyLikelihoodBatch), median tick | {batch_ms:.2f} | "
          f"{batch_ms / river_ms:.4f} | < 10 ms: {'met' if batch_ms < 10 else 'NOT met'} "
          f"({batch_ms / single:.4f} x its per-series detectors) |")
    print(f"| the same, mean over 200 ticks (one pruning of every slot) | "
          f"{likelihood['mean']:.2f} | {likelihood['mean'] / river_ms:.4f} | |")
    print(f"| the same, slowest of those 200 ticks (the pruning) | {likelihood['max']:.1f} | "
          f"{likelihood['max'] / river_ms:.3f} | |")
    print(f"| the same, the tick that ends every slot's warm-up at once | "
          f"{likelihood['start']:.0f} | {likelihood['start'] / river_ms:.2f} | |")
    single, quiet = channels["per-series"], channels["median"]
    print(f"| sloguard per-series `anomaly_channels` detectors ({n // 10} measured, x 10) | "
          f"{single:.0f} | {single / river_ms:.2f} | |")
    print(f"| batch anomaly_channels (AnomalyChannelsBatch), median tick | {quiet:.2f} | "
          f"{quiet / river_ms:.4f} | < 10 ms: {'met' if quiet < 10 else 'NOT met'} "
          f"({quiet / single:.4f} x its per-series detectors) |")
    print(f"| the same, median tick at a segment boundary (every slot's prototype step) | "
          f"{channels['boundary']:.0f} | {channels['boundary'] / river_ms:.2f} | |")
    print(f"| the same, mean over 240 ticks (10 boundaries, 8 exact volatility sums) | "
          f"{channels['mean']:.1f} | {channels['mean'] / river_ms:.3f} | |")
    print(f"\nAnomalyLikelihoodBatch memory: {likelihood['bytes']:.0f} bytes per series; "
          f"AnomalyChannelsBatch: {channels['bytes']:.0f} bytes per series, and "
          f"{channels['prototype bytes']:.0f} of prototype memory per series after those ticks "
          f"(default parameters)")


def print_channels(channels: dict[str, float], n: int) -> None:
    """The anomaly_channels rows alone, against its per-series detectors in the same run."""
    single = channels["per-series"]
    print(f"\n{n} series; reference: sloguard's per-series `anomaly_channels` detectors "
          f"({n // 10} measured, x 10), {single:.0f} ms a tick\n")
    print("| what | ms a tick | x the per-series detectors |")
    print("|---|---|---|")
    print(f"| per-series `anomaly_channels` detectors | {single:.0f} | 1.00 |")
    for key, what in (("median", "median tick between segment boundaries"),
                      ("boundary", "median tick at a segment boundary (every slot's "
                                   "prototype step)"),
                      ("mean", "mean over 240 ticks (10 boundaries, 8 exact volatility "
                               "sums)")):
        print(f"| `AnomalyChannelsBatch`, {what} | {channels[key]:.1f} | "
              f"{channels[key] / single:.4f} |")
    print(f"\nAnomalyChannelsBatch: {channels['bytes']:.0f} bytes per series, and "
          f"{channels['prototype bytes']:.0f} of prototype memory per series after those ticks "
          f"(default parameters)")


def anomaly_channels(n: int, rng: np.random.Generator,
                     batch_type: type = AnomalyChannelsBatch) -> dict[str, float]:
    """Per-series detectors (on n / 10 series) and the batch over `n` series of N(10, 1) noise,
    past warm-up and past the first window shape (288 values)."""
    print(f"[7/8] per-series anomaly_channels over {n // 10} series", file=sys.stderr,
          flush=True)
    registry = DetectorRegistry()
    templates = []
    for _ in range(50):
        detector = registry.make("anomaly_channels", {})
        for value in rng.normal(10, 1, 340):
            detector.update(float(value), 0)
        templates.append(detector)
    # copied, not pickled: its window shape holds the numpy module, shared by the copies
    detectors = [copy.deepcopy(templates[i % len(templates)], {id(np): np})
                 for i in range(n // 10)]

    def per_series() -> None:
        values = rng.normal(10, 1, len(detectors))
        for i, detector in enumerate(detectors):
            detector.update(float(values[i]), 0)

    single = timed(per_series, 3) * 10
    detectors.clear()

    print(f"[8/8] AnomalyChannelsBatch over {n} series", file=sys.stderr, flush=True)
    batch = batch_type({})
    for _ in range(340):
        batch.update(rng.normal(10, 1, n), 0)
    quiet, boundary = [], []
    for _ in range(240):
        values = rng.normal(10, 1, n)
        ended = int(batch._count[0]) == batch.segment - 1  # every slot ends a segment now
        started = time.perf_counter()
        batch.update(values, 0)
        (boundary if ended else quiet).append((time.perf_counter() - started) * 1000)
    prototypes = batch.prototype_bytes()
    return {"per-series": single, "median": statistics.median(quiet),
            "boundary": statistics.median(boundary),
            "mean": statistics.fmean(quiet + boundary), "bytes": batch.bytes_per_slot(),
            "prototype bytes": prototypes / n}


def anomaly_likelihood(n: int, rng: np.random.Generator) -> dict[str, float]:
    """Per-series detectors and the batch over `n` series of N(10, 1) noise, past warm-up."""
    print(f"[5/8] per-series anomaly_likelihood over {n} series", file=sys.stderr, flush=True)
    registry = DetectorRegistry()
    # 200 detectors warmed on their own series, each copied to n / 200 series: n warm-ups of
    # 300 values would take minutes; a tick's cost does not depend on which state it meets
    templates = []
    for _ in range(200):
        detector = registry.make("anomaly_likelihood", {})
        for value in rng.normal(10, 1, 320):
            detector.update(float(value), 0)
        templates.append(pickle.dumps(detector))
    detectors = [pickle.loads(templates[i % len(templates)]) for i in range(n)]

    def per_series() -> None:
        values = rng.normal(10, 1, n)
        for i in range(n):
            detectors[i].update(float(values[i]), 0)

    single = timed(per_series, 3)
    detectors.clear()  # their memory, before the batch is measured

    print(f"[6/8] AnomalyLikelihoodBatch over {n} series", file=sys.stderr, flush=True)
    batch = AnomalyLikelihoodBatch({})
    warming = []
    for _ in range(320):
        values = rng.normal(10, 1, n)
        started = time.perf_counter()
        batch.update(values, 0)
        warming.append((time.perf_counter() - started) * 1000)
    ticks = []
    for _ in range(200):  # every slot prunes once in 200 values (memory 2000)
        values = rng.normal(10, 1, n)
        started = time.perf_counter()
        batch.update(values, 0)
        ticks.append((time.perf_counter() - started) * 1000)
    return {"per-series": single, "median": statistics.median(ticks),
            "mean": statistics.fmean(ticks), "max": max(ticks),
            "start": warming[batch.warmup - 1], "bytes": batch.bytes_per_slot()}


if __name__ == "__main__":
    main()
