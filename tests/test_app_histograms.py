"""Percentiles from real prometheus-client histograms and summaries, per scrape interval: the
PromQL estimate, its bound, counter resets, `_created`, OpenMetrics, and pages that are wrong."""

from __future__ import annotations

import bisect
import math
import random

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics

from sloguard.collectors.exposition import (
    OPENMETRICS,
    ExpositionError,
    ReadSpec,
    interval,
    read,
)
from sloguard.collectors.histograms import (
    INF,
    Buckets,
    delta,
    exact_quantile,
    from_counts,
    histogram_quantile,
    merge,
)
from sloguard.collectors.latency import LatencyBatch, combined_quantile
from sloguard.core.percentiles import parse_percentile, percentile_name

BOUNDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)


def _service(registry: CollectorRegistry | None = None):
    registry = registry or CollectorRegistry()
    hist = Histogram("rpc_latency_seconds", "latency", ["method"], buckets=BOUNDS,
                     registry=registry)
    codes = Counter("rpc_requests", "requests", ["code"], registry=registry)
    return registry, hist, codes


def test_promql_estimate_within_one_bucket_of_the_truth():
    rng = random.Random(7)
    registry, hist, _ = _service()
    values = [rng.lognormvariate(math.log(0.02), 0.8) for _ in range(20_000)]
    for v in values:
        hist.labels("get").observe(v)
    reading = read(generate_latest(registry).decode(), "text/plain", ReadSpec())
    [series] = reading.series.values()
    ordered = sorted(v * 1000 for v in values)
    bounds_ms = [b * 1000 for b in BOUNDS]
    for q in (0.5, 0.9, 0.99):
        estimate = histogram_quantile(q, series.buckets)
        truth = exact_quantile(ordered, q)
        i = bisect.bisect_left(bounds_ms, truth)
        lower, upper = (bounds_ms[i - 1] if i else 0.0), bounds_ms[i]
        assert lower <= estimate <= upper, (q, estimate, truth)
        assert abs(estimate - truth) <= upper - lower  # the documented bound


def test_quantile_matches_promql_edge_cases():
    b = Buckets((1.0, 2.0, 4.0, INF), (10, 20, 20, 20))
    assert histogram_quantile(0.5, b) == 1.0  # rank 10 is the top of the first bucket
    assert histogram_quantile(0.75, b) == 1.5
    assert histogram_quantile(0.25, b) == 0.5  # the first bucket starts at 0
    tail = Buckets((1.0, 2.0, INF), (1, 2, 100))
    assert histogram_quantile(0.99, tail) == 2.0  # in +Inf: the largest finite bound
    assert math.isnan(histogram_quantile(0.5, Buckets((1.0, INF), (0, 0))))
    assert percentile_name(0.5) == "p50" and percentile_name(0.999) == "p999"
    assert percentile_name(0.95) == "p95" and percentile_name(0.9999) == "p9999"


@pytest.mark.parametrize("name, quantile", [
    ("p50", 0.5), ("p5", 0.05), ("p05", 0.05), ("p90", 0.9), ("p99", 0.99), ("p999", 0.999),
    ("p99.9", 0.999), ("P99.99", 0.9999), ("p9995", 0.9995), ("p0.1", 0.001)])
def test_one_percentile_vocabulary(name, quantile):
    """Rules (aggregations), SLOs, pushed fields and stored field names read a percentile the
    same way: p999 was 99.9 for an SLO but refused as a rule's aggregation before."""
    from sloguard.collectors.config import SloConfig
    from sloguard.detector.signals import aggregate
    from sloguard.store import check_aggregation

    assert parse_percentile(name) == pytest.approx(quantile)
    assert parse_percentile(percentile_name(quantile)) == pytest.approx(quantile)
    assert check_aggregation(name) == name.lower()  # one spelling downstream
    assert SloConfig(service="s", percentile=name, latency_ms=1).quantile == pytest.approx(quantile)
    values = [float(v) for v in range(10001)]
    assert aggregate(list(range(len(values))), values, name) == pytest.approx(10000 * quantile)


@pytest.mark.parametrize(
    "name", ["p0", "p100", "p200", "p", "99", "p-1", "p1e2", "p²", "p99.", "mean2"])
def test_not_a_percentile(name):
    from sloguard.store import check_aggregation

    with pytest.raises(ValueError):
        parse_percentile(name)
    with pytest.raises(ValueError):
        check_aggregation(name)


