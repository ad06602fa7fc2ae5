"""The receive endpoints: services push their latency to the agent on their node.

    POST /api/v1/observations   JSON batches: raw latencies, a histogram or percentiles
    POST /api/v1/write          InfluxDB line protocol (?precision=ns|us|ms|s)

Some services cannot be scraped (batch front-ends, short-lived workers, clients measuring what
they get); pushing is their way in. Pushed data joins the scraped data's pipeline (samples ->
buffer -> store -> rules, and the SLO windows). Both endpoints want `Authorization: Bearer
<token>` (compared in constant time, never logged), refuse bodies over `max_body`, and answer a
mistake with a 4xx that names the field or the line, accepting nothing from a bad batch.

What pushers send is outside input and must not blind or steer the guard. Timestamps must lie
within `max_past` before and `max_future` after the agent's clock: one point stamped a day ahead
used to end every rule window (they were pruned against the newest sample) and resolve firing
incidents as "no data", and one past 2**63 broke every later store write. Pushed tags cannot set
the agent's own tags (RESERVED_TAGS: `class`, `resource`, `cgroup`... steer the levers and the
eviction ranking; `node` is always the agent's), and series, tags per point, label length,
fields per point and field names per measurement are bounded, each with a 4xx naming the line.
"""

from __future__ import annotations

import hmac
import json
import logging
import math
import os
import threading
import time
import zlib
from collections.abc import Callable
from typing import Any, Literal

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import Response
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)
from starlette.concurrency import run_in_threadpool

from sloguard.collectors.app_latency import AppLatencyCollector, Overloaded
from sloguard.collectors.histograms import from_counts
from sloguard.collectors.latency import LatencyBatch
from sloguard.core.percentiles import is_percentile, parse_percentile
from sloguard.core.samples import Sample
from sloguard.ui.line_protocol import LineProtocolError, parse_lines

log = logging.getLogger(__name__)

MAX_VALUES = 100_000  # latencies in one observation
MAX_PERCENTILES = 32  # precomputed percentiles in one observation
MAX_FIELD_NAMES = 256  # distinct field names pushed per measurement (each is a store column)
# Bodies up to this are parsed on the event loop (at most about 3.5 ms: 1,365 one-field lines),
# larger ones in a worker thread, so that they cannot hold up /healthz or another push long
# (64 KiB of such lines take 27 ms). The hop costs 0.14 ms of CPU against 6 us for validating
# a 50-value observation inline (issue #23: the receive cost per push in
# benchmarks/agent_overhead.py --push-every).
INLINE_BODY = 8 * 1024
SERIES_TTL_NS = 3600 * 10**9  # a series not pushed for an hour no longer counts to max_series
# Tags the agent's collectors set and rules, levers and the eviction ranking read: a pusher
# setting them could make its series look like a cgroup's, an LS pod's or a resource's.
RESERVED_TAGS = frozenset({"class", "resource", "level", "cgroup", "qos", "pod_uid",
                           "container", "container_id", "workload", "kind", "percentile"})
# Pushers present the receive token, not the UI's: the UI's login check lets these through.
RECEIVE_PATHS = frozenset({"/api/v1/observations", "/api/v1/write"})


class HistogramIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    bounds_ms: list[float] = Field(min_length=1, description="ascending upper bounds, in ms")
    counts: list[float] = Field(
        description="observations per bucket (not cumulative); one more than bounds_ms, the "
                    "last counting those above every bound")

    @model_validator(mode="after")
    def _shape(self) -> HistogramIn:
        if len(self.counts) != len(self.bounds_ms) + 1:
            raise ValueError(f"counts needs {len(self.bounds_ms) + 1} entries (one per bound "
                             f"and one above them), got {len(self.counts)}")
        if any(not math.isfinite(b) or b < 0 for b in self.bounds_ms) or any(
                b >= a for a, b in zip(self.bounds_ms[1:], self.bounds_ms, strict=False)):
            raise ValueError("bounds_ms must be finite, >= 0 and ascending")
        if any(not math.isfinite(c) or c < 0 for c in self.counts):
            raise ValueError("counts must be finite and >= 0")
        return self


