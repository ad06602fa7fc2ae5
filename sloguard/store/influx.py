"""InfluxDB as the sample store: collectors write to it, detectors and backtests read from it.

The agent's loop must never wait for the network, and nothing may be lost while InfluxDB is
away. So `write()` only encodes samples to line protocol and appends them to the batch being
filled; a sender thread cuts batches by size (`batch_size` points) or age (`flush_interval`),
posts them, and on any failure that retrying can fix (unreachable, timeout, 5xx, 429, and the
401/403/404 an operator fixes by correcting a token or creating a database) moves the batch
and everything queued behind it to the on-disk spool. While the spool holds anything, new
batches join its tail and the sender replays from its head, so points reach the server in the
order they were collected, with exponential backoff and jitter, never sooner than a
Retry-After. Replaying a batch the server already had (the answer was lost) is harmless:
InfluxDB keeps one value per series, field and timestamp.

Points that line protocol cannot carry, series beyond `max_series`, and batches the server
refuses for good (400: field type conflict, outside the retention) are counted and logged, and
never block the batches behind them.
"""

from __future__ import annotations

import collections
import ipaddress
import logging
import random
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import urllib3

from sloguard.core.health import ComponentStatus
from sloguard.core.samples import Sample
from sloguard.store import StoreError, WindowQuery, check_aggregation
from sloguard.store.influx_lineprotocol import LineEncoder
from sloguard.store.influx_query import QueryClient, select_statement, to_frame, to_samples
from sloguard.store.influx_spool import Spool, SpoolError
from sloguard.store.influx_write import (
    PATH_NAMES,
    V1,
    V2,
    Batch,
    Credentials,
    SendResult,
    Transport,
    make_transport,
    path_for_version,
    redact_url,
    server_version,
)

if TYPE_CHECKING:
    import pandas as pd

    from sloguard.core.selfmetrics import InfluxMetrics
    from sloguard.store.config import StoreConfig

log = logging.getLogger(__name__)

SERIES_TTL_NS = 3600 * 10**9  # a series not written for an hour no longer counts to max_series
# While the server answers but slower than samples come, batches wait in memory up to this
# many bytes before the oldest go to the spool (an agent writes ~200 KB a second).
MEMORY_BYTES = 16 * 1024**2
CLOSE_GRACE_S = 5.0
WRITE_CHUNK = 1000  # samples encoded between two chances for the writer thread to run
_NUMERIC = ("float", "integer", "boolean")


def wants_gzip(cfg: StoreConfig) -> bool:
    """`gzip: auto` compresses unless the server is on this host: over loopback compression
    only costs CPU on both ends (benchmarks/influx_write.py: 0.70x the throughput)."""
    if isinstance(cfg.gzip, bool):
        return cfg.gzip
    host = urlsplit(str(cfg.url)).hostname or ""
    if host == "localhost":
        return False
    try:
        return not ipaddress.ip_address(host).is_loopback
    except ValueError:
        return True


def credentials(cfg: StoreConfig) -> Credentials:
    return Credentials(
        url=str(cfg.url), token=cfg.token.get_secret_value() if cfg.token else None,
        org=cfg.org, bucket=cfg.bucket, database=cfg.database,
        retention_policy=cfg.retention_policy, username=cfg.username,
        password=cfg.password.get_secret_value() if cfg.password else None)


