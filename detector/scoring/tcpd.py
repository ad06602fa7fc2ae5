"""The Turing Change Point Dataset's metrics: F1 with a margin, and segmentation cover.

Implemented from the benchmark's published definitions (van den Burg and Williams, 2020):
precision against the union of the annotators' change points, recall averaged over annotators,
index 0 counted as a change point on every side; cover averaged over annotators. The test
checks this implementation against the published "no change points" figures of the data set.
Reads the official repository's layout as it is (`datasets/<name>/<name>.json`,
`analysis/annotations/annotations.json`) and the shared bench copy (annotations at the root).
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Series:
    name: str
    values: list[list[float | None]]  # one list per dimension
    annotations: dict[str, list[int]]

    @property
    def n_obs(self) -> int:
        return len(self.values[0])


ANNOTATIONS = (Path("analysis", "annotations", "annotations.json"), Path("annotations.json"))


def locate(root: Path) -> tuple[Path, Path]:
    """(datasets directory, annotations file) of a TCPD checkout; FileNotFoundError naming
    the missing path otherwise."""
    data = Path(root) / "datasets"
    if not data.is_dir():
        raise FileNotFoundError(f"no TCPD datasets directory at {data}")
    for relative in ANNOTATIONS:
        if (Path(root) / relative).is_file():
            return data, Path(root) / relative
    raise FileNotFoundError(f"no TCPD annotations at {Path(root) / ANNOTATIONS[0]} "
                            f"(nor at {Path(root) / ANNOTATIONS[1]})")


def load(data_dir: Path, annotations_file: Path) -> list[Series]:
    """Every data set of a TCPD-format directory that has annotations."""
    if not Path(data_dir).is_dir():
        raise FileNotFoundError(f"no TCPD datasets directory at {data_dir}")
    if not Path(annotations_file).is_file():
        raise FileNotFoundError(f"no TCPD annotations file at {annotations_file}")
    annotations = json.loads(Path(annotations_file).read_text())
    out = []
    for name in sorted(annotations):
        path = Path(data_dir) / name / f"{name}.json"
        if not path.exists():
            continue
        data = json.loads(path.read_text())
        values = [[None if v is None else float(v) for v in s["raw"]] for s in data["series"]]
        out.append(Series(name, values, {k: list(v) for k, v in annotations[name].items()}))
    return out


def true_positives(truth: Iterable[int], predicted: Iterable[int], margin: int = 5) -> set[int]:
    """True change points matched one-to-one to the closest prediction within `margin`."""
    unmatched = set(predicted)
    found = set()
    for tau in sorted(set(truth)):
        close = sorted((abs(tau - x), x) for x in unmatched if abs(tau - x) <= margin)
        if close:
            found.add(tau)
            unmatched.remove(close[0][1])
    return found


def f_measure(annotations: dict[str, list[int]], predicted: Iterable[int], margin: int = 5,
              alpha: float = 0.5) -> tuple[float, float, float]:
    """(F, precision, recall) as the TCPD benchmark defines them."""
    per_annotator = [set(cps) | {0} for cps in annotations.values()]
    prediction = set(predicted) | {0}
    union = set().union(*per_annotator)
    precision = len(true_positives(union, prediction, margin)) / len(prediction)
    recall = sum(len(true_positives(t, prediction, margin)) / len(t)
                 for t in per_annotator) / len(per_annotator)
    if precision == 0 and recall == 0:
        return 0.0, precision, recall
    return precision * recall / (alpha * recall + (1 - alpha) * precision), precision, recall


def _partition(locations: Iterable[int], n_obs: int) -> list[set[int]]:
    cps = sorted({c for c in locations if 0 < c < n_obs})
    bounds = [0, *cps, n_obs]
    return [set(range(a, b)) for a, b in itertools.pairwise(bounds) if b > a]


def covering(annotations: dict[str, list[int]], predicted: Iterable[int], n_obs: int) -> float:
    """Segmentation cover of each annotator's partition by the predicted one, averaged."""
    mine = _partition(predicted, n_obs)
    covers = []
    for cps in annotations.values():
        total = 0.0
        for segment in _partition(cps, n_obs):
            total += len(segment) * max(len(segment & r) / len(segment | r) for r in mine)
        covers.append(total / n_obs)
    return sum(covers) / len(covers)


def forward_filled(values: list[float | None]) -> list[float]:
    """Missing values carried forward (the first ones backward): segmenters need numbers."""
    out, last = [], next((v for v in values if v is not None), 0.0)
    for v in values:
        last = last if v is None else v
        out.append(last)
    return out


def standardised(series: Series) -> Any:
    """The series as an (n_obs, dimensions) array, missing values carried forward and each
    dimension scaled to mean 0 and variance 1 (as the TCPD reference does before every method;
    a constant dimension stays 0). The penalties here scale with the signal, so a univariate
    segmentation does not change; dimensions of different units weigh alike."""
    import numpy as np

    x = np.column_stack([np.asarray(forward_filled(v), dtype=float) for v in series.values])
    x -= x.mean(axis=0)
    sd = x.std(axis=0)
    return x / np.where(sd > 0, sd, 1.0)


@dataclass(frozen=True)
class Result:
    name: str
    dimensions: int
    f1: float
    cover: float
    baseline_f1: float  # "no change points"
    baseline_cover: float


def evaluate(series: list[Series], segment: Callable[[Any], list[int]],
             margin: int = 5) -> list[Result]:
    """F1 and cover of `segment` (given the standardised (n_obs, dimensions) array) on each
    series, next to the no-change baseline."""
    out = []
    for s in series:
        cps = segment(standardised(s))
        out.append(Result(s.name, len(s.values), f_measure(s.annotations, cps, margin)[0],
                          covering(s.annotations, cps, s.n_obs),
                          f_measure(s.annotations, [], margin)[0],
                          covering(s.annotations, [], s.n_obs)))
    return out


@dataclass(frozen=True)
class Score:
    series: int
    f1: float
    cover: float
    baseline_f1: float  # "no change points", computed in the same run
    baseline_cover: float


def summary(results: list[Result]) -> Score:
    """The means over `results` (all zeros when there are none)."""
    n = max(len(results), 1)
    return Score(len(results), sum(r.f1 for r in results) / n,
                 sum(r.cover for r in results) / n, sum(r.baseline_f1 for r in results) / n,
                 sum(r.baseline_cover for r in results) / n)
