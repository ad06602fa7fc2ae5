"""The change-point detector (a built-in plugin): a level shift in the recent window.

Interference switches on: a BE job starts and the LS signal moves to a new level. A threshold
needs the level known in advance and EWMA adapts to slow drifts; a change-point search on a
bounded sliding window finds when the level changed and by how much, which is what an SRE wants
on the incident ("p99 went from 0.2 to 3.1 ms at 14:02:17").

The default segmentation (#25, chosen on TCPD by benchmarks/changepoint_methods.py; the figures
and the sensitivity of each default are in docs/plugins.md): each segment is a straight line
(`cost: linear`), so a steady trend or drift is one segment and a jump or a change of slope is a
change; the optimum of the penalised cost over a grid of at most 100 candidate change points
(`method: grid`, numpy: the exact optimum for a window up to 100 points; 1 to 2x binseg's
time); penalty 3 x log(n) x the residual variance of one line through the window (MBIC's
constant).
`method: binseg`, binary segmentation (the default from #25 until the grid search; up to 2x
faster, a little less accurate); `method: pelt`, the exact optimum at any length (9 to 16 ms per
1,000 points); `cost: constant` segments levels only (the default before #25, with
`method: kernel`, ruptures' KernelCPD in C, the fastest exact one).

Parameters (rule `params`):
  window          points kept and segmented (default 120; at most 5000)
  penalty         pen = penalty x log(n) x the residual variance of the no-change fit (default 3)
  min_size        fewest points of a segment (default 5)
  recent          a change fires only while it is at most this many points old (default 10)
  min_shift       smallest absolute level change that counts (default 0)
  min_relative    smallest change relative to the level before it, 0.5 = 50% (default 0)
  direction       up, down or both (default up)
  method          grid, binseg, pelt or kernel (default grid)
  cost            linear or constant (default linear; kernel takes constant only, its default)
Once fired, the detector holds the level from before the change and recovers when the mean of
the last `min_size` points has come back more than half way to it.
"""

from __future__ import annotations

import math
from collections import deque
from datetime import UTC, datetime
from typing import Any

from sloguard.detector.api import Verdict, hookimpl, reject_unknown

_PARAMS = {"window", "penalty", "min_size", "recent", "min_shift", "min_relative", "direction",
           "method", "cost"}


