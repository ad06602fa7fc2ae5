"""How the change-point detector segments, measured here: cost, search, penalty and their spread.

Quality: F1 (margin 5) and segmentation cover on the Turing Change Point Dataset in
../shared/bench/tcpd, one parameter set for all series (no per-series tuning), on the univariate
series and on all of them (a multivariate one segmented jointly, dimensions standardised), with
the "no change points" baseline of the same run. Speed: milliseconds to segment a 1,000-point
window, penalty included (two level shifts in noise, and plain noise, the slowest case for the
exact searches); the budget is 5 ms, and each time is also given as a ratio to binary
segmentation's (the default before the grid search) in the same run. Then how much hangs on each
default: one at a time, the noise estimates tried for the penalty, a random neighbourhood of all
of them at once, and the grid search against binary segmentation on random halves of the series.

    .venv/bin/python benchmarks/changepoint_methods.py [--tcpd ../shared/bench/tcpd] [--draws 40]
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from sloguard.detector.scoring import tcpd
from sloguard.plugins.changepoint import Segmenter, make_algorithm, penalty

HERE = Path(__file__).resolve().parent.parent
BUDGET_MS = 5.0  # issue #3: change-point on a 1k-point window in under 5 ms
DEFAULTS = {"method": "grid", "cost": "linear", "penalty": 3.0, "min_size": 5}


def segmenter(method: str, cost: str, factor: float, min_size: int,
              noise: Callable[[np.ndarray], float] | None = None,
              grid_points: int | None = None) -> Callable[[np.ndarray], list]:
    """The detector's segmentation; `noise` replaces the penalty's variance estimate."""
    algo = (make_algorithm(method, min_size, cost) if grid_points is None
            else Segmenter("grid", cost, min_size, grid_points))

    def segment(x: np.ndarray) -> list[int]:
        pen = (penalty(x, factor, cost) if noise is None
               else factor * math.log(len(x)) * max(noise(x), 1e-12))
        return [int(b) for b in algo.fit(x).predict(pen=pen)[:-1]]

    return segment


def scores(series: list[tcpd.Series], segment: Callable) -> tuple[float, float, float, float]:
    """(F1, cover) on the univariate series, then on all."""
    results = tcpd.evaluate(series, segment)
    uni, every = tcpd.summary([r for r in results if r.dimensions == 1]), tcpd.summary(results)
    return uni.f1, uni.cover, every.f1, every.cover


def mad_of_differences(order: int) -> Callable[[np.ndarray], float]:
    """sigma^2 from the MAD of the order-th differences (robust to the shifts themselves)."""
    scale = {1: 2.0, 2: 6.0}[order]  # var of the differences of white noise / sigma^2

    def noise(x: np.ndarray) -> float:
        d = np.diff(x, n=order, axis=0)
        mad = np.median(np.abs(d - np.median(d, axis=0)), axis=0)
        return float(((1.4826 * mad) ** 2 / scale).sum())

    return noise


def milliseconds(method: str, cost: str, window: np.ndarray, grid_points: int | None = None
                 ) -> float:
    algo = (make_algorithm(method, 5, cost) if grid_points is None
            else Segmenter("grid", cost, 5, grid_points))
    samples = []
    for _ in range(30):
        started = time.perf_counter()
        algo.fit(window).predict(pen=penalty(window, 3.0, cost))
        samples.append((time.perf_counter() - started) * 1000)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tcpd", type=Path, default=HERE.parent / "shared" / "bench" / "tcpd")
    parser.add_argument("--draws", type=int, default=40, help="random neighbours of the defaults")
    args = parser.parse_args()
    series = tcpd.load(*tcpd.locate(args.tcpd))
    n_uni = sum(len(s.values) == 1 for s in series)
    results = tcpd.evaluate(series, lambda x: [])
    uni = tcpd.summary([r for r in results if r.dimensions == 1])
    base = tcpd.summary(results)
    rng = np.random.default_rng(0)
    shifts = np.concatenate([rng.normal(0, 1, 400), rng.normal(3, 1, 300),
                             rng.normal(1, 1, 300)]).reshape(-1, 1)
    noise = rng.normal(0, 1, 1000).reshape(-1, 1)

    print(f"TCPD: {len(series)} series, {n_uni} univariate; penalty 3 x log(n) x the residual "
          f"variance of the no-change fit, min_size 5\n")
    print(f"| method | cost | F1 | cover | F1 all {len(series)} | cover all {len(series)} | "
          "ms per 1k window (shifts / noise) | x binseg, linear |")
    print("|---|---|---|---|---|---|---|---|")
    print(f"| no change points | | {uni.baseline_f1:.3f} | {uni.baseline_cover:.3f} | "
          f"{base.baseline_f1:.3f} | {base.baseline_cover:.3f} | | |")
    reference = (milliseconds("binseg", "linear", shifts), milliseconds("binseg", "linear", noise))
    for method, cost in (("grid", "linear"), ("binseg", "linear"), ("pelt", "linear"),
                         ("grid", "constant"), ("binseg", "constant"), ("pelt", "constant"),
                         ("kernel", "constant")):
        print(f"[{method}, {cost}]", file=sys.stderr, flush=True)
        f1, cover, f1_all, cover_all = scores(series, segmenter(method, cost, 3.0, 5))
        ms = (milliseconds(method, cost, shifts), milliseconds(method, cost, noise))
        budget = "" if max(ms) < BUDGET_MS else f" (over {BUDGET_MS:g} ms)"
        print(f"| {method} | {cost} | {f1:.3f} | {cover:.3f} | {f1_all:.3f} | {cover_all:.3f} | "
              f"{ms[0]:.2f} / {ms[1]:.2f}{budget} | {ms[0] / reference[0]:.1f} / "
              f"{ms[1] / reference[1]:.1f} |")

    d = DEFAULTS
    print(f"\nOne at a time from the defaults ({d['method']}, {d['cost']}, penalty "
          f"{d['penalty']:g}, min_size {d['min_size']}):\n")
    print(f"| changed | F1 | cover | F1 all {len(series)} | cover all {len(series)} |")
    print("|---|---|---|---|---|")
    changes: list[tuple[str, dict, Callable | None]] = [("nothing (the defaults)", {}, None)]
    changes += [(f"penalty {v:g}", {"penalty": v}, None) for v in (1, 1.5, 2, 2.5, 3.5, 4, 6)]
    changes += [(f"min_size {v}", {"min_size": v}, None) for v in (2, 3, 8, 10, 15)]
    changes += [(f"grid points {v}", {"grid_points": v}, None) for v in (50, 150, 200, 300, 400)]
    changes += [("noise: MAD of first differences", {}, mad_of_differences(1)),
                ("noise: MAD of second differences", {}, mad_of_differences(2))]
    for label, change, noise_of in changes:
        p = {**d, **change}
        row = scores(series, segmenter(p["method"], p["cost"], p["penalty"], p["min_size"],
                                       noise_of, p.get("grid_points")))
        ms = ("" if "grid_points" not in p else
              f" ({milliseconds('grid', 'linear', shifts, p['grid_points']):.2f} / "
              f"{milliseconds('grid', 'linear', noise, p['grid_points']):.2f} ms per 1k)")
        print(f"| {label}{ms} | " + " | ".join(f"{v:.3f}" for v in row) + " |")

    print(f"[{args.draws} random neighbours]", file=sys.stderr, flush=True)
    draws = []
    for _ in range(args.draws):
        factor = float(np.exp(rng.uniform(math.log(2), math.log(4.5))))
        size = int(rng.integers(3, 9))
        draws.append(scores(series, segmenter(d["method"], d["cost"], factor, size)))
    cols = list(zip(*draws, strict=True))
    print(f"\nRandom neighbourhood: {args.draws} draws, penalty log-uniform in [2, 4.5] and "
          f"min_size uniform in 3..8 (seed 0):\n")
    print("| | F1 | cover | F1 all | cover all |\n|---|---|---|---|---|")
    for name, fn in (("min", min), ("median", statistics.median), ("max", max)):
        print(f"| {name} | " + " | ".join(f"{fn(c):.3f}" for c in cols) + " |")
    both = sum(f >= 0.75 and c >= 0.72 for f, c, *_ in draws)
    f_only = sum(f >= 0.75 for f, *_ in draws)
    print(f"\nF1 >= 0.75 in {f_only} of {args.draws} draws; F1 >= 0.75 and cover >= 0.72 in "
          f"{both} of {args.draws}")
    halves(series, rng)


def halves(series: list[tcpd.Series], rng: np.random.Generator, splits: int = 50) -> None:
    """Is the grid search's gain over binary segmentation spread over the series? Split the 32
    series at random into two halves, 50 times; on each half (100 in all): the difference of
    cover and F1. And a choice made on one half, scored on the other: the search (grid,
    binseg) and penalty (2 to 4) with the best cover at F1 >= 0.75 on one half, against the
    defaults, on the other."""
    print("[halves]", file=sys.stderr, flush=True)
    settings = [(m, f) for m in ("grid", "binseg") for f in (2.0, 2.5, 3.0, 3.5, 4.0)]
    per: dict[tuple[str, float], dict[str, tuple[float, float]]] = {}
    for method, factor in settings:
        results = tcpd.evaluate(series, segmenter(method, "linear", factor, 5))
        per[(method, factor)] = {r.name: (r.f1, r.cover) for r in results}
    names = [s.name for s in series]

    def mean(setting: tuple[str, float], part: list[str], i: int) -> float:
        return statistics.mean(per[setting][k][i] for k in part)

    default, before = ("grid", 3.0), ("binseg", 3.0)
    cover_gain, f1_gain, chosen, held, held_default = [], [], [], [], []
    for _ in range(splits):
        order = rng.permutation(len(names))
        half = len(names) // 2
        a, b = [names[i] for i in order[:half]], [names[i] for i in order[half:]]
        for train, test in ((a, b), (b, a)):
            cover_gain.append(mean(default, test, 1) - mean(before, test, 1))
            f1_gain.append(mean(default, test, 0) - mean(before, test, 0))
            fit = [s for s in settings if mean(s, train, 0) >= 0.75] or settings
            pick = max(fit, key=lambda s: mean(s, train, 1))
            chosen.append(pick)
            held.append(mean(pick, test, 1))
            held_default.append(mean(default, test, 1))
    n, higher = len(cover_gain), sum(g > 0 for g in cover_gain)
    print(f"\nRandom halves ({splits} splits, both halves: {n}), grid minus binseg at the "
          f"defaults: cover {statistics.median(cover_gain):+.4f} median "
          f"[{min(cover_gain):+.4f}, {max(cover_gain):+.4f}], higher on {higher} "
          f"of {n}; F1 {statistics.median(f1_gain):+.4f} median "
          f"[{min(f1_gain):+.4f}, {max(f1_gain):+.4f}]")
    counts = sorted(((chosen.count(s), s) for s in settings if chosen.count(s)), reverse=True)
    print("Chosen on one half (search, penalty: times): "
          + ", ".join(f"{m} {f:g}: {c}" for c, (m, f) in counts))
    print(f"Cover on the other half: chosen {statistics.median(held):.3f} median "
          f"[{min(held):.3f}, {max(held):.3f}]; the defaults {statistics.median(held_default):.3f} "
          f"median [{min(held_default):.3f}, {max(held_default):.3f}]")


if __name__ == "__main__":
    main()
