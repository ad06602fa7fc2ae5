"""Quiet slots' tails deferred (the anomaly batches' default) against every slot's tail every
tick (`_defer` False, as before), over 100,000 series of the data of
benchmarks/detector_throughput.py (N(10, 1) noise, past warm-up), fed the same values and
alternated tick by tick in one run: the machine's noise falls on both.

    .venv/bin/python benchmarks/quiet_tail.py [--series 100000] [--only likelihood|channels]
        [--staggered]

`--staggered`: slot i starts at tick i % 200 (NaN before), so a block's slots have judged
different numbers of averages (the Student-t's n differs, and the rings are not in step).

Prints, for AnomalyLikelihoodBatch and AnomalyChannelsBatch (ticks at a segment boundary
left out, unless staggered), the median tick of each and the ratio, and checks on the way that
both give the same verdicts and, on a sample of slots and on the last tick's whole arrays, the
same scores, notes and levels.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from sloguard.plugins.anomaly_channels import AnomalyChannelsBatch
from sloguard.plugins.anomaly_likelihood import AnomalyLikelihoodBatch


def alternated(kind: str, n: int, rng: np.random.Generator,
               staggered: bool = False) -> dict[str, float]:
    if kind == "likelihood":
        deferred, eager = AnomalyLikelihoodBatch({}), AnomalyLikelihoodBatch({})
        eager._defer = False
        warm, ticks = 320, 200
    else:
        deferred, eager = AnomalyChannelsBatch({}), AnomalyChannelsBatch({})
        for channel in (eager.value, eager.volatility, eager.shape):
            channel._defer = False
        warm, ticks = 340, 240
    start = np.arange(n) % 200 if staggered else np.zeros(n, dtype=int)
    warm += int(start.max())
    for tick in range(warm):
        values = rng.normal(10, 1, n)
        values[start > tick] = np.nan
        deferred.update(values, 0)
        eager.update(values, 0)
    times: dict[str, list[float]] = {"eager": [], "deferred": []}
    sample = rng.integers(0, n, 50).tolist()
    for tick in range(ticks):
        values = rng.normal(10, 1, n)
        # every slot's prototype step at once (staggered: a 24th of the slots' every tick)
        boundary = (kind == "channels" and not staggered
                    and int(deferred._count[0]) == deferred.segment - 1)
        runs = [("eager", eager), ("deferred", deferred)]
        out = {}
        for name, batch in runs if tick % 2 == 0 else runs[::-1]:
            started = time.perf_counter()
            out[name] = batch.update(values, 0)
            if not boundary:
                times[name].append((time.perf_counter() - started) * 1000)
        a, b = out["eager"], out["deferred"]
        assert np.array_equal(a.crossed, b.crossed) and np.array_equal(a.recovered, b.recovered)
        assert all(a.score[i] == b.score[i] and a.note(i) == b.note(i) for i in sample)
    assert np.array_equal(np.asarray(a.score), np.asarray(b.score))
    level = (lambda batch: batch.level) if kind == "likelihood" else (
        lambda batch: batch.value.level)
    assert np.array_equal(level(eager), level(deferred))
    return {name: statistics.median(samples) for name, samples in times.items()} | {
        "per tick": statistics.median(d / e for e, d in zip(times["eager"], times["deferred"],
                                                             strict=True))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--series", type=int, default=100_000)
    parser.add_argument("--only", choices=["likelihood", "channels"])
    parser.add_argument("--staggered", action="store_true")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    print(f"\n{args.series} series{', staggered starts' if args.staggered else ''}, median "
          f"tick, alternated tick by tick in this run\n")
    print("| batch | every tail (ms) | quiet tails deferred (ms) | ratio | median per-tick ratio |")
    print("|---|---|---|---|---|")
    for kind in ("likelihood", "channels"):
        if args.only in (None, kind):
            got = alternated(kind, args.series, rng, args.staggered)
            print(f"| {kind} | {got['eager']:.2f} | {got['deferred']:.2f} | "
                  f"{got['deferred'] / got['eager']:.3f} | {got['per tick']:.3f} |", flush=True)


if __name__ == "__main__":
    main()
