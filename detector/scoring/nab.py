"""The Numenta Anomaly Benchmark's scoring, implemented from the published algorithm.

Every detector runs causally over each file (it sees rows in order, never ahead) and gives each
row an anomaly score in [0, 1]. A single threshold for the whole corpus turns scores into
detections; inside a labelled window only the earliest detection counts, weighted by a sigmoid
of how early it came; a window without one costs `fnWeight`; a detection outside windows costs
`fpWeight`, less right after a window. The first 15% of each file (at most 750 rows) is
probationary and not scored. The score is normalised between the null detector (never fires:
0) and the perfect one (fires at every window's left edge: 100).
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

PROBATION_PERCENT = 0.15
PROBATION_MAX_ROWS = 750


def scaled_sigmoid(position: float) -> float:
    """NAB's weight: ~1 at a window's left edge (-1), 0 past its right edge, -1 far after."""
    if position > 3.0:
        return -1.0
    return 2.0 / (1.0 + math.exp(5.0 * position)) - 1.0


@dataclass
class DataFile:
    name: str  # "<category>/<file>.csv", as windows.json names it
    timestamps: list[str]
    values: list[float]
    windows: list[tuple[int, int]]  # inclusive row ranges
    scores: list[float] = field(default_factory=list)

    @property
    def probation(self) -> int:
        return min(math.floor(PROBATION_PERCENT * len(self.values)), PROBATION_MAX_ROWS)

    def time_ns(self, row: int) -> int:
        moment = datetime.fromisoformat(self.timestamps[row]).replace(tzinfo=UTC)
        return int(moment.timestamp() * 1e9)


def locate(root: Path | None, data: Path | None = None, windows: Path | None = None,
           profiles: Path | None = None) -> tuple[Path, Path, Path]:
    """(data dir, windows file, profiles file) from a NAB root and/or explicit paths.

    A root may be the official repository as it is cloned (`data/`,
    `labels/combined_windows.json`, `config/profiles.json`) or the shared subset's flat layout
    (`data/`, `windows.json`, `profiles.json`), so neither has to be rearranged; an explicit
    path wins over the root's. ValueError names the first path that is missing.
    """
    if root is not None:
        root = Path(root)
        if not root.is_dir():
            raise ValueError(f"the NAB root {root} is not a directory")
        flat = not (root / "labels").exists() and (root / "windows.json").exists()
        data = data or root / "data"
        windows = windows or (root / "windows.json" if flat else
                              root / "labels" / "combined_windows.json")
        profiles = profiles or (root / "profiles.json" if flat else
                                root / "config" / "profiles.json")
    elif data is None or windows is None:
        raise ValueError("give a NAB root (ROOT or --root), or both --data and --windows")
    profiles = profiles or Path(windows).parent / "profiles.json"
    for path, what in ((data, "data directory"), (windows, "windows (labels) file"),
                       (profiles, "profiles file")):
        if not Path(path).exists():
            raise ValueError(f"the NAB {what} {path} does not exist")
    return Path(data), Path(windows), Path(profiles)


def load(data_dir: Path, windows_file: Path) -> list[DataFile]:
    """Every CSV named in the windows file that exists under `data_dir`."""
    windows = json.loads(Path(windows_file).read_text())
    files = []
    for name in sorted(windows):
        path = Path(data_dir) / name
        if not path.exists():
            continue
        with path.open(newline="") as handle:
            rows = list(csv.DictReader(handle))
        stamps = [row["timestamp"] for row in rows]
        values = [float(row["value"]) for row in rows]
        ranges = []
        for start, end in windows[name]:
            inside = [i for i, t in enumerate(stamps) if _stamp(start) <= _stamp(t) <= _stamp(end)]
            if inside:
                ranges.append((inside[0], inside[-1]))
        files.append(DataFile(name, stamps, values, ranges))
    return files


def _stamp(text: str) -> str:
    return text.split(".")[0]  # windows carry fractional seconds ("...00:00.000000")


def run_detector(files: list[DataFile], make: Callable[[], object],
                 progress: Callable[[str], None] | None = None) -> None:
    """Score every row causally with a fresh detector per file (no look-ahead)."""
    for file in files:
        detector = make()
        file.scores = []
        for row, value in enumerate(file.values):
            try:
                verdict = detector.update(value, file.time_ns(row))
            except Exception as exc:
                raise ValueError(f"{file.name} row {row + 2}: the detector failed: "
                                 f"{exc.__class__.__name__}: {exc}") from exc
            score = verdict.score if verdict.score is not None else float(verdict.crossed)
            file.scores.append(min(max(score, 0.0), 1.0))
        if progress is not None:
            progress(file.name)


@dataclass
class _Point:
    score: float
    file: int
    row: int
    window: int | None  # index in the corpus-wide window list
    weight: float  # unweighted sigmoid: the TP weight in a window, the FP weight outside


def _points(files: list[DataFile]) -> tuple[list[_Point], int]:
    points, window_id = [], 0
    for f, file in enumerate(files):
        starts = {a: (a, b) for a, b in file.windows}
        current, previous = None, None
        ids = {}
        for a, b in file.windows:
            ids[(a, b)] = window_id
            window_id += 1
        for row in range(len(file.values)):
            if row in starts:
                current = starts[row]
            if current is not None:
                width = current[1] - current[0] + 1
                weight = scaled_sigmoid(-(current[1] - row + 1) / width)
                window = ids[current]
            else:
                window = None
                if previous is None:
                    weight = -1.0
                else:
                    width = previous[1] - previous[0] + 1
                    weight = scaled_sigmoid(abs(previous[1] - row) / max(width - 1, 1))
            if row >= file.probation:
                points.append(_Point(file.scores[row], f, row, window, weight))
            if current is not None and row == current[1]:
                previous, current = current, None
    return points, window_id


@dataclass(frozen=True)
class ProfileScore:
    profile: str
    normalized: float
    raw: float
    threshold: float


def score(files: list[DataFile], profiles: dict[str, dict[str, float]],
          thresholds: dict[str, float] | None = None) -> list[ProfileScore]:
    """The normalised NAB score of each profile, with the corpus-wide best threshold, or at
    the given threshold of each profile (one chosen on other files: a held-out score)."""
    points, windows = _points(files)
    order = sorted(points, key=lambda p: p.score, reverse=True)
    out = []
    for name, weights in profiles.items():
        tp_w, fn_w, fp_w = weights["tpWeight"], weights["fnWeight"], weights["fpWeight"]
        null = -fn_w * windows
        perfect = tp_w * scaled_sigmoid(-1.0) * windows
        best_window: dict[int, float] = {}
        fp_sum, raw = 0.0, null
        best_raw, best_threshold = null, 1.0 + 1e-9
        i = 0
        while i < len(order):
            threshold = order[i].score
            while i < len(order) and order[i].score == threshold:
                point = order[i]
                if point.window is None:
                    fp_sum += fp_w * point.weight
                elif point.window not in best_window or point.weight > best_window[point.window]:
                    best_window[point.window] = point.weight
                i += 1
            detected = sum(tp_w * w for w in best_window.values())
            raw = detected - fn_w * (windows - len(best_window)) + fp_sum
            if thresholds is not None:
                if threshold >= thresholds[name]:  # scores descend: the last one kept counts
                    best_raw, best_threshold = raw, thresholds[name]
            elif raw > best_raw:
                best_raw, best_threshold = raw, threshold
        if thresholds is not None:
            best_threshold = thresholds[name]
        normalized = 100 * (best_raw - null) / (perfect - null) if perfect != null else 0.0
        out.append(ProfileScore(name, normalized, best_raw, best_threshold))
    return out


@dataclass(frozen=True)
class EventScore:
    precision: float
    recall: float
    f1: float
    mean_delay_rows: float
    mean_delay_s: float
    false_alarms: int


def events(files: list[DataFile], threshold: float) -> EventScore:
    """Window-level detections at a threshold: a window is found by any detection in it; runs
    of detections outside windows are one false alarm each; delay from the window's start."""
    found = missed = false_alarms = 0
    delays_rows, delays_s = [], []
    for file in files:
        in_window = set()
        for a, b in file.windows:
            hits = [r for r in range(max(a, file.probation), b + 1)
                    if file.scores[r] >= threshold]
            in_window.update(range(a, b + 1))
            if hits:
                found += 1
                delays_rows.append(hits[0] - a)
                delays_s.append((file.time_ns(hits[0]) - file.time_ns(a)) / 1e9)
            else:
                missed += 1
        previous = False
        for row in range(file.probation, len(file.values)):
            alarm = file.scores[row] >= threshold and row not in in_window
            if alarm and not previous:
                false_alarms += 1
            previous = alarm
    precision = found / (found + false_alarms) if found + false_alarms else 0.0
    recall = found / (found + missed) if found + missed else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return EventScore(precision, recall, f1, _mean(delays_rows), _mean(delays_s), false_alarms)


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def write_results(files: list[DataFile], out_dir: Path) -> None:
    """One CSV per input: timestamp, value, anomaly_score, label (1 inside a window)."""
    for file in files:
        target = Path(out_dir) / file.name
        target.parent.mkdir(parents=True, exist_ok=True)
        labels = [0] * len(file.values)
        for a, b in file.windows:
            for r in range(a, b + 1):
                labels[r] = 1
        with target.open("w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(["timestamp", "value", "anomaly_score", "label"])
            for row in range(len(file.values)):
                writer.writerow([file.timestamps[row], file.values[row],
                                 f"{file.scores[row]:.6f}", labels[row]])
