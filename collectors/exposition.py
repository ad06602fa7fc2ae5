"""A service's latency as its /metrics page states it, and what changed between two scrapes.

Parsing is prometheus-client's own (the text format, or OpenMetrics when the response says so),
so anything Prometheus can scrape, sloguard can. From the families it keeps the latency histogram
(or summary) and the counter that tells errors apart by status label; `interval` turns two
readings into the observations in between, handling counter resets and `_created` series.

A target's page is outside input, read on the agent's own threads, so what it may cost is
bounded: the page's size (`max_response`, by the fetch), its lines (no longer than a series
within the label bounds can be: prometheus-client's parser slices the rest of a line for each
label, so a long line of labels costs the square of its length), its series (`max_series`), the
labels of a series (`max_labels`) and their length (`max_label_length`). A page over a bound is
an ExpositionError, reported as the target's error like any malformed page. Everything after
the parse is linear in the number of samples.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from sloguard.collectors.histograms import INF, Buckets, check_buckets, delta, merge
from sloguard.collectors.latency import LatencyBatch

LabelKey = tuple[tuple[str, str], ...]
OPENMETRICS = "application/openmetrics-text"
# Prometheus' own Accept header: OpenMetrics first, the text format as the fallback.
ACCEPT = ("application/openmetrics-text;version=1.0.0;q=0.75,"
          "text/plain;version=0.0.4;q=0.5,*/*;q=0.1")

_UNIT_SUFFIXES = (("_milliseconds", 1.0), ("_ms", 1.0), ("_microseconds", 0.001),
                  ("_us", 0.001), ("_seconds", 1000.0))


class ExpositionError(Exception):
    """The page is not a valid exposition, or does not hold what the target needs."""


@dataclass(frozen=True, slots=True)
class ReadSpec:
    """What to take from a page: the latency family and how errors are told apart."""

    metric: str | None = None
    labels: tuple[tuple[str, str], ...] = ()
    unit: str = "auto"  # auto | s | ms
    error_metric: str | None = None
    error_label: str = "code"
    error_match: str = "5.."
    max_series: int = 10_000
    max_labels: int = 32
    max_label_length: int = 1024

    @property
    def max_line(self) -> int:
        """The longest line a series within the label bounds needs (name, labels, value,
        timestamp, exemplar), and HELP text of reasonable length."""
        return 4096 + self.max_labels * (2 * self.max_label_length + 8)


@dataclass(slots=True)
class _Series:
    count: float
    created: float | None
    buckets: Buckets | None = None  # histograms, bounds in ms
    quantiles: dict[float, float] = field(default_factory=dict)  # summaries, ms
    is_error: bool = False


@dataclass(slots=True)
class Reading:
    """One scrape of one target: cumulative values per series."""

    metric: str
    kind: str  # histogram | summary
    series: dict[LabelKey, _Series]
    errors: dict[LabelKey, _Series]  # counter series (value in `count`), or empty
    error_source: str  # how errors were told apart, for the status page


def parse(text: str, content_type: str = "") -> list:
    """prometheus-client's families; ExpositionError (with the parser's reason) if malformed."""
    try:
        if OPENMETRICS in content_type.lower():
            from prometheus_client.openmetrics.parser import text_string_to_metric_families
        else:
            from prometheus_client.parser import text_string_to_metric_families
        return list(text_string_to_metric_families(text))
    except Exception as exc:  # the parsers raise ValueError, IndexError, KeyError, ...
        reason = str(exc) or exc.__class__.__name__
        raise ExpositionError(f"malformed exposition: {reason[:300]}") from None


def read(text: str, content_type: str, spec: ReadSpec) -> Reading:
    """The latency family and error counter of one page, as a Reading."""
    _check_lines(text, spec.max_line)
    samples: list[tuple[str, dict[str, str], float]] = []
    types: dict[str, str] = {}
    for family in parse(text, content_type):
        types[family.name] = family.type
        samples.extend((s.name, s.labels, s.value) for s in family.samples)
        if len(samples) > spec.max_series:
            raise ExpositionError(f"more than {spec.max_series} series on the page "
                                  "(app_latency.max_series)")
    _check_labels(samples, spec)
    histograms = _histogram_names(types, samples)
    summaries = sorted({n for n, t in types.items() if t == "summary"}
                       & {name for name, labels, _ in samples if "quantile" in labels})
    metric = spec.metric or _pick(histograms) or (summaries[0] if summaries else None)
    if metric is None:
        raise ExpositionError("no latency histogram or summary on the page; name one with "
                              "`metric`")
    if metric in histograms:
        kind = "histogram"
    elif metric in types and types[metric] == "summary":
        kind = "summary"
    else:
        found = ", ".join(sorted(histograms) + summaries)[:200] or "none"
        raise ExpositionError(f"no histogram or summary named {metric!r} (found: {found})")
    scale = _scale(metric, spec.unit)
    wanted = dict(spec.labels)
    series = _histograms(metric, samples, wanted, scale) if kind == "histogram" else \
        _summaries(metric, samples, wanted, scale)
    errors, source = _errors(spec, types, samples, series, metric)
    return Reading(metric, kind, series, errors, source)


def _check_lines(text: str, limit: int) -> None:
    """No line longer than `limit` (before the parser, whose cost per line is quadratic)."""
    if len(text) <= limit:
        return
    lengths = list(map(len, text.split("\n")))
    longest = max(lengths)
    if longest > limit:
        line = lengths.index(longest) + 1
        raise ExpositionError(f"line {line} has {longest} characters, more than a series "
                              f"within app_latency.max_labels and max_label_length needs "
                              f"({limit})")


def _check_labels(samples: list, spec: ReadSpec) -> None:
    limit = spec.max_label_length
    for name, labels, _ in samples:
        if len(labels) > spec.max_labels:
            raise ExpositionError(f"{name[:100]}: {len(labels)} labels, more than "
                                  f"app_latency.max_labels ({spec.max_labels})")
        for key, value in labels.items():
            if len(key) > limit or len(value) > limit:
                raise ExpositionError(f"{name[:100]}: label {key[:100]!r} is longer than "
                                      f"app_latency.max_label_length ({limit} characters)")


def _histogram_names(types: dict[str, str], samples: list) -> set[str]:
    """Typed histograms, and untyped ones recognised by `_bucket` series with `le`."""
    names = {n for n, t in types.items() if t == "histogram"}
    for name, labels, _ in samples:
        if name.endswith("_bucket") and "le" in labels:
            base = name[: -len("_bucket")]
            if types.get(base, types.get(name, "unknown")) in ("unknown", "untyped", "histogram"):
                names.add(base)
    return names


def _pick(names: set[str]) -> str | None:
    """Without `metric`: the histogram that looks most like request latency."""
    def score(name: str) -> tuple[int, str]:
        lowered = name.lower()
        points = sum(word in lowered for word in ("request", "duration", "latency", "seconds"))
        return -points, name

    return min(names, key=score) if names else None


def _scale(metric: str, unit: str) -> float:
    if unit == "ms":
        return 1.0
    if unit == "s":
        return 1000.0
    for suffix, factor in _UNIT_SUFFIXES:
        if metric.endswith(suffix):
            return factor
    return 1000.0  # Prometheus' convention: base units, seconds


def _key(labels: dict[str, str], drop: str) -> LabelKey:
    return tuple(sorted((k, v) for k, v in labels.items() if k != drop))


def _selected(labels: dict[str, str], wanted: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in wanted.items())


def _histograms(metric: str, samples: list, wanted: dict[str, str],
                scale: float) -> dict[LabelKey, _Series]:
    buckets: dict[LabelKey, dict[float, float]] = {}
    counts: dict[LabelKey, float] = {}
    created: dict[LabelKey, float] = {}
    for name, labels, value in samples:
        if not _selected(labels, wanted):
            continue
        if name == f"{metric}_bucket" and "le" in labels:
            try:
                bound = float(labels["le"])
            except ValueError:
                raise ExpositionError(f"{name}: le={labels['le']!r} is not a number") from None
            buckets.setdefault(_key(labels, "le"), {})[bound] = value
        elif name == f"{metric}_count":
            counts[_key(labels, "")] = value
        elif name == f"{metric}_created":
            created[_key(labels, "")] = value
    if not buckets:
        raise ExpositionError(f"{metric}: no bucket series"
                              + (f" with labels {wanted}" if wanted else ""))
    out = {}
    for key, by_bound in buckets.items():
        bounds = tuple(sorted(by_bound))
        cumulative = tuple(by_bound[b] for b in bounds)
        problem = check_buckets(bounds, cumulative)
        if problem:
            raise ExpositionError(f"{metric}{dict(key) or ''}: {problem}")
        count = counts.get(key, cumulative[-1])
        out[key] = _Series(count, created.get(key),
                           buckets=Buckets(tuple(b * scale if b != INF else INF for b in bounds),
                                           cumulative))
    return out


def _summaries(metric: str, samples: list, wanted: dict[str, str],
               scale: float) -> dict[LabelKey, _Series]:
    out: dict[LabelKey, _Series] = {}
    for name, labels, value in samples:
        if not _selected(labels, wanted):
            continue
        if name == metric and "quantile" in labels:
            series = out.setdefault(_key(labels, "quantile"), _Series(0.0, None))
            try:
                series.quantiles[float(labels["quantile"])] = value * scale
            except ValueError:
                raise ExpositionError(f"{metric}: quantile={labels['quantile']!r} is not a "
                                      "number") from None
        elif name == f"{metric}_count":
            out.setdefault(_key(labels, ""), _Series(0.0, None)).count = value
        elif name == f"{metric}_created":
            out.setdefault(_key(labels, ""), _Series(0.0, None)).created = value
    if not out:
        raise ExpositionError(f"{metric}: no summary series"
                              + (f" with labels {wanted}" if wanted else ""))
    return out


def _errors(spec: ReadSpec, types: dict[str, str], samples: list,
            series: dict[LabelKey, _Series], metric: str) -> tuple[dict[LabelKey, _Series], str]:
    """Error counts by status label: from a counter, else from the latency family's own label."""
    label = spec.error_label
    try:
        pattern = re.compile(spec.error_match)
    except re.error as exc:
        raise ExpositionError(f"error regex {spec.error_match!r}: {exc}") from None
    counters = sorted(n for n, t in types.items() if t == "counter")
    name = spec.error_metric
    if name is None:  # the requests counter, not e.g. Go's promhttp_metric_handler_requests
        # one pass over the samples (a scan per counter was quadratic on a page of counters)
        with_label = {s[0] for s in samples if label in s[1]}
        labelled = [c for c in counters if not c.startswith("promhttp_") and (
            c in with_label or f"{c}_total" in with_label)]
        name = min(labelled, key=lambda c: ("request" not in c.lower(), c), default=None)
    if name is not None:
        if name.removesuffix("_total") not in {c.removesuffix("_total") for c in counters} and \
                spec.error_metric:
            raise ExpositionError(f"no counter named {name!r} for errors")
        base = name.removesuffix("_total")
        values: dict[LabelKey, _Series] = {}
        created: dict[LabelKey, float] = {}
        shared = {k: v for k, v in spec.labels}
        for sample_name, labels, value in samples:
            if not _selected(labels, {k: v for k, v in shared.items() if k in labels}):
                continue
            if sample_name in (base, f"{base}_total"):
                is_error = label in labels and pattern.fullmatch(labels[label]) is not None
                values[_key(labels, "")] = _Series(value, None, is_error=is_error)
            elif sample_name == f"{base}_created":
                created[_key(labels, "")] = value
        for key, created_at in created.items():
            if key in values:
                values[key].created = created_at
        return values, f"counter {base}, label {label} ~ {spec.error_match}"
    if any(label in dict(key) for key in series):
        return ({key: _Series(s.count, s.created,
                              is_error=pattern.fullmatch(dict(key).get(label, "")) is not None)
                 for key, s in series.items()},
                f"{metric}, label {label} ~ {spec.error_match}")
    return {}, ""