class ChangePoint:
    name = "changepoint"

    def __init__(self, params: dict[str, Any]) -> None:
        reject_unknown(params, _PARAMS, self.name)
        try:
            self.window = int(params.get("window", 120))
            self.penalty = float(params.get("penalty", 3.0))
            self.min_size = int(params.get("min_size", 5))
            self.recent = int(params.get("recent", 10))
            self.min_shift = float(params.get("min_shift", 0.0))
            self.min_relative = float(params.get("min_relative", 0.0))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"changepoint parameters must be numbers: {exc}") from exc
        self.direction = params.get("direction", "up")
        if self.direction not in ("up", "down", "both"):
            raise ValueError("direction must be up, down or both")
        if not 4 <= 2 * self.min_size <= self.window <= 5000:
            raise ValueError("need 2 <= min_size and 2 x min_size <= window <= 5000")
        if self.penalty <= 0 or self.recent < 1 or self.min_shift < 0 or self.min_relative < 0:
            raise ValueError("penalty and recent must be positive, min_shift and min_relative "
                             "not negative")
        method = params.get("method", "grid")
        self.cost = params.get("cost", "constant" if method == "kernel" else "linear")
        self._algo = make_algorithm(method, self.min_size, self.cost)
        self.points: deque[tuple[int, float]] = deque(maxlen=self.window)
        self.before: float | None = None  # the level before the change that fired
        self.shift = 0.0
        self.changed_ns: int | None = None  # when that change began

    def update(self, value: float, time_ns: int) -> Verdict:
        if math.isnan(value):
            return Verdict(False, True, None, "no data")
        self.points.append((time_ns, value))
        if self.before is not None:
            return self._holding()
        if len(self.points) < 2 * self.min_size:
            return Verdict(False, True, None, "filling the window")
        change = self.last_change()
        if change is None:
            return Verdict(False, True, None)
        _, before, after = change
        # The segmenter must give its last segment `min_size` points, so a new level (or a
        # lone outlier) pulls the break early. Act only once the last `min_size` points all
        # sit past the midpoint, and measure the change from that run of points.
        mid = (before + after) / 2
        sign = 1.0 if after > before else -1.0
        values = [v for _, v in self.points]
        start = len(values)
        while start > 0 and sign * (values[start - 1] - mid) > 0:
            start -= 1
        run = values[start:]
        if len(run) < self.min_size:
            return Verdict(False, True, None, "possible change, not yet established")
        after = sum(run) / len(run)
        shift = after - before
        signed = {"up": shift, "down": -shift, "both": abs(shift)}[self.direction]
        big_enough = signed > 0 and abs(shift) >= self.min_shift and (
            abs(shift) >= self.min_relative * abs(before))
        fresh = len(run) <= self.recent + self.min_size
        if not (big_enough and fresh):
            return Verdict(False, True, before + math.copysign(self.min_shift, shift))
        self.before, self.shift, self.changed_ns = before, shift, self.points[start][0]
        at = datetime.fromtimestamp(self.points[start][0] / 1e9, UTC).strftime("%H:%M:%S")
        return Verdict(True, False, before, f"changed at {at} by {shift:+.3g} "
                                              f"({before:.3g} -> {after:.3g})",
                       change_ns=self.changed_ns)

    def last_change(self) -> tuple[int, float, float] | None:
        """(index, level before, mean after) of the most recent change point in the window.

        The level before is the segment's mean, or with the linear cost and a segment of at
        least 2 x min_size points, its line at its last point: a jump off a ramp is measured
        from where the ramp had got to, not from its middle. A shorter segment keeps its mean:
        its line, extrapolated to its end, swings with one outlier (a lone spike fired as a
        shift when every segment used its line).
        """
        import numpy as np

        x = np.fromiter((v for _, v in self.points), dtype=float)
        pen = penalty(x, self.penalty, self.cost)
        breaks = self._algo.fit(x.reshape(-1, 1)).predict(pen=pen)[:-1]
        if not breaks:
            return None
        last = int(breaks[-1])
        start = int(breaks[-2]) if len(breaks) > 1 else 0
        before = x[start:last]
        if self.cost == "linear" and len(before) >= 2 * self.min_size:
            slope, intercept = np.polyfit(np.arange(len(before), dtype=float), before, 1)
            level = float(slope * (len(before) - 1) + intercept)
        else:
            level = float(before.mean())
        return last, level, float(x[last:].mean())

    def _holding(self) -> Verdict:
        assert self.before is not None
        recent = [v for _, v in list(self.points)[-self.min_size:]]
        moved = sum(recent) / len(recent) - self.before
        if self.shift and moved / self.shift > 1:
            self.shift = moved  # the new level settled further away: recover against it
        still = (moved / self.shift) > 0.5 if self.shift else False
        if not still:
            self.before = None
            return Verdict(False, True, None, "back to the level before the change")
        return Verdict(True, False, self.before, f"{moved:+.3g} from the level before",
                       change_ns=self.changed_ns)


def penalty(x: Any, factor: float, cost: str = "linear") -> float:
    """factor x log(n) x the residual variance of the no-change fit (a BIC-like penalty).

    The no-change fit is one straight line per dimension for the `linear` cost and one constant
    for `constant` (there, the window's variance, as before #25); a multi-dimensional signal
    sums the dimensions' variances. With factor 3 this is MBIC's 3 log(n) on a signal scaled to
    unit noise, the TCPD reference's default. A shift or a slope change inflates the estimate,
    which keeps trends and seasons from being cut into many pieces; the noise estimates robust
    to shifts that #25 measured (the MAD of first or second differences) over-segmented TCPD
    (F1 0.58 to 0.61 against 0.784), see docs/plugins.md.
    """
    import numpy as np

    x = np.asarray(x, dtype=float)
    x = x.reshape(len(x), -1)
    if cost == "linear" and len(x) > 2:
        t = np.arange(len(x), dtype=float)
        t -= t.mean()
        x = x - x.mean(0)
        x = x - np.outer(t, t @ x / (t @ t))
    return factor * math.log(len(x)) * (float(np.var(x, axis=0).sum()) or 1e-12)