class InfluxStore:
    name = "influxdb"

    def __init__(self, cfg: StoreConfig, data_dir: Path, metrics: InfluxMetrics | None = None,
                 writer: bool = True) -> None:
        self.cfg = cfg
        self.creds = credentials(cfg)
        self.url = redact_url(self.creds.url)
        self.metrics = metrics
        self._query = QueryClient(self.creds, cfg.timeout, cfg.verify_tls)
        self._encoder = LineEncoder()
        self._series: dict[str, int] = {}  # series prefix -> last time_ns written
        self._cond = threading.Condition()
        self._pending: list[str] = []
        self._pending_since = 0.0
        self._ready: collections.deque[Batch] = collections.deque()
        self._ready_bytes = 0
        self._in_flight = 0
        self._closing = False
        self._transport: Transport | None = None
        self.server_version = ""
        self.path = {"v1": V1, "v2": V2}.get(cfg.api, "")
        self._last_error = ""
        self._failing_since = 0.0
        self._failures = 0
        self._next_attempt = 0.0
        self._last_rejection = ""
        self._rejection_logged: dict[str, float] = {}
        self.points_sent = 0
        self.points_rejected = 0
        self.spool: Spool | None = None
        self._thread: threading.Thread | None = None
        if not writer:
            return
        try:
            self.spool = Spool(Path(data_dir) / "influx-spool", cfg.spool_max_size,
                               cfg.spool_full)
        except SpoolError as exc:
            raise StoreError(str(exc)) from exc
        if len(self.spool):
            log.info("InfluxDB spool holds %d batches (%d points) from before: replaying them",
                     len(self.spool), self.spool.points)
        if metrics is not None:
            metrics.spool_callback(self._spool_gauges)
        self._thread = threading.Thread(target=self._run, name="influx-writer", daemon=True)
        self._thread.start()

    # -- writing (the agent's loop) ------------------------------------------------------

    def write(self, samples: list[Sample]) -> None:
        """Encode and queue; never waits for the network. Raises StoreError only when the
        spool cannot take what the server did not (the agent then keeps the samples)."""
        if not samples:
            return
        if self.spool is None:
            raise StoreError("this InfluxDB store was opened read-only")
        if self._spill_error and self._ready_bytes > MEMORY_BYTES:
            # The server is away and the disk refuses the spool: the agent keeps the samples
            # in its own bounded buffer instead of this queue growing without bound.
            raise StoreError(f"InfluxDB at {self.url} not taking writes and the spool cannot "
                             f"be written: {self._spill_error}")
        for start in range(0, len(samples), WRITE_CHUNK):
            if start:
                time.sleep(0)  # hand the GIL to the writer thread, which may have a reply
            self._queue_lines(self._encode(samples[start:start + WRITE_CHUNK]))

    def _encode(self, samples: list[Sample]) -> list[str]:
        lines, rejected = self._encoder.encode(samples, self._series, self.cfg.max_series)
        for _, exc in rejected:
            self._reject(exc.reason, str(exc), 1)
        return lines

    def write_lines(self, lines: list[str]) -> None:
        """Queue line protocol that is already encoded (one point a line, no newline in it),
        for callers that build their own; it goes through the same batches, retries and spool.
        """
        if self.spool is None:
            raise StoreError("this InfluxDB store was opened read-only")
        self._queue_lines(lines)

    def _queue_lines(self, lines: list[str]) -> None:
        if not lines:
            return
        with self._cond:
            if not self._pending:
                self._pending_since = time.monotonic()
            self._pending.extend(lines)
            if len(self._pending) >= self.cfg.batch_size:
                self._cut()
                self._cond.notify_all()

    _spill_error = ""

    def _cut(self) -> None:
        """Turn pending lines into batches of at most batch_size (caller holds the lock)."""
        size = self.cfg.batch_size
        while self._pending:
            chunk, self._pending = self._pending[:size], self._pending[size:]
            batch = Batch(len(chunk), raw=("\n".join(chunk) + "\n").encode())
            self._ready.append(batch)
            self._ready_bytes += len(batch.raw())
        # Not while a memory batch is in flight: if it fails it must go to the spool ahead of
        # these, which are younger.
        if self._ready_bytes > MEMORY_BYTES and not self._in_flight:
            self._spill()

    def _spill(self) -> None:
        """Memory batches to the spool's tail, oldest first (caller holds the lock)."""
        assert self.spool is not None
        while self._ready:
            batch = self._ready[0]
            try:
                self._count_dropped(self.spool.append(batch.gz(), batch.points))
            except SpoolError as exc:
                self._spill_error = str(exc)
                log.error("%s", exc)
                return
            self._pop_ready()
        self._spill_error = ""

    def _pop_ready(self) -> Batch:
        batch = self._ready.popleft()
        self._ready_bytes -= len(batch.raw())
        return batch

    @property
    def backlog(self) -> int:
        """Points written but not yet acknowledged by the server nor spooled."""
        with self._cond:
            return len(self._pending) + sum(b.points for b in self._ready) + self._in_flight

    def _count_dropped(self, dropped: list) -> None:
        if dropped and self.metrics is not None:
            self.metrics.spool_dropped_batches.inc(len(dropped))
            self.metrics.spool_dropped_points.inc(sum(b.points for b in dropped))

    def _reject(self, reason: str, message: str, points: int) -> None:
        self.points_rejected += points
        self._last_rejection = message[:500]
        if self.metrics is not None:
            self.metrics.points_rejected.labels(reason).inc(points)
        now = time.monotonic()
        if now - self._rejection_logged.get(reason, -1e9) >= 60:  # one line a minute a reason
            self._rejection_logged[reason] = now
            log.error("InfluxDB: %d point(s) not written (%s): %s", points, reason, message)

    # -- sending (the writer thread) -----------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait(timeout=self._idle_wait())
                due = self._pending and (
                    self._closing
                    or time.monotonic() - self._pending_since >= self.cfg.flush_interval)
                if due:
                    self._cut()
                if self._last_error and self._ready and not self._in_flight:
                    self._spill()  # while the server is away, batches wait on disk, not in RAM
                closing = self._closing
            if closing and self._last_error:
                return  # the server is failing: no retries on the way out, all to the spool
            try:
                self._deliver(deadline=self._close_deadline if closing else None)
            except Exception:  # the writer must outlive any one failure
                log.exception("InfluxDB writer failed; retrying")
                self._backoff(SendResult(False, retryable=True, message="internal error"))
            if closing:
                return

    def _idle_wait(self) -> float:
        now = time.monotonic()
        waits = [self.cfg.flush_interval]
        if self._pending:
            waits.append(self._pending_since + self.cfg.flush_interval - now)
        if self._ready or (self.spool is not None and len(self.spool)):
            waits.append(self._next_attempt - now)
        return max(0.0, min(waits))

    def _deliver(self, deadline: float | None = None) -> None:
        """Send what can be sent: the spool's head first, then memory batches, in order."""
        assert self.spool is not None
        while True:
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                return
            if now < self._next_attempt:
                if deadline is None:
                    return
                time.sleep(min(self._next_attempt, deadline) - now)
                continue
            head = self.spool.head()
            if head is not None:
                batch = Batch(head.points, gz=head.read(), spooled=head)
            else:
                with self._cond:
                    if self.spool.head() is not None:
                        continue  # spilled meanwhile: older than what is left in memory
                    if not self._ready:
                        return
                    batch = self._pop_ready()
                    self._in_flight = batch.points
            result = self._send(batch)
            with self._cond:
                self._in_flight = 0
                if result.ok or not result.retryable:
                    if batch.spooled is not None:
                        self.spool.remove(batch.spooled)
                    self._cond.notify_all()
                    continue
                if batch.spooled is None:  # back in front of the queue, then all to the spool
                    self._ready.appendleft(batch)
                    self._ready_bytes += len(batch.raw())
                self._spill()
                self._cond.notify_all()

    def _send(self, batch: Batch) -> SendResult:
        transport = self._transport_or_none()
        if transport is None:
            result = SendResult(False, retryable=True,
                                message=f"cannot reach {self.url} to learn its version")
        else:
            started = time.perf_counter()
            result = transport.send(batch)
            if self.metrics is not None:
                self.metrics.write_seconds.observe(time.perf_counter() - started)
            if result.too_large and batch.points > 1:
                result = self._send_halves(transport, batch)
        if result.ok:
            self._sent(batch.points)
        elif result.retryable:
            self._backoff(result)
        else:
            refused = result.dropped_points if result.dropped_points is not None \
                else batch.points
            self._reject(f"http_{result.status}", f"{self.url} refused a batch of "
                                                  f"{batch.points} points: {result.message}",
                         refused)
            self._sent(batch.points - refused)
        return result

    def _send_halves(self, transport: Transport, batch: Batch) -> SendResult:
        """413: the server's body limit is below batch_size; split until the halves fit.

        A half that fails to send fails the whole batch, which is retried whole: the halves
        that did arrive are written again, which InfluxDB does not duplicate.
        """
        lines = batch.raw().splitlines(keepends=True)
        middle = len(lines) // 2
        for part in (lines[:middle], lines[middle:]):
            half = Batch(len(part), raw=b"".join(part))
            result = transport.send(half)
            if result.too_large and half.points > 1:
                result = self._send_halves(transport, half)
            if not result.ok:
                return result
        return SendResult(True, status=204)

    def _transport_or_none(self) -> Transport | None:
        if self._transport is not None:
            return self._transport
        path = self.path
        if not path:  # api: auto
            try:
                self.server_version = server_version(self.creds, self.cfg.timeout,
                                                     self.cfg.verify_tls)
            except (urllib3.exceptions.HTTPError, OSError) as exc:
                log.debug("InfluxDB /ping failed: %s", exc)
                return None
            path = path_for_version(self.server_version)
            log.info("InfluxDB at %s reports version %r: writing through %s", self.url,
                     self.server_version or "(none)", PATH_NAMES[path])
        self.path = path
        self._transport = make_transport(path, self.creds, self.cfg.timeout,
                                         wants_gzip(self.cfg), self.cfg.verify_tls)
        return self._transport

    def _sent(self, points: int) -> None:
        self.points_sent += points
        if self.metrics is not None:
            self.metrics.points_sent.labels(self.path).inc(points)
            self.metrics.batches_sent.labels(self.path).inc()
        if self._last_error:
            log.info("InfluxDB at %s answers again after %.0f s; replaying the spool",
                     self.url, time.monotonic() - self._failing_since)
        self._last_error = ""
        self._failures = 0
        self._next_attempt = 0.0

    def _backoff(self, result: SendResult) -> None:
        """Exponential backoff with full jitter, never sooner than the server's Retry-After."""
        if not self._last_error:
            self._failing_since = time.monotonic()
            log.warning("InfluxDB write to %s failed, spooling and retrying: %s", self.url,
                        result.message)
        self._last_error = result.message or "write failed"
        self._failures += 1
        if self.metrics is not None:
            self.metrics.write_failures.inc()
        ceiling = min(self.cfg.max_backoff, 0.5 * 2 ** min(self._failures, 16))
        wait = random.uniform(ceiling / 2, ceiling)
        if result.retry_after is not None:
            wait = max(wait, min(result.retry_after, 3600.0))
        self._next_attempt = time.monotonic() + wait

    # -- waiting and closing -------------------------------------------------------------

    def flush(self, timeout: float = 30.0) -> bool:
        """Send everything now; True once nothing is pending, queued or spooled."""
        end = time.monotonic() + timeout
        with self._cond:
            self._cut()
            self._next_attempt = 0.0
            self._cond.notify_all()
            while time.monotonic() < end:
                if not (self._pending or self._ready or self._in_flight
                        or (self.spool is not None and len(self.spool))):
                    return True
                self._cond.wait(timeout=min(0.05, max(0.0, end - time.monotonic())))
                self._cond.notify_all()
        return False

    _close_deadline = 0.0

    def close(self) -> None:
        """Send what can be sent within a few seconds; spool the rest for the next start."""
        if self._thread is not None:
            with self._cond:
                self._close_deadline = time.monotonic() + min(CLOSE_GRACE_S, self.cfg.timeout)
                self._closing = True
                self._cond.notify_all()
            self._thread.join(timeout=CLOSE_GRACE_S + self.cfg.timeout + 5)
            with self._cond:
                self._cut()
                self._spill()
                left = len(self.spool) if self.spool is not None else 0
            if left:
                log.warning("InfluxDB store closed with %d batches (%d points) spooled in %s; "
                            "they are sent at the next start", left, self.spool.points,
                            self.spool.directory)
        if self._transport is not None:
            self._transport.close()
        self._query.close()

    # -- reading -------------------------------------------------------------------------

    def _fields(self, query: WindowQuery, numeric: bool) -> list[str]:
        if query.fields:
            return list(query.fields)
        return [name for name, kind in self._query.field_keys(query.measurement)
                if not numeric or kind in _NUMERIC]

    def read(self, query: WindowQuery) -> pd.DataFrame:
        check_aggregation(query.agg)
        fields = self._fields(query, numeric=bool(query.every_ns))
        if not fields:
            return to_frame([], [], drop_empty=True)
        series = self._query.run(select_statement(query, fields))
        return to_frame(series, fields, drop_empty=not query.fields)

    def read_samples(self, query: WindowQuery) -> list[Sample]:
        if query.every_ns:
            raise ValueError("read_samples returns raw samples; use read() to aggregate")
        fields = self._fields(query, numeric=False)
        if not fields:
            return []
        return to_samples(query.measurement, self._query.run(select_statement(query, fields)))

    # -- upkeep and health ---------------------------------------------------------------

    def maintain(self, now_ns: int) -> None:
        """Retention is the server's (its retention policy or bucket); here only the series
        that stopped reporting an hour ago stop counting towards max_series."""
        cutoff = now_ns - SERIES_TTL_NS
        stale = [key for key, seen in self._series.items() if seen < cutoff]
        for key in stale:
            del self._series[key]

    def _spool_gauges(self) -> dict[str, float]:
        spool = self.spool
        if spool is None:
            return {}
        return {"bytes": spool.bytes, "batches": len(spool), "points": spool.points,
                "max_bytes": spool.max_bytes}

    def status(self) -> ComponentStatus:
        spool = self.spool
        details: dict[str, object] = {
            "url": self.url,
            "write_path": PATH_NAMES.get(self.path, "not chosen yet (server not reached)"),
            "chosen_by": "config (store.api)" if self.cfg.api != "auto" else "server version",
            "server_version": self.server_version,
            "database": self.creds.db,
            "gzip": wants_gzip(self.cfg),
            "points_sent": self.points_sent,
            "points_rejected": self.points_rejected,
            "pending_points": self.backlog,
        }
        if self.cfg.bucket:
            details["bucket"] = self.cfg.bucket
        if self._last_rejection:
            details["last_rejection"] = self._last_rejection
        if spool is not None:
            details.update({
                "spool_batches": len(spool), "spool_bytes": spool.bytes,
                "spool_max_bytes": spool.max_bytes, "spool_full_policy": spool.policy,
                "spool_dropped_points": spool.dropped_points,
            })
        reason = ""
        if self._last_error:
            since = time.monotonic() - self._failing_since
            queued = f"{len(spool)} batches spooled" if spool is not None else ""
            reason = (f"InfluxDB at {self.url} failing for {since:.0f} s: {self._last_error}; "
                      f"{queued}, replayed in order when it answers")
        elif self._spill_error:
            reason = self._spill_error
        return ComponentStatus("store:influxdb", ok=not reason, reason=reason, details=details)