def test_delta_handles_resets_and_layout_changes():
    before = Buckets((1.0, INF), (5, 8))
    after = Buckets((1.0, INF), (7, 12))
    assert delta(before, after) == (Buckets((1.0, INF), (2, 4)), False)
    restarted = Buckets((1.0, INF), (1, 1))
    assert delta(after, restarted) == (restarted, True)  # went down: all of it is new
    relaid = Buckets((0.5, 1.0, INF), (3, 9, 20))
    assert delta(after, relaid) == (relaid, True)
    merged = merge([Buckets((1.0, 2.0, INF), (1, 2, 3)), Buckets((2.0, 5.0, INF), (4, 5, 6))])
    assert merged == Buckets((2.0, INF), (6, 9))  # only the bounds both have
    assert from_counts([10, 50], [90, 9, 1]) == Buckets((10, 50, INF), (90, 99, 100))


def test_interval_follows_latency_and_errors_between_scrapes():
    registry, hist, codes = _service()
    for _ in range(1000):
        hist.labels("get").observe(0.003)
        codes.labels("200").inc()
    first = read(generate_latest(registry).decode(), "text/plain", ReadSpec())
    assert interval(None, first, None) == (None, 0)  # nothing to subtract from yet
    for i in range(100):  # the next interval: slow, 10% errors
        hist.labels("get").observe(0.3)
        codes.labels("500" if i % 10 == 0 else "200").inc()
    second = read(generate_latest(registry).decode(), "text/plain", ReadSpec())
    batch, resets = interval(first, second, 2.0)
    assert resets == 0 and batch.requests == 100 and batch.errors == 10
    fields = batch.fields()
    assert 250 <= fields["p50"] <= 500 and 250 <= fields["p99"] <= 500  # only the new ones
    assert fields["rate"] == 50 and fields["error_rate"] == pytest.approx(0.1)
    assert second.error_source.startswith("counter rpc_requests, label code")


def test_restarted_service_counts_as_a_reset_not_a_negative_interval():
    registry, hist, _ = _service()
    for _ in range(500):
        hist.labels("get").observe(0.2)
    old = read(generate_latest(registry).decode(), "text/plain", ReadSpec())
    registry2, hist2, _ = _service()  # the process restarted: counters from zero
    for _ in range(10):
        hist2.labels("get").observe(0.004)
    new = read(generate_latest(registry2).decode(), "text/plain", ReadSpec())
    batch, resets = interval(old, new, 1.0)
    assert resets == 1 and batch.requests == 10
    assert batch.fields()["p99"] <= 5.0  # the 10 new fast ones, not 500 old slow ones


def test_created_series_reveal_a_reset_that_counts_hide():
    registry, hist, _ = _service()
    for _ in range(5):
        hist.labels("get").observe(0.2)
    old = read(generate_latest(registry).decode(), "text/plain", ReadSpec())
    registry2, hist2, _ = _service()
    for _ in range(8):  # more than before: only `_created` tells it restarted
        hist2.labels("get").observe(0.004)
    new = read(generate_latest(registry2).decode(), "text/plain", ReadSpec())
    assert old.series[(("method", "get"),)].created != new.series[(("method", "get"),)].created
    batch, resets = interval(old, new, 1.0)
    assert resets == 1 and batch.requests == 8 and batch.fields()["p99"] <= 5.0


def test_openmetrics_page_reads_the_same():
    registry, hist, codes = _service()
    for v in (0.004, 0.02, 0.2):
        hist.labels("get").observe(v)
        codes.labels("503").inc()
    text = read(generate_latest(registry).decode(), "text/plain; version=0.0.4", ReadSpec())
    om = read(generate_openmetrics(registry).decode(), f"{OPENMETRICS}; version=1.0.0",
              ReadSpec())
    key = (("method", "get"),)
    assert om.series[key].buckets == text.series[key].buckets
    assert om.series[key].created == text.series[key].created is not None
    def counts(reading):
        return {k: v.count for k, v in reading.errors.items()}

    assert counts(om) == counts(text) == {(("code", "503"),): 3.0}


