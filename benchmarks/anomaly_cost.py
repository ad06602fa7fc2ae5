"""Cost per value of anomaly_channels (issue #25: anomaly_likelihood on three channels) against
anomaly_likelihood, measured in the same run over the same values (the NAB files).

Every file of the NAB root is fed once, value by value, to a fresh detector of each kind; the
median of `--repeats` passes is printed in microseconds per value, with the ratio (machines here
are noisy: read the ratio).

    .venv/bin/python benchmarks/anomaly_cost.py [ROOT] [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from sloguard.detector.registry import DetectorRegistry
from sloguard.detector.scoring import nab

SHARED = Path(__file__).resolve().parent.parent.parent / "shared" / "bench" / "nab"
DETECTORS = ("anomaly_likelihood", "anomaly_channels")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", nargs="?", type=Path, default=SHARED)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    data, windows, _ = nab.locate(args.root)
    files = nab.load(data, windows)
    registry = DetectorRegistry()
    values = sum(len(f.values) for f in files)
    for name in DETECTORS:  # imports (river, scipy, numpy) paid before timing
        registry.make(name, {}).update(1.0, 0)
    micros: dict[str, list[float]] = {name: [] for name in DETECTORS}
    for _ in range(args.repeats):
        for name in DETECTORS:  # interleaved: both see the same machine noise
            started = time.perf_counter()
            for file in files:
                detector = registry.make(name, {})
                for row, value in enumerate(file.values):
                    detector.update(value, row)
            micros[name].append((time.perf_counter() - started) * 1e6 / values)
    print(f"{len(files)} files, {values} values, median of {args.repeats} passes")
    base = statistics.median(micros[DETECTORS[0]])
    for name in DETECTORS:
        median = statistics.median(micros[name])
        print(f"{name:20s} {median:6.1f} us per value ({median / base:.1f}x)")


if __name__ == "__main__":
    main()