class _Cost:
    """Least-squares cost of segments [a, b) from prefix sums: the sum over dimensions of the
    squared residuals around the segment's mean (`constant`) or its straight line (`linear`).
    a and b are integer arrays that broadcast together; every segment has >= 2 points."""

    def __init__(self, x: Any, linear: bool) -> None:
        import numpy as np

        x = np.asarray(x, dtype=float)
        x = x.reshape(len(x), -1)
        x = (x - x.mean(0)).T  # centred: the cost does not change, the prefix sums stay small
        zero = np.zeros((x.shape[0], 1))
        self.s1 = np.hstack([zero, np.cumsum(x, 1)])
        self.s2 = np.concatenate([[0.0], np.cumsum((x * x).sum(0))])
        self.st = np.hstack([zero, np.cumsum(x * np.arange(x.shape[1]), 1)]) if linear else None

    def __call__(self, a: Any, b: Any) -> Any:
        import numpy as np

        a, b = np.atleast_1d(a), np.atleast_1d(b)
        s1 = self.s1[:, b] - self.s1[:, a]
        n = b - a
        out = self.s2[b] - self.s2[a] - (s1 * s1).sum(0) / n
        if self.st is not None:
            # sum of (t - mean t) x over the segment; its square over sum (t - mean t)^2
            c = self.st[:, b] - self.st[:, a] - 0.5 * (a + b - 1) * s1
            out -= 12.0 * (c * c).sum(0) / (n * (n * n - 1.0))
        return out


GRID_POINTS = 100
"""The `grid` search's most candidate change points: a window up to this long gets the exact
optimum; a longer one a grid of this many points, each change then moved to its best place
within a grid step. Chosen by cost, not by score (benchmarks/changepoint_methods.py, issue #25):
100 costs 1 to 2x binseg's time on a 1,000-point window and on the default 120-point one, 200
costs 2 to 5x (up to 5 ms on a busy 2-core VM); TCPD's cover is the same within 0.005 from 50
to 400 points."""


