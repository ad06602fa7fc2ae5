"""Percentiles from log2 histograms: the bucket error the docs promise (within a factor of 2,
interpolated inside the bucket) and the slot layout the BPF programs use (bpf_log2l)."""

from __future__ import annotations

import math
import random

import pytest

from sloguard.collectors.log2hist import SLOTS, Log2Histogram, slot_bounds


def bpf_log2l(value: int) -> int:
    """BCC's bpf_log2l (helpers.h): floor(log2(v)) + 1, and 1 for 0."""
    return max(value.bit_length(), 1)


def _hist(values: list[int]) -> Log2Histogram:
    """What the BPF side would leave in its `struct hist` for these values, decoded."""
    counts = [0] * SLOTS
    for value in values:
        counts[min(bpf_log2l(value), SLOTS - 1)] += 1
    return Log2Histogram.from_values((*counts, sum(values)))


def test_slots_hold_what_bpf_log2l_puts_in_them():
    for value in [0, 1, 2, 3, 4, 7, 8, 1000, 4096, 10**6, 10**9, 2**40 + 5]:
        low, high = slot_bounds(bpf_log2l(value))
        assert low <= value < high, value


@pytest.mark.parametrize("seed", range(5))
def test_quantiles_are_within_a_factor_of_two(seed):
    rng = random.Random(seed)
    values = [int(rng.lognormvariate(10, 2)) + 1 for _ in range(5000)]
    hist = _hist(values)
    exact = sorted(values)
    for q in (0.5, 0.9, 0.99):
        true = exact[math.ceil(q * len(exact)) - 1]
        estimate = hist.quantile(q)
        assert true / 2 <= estimate <= true * 2, (q, true, estimate)
    assert hist.mean() == pytest.approx(sum(values) / len(values))  # the sum is exact
    assert hist.count == len(values)


def test_interpolation_inside_one_bucket():
    hist = _hist([1000] * 10)  # slot 10 holds [512, 1024)
    assert slot_bounds(10) == (512, 1024)
    assert hist.quantile(0.5) == pytest.approx(512 + 512 * 0.5)
    assert hist.quantile(1.0) == pytest.approx(1024)


def test_merge_is_the_histogram_of_the_union():
    a, b = [5, 100, 3000], [70, 70000]
    merged = _hist(a)
    merged.merge(_hist(b))
    union = _hist(a + b)
    assert merged.counts == union.counts and merged.sum_ns == union.sum_ns


def test_empty_histogram_gives_no_fields():
    hist = Log2Histogram()
    assert hist.fields() == {} and math.isnan(hist.quantile(0.5))
    fields = _hist([2000, 4000]).fields()
    assert set(fields) == {"p50_us", "p99_us", "mean_us", "total_us", "count"}
    assert fields["mean_us"] == pytest.approx(3.0) and fields["count"] == 2
