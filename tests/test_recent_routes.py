"""RecentWindows routes each series through the subscriptions it matched the first time it was
seen; the routes must follow every change of the subscriptions. These tests fail if a route
goes stale (a new subscription missing a known series, a dropped one still fed) or if routing
puts points anywhere else than offering every sample to every subscription would."""

from __future__ import annotations

import math

from sloguard.core.samples import Sample
from sloguard.core.selectors import parse_selector
from sloguard.detector.recent import RecentWindows, Subscription

S = 10**9


def _samples(t: int) -> list[Sample]:
    out = []
    for i in range(6):
        cls = "LS" if i % 3 == 0 else "BE"
        tags = {"node": "n", "cgroup": f"/cg{i}", "class": cls, "level": "pod"}
        out.append(Sample("container_cpu", tags, {"usage_cores": 0.1 * i + t,
                                                  "throttled_ratio": math.nan,
                                                  "note": "x", "flag": True}, t * S))
        out.append(Sample("container_pressure", {**tags, "resource": "io"},
                          {"some_rate": float(i)}, t * S))
    out.append(Sample("node_cpu", {"node": "n"}, {"usage": 1.0}, t * S))
    return out


def _reference(subs: list[Subscription], samples: list[Sample]) -> None:
    for sample in samples:
        for sub in subs:
            if sub.selector.measurement == sample.measurement:
                sub.offer(sample, tuple(sample.tags.items()))


def _state(sub: Subscription) -> tuple:
    return ({k: list(v) for k, v in sub.series.items()}, set(sub.unordered))


SPECS = [('container_cpu{class="BE"}', "usage_cores", 5),
         ('container_cpu{class="LS"}', "throttled_ratio", 30),
         ('container_cpu', "note", 5),
         ('container_pressure{class="BE", resource="io"}', "some_rate", 3),
         ('container_pressure{class=~"L.*"}', "some_rate", 3)]


def test_routing_puts_every_point_where_offering_would():
    windows = RecentWindows()
    subs = [windows.subscribe(parse_selector(s), f, w)[0] for s, f, w in SPECS]
    twins = [Subscription(parse_selector(s), f, int(w * S)) for s, f, w in SPECS]
    for t in (1, 2, 3, 2, 4):  # a step back in time too: `unordered`
        windows.add(_samples(t))
        _reference(twins, _samples(t))
    for sub, twin in zip(subs, twins, strict=True):
        assert _state(sub) == _state(twin), sub.key
    assert subs[0].series and subs[3].unordered  # the test sees points, and disorder


def test_a_subscription_added_later_gets_the_series_seen_before():
    windows = RecentWindows()
    be, _ = windows.subscribe(parse_selector('container_cpu{class="BE"}'), "usage_cores", 60)
    windows.add(_samples(1))  # every series routed now, before the second subscription
    ls, new = windows.subscribe(parse_selector('container_cpu{class="LS"}'), "usage_cores", 60)
    assert new
    windows.add(_samples(2))
    assert sorted(dict(k)["cgroup"] for k in ls.series) == ["/cg0", "/cg3"]
    assert all(len(points) == 1 for points in ls.series.values())
    assert all(len(points) == 2 for points in be.series.values())


def test_a_subscription_dropped_is_fed_no_more():
    windows = RecentWindows()
    be, _ = windows.subscribe(parse_selector('container_cpu{class="BE"}'), "usage_cores", 60)
    ls, _ = windows.subscribe(parse_selector('container_cpu{class="LS"}'), "usage_cores", 60)
    windows.add(_samples(1))
    windows.retain([ls])
    windows.add(_samples(2))
    assert all(len(points) == 1 for points in be.series.values())
    assert all(len(points) == 2 for points in ls.series.values())
    again, new = windows.subscribe(parse_selector('container_cpu{class="BE"}'),
                                   "usage_cores", 60)
    windows.add(_samples(3))
    assert new and again is not be
    assert all(len(points) == 1 for points in again.series.values()) and again.series