class ObservationIn(BaseModel):
    """What one service saw: exactly one of latency_ms, histogram, percentiles."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    service: str = Field(min_length=1, max_length=253)
    namespace: str | None = Field(None, max_length=253)
    pod: str | None = Field(None, max_length=253)
    target: str | None = Field(None, max_length=500, description="default: push")
    class_: Literal["LS", "BE"] = Field("LS", alias="class")
    time_ns: int | None = Field(None, ge=0, description="default: when it arrives")
    latency_ms: list[float] | None = Field(None, min_length=1, max_length=MAX_VALUES)
    histogram: HistogramIn | None = None
    percentiles: dict[str, float] | None = Field(
        None, max_length=MAX_PERCENTILES, description="precomputed, e.g. {\"p99\": 12.5} (ms)")
    requests: float | None = Field(
        None, ge=0, description="default: the number of observations")
    errors: float | None = Field(None, ge=0)
    interval_s: float | None = Field(None, gt=0, description="the span observed: gives `rate`")

    @field_validator("service", "namespace", "pod", "target")
    @classmethod
    def _unicode(cls, value: str | None) -> str | None:
        """JSON may escape a lone surrogate (\\ud800): no store or line protocol can hold it."""
        if value is not None:
            try:
                value.encode()
            except UnicodeEncodeError:
                raise ValueError("not valid Unicode (a lone surrogate)") from None
        return value

    @model_validator(mode="after")
    def _one_kind(self) -> ObservationIn:
        given = [n for n in ("latency_ms", "histogram", "percentiles") if getattr(self, n)]
        if len(given) != 1:
            raise ValueError("give exactly one of latency_ms, histogram, percentiles"
                             + (f" (got {', '.join(given)})" if given else ""))
        if self.latency_ms and any(not math.isfinite(v) or v < 0 for v in self.latency_ms):
            bad = next(i for i, v in enumerate(self.latency_ms)
                       if not math.isfinite(v) or v < 0)
            raise ValueError(f"latency_ms.{bad}: must be a finite number >= 0")
        for name, value in (self.percentiles or {}).items():
            try:
                parse_percentile(name)
            except ValueError as exc:
                raise ValueError(f"percentiles.{name}: {exc}") from None
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"percentiles.{name}: must be a finite number >= 0")
        if self.errors is not None and self.requests is not None and \
                self.errors > self.requests:
            raise ValueError("errors cannot exceed requests")
        return self

    def batch(self) -> LatencyBatch:
        if self.latency_ms:
            batch = LatencyBatch(values=list(self.latency_ms), requests=len(self.latency_ms))
        elif self.histogram:
            buckets = from_counts(self.histogram.bounds_ms, self.histogram.counts)
            batch = LatencyBatch(buckets=buckets, requests=buckets.total)
        else:
            batch = LatencyBatch(quantiles={parse_percentile(k): v
                                            for k, v in (self.percentiles or {}).items()})
        if self.requests is not None:
            batch.requests = self.requests
        batch.errors = self.errors
        batch.seconds = self.interval_s
        return batch


class ObservationBatchIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    observations: list[ObservationIn] = Field(min_length=1, max_length=10_000)


class _Token:
    """The bearer token, from the config (or its environment variable) or a file that a mounted
    Secret may rotate: re-read when the file changes."""

    def __init__(self, cfg: Any) -> None:
        self.value = cfg.token.get_secret_value() if cfg.token is not None else None
        self.file = cfg.token_file
        self._mtime: float | None = None
        self._cached = ""

    def current(self) -> str:
        if self.value is not None:
            return self.value
        try:
            mtime = os.stat(self.file).st_mtime
            if mtime != self._mtime:
                with open(self.file, encoding="utf-8") as handle:
                    self._cached = handle.read().strip()
                self._mtime = mtime
        except OSError as exc:
            raise HTTPException(503, f"the receive token cannot be read from "
                                     f"receive.token_file: {exc.strerror}") from None
        if not self._cached:
            raise HTTPException(503, "receive.token_file is empty")
        return self._cached


class SeriesBudget:
    """The distinct series pushed in the last hour, at most `limit` of them.

    Each new series is a row of the store's series table, an entry in every matching rule
    window and, in InfluxDB, a series of its own: a pusher inventing tag values must hit a
    bound, not exhaust the agent's memory or the store.
    """

    def __init__(self, limit: int, ttl_ns: int = SERIES_TTL_NS) -> None:
        self.limit = limit
        self.ttl_ns = ttl_ns
        self._seen: dict[tuple, int] = {}
        self._lock = threading.Lock()
        self._expired_ns = 0

    def __len__(self) -> int:
        return len(self._seen)

    def admit(self, keys: list[tuple], now_ns: int) -> int | None:
        """Record every key, or none: the index of the first key beyond the bound."""
        with self._lock:
            new = [i for i, key in enumerate(keys) if key not in self._seen]
            fresh = len({keys[i] for i in new})
            if len(self._seen) + fresh > self.limit and now_ns - self._expired_ns > 10**10:
                self._expired_ns = now_ns  # at most every 10 s: a scan costs O(limit)
                cutoff = now_ns - self.ttl_ns
                self._seen = {k: t for k, t in self._seen.items() if t >= cutoff}
            if len(self._seen) + fresh > self.limit:
                room, counted = self.limit - len(self._seen), set()
                for i in new:
                    counted.add(keys[i])
                    if len(counted) > room:
                        return i
            for key in keys:
                self._seen[key] = now_ns
            return None


def check_time(where: str, time_ns: int | None, now_ns: int, cfg: Any) -> int:
    """The sample's time: `now_ns` when none is given; ValueError outside the accepted window."""
    if time_ns is None:
        return now_ns
    ahead = (time_ns - now_ns) / 1e9
    if ahead > cfg.max_future:
        raise ValueError(f"{where}: timestamp {time_ns} is {ahead:.0f} s ahead of the agent's "
                         f"clock (receive.max_future: {cfg.max_future:g}s)")
    if -ahead > cfg.max_past:
        raise ValueError(f"{where}: timestamp {time_ns} is {-ahead:.0f} s behind the agent's "
                         f"clock (receive.max_past: {cfg.max_past:g}s)")
    return time_ns


