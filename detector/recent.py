"""The recent past of the series that rules watch, in memory: what rules evaluate each tick.

Each rule subscribes to (selector, field, window); every tick's samples are routed to the
subscriptions they match as they arrive, so a tick costs O(new samples), not a re-scan of every
window. Re-reading each rule's window from the store every second cost ~100x more CPU, the same
reason Prometheus evaluates rules on its in-memory head. The store stays the record: a new
subscription is backfilled from it, so `for` durations and rates continue across restarts, and
backtests and the UI read the store directly.
"""

from __future__ import annotations

import itertools
import math
from collections import deque
from collections.abc import Iterable

from sloguard.core.samples import Sample
from sloguard.core.selectors import Selector
from sloguard.detector.signals import aggregate_values

SeriesKey = tuple[tuple[str, str], ...]
_CACHE_LIMIT = 100_000
_PRUNE_EVERY_NS = 5 * 10**9
_FUTURE_NS = 3600 * 10**9  # points this far ahead of the newest batch: the clock stepped back


class Subscription:
    """The values of one field of the series one selector matches, over a sliding window."""

    __slots__ = ("added", "field", "key", "match", "pruned_ns", "selector", "series",
                 "unordered", "window_ns")

    def __init__(self, selector: Selector, field: str, window_ns: int) -> None:
        self.selector = selector
        self.field = field
        self.window_ns = window_ns
        self.key = (selector, field, window_ns)  # selectors are frozen: compared as values
        self.series: dict[SeriesKey, deque[tuple[int, float]]] = {}
        self.match: dict[tuple, SeriesKey | None] = {}  # tag items as given -> key or no match
        self.unordered: set[SeriesKey] = set()  # series that got a point older than their last
        self.pruned_ns = 0
        # points put so far: what a rule judged on this subscription cannot have changed
        # while it stays the same, but for points leaving the window with time
        # (Engine: a held-back rule is not judged again on arrival)
        self.added = 0

    def offer(self, sample: Sample, given: tuple) -> None:
        value = sample.fields.get(self.field)
        if value is None or isinstance(value, str | bool):
            return
        key = self.match.get(given, False)
        if key is False:
            if len(self.match) > _CACHE_LIMIT:
                self.match.clear()
            key = tuple(sorted(given)) if self.selector.matches(sample.tags) else None
            self.match[given] = key
        if key is not None:
            self.put(key, sample.time_ns, value)

    def put(self, key: SeriesKey, time_ns: int, value: float) -> None:
        """Append a point to series `key` (a number: the caller checked it)."""
        points = self.series.get(key)
        if points is None:
            points = self.series[key] = deque()
        elif time_ns < points[-1][0]:
            self.unordered.add(key)
        points.append((time_ns, float(value)))
        self.added += 1

    def prune(self, latest_ns: int) -> None:
        """Drop points that left the window. Every few seconds, not every tick: `window` filters
        by time anyway, and a pass over every series costs as much as evaluating them."""
        if 0 <= latest_ns - self.pruned_ns < _PRUNE_EVERY_NS:
            return
        self.pruned_ns = latest_ns
        cutoff = latest_ns - self.window_ns - 1_000_000_000  # one second of slack
        empty = []
        for key, points in self.series.items():
            while points and (points[0][0] < cutoff or points[0][0] > latest_ns + _FUTURE_NS):
                points.popleft()
            if not points:
                empty.append(key)
        for key in empty:
            del self.series[key]
            self.unordered.discard(key)

    def window(self, start_ns: int, end_ns: int) -> dict[SeriesKey, tuple[list[int], list[float]]]:
        out = {}
        unordered = self.unordered
        for key, points in self.series.items():
            if points[-1][0] < end_ns and key not in unordered:  # in time order: the usual case
                skip = 0
                for point in points:  # the few points older than the window, until a prune
                    if point[0] >= start_ns:
                        break
                    skip += 1
                if skip == len(points):
                    continue
                inside = itertools.islice(points, skip, None) if skip else points
            else:
                inside = [p for p in points if start_ns <= p[0] < end_ns]
                if not inside:
                    continue
            times, values = zip(*inside, strict=True)
            out[key] = (times, values)
        return out


    def reduce(self, start_ns: int, end_ns: int, how: str) -> dict[SeriesKey, float]:
        """Each series' `how` (an orderless aggregate, signals.orderless) over [start_ns,
        end_ns): `window` + `aggregate`, without copying the window out. Written as loops
        for min and max, the aggregate of the shipped rules' BE conditions (90 series of a 5 s
        window each on 100 cgroups): "evaluate" in benchmarks/agent_tick.py went from 4.55 to
        3.50 ms a tick (alternated with the code before; 96 against 412 us for one such
        condition's 90 series, timed alone)."""
        out: dict[SeriesKey, float] = {}
        unordered = self.unordered
        extreme = how in ("max", "min")
        larger = how == "max"
        for key, points in self.series.items():
            if points[-1][0] < end_ns and key not in unordered:  # in time order, as `window`
                if extreme:
                    best = None
                    seen = False
                    for t, v in points:
                        if t < start_ns:
                            continue
                        seen = True
                        # what max() and min() keep: the first of equals; NaN is skipped
                        if v == v and (best is None or (v > best if larger else v < best)):
                            best = v
                    if seen:
                        out[key] = math.nan if best is None else best
                    continue
                values = [v for t, v in points if t >= start_ns]
            else:
                values = [v for t, v in points if start_ns <= t < end_ns]
            if values:
                out[key] = aggregate_values(values, how)
        return out

    def last(self, start_ns: int, end_ns: int) -> dict[SeriesKey, float]:
        """Each series' latest non-NaN value in [start_ns, end_ns): `window` + `last`, cheaper."""
        out = {}
        unordered = self.unordered
        for key, points in self.series.items():
            newest = points[-1]
            if start_ns <= newest[0] < end_ns and newest[1] == newest[1] and (
                    key not in unordered):
                out[key] = newest[1]  # in time order, inside, a number: the usual case
                continue
            inside = [p for p in points if start_ns <= p[0] < end_ns and p[1] == p[1]]
            if inside:
                if key in unordered:  # latest by time; among equal times, the latest to arrive
                    inside.sort(key=lambda p: p[0])
                out[key] = inside[-1][1]
        return out