def _restarted(previous: _Series, current: _Series) -> bool:
    """A count that went down, or a new `_created` timestamp: the process started over."""
    return current.count < previous.count or (
        current.created is not None and previous.created is not None
        and current.created != previous.created)


def _increase(previous: _Series | None, current: _Series) -> float:
    """A counter's increase between two readings, across a restart."""
    if previous is None:
        return current.count  # a series born since the last scrape: all of it is new
    return current.count if _restarted(previous, current) else current.count - previous.count


def interval(previous: Reading | None, current: Reading,
             seconds: float | None) -> tuple[LatencyBatch | None, int]:
    """The observations between two readings of one target, and how many series were reset.

    None on the first reading, or when the target now exposes another family (nothing to
    subtract from).
    """
    if previous is None or (previous.metric, previous.kind) != (current.metric, current.kind):
        return None, 0
    resets = 0
    requests = 0.0
    histograms: list[Buckets] = []
    quantiles: dict[float, float] = {}
    for key, now in current.series.items():
        before = previous.series.get(key)
        if current.kind == "histogram" and now.buckets is not None:
            restarted = before is not None and _restarted(before, now)
            base = None if before is None or restarted else before.buckets
            diff, relaid = delta(base, now.buckets)  # buckets that went down or changed layout
            restarted = restarted or relaid
            resets += restarted
            histograms.append(diff)
            requests += now.count if before is None or restarted else now.count - before.count
        else:
            resets += before is not None and _restarted(before, now)
            requests += _increase(before, now)
            for q, value in now.quantiles.items():
                if not math.isnan(value):
                    quantiles[q] = max(quantiles.get(q, -math.inf), value)
    errors = None
    if current.error_source:
        errors = sum(_increase(previous.errors.get(key), now)
                     for key, now in current.errors.items() if now.is_error)
    merged = merge(histograms) if histograms else None
    batch = LatencyBatch(buckets=merged, quantiles=quantiles if merged is None else {},
                         requests=requests, errors=errors, seconds=seconds)
    return batch, int(resets)