def test_label_filter_unit_and_summaries():
    page = """\
# TYPE api_ms histogram
api_ms_bucket{path="/a",le="10"} 5
api_ms_bucket{path="/a",le="100"} 10
api_ms_bucket{path="/a",le="+Inf"} 10
api_ms_count{path="/a"} 10
api_ms_bucket{path="/b",le="10"} 0
api_ms_bucket{path="/b",le="100"} 0
api_ms_bucket{path="/b",le="+Inf"} 4
api_ms_count{path="/b"} 4
# TYPE rpc_seconds summary
rpc_seconds{quantile="0.5"} 0.01
rpc_seconds{quantile="0.99"} 0.25
rpc_seconds_count 40
rpc_seconds_sum 1.2
"""
    only_a = read(page, "", ReadSpec(metric="api_ms", labels=(("path", "/a"),)))
    [series] = only_a.series.values()
    assert series.buckets.bounds == (10.0, 100.0, INF)  # _ms: already milliseconds
    summary = read(page, "", ReadSpec(metric="rpc_seconds"))
    later = read(page.replace("0.25", "0.4").replace("_count 40", "_count 70"), "",
                 ReadSpec(metric="rpc_seconds"))
    batch, _ = interval(summary, later, 3.0)
    assert batch.requests == 30 and batch.fields()["p99"] == pytest.approx(400.0)
    assert batch.fields()["p50"] == pytest.approx(10.0)
    # errors from the histogram's own status label when there is no counter
    coded = page.replace('path="/a"', 'code="200"').replace('path="/b"', 'code="502"')
    reading = read(coded, "", ReadSpec(metric="api_ms"))
    assert reading.error_source.startswith("api_ms, label code")
    assert sum(s.count for s in reading.errors.values() if s.is_error) == 4


@pytest.mark.parametrize("page, message", [
    ("this is { not prometheus", "malformed exposition"),
    ('# TYPE x histogram\nx_bucket{le="1"} 3\nx_bucket{le="2"} 1\nx_bucket{le="+Inf"} 3\n',
     "cumulative bucket counts go down"),
    ('# TYPE x histogram\nx_bucket{le="1"} 3\nx_count 3\n', r"x: no \+Inf bucket"),
    ("# TYPE up gauge\nup 1\n", "no latency histogram or summary"),
    ('# TYPE x histogram\nx_bucket{le="abc"} 3\n', "le='abc' is not a number"),
])
def test_malformed_pages_are_errors_with_a_reason(page, message):
    with pytest.raises(ExpositionError, match=message):
        read(page, "text/plain", ReadSpec())


def test_missing_named_metric_lists_what_is_there():
    registry, hist, _ = _service()
    hist.labels("get").observe(0.1)
    with pytest.raises(ExpositionError, match="rpc_latency_seconds"):
        read(generate_latest(registry).decode(), "", ReadSpec(metric="nope_seconds"))


def test_combined_quantile_merges_histograms_values_and_keeps_the_worst_summary():
    h1 = LatencyBatch(buckets=from_counts([10, 100], [98, 2, 0]), requests=100)
    h2 = LatencyBatch(buckets=from_counts([10, 100], [0, 100, 0]), requests=100)
    assert 10 <= combined_quantile([h1, h2], 0.5) <= 100
    raw = LatencyBatch(values=[1.0, 2.0, 3.0, 400.0], requests=4)
    assert combined_quantile([raw], 0.5) == 2.5
    # 104 observations: rank 102.96 of p99 is inside (10, 100]; rank 103.9 of p999 is in +Inf
    assert combined_quantile([h1, raw], 0.99) == pytest.approx(10 + 90 * 1.96 / 2)
    assert combined_quantile([h1, raw], 0.999) == 100.0  # the largest finite bound
    pushed = LatencyBatch(quantiles={0.99: 700.0})
    assert combined_quantile([h1, pushed], 0.99) == 700.0
    assert math.isnan(combined_quantile([], 0.99))


def test_error_counter_is_the_requests_counter_not_the_metrics_handlers():
    page = (
        "# TYPE promhttp_metric_handler_requests counter\n"
        'promhttp_metric_handler_requests_total{code="500"} 9\n'
        "# TYPE app_failures counter\n"
        'app_failures_total{code="500"} 1\n'
        "# TYPE http_requests counter\n"
        'http_requests_total{code="500"} 2\n'
        'http_requests_total{code="200"} 5\n'
        "# TYPE t_seconds histogram\n"
        't_seconds_bucket{le="+Inf"} 7\n'
        "t_seconds_count 7\n"
    )
    reading = read(page, "", ReadSpec())
    assert reading.error_source.startswith("counter http_requests, label code")
    named = read(page, "", ReadSpec(error_metric="app_failures_total", error_match="5.*"))
    assert named.error_source.startswith("counter app_failures")
    with pytest.raises(ExpositionError, match="no counter named 'nope'"):
        read(page, "", ReadSpec(error_metric="nope"))