class RecentWindows:
    def __init__(self) -> None:
        self._subs: dict[tuple, Subscription] = {}
        self._by_measurement: dict[str, list[Subscription]] = {}
        # measurement -> tag items as given -> (subscription, its series key) for each one
        # whose selector matches: a series is matched against the subscriptions once, not
        # every sample against every subscription of its measurement (offered one by one, the
        # 100-cgroup agent made ~1200 calls a tick: "windows" in benchmarks/agent_tick.py).
        # Rebuilt whenever the subscriptions change.
        self._routes: dict[str, dict[tuple, list[tuple[Subscription, SeriesKey]]]] = {}

    def subscribe(self, selector: Selector, field: str, window_s: float) -> tuple[Subscription,
                                                                                  bool]:
        """The subscription for these parameters, and whether it was just created (empty).
        Looked up by value, without making one: each rule asks on every evaluation."""
        window_ns = int(window_s * 1e9)
        existing = self._subs.get((selector, field, window_ns))
        if existing is not None:
            return existing, False
        sub = Subscription(selector, field, window_ns)
        self._subs[sub.key] = sub
        self._by_measurement.setdefault(selector.measurement, []).append(sub)
        self._routes = {}
        return sub, True

    def find(self, selector: Selector, field: str, window_s: float) -> Subscription | None:
        """The subscription for these parameters, if there is one (none is made)."""
        return self._subs.get((selector, field, int(window_s * 1e9)))

    def retain(self, keep: Iterable[Subscription]) -> None:
        """Forget subscriptions no rule uses any more."""
        wanted = {sub.key for sub in keep}
        self._subs = {k: s for k, s in self._subs.items() if k in wanted}
        self._by_measurement = {}
        for sub in self._subs.values():
            self._by_measurement.setdefault(sub.selector.measurement, []).append(sub)
        self._routes = {}

    def _route(self, sample: Sample, given: tuple) -> list[tuple[Subscription, SeriesKey]]:
        """The subscriptions of the sample's measurement that its tags match, in order."""
        routes = self._routes.setdefault(sample.measurement, {})
        if len(routes) > _CACHE_LIMIT:
            routes.clear()
        key = tuple(sorted(given))
        route = routes[given] = [
            (sub, key) for sub in self._by_measurement.get(sample.measurement, ())
            if sub.selector.matches(sample.tags)]
        return route

    def add(self, samples: Iterable[Sample], only: Subscription | None = None,
            now_ns: int | None = None) -> None:
        """Route samples to the subscriptions they match, then drop what left every window.

        The agent passes its own clock as `now_ns`: windows are pruned against it, never
        against a sample's time, since pushed samples carry the pusher's: one point stamped a
        day ahead emptied every window and resolved firing incidents as "no data". Without
        `now_ns` (backtests replaying recorded data) windows end at the newest sample of this
        batch, not the newest ever seen: after the wall clock steps back, new samples are kept
        (points stamped in the "future" are outside every window until the clock catches up).
        """
        newest = 0
        routes = self._routes
        for sample in samples:
            if only is not None:
                only.offer(sample, tuple(sample.tags.items()))
                newest = max(newest, sample.time_ns)
                continue
            measurement = sample.measurement
            if measurement not in self._by_measurement:
                continue
            given = tuple(sample.tags.items())
            route = routes.get(measurement, {}).get(given)
            if route is None:
                route = self._route(sample, given)
            time_ns, fields = sample.time_ns, sample.fields
            for sub, key in route:  # Subscription.offer, its match already routed
                value = fields.get(sub.field)
                if value is not None and not isinstance(value, str | bool):
                    sub.put(key, time_ns, value)
            if time_ns > newest:
                newest = time_ns
        if now_ns is not None:
            newest = now_ns
        if newest:
            for sub in self._subs.values():
                sub.prune(newest)
