"""A batch whose series count rises by `--step` each tick from 0 to `--series`, then falls to
1 in 100 (issue #25, constant memory per series): before and after, alternated tick by tick in
one run.

Before: the per-slot arrays reallocated to the exact size at each new peak (`_growth` 1.0, what
the batches did until #25) and never compacted. After: room grown 1.5x (`SlotArrays`) and the
live slots compacted once fewer than 1 in 4 is in use (`Slots.compact`, here
`compact(keep)` directly with the slots it would keep). Each tick gives every slot a fresh
N(10, 1) value; a slot beyond the batch's size starts fresh, as a new series' slot does. Printed:
ms per tick over the rise (mean, and its last 10%), the times the arrays were reallocated, and
after the fall the batch's memory (`nbytes`: per-slot buffers, room included) and its median
tick over the 1% left. Machines here are noisy: read the ratios.

    .venv/bin/python benchmarks/batch_growth.py [--series 100000] [--step 100]
        [--only likelihood|channels]

`anomaly_channels` runs over a fifth of the series by default (`--channels-series`): its
batch holds 6 KB a slot and ticks ten times slower.

`--flapping`: instead, the series flap each tick between all and 1 in 5 (a window shorter than
their scrape interval), through the engine's `Slots` and `Batch`; a batch compacted as soon as
fewer than 1 in 4 slots is in use (`COMPACT_AFTER` 1, as #25 was merged) against one compacted
after `COMPACT_AFTER` low evaluations in a row (the default), alternated tick by tick.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from sloguard.plugins.anomaly_channels import AnomalyChannelsBatch
from sloguard.plugins.anomaly_likelihood import AnomalyLikelihoodBatch

PARTS = {"likelihood": AnomalyLikelihoodBatch, "channels": AnomalyChannelsBatch}


def reference(batch):
    """The batch as before #25: reallocated to the exact size at each new peak."""
    for part in (batch, *(getattr(batch, name, None) for name in ("value", "volatility",
                                                                    "shape"))):
        if part is not None:
            part._growth = 1.0
    return batch


def reallocations(batch) -> int:
    return getattr(batch, "value", batch).reallocations


def measure(kind: str, series: int, step: int) -> None:
    rng = np.random.default_rng(0)
    pool = rng.normal(10, 1, (64, series))
    before, after = reference(PARTS[kind]({})), PARTS[kind]({})
    rising: dict[str, list[float]] = {"before": [], "after": []}
    ticks = range(series // step)
    for tick in ticks:
        values = pool[tick % len(pool), :(tick + 1) * step]
        order = [("before", before), ("after", after)]
        for name, batch in order if tick % 2 else order[::-1]:
            started = time.perf_counter()
            batch.update(values, tick)
            rising[name].append((time.perf_counter() - started) * 1000)
    tail = max(1, len(ticks) // 10)
    print(f"\n{kind}: {series:,} series, rising by {step} a tick ({len(ticks)} ticks)")
    print("| what | before | after | after / before |")
    print("|---|---|---|---|")
    for label, pick in (("ms a tick, mean over the rise", lambda s: statistics.mean(s)),
                        ("ms a tick, mean over its last 10%",
                         lambda s: statistics.mean(s[-tail:])),
                        ("ms over the whole rise", sum)):
        old, new = pick(rising["before"]), pick(rising["after"])
        print(f"| {label} | {old:.2f} | {new:.2f} | {new / old:.3f} |")
    print(f"| reallocations of the arrays | {reallocations(before)} | "
          f"{reallocations(after)} | |")
    peak = (before.nbytes(), after.nbytes())
    print(f"| MB at the peak (room included) | {peak[0] / 1e6:.1f} | {peak[1] / 1e6:.1f} | "
          f"{peak[1] / peak[0]:.3f} |")

    # The fall: 1 series in 100 stays. Before, the others' slots stay (NaN each tick); after,
    # the engine's Slots compact them away: the batch keeps the survivors only.
    keep = np.arange(0, series, 100)
    started = time.perf_counter()
    after.compact(keep)
    compacting = (time.perf_counter() - started) * 1000
    fallen: dict[str, list[float]] = {"before": [], "after": []}
    for tick in range(60):
        row = pool[tick % len(pool)]
        sparse = np.full(series, np.nan)
        sparse[keep] = row[keep]
        order = [("before", before, sparse), ("after", after, row[keep])]
        for name, batch, values in order if tick % 2 else order[::-1]:
            started = time.perf_counter()
            batch.update(values, len(ticks) + tick)
            fallen[name].append((time.perf_counter() - started) * 1000)
    old, new = (statistics.median(fallen[name]) for name in ("before", "after"))
    print(f"| after the fall to {len(keep):,} series: ms a tick, median | {old:.3f} | "
          f"{new:.3f} | {new / old:.4f} |")
    left = (before.nbytes(), after.nbytes())
    print(f"| after the fall: MB held | {left[0] / 1e6:.1f} | {left[1] / 1e6:.2f} | "
          f"{left[1] / left[0]:.4f} |")
    print(f"(the compaction itself: {compacting:.1f} ms, once)")


def flapping(kind: str, series: int, ticks: int = 60) -> None:
    from types import SimpleNamespace

    from sloguard.detector import batching
    from sloguard.detector.registry import DetectorRegistry

    registry = DetectorRegistry()
    name = {"likelihood": "anomaly_likelihood", "channels": "anomaly_channels"}[kind]
    spec = SimpleNamespace(detector=name, params={})
    keys = [(("pod", f"p{i}"),) for i in range(series)]
    pool = np.random.default_rng(0).normal(10, 1, (16, series))
    runs = {"at once": (1, batching.Slots(spec)),
            "waiting": (batching.COMPACT_AFTER, batching.Slots(spec))}
    engine = SimpleNamespace(_batches={})
    spent: dict[str, list[float]] = {label: [] for label in runs}
    default = batching.COMPACT_AFTER
    try:
        for tick in range(ticks):
            live = range(series) if tick % 2 == 0 else range(0, series, 5)
            inputs = {keys[i]: float(pool[tick % 16, i]) for i in live}
            order = list(runs.items())
            for label, (after, slots) in order if tick % 4 < 2 else order[::-1]:
                batching.COMPACT_AFTER = after
                slots.arrange(inputs)
                batch = batching.Batch("key", spec, inputs, slots)
                started = time.perf_counter()
                detector = batch.run(registry, tick)[0]
                spent[label].append((time.perf_counter() - started) * 1000)
                batch.keep(engine, detector)
    finally:
        batching.COMPACT_AFTER = default
    old, new = (statistics.mean(spent[label][10:]) for label in runs)
    print(f"\n{kind}: {series:,} series flapping each tick to 1 in 5 ({ticks} ticks)")
    print(f"| ms a tick, mean (the batch's run) | at once {old:.2f} | waiting {new:.2f} | "
          f"{new / old:.3f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--series", type=int, default=100_000)
    parser.add_argument("--channels-series", type=int, default=20_000)
    parser.add_argument("--step", type=int, default=100)
    parser.add_argument("--only", choices=sorted(PARTS))
    parser.add_argument("--flapping", action="store_true")
    args = parser.parse_args()
    if args.flapping:
        halves = (("likelihood", args.series // 2), ("channels", args.channels_series // 2))
        for kind, series in halves:
            if args.only in (None, kind):
                flapping(kind, series)
        return
    if args.only in (None, "likelihood"):
        measure("likelihood", args.series, args.step)
    if args.only in (None, "channels"):
        measure("channels", args.channels_series, args.step)


if __name__ == "__main__":
    main()
