"""How much the NAB score of the default detector hangs on its parameters and on the files its
defaults were chosen on (issue #25).

Three checks, printed as the tables of docs/plugins.md's NAB section:

- one at a time: each tunable parameter moved to its neighbours, the others at their defaults;
- a random neighbourhood: every parameter moved at once to a random neighbour, N draws;
- leave one category out: for each category of the corpus, the configuration (among the
  default, the one-at-a-time moves and the random draws) that scores best (standard profile) on
  the OTHER categories, with its thresholds, scores the held-out one. A category without
  windows (artificialNoAnomaly) has no normalised score: its false alarms and raw cost are shown.

Every detector in DETECTORS is checked the same way (a candidate default beside the one it would
replace, each with its own grid), so they compare like for like. Every configuration runs once
over every file; the scores are kept per file and reused for each subset.

    .venv/bin/python benchmarks/nab_robustness.py [ROOT] [--draws 40] [--only default]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

from sloguard.detector.registry import DetectorRegistry
from sloguard.detector.scoring import nab

SHARED = Path(__file__).resolve().parent.parent.parent / "shared" / "bench" / "nab"
PROFILES = ("standard", "reward_low_FP_rate", "reward_low_FN_rate")

# Each detector's defaults and, per tunable parameter, its neighbours (the first value of each
# list is the default). A new default goes here beside the one it replaces, so that the two are
# checked the same way in the same run. anomaly_likelihood's own parameters are also
# anomaly_channels', which passes them to each of its channels.
LIKELIHOOD_NEIGHBOURS = {
    "bins": [50, 35, 70],
    "radius": [1, 2],
    "rarity": [0.01, 0.005, 0.02],
    "memory": [2000, 1000, 5000],
    "average": [10, 8, 12],
    "fading_factor": [0.001, 0.0005, 0.002],
    "tolerance": [0.05, 0.02, 0.1],
    "warmup": [150, 100, 200],
}
DETECTORS = {
    "anomaly_likelihood": ("anomaly_likelihood", {}, LIKELIHOOD_NEIGHBOURS),
    "anomaly_channels": ("anomaly_channels", {}, {
        **LIKELIHOOD_NEIGHBOURS,
        "novelty_span": [2, 1, 4],
        "independence": [0.3, 0.1, 1],
        "volatility_span": [30, 20, 45],
        "segments": [12, 8, 16],
        "segment": [24, 18, 36],
        "prototypes": [64, 32, 128],
        "vigilance": [0.05, 0.03, 0.1],
        "learning_rate": [0.05, 0.02, 0.1],
        "penalty": [0.3, 0.2, 0.4],
    }),
}


class Corpus:
    """The files, loaded once, and each configuration's per-file scores, computed once."""

    def __init__(self, root: Path) -> None:
        data, windows, profiles = nab.locate(root)
        self.files = nab.load(data, windows)
        self.weights = {k: v["CostMatrix"] for k, v in json.loads(profiles.read_text()).items()}
        self.registry = DetectorRegistry()
        self._scores: dict[str, list[list[float]]] = {}
        self.runs = 0

    def categories(self) -> list[str]:
        return sorted({f.name.split("/")[0] for f in self.files})

    def scores(self, name: str, params: dict) -> list[list[float]]:
        key = json.dumps([name, params], sort_keys=True)
        if key not in self._scores:
            nab.run_detector(self.files, lambda: self.registry.make(name, params))
            self._scores[key] = [f.scores for f in self.files]
            self.runs += 1
        return self._scores[key]

    def subset(self, name: str, params: dict, keep: set[str] | None = None) -> list:
        """The files (of the categories in `keep`) carrying this configuration's scores."""
        out = []
        for file, scores in zip(self.files, self.scores(name, params), strict=True):
            if keep is None or file.name.split("/")[0] in keep:
                file.scores = scores
                out.append(file)
        return out

    def evaluate(self, name: str, params: dict, keep: set[str] | None = None,
                 thresholds: dict[str, float] | None = None) -> dict:
        files = self.subset(name, params, keep)
        results = {s.profile: s for s in nab.score(files, self.weights, thresholds)}
        events = nab.events(files, results["standard"].threshold)
        return {"profiles": results, "events": events}


def row(figures: dict) -> str:
    p = figures["profiles"]
    e = figures["events"]
    return (" | ".join(f"{p[k].normalized:.1f}" for k in PROFILES)
            + f" | {e.precision:.2f} / {e.recall:.2f}")