def receive_router(collector: AppLatencyCollector, cfg: Any, node: str) -> APIRouter:
    router = APIRouter(prefix="/api/v1", tags=["receive"])
    token = _Token(cfg)
    allowed = set(cfg.measurements)
    series = SeriesBudget(cfg.max_series)
    field_names: dict[str, set[str]] = {}
    field_lock = threading.Lock()

    def refuse(endpoint: str, reason: str, status: int, message: str) -> HTTPException:
        collector.reject(endpoint, reason)
        return HTTPException(status, message)

    def check_point(where: str, point: Any) -> None:
        """Tags and fields of one line within the bounds (400 naming the line and tag)."""
        limit = cfg.max_label_length
        if len(point.tags) > cfg.max_tags:
            raise refuse("write", "cardinality", 400, f"{where}: {len(point.tags)} tags, more "
                         f"than receive.max_tags ({cfg.max_tags})")
        for key, value in point.tags.items():
            if key in RESERVED_TAGS:
                raise refuse("write", "reserved_tag", 400, f"{where}: tag {key!r} is the "
                             f"agent's own and cannot be pushed (reserved: "
                             f"{', '.join(sorted(RESERVED_TAGS))})")
            if len(key) > limit or len(value) > limit:
                raise refuse("write", "cardinality", 400, f"{where}: tag {key[:40]!r} is longer "
                             f"than receive.max_label_length ({limit} characters)")
        if len(point.fields) > cfg.max_fields:
            raise refuse("write", "cardinality", 400, f"{where}: {len(point.fields)} fields, "
                         f"more than receive.max_fields ({cfg.max_fields})")
        for key in point.fields:
            if len(key) > limit:
                raise refuse("write", "cardinality", 400, f"{where}: field {key[:40]!r} is "
                             f"longer than receive.max_label_length ({limit} characters)")

    def admit_fields(endpoint: str, samples: list[Sample], where: list[str],
                     status: int) -> None:
        """Each new field name is a column of the store: a bounded number per measurement."""
        with field_lock:
            added: dict[str, set[str]] = {}
            for sample, place in zip(samples, where, strict=True):
                known = field_names.get(sample.measurement, set())
                extra = added.setdefault(sample.measurement, set())
                for key in sample.fields:
                    if key in known or key in extra:
                        continue
                    if len(known) + len(extra) >= MAX_FIELD_NAMES:
                        raise refuse(endpoint, "cardinality", status, f"{place}: field "
                                     f"{key[:40]!r} would be field name number "
                                     f"{MAX_FIELD_NAMES + 1} of {sample.measurement!r} pushed "
                                     f"here (at most {MAX_FIELD_NAMES})")
                    extra.add(key)
            for measurement, names in added.items():
                field_names.setdefault(measurement, set()).update(names)

    def admit_series(endpoint: str, keys: list[tuple], where: list[str], now_ns: int,
                     status: int) -> None:
        beyond = series.admit(keys, now_ns)
        if beyond is not None:
            raise refuse(endpoint, "cardinality", status, f"{where[beyond]}: a new series beyond "
                         f"receive.max_series ({cfg.max_series} series pushed in the last hour)")

    async def authorized_body(request: Request, endpoint: str) -> bytes:
        header = request.headers.get("authorization", "")
        scheme, _, given = header.partition(" ")
        if scheme.lower() != "bearer" or not given:
            collector.reject(endpoint, "unauthenticated")
            raise HTTPException(401, "missing `Authorization: Bearer <token>`",
                                headers={"WWW-Authenticate": "Bearer"})
        if not hmac.compare_digest(given.strip().encode(), token.current().encode()):
            collector.reject(endpoint, "bad_token")
            raise HTTPException(401, "invalid token", headers={"WWW-Authenticate": "Bearer"})
        limit = cfg.max_body
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            collector.reject(endpoint, "too_large")
            raise HTTPException(413, f"body of {declared} bytes exceeds receive.max_body "
                                     f"({limit} bytes)")
        gzipped = request.headers.get("content-encoding", "").lower() == "gzip"
        inflate = zlib.decompressobj(wbits=31) if gzipped else None
        chunks, size = [], 0
        try:
            async for chunk in request.stream():
                if inflate is not None:
                    chunk = inflate.decompress(chunk, limit + 1 - size)
                size += len(chunk)
                if size > limit:
                    collector.reject(endpoint, "too_large")
                    raise HTTPException(413, f"body exceeds receive.max_body ({limit} bytes)")
                chunks.append(chunk)
        except zlib.error as exc:
            collector.reject(endpoint, "bad_gzip")
            raise HTTPException(400, f"body is not valid gzip: {exc}") from None
        return b"".join(chunks)

    def accept(endpoint: str, samples: list[Sample], batches: list, observations: int,
               points: int) -> None:
        try:
            collector.receive(samples, batches, observations=observations, points=points)
        except Overloaded as exc:
            collector.reject(endpoint, "overloaded")
            raise HTTPException(503, f"the agent is behind ({exc}); retry later",
                                headers={"Retry-After": "5"}) from None

    @router.post("/observations", status_code=200, summary="Push latency observations (JSON)")
    async def observations(request: Request) -> dict[str, int]:
        """Body: {"observations": [{"service": "web", "latency_ms": [12.1, 14.9], "errors": 0},
        {"service": "api", "histogram": {"bounds_ms": [10, 50], "counts": [90, 9, 1]}}]}."""
        raw = await authorized_body(request, "observations")
        try:
            document = json.loads(raw)
        except (ValueError, UnicodeDecodeError, RecursionError) as exc:  # [[[[... nests deep
            collector.reject("observations", "bad_json")
            raise HTTPException(400, f"body is not JSON: {exc}") from None
        try:
            batch = await _off_loop(len(raw), ObservationBatchIn.model_validate, document)
        except ValidationError as exc:
            collector.reject("observations", "invalid")
            raise HTTPException(422, _problems(exc)) from None
        now = time.time_ns()
        samples, batches = [], []
        for index, item in enumerate(batch.observations):
            try:
                when = check_time(f"observations.{index}.time_ns", item.time_ns, now, cfg)
            except ValueError as exc:
                raise refuse("observations", "timestamp", 422, str(exc)) from None
            latency = item.batch()
            tags = {"node": node, "service": item.service, "target": item.target or "push",
                    "class": item.class_}
            if item.namespace:
                tags["namespace"] = item.namespace
            if item.pod:
                tags["pod"] = item.pod
            fields = latency.fields()
            slo = collector.slo.find(item.service, item.namespace or "")
            if slo is not None:
                fields["slo_latency_ms"] = float(slo.latency_ms)
            samples.append(Sample("app_latency", tags, fields, when))
            batches.append((item.service, item.namespace or "", latency, when))
        places = [f"observations.{i}" for i in range(len(samples))]
        admit_fields("observations", samples, places, 422)
        admit_series("observations", [_series_key(s) for s in samples], places, now, 422)
        accept("observations", samples, batches, observations=len(samples), points=0)
        return {"accepted": len(samples)}

    @router.post("/write", status_code=204, summary="Push InfluxDB line protocol")
    async def write(request: Request, precision: str = "ns") -> Response:
        raw = await authorized_body(request, "write")
        try:
            text = raw.decode("utf-8")
            points = await _off_loop(len(raw), parse_lines, text, precision)
        except UnicodeDecodeError as exc:
            collector.reject("write", "invalid")
            raise HTTPException(400, f"body is not UTF-8: {exc}") from None
        except LineProtocolError as exc:
            collector.reject("write", "invalid")
            raise HTTPException(400, str(exc)) from None
        now = time.time_ns()
        samples, batches = [], []
        for point in points:
            where = f"line {point.line}"
            if point.measurement not in allowed:
                collector.reject("write", "measurement")
                raise HTTPException(400, f"{where}: measurement {point.measurement!r} is not "
                                         f"accepted here (receive.measurements: "
                                         f"{', '.join(sorted(allowed))})")
            check_point(where, point)
            try:
                when = check_time(where, point.time_ns, now, cfg)
            except ValueError as exc:
                raise refuse("write", "timestamp", 400, str(exc)) from None
            tags = {**point.tags, "node": node}
            fields: dict[str, Any] = dict(point.fields)
            if point.measurement == "app_latency":
                fields = _app_latency_fields(where, point.tags, point.fields)
                tags.setdefault("target", "push")
                batch = LatencyBatch(
                    quantiles={parse_percentile(k): v for k, v in fields.items()
                               if is_percentile(k)},
                    requests=fields.get("requests", 0.0), errors=fields.get("errors"))
                batches.append((tags["service"], tags.get("namespace", ""), batch, when))
            samples.append(Sample(point.measurement, tags, fields, when))
        places = [f"line {p.line}" for p in points]
        admit_fields("write", samples, places, 400)
        admit_series("write", [_series_key(s) for s in samples], places, now, 400)
        accept("write", samples, batches, observations=0, points=len(samples))
        return Response(status_code=204)

    return router