class Segmenter:
    """Penalised least-squares segmentation, ruptures' fit/predict shape, in numpy.

    `binseg`: binary segmentation, each segment split at its best point while that lowers the
    cost by more than the penalty (one vectorised search per level of the tree). `pelt`: the exact
    optimum (optimal partitioning with PELT pruning, the ends processed `min_size` at a time).
    `grid`: optimal partitioning over at most GRID_POINTS candidate change points (every point of
    a shorter window, so there the same optimum as `pelt`), each change then moved to its best
    place within a grid step between its neighbours. Binary segmentation fixes each split before
    it looks inside the halves, so two changes close together or a change of slope next to a
    jump end up misplaced or merged; the optimum over all segmentations does not (TCPD cover
    0.716 -> 0.727, docs/plugins.md), and the grid bounds its cost where PELT's pruning does
    not (no change to prune on: O(n^2) segments, 9 to 16 ms for 1,000 points).
    """

    def __init__(self, search: str, cost: str, min_size: int,
                 grid_points: int = GRID_POINTS) -> None:
        self.search, self.linear, self.min_size = search, cost == "linear", min_size
        self.grid_points = grid_points
        self.n = 0

    def fit(self, signal: Any) -> Segmenter:
        import numpy as np

        self.n = len(signal)
        self._cost = _Cost(np.asarray(signal, dtype=float), self.linear)
        return self

    def predict(self, pen: float) -> list[int]:
        search = {"binseg": self._binseg, "pelt": self._pelt, "grid": self._grid}[self.search]
        return [*search(pen), self.n]

    def _binseg(self, pen: float) -> list[int]:
        import numpy as np

        m, cost, out = self.min_size, self._cost, []
        todo = np.array([[0, self.n]])
        while len(todo):  # one vectorised search for all the segments of a level of the tree
            todo = todo[todo[:, 1] - todo[:, 0] >= 2 * m]
            if not len(todo):
                break
            a, b = todo[:, 0], todo[:, 1]
            counts = b - a - 2 * m + 1
            starts = np.cumsum(counts) - counts
            seg = np.repeat(np.arange(len(todo)), counts)
            t = a[seg] + m + np.arange(counts.sum()) - starts[seg]
            gain = cost(a, b)[seg] - cost(a[seg], t) - cost(t, b[seg])
            best = np.maximum.reduceat(gain, starts)
            split = []
            for j in np.flatnonzero(best > pen):
                cut = int(t[starts[j] + np.argmax(gain[starts[j]:starts[j] + counts[j]])])
                out.append(cut)
                split += [(a[j], cut), (cut, b[j])]
            todo = np.array(split, dtype=int).reshape(-1, 2)
        return sorted(out)

    def _pelt(self, pen: float) -> list[int]:
        import numpy as np

        n, m, cost = self.n, self.min_size, self._cost
        best = np.full(n + 1, np.inf)  # best[b]: the least penalised cost of x[:b]
        best[0] = -pen
        last = np.zeros(n + 1, dtype=int)
        cand = np.array([0])
        for start in range(m, n + 1, m):
            # every candidate a <= b - m of the ends b in [start, start + m) is already solved
            ends = np.arange(start, min(start + m, n + 1))
            short = ends[None, :] - cand[:, None] < m
            with np.errstate(divide="ignore", invalid="ignore"):  # short ones: masked
                total = best[cand][:, None] + cost(cand[:, None], ends[None, :])
            total[short] = np.inf
            pick = total.argmin(0)
            best[ends] = total[pick, np.arange(len(ends))] + pen
            last[ends] = cand[pick]
            # PELT: a candidate worse than the optimum at `start` stays worse at every end
            # b >= start + m (the next ones), where the optimum at `start` is a candidate too
            keep = short[:, 0] | (total[:, 0] <= best[start] + 1e-9 * (1 + abs(best[start])))
            cand = np.concatenate([cand[keep], ends])
        out, b = [], n
        while (b := int(last[b])) > 0:
            out.append(b)
        return out[::-1]

    def _grid(self, pen: float) -> list[int]:
        import numpy as np

        n, m, cost = self.n, self.min_size, self._cost
        if n < 2 * m:
            return []
        step = -(-n // self.grid_points)
        at = np.unique(np.minimum(np.arange(0, n + step, step), n))  # 0, step, ..., n
        g = len(at)
        first, second = np.triu_indices(g, 1)
        long_enough = at[second] - at[first] >= m
        first, second = first[long_enough], second[long_enough]
        segment = np.full((g, g), np.inf)  # segment[j, i]: the cost of x[at[i]:at[j]]
        segment[second, first] = cost(at[first], at[second])
        best = np.full(g, np.inf)  # best[j]: the least penalised cost of x[:at[j]]
        best[0] = -pen
        last = [0] * g
        for j in range(1, g):
            total = best[:j] + segment[j, :j]
            last[j] = int(total.argmin())
            best[j] = total[last[j]] + pen
        bounds, j = [n], g - 1
        while (j := last[j]) > 0:
            bounds.append(int(at[j]))
        bounds.append(0)
        bounds.reverse()
        if step > 1:  # each change to its best place within a step, between its neighbours
            for k in range(1, len(bounds) - 1):
                low = max(bounds[k - 1] + m, bounds[k] - step + 1)
                high = min(bounds[k + 1] - m, bounds[k] + step - 1)
                if low < high:
                    t = np.arange(low, high + 1)
                    split = cost(bounds[k - 1], t) + cost(t, bounds[k + 1])
                    bounds[k] = int(t[np.argmin(split)])
        return bounds[1:-1]


def make_algorithm(method: str, min_size: int, cost: str = "linear") -> Any:
    """The segmenter of `method` (grid, binseg, pelt, kernel) with `cost` (linear, constant)."""
    if cost not in ("linear", "constant"):
        raise ValueError("cost must be linear or constant")
    if method not in ("grid", "binseg", "pelt", "kernel"):
        raise ValueError("method must be grid, binseg, pelt or kernel")
    if min_size < 2:
        raise ValueError("min_size must be at least 2")
    if method != "kernel":
        return Segmenter(method, cost, min_size)
    if cost != "constant":
        raise ValueError("method kernel segments levels only: use it with cost: constant")
    import ruptures  # KernelCPD with a linear kernel: the constant cost's optimum, in C

    return ruptures.KernelCPD(kernel="linear", min_size=min_size)


@hookimpl
def sloguard_detectors() -> list[type]:
    return [ChangePoint]
