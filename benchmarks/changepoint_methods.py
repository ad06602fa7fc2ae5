"""Which ruptures method the change-point detector uses: Pelt, Binseg or KernelCPD, measured here.

Quality: F1 (margin 5) and segmentation cover on the univariate series of the Turing Change Point
Dataset in ../shared/bench/tcpd, with the detector's own default penalty for all series (no
per-series tuning), next to the "no change points" baseline computed in the same run. Speed:
milliseconds to segment a 1,000-point window (two level shifts in noise); the budget is 5 ms.

    .venv/bin/python benchmarks/changepoint_methods.py [--tcpd ../shared/bench/tcpd]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from sloguard.detector.scoring import tcpd
from sloguard.plugins.changepoint import make_algorithm, penalty

HERE = Path(__file__).resolve().parent.parent


BUDGET_MS = 5.0  # issue #3: change-point on a 1k-point window in under 5 ms


def methods(min_size: int) -> dict[str, object]:
    return {name: make_algorithm(name, min_size) for name in ("pelt", "binseg", "kernel")}


def clean(values: list[float | None]) -> np.ndarray:
    return np.asarray(tcpd.forward_filled(values), dtype=float)


def segment(algo: object, x: np.ndarray, penalty_factor: float) -> list[int]:
    """The detector's own segmentation: its penalty, on the raw values."""
    pen = penalty(x, penalty_factor)
    return [int(b) for b in algo.fit(x.reshape(-1, 1)).predict(pen=pen)[:-1]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tcpd", type=Path, default=HERE.parent / "shared" / "bench" / "tcpd")
    parser.add_argument("--penalty-factor", type=float, default=3.0,
                        help="penalty = factor x log(n) on z-normalised data (BIC-like)")
    parser.add_argument("--min-size", type=int, default=5)
    args = parser.parse_args()
    series = [s for s in tcpd.load(args.tcpd / "datasets", args.tcpd / "annotations.json")
              if len(s.values) == 1]
    rows = {}
    baseline_f = [tcpd.f_measure(s.annotations, [])[0] for s in series]
    baseline_c = [tcpd.covering(s.annotations, [], s.n_obs) for s in series]
    rows["no change points"] = (statistics.mean(baseline_f), statistics.mean(baseline_c), None)
    rng = np.random.default_rng(0)
    window = np.concatenate([rng.normal(0, 1, 400), rng.normal(3, 1, 300),
                             rng.normal(1, 1, 300)]).reshape(-1, 1)
    for name, algo in methods(args.min_size).items():
        print(f"[{name}] segmenting {len(series)} series", file=sys.stderr, flush=True)
        f1s, covers = [], []
        for s in series:
            cps = segment(algo, clean(s.values[0]), args.penalty_factor)
            f1s.append(tcpd.f_measure(s.annotations, cps)[0])
            covers.append(tcpd.covering(s.annotations, cps, s.n_obs))
        timings = []
        for _ in range(3 if "pelt" in name else 20):
            started = time.perf_counter()
            algo.fit(window).predict(pen=penalty(window.ravel(), args.penalty_factor))
            timings.append((time.perf_counter() - started) * 1000)
        rows[name] = (statistics.mean(f1s), statistics.mean(covers), statistics.median(timings))
    base_f, base_c, _ = rows["no change points"]
    fastest = min(ms for _, _, ms in rows.values() if ms is not None)
    print(f"\nTCPD, {len(series)} univariate series, the detector's penalty "
          f"({args.penalty_factor} x log(n) x robust sigma^2), min_size {args.min_size}\n")
    print("| method | F1 | cover | F1 / baseline | cover / baseline | ms per 1k window | "
          "time / fastest |")
    print("|---|---|---|---|---|---|---|")
    for name, (f1, cover, ms) in rows.items():
        speed = "" if ms is None else f"{ms:.2f} | {ms / fastest:.1f}x"
        print(f"| {name} | {f1:.3f} | {cover:.3f} | {f1 / base_f:.3f} | {cover / base_c:.3f} | "
              f"{speed or ' | '} |")
    scored = {n: r for n, r in rows.items() if r[2] is not None and r[2] <= BUDGET_MS}
    if not scored:
        print(f"\nno method segments a 1k window within {BUDGET_MS} ms here")
        return
    best = max(scored, key=lambda n: (round(scored[n][0] + scored[n][1], 2), -scored[n][2]))
    print(f"\nchosen: {best} (best F1 + cover to two decimals among the methods within "
          f"{BUDGET_MS:g} ms per 1k window, then fastest)")


if __name__ == "__main__":
    main()