def neighbours(grid: dict, draws: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    return [{k: rng.choice(v) for k, v in grid.items()} for _ in range(draws)]


def check(corpus: Corpus, label: str, draws: int) -> None:
    name, base, grid = DETECTORS[label]
    say = lambda text: print(text, file=sys.stderr, flush=True)  # noqa: E731
    started = time.perf_counter()
    default = corpus.evaluate(name, base)
    print(f"\n## {label}: {name} {base or '(its defaults)'}\n")
    print("| configuration | standard | low FP | low FN | event P / R |\n|---|---|---|---|---|")
    print(f"| defaults | {row(default)} |")
    configs = [dict(base)]
    for key, values in grid.items():
        for value in values[1:]:
            params = {**base, key: value}
            say(f"  [{label}] one at a time: {key}={value}")
            print(f"| `{key}` {value} | {row(corpus.evaluate(name, params))} |")
            configs.append(params)
    standard, low_fp, low_fn, precision, recall = [], [], [], [], []
    for i, draw in enumerate(neighbours(grid, draws), 1):
        params = {**base, **draw}
        say(f"  [{label}] neighbourhood {i}/{draws}")
        evaluated = corpus.evaluate(name, params)
        figures = evaluated["profiles"]
        precision.append(evaluated["events"].precision)
        recall.append(evaluated["events"].recall)
        standard.append(figures["standard"].normalized)
        low_fp.append(figures["reward_low_FP_rate"].normalized)
        low_fn.append(figures["reward_low_FN_rate"].normalized)
        configs.append(params)
    if draws:
        median = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
        print(f"\nrandom neighbourhood ({draws} draws): standard median {median(standard):.1f} "
              f"(min {min(standard):.1f}, max {max(standard):.1f}), "
              f"{sum(s >= 65 for s in standard)} of {draws} at 65 or more; low FP median "
              f"{median(low_fp):.1f}, low FN median {median(low_fn):.1f}; event precision "
              f"median {median(precision):.2f} (min {min(precision):.2f}), recall median "
              f"{median(recall):.2f} (min {min(recall):.2f})")
    print(f"\nleave one category out ({len(configs)} configurations to choose from):\n")
    print("| held out | chosen on the others | held-out standard / low FP / low FN | "
          "held-out event P / R | whole corpus with it (standard) |\n|---|---|---|---|---|")
    for held in corpus.categories():
        train = set(corpus.categories()) - {held}
        say(f"  [{label}] leave out {held}")
        best = max(configs, key=lambda c: corpus.evaluate(name, c, train)["profiles"][
            "standard"].raw)
        chosen = corpus.evaluate(name, best, train)["profiles"]
        thresholds = {k: chosen[k].threshold for k in chosen}
        test = corpus.evaluate(name, best, {held}, thresholds)
        whole = corpus.evaluate(name, best)["profiles"]["standard"].normalized
        changed = {k: v for k, v in best.items() if base.get(k, grid.get(k, [v])[0]) != v}
        if any(f.windows for f in corpus.subset(name, best, {held})):
            held_out = " / ".join(f"{test['profiles'][k].normalized:.1f}" for k in PROFILES)
        else:
            held_out = (f"no windows: raw {test['profiles']['standard'].raw:.2f} "
                        f"(0 is perfect)")
        e = test["events"]
        print(f"| {held} | {changed or 'the defaults'} | {held_out} | "
              f"{e.precision:.2f} / {e.recall:.2f} ({e.false_alarms} false alarms) | "
              f"{whole:.1f} |")
    print(f"\n({corpus.runs} detector runs so far, {time.perf_counter() - started:.0f} s)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", nargs="?", type=Path, default=SHARED,
                        help="a NAB root (the official layout or the shared subset)")
    parser.add_argument("--draws", type=int, default=40)
    parser.add_argument("--only", choices=sorted(DETECTORS))
    args = parser.parse_args()
    corpus = Corpus(args.root)
    print(f"{len(corpus.files)} files, {sum(len(f.windows) for f in corpus.files)} windows, "
          f"categories {', '.join(corpus.categories())}")
    for label in DETECTORS:
        if args.only in (None, label):
            check(corpus, label, args.draws)


if __name__ == "__main__":
    main()