async def _off_loop(size: int, call: Callable[..., Any], *args: Any) -> Any:
    """`call(*args)` for a body of `size` bytes: inline when small (INLINE_BODY)."""
    if size <= INLINE_BODY:
        return call(*args)
    return await run_in_threadpool(call, *args)


def _series_key(sample: Sample) -> tuple:
    return (sample.measurement, *sorted(sample.tags.items()))


def _app_latency_fields(where: str, tags: dict[str, str],
                        fields: dict[str, Any]) -> dict[str, float]:
    """app_latency points feed rules and SLOs: a service tag and numeric fields, as floats (one
    type per field, as InfluxDB requires)."""
    if not tags.get("service"):
        raise HTTPException(400, f"{where}: app_latency needs a `service` tag")
    out = {}
    for name, value in fields.items():
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise HTTPException(400, f"{where}: field {name!r} must be a number")
        out[name] = float(value)
    return out


def _problems(exc: ValidationError) -> str:
    """Every problem as `path: message`, e.g. `observations.2.latency_ms: ...`."""
    lines = []
    for error in exc.errors():
        path = ".".join(str(part) for part in error["loc"])
        message = error["msg"].removeprefix("Value error, ")
        lines.append(f"{path}: {message}" if path else message)
    return "; ".join(lines)[:2000]
