"""How fast the InfluxDB store writes and reads, against a bare HTTP client in the same run.

Issue #4 asks for two figures:

1. points per second written from one agent in batches of 5,000, as a ratio against posting
   the same pre-built line protocol with a bare HTTP client (urllib3, one POST per 5,000 lines,
   no compression) in the same run; target >= 0.8. The sloguard side starts from `Sample`
   objects, as the agent does: it encodes them (`InfluxStore.write`), cuts batches, gzips
   them when `gzip: true`, and the clock stops when the server has acknowledged the last one
   (`flush()`). The reference's line protocol is built before its clock starts. The producer
   keeps at most one batch queued behind the one being sent (faster, and the writer would
   park the excess in its spool, as it does for an agent the server cannot keep up with).
2. the latency to read 5 minutes of one series into pandas through InfluxQL, next to the
   embedded SQLite store reading the same window from the same samples;
3. and, for the cardinality figures of docs/performance.md, what one series of container tags
   costs the server (RSS of influxd, bytes on disk) when many containers have come and gone.

Both run against Debian's InfluxDB 1.6.7 (the only InfluxDB installable here), started on
loopback by the test support code, with a fresh database per run so that no run overwrites
another's points. Runs alternate between the contenders and the tables give medians; read the
ratios, which come from the same run, rather than the absolute figures of a shared VM.

    .venv/bin/python benchmarks/influx_write.py              # ~1-2 minutes
    .venv/bin/python benchmarks/influx_write.py --points 50000 --repeats 1   # a quick look
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import urllib3

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from support.influxenv import InfluxServer, missing_message  # noqa: E402

from sloguard.core.samples import Sample  # noqa: E402
from sloguard.core.selectors import Matcher  # noqa: E402
from sloguard.store import WindowQuery  # noqa: E402
from sloguard.store.config import StoreConfig  # noqa: E402
from sloguard.store.embedded import EmbeddedStore  # noqa: E402
from sloguard.store.influx import InfluxStore  # noqa: E402
from sloguard.store.influx_lineprotocol import LineEncoder  # noqa: E402

S = 1_000_000_000
T0 = 1_767_225_600 * S  # 2026-01-01T00:00:00Z
BATCH = 5000


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def agent_samples(points: int, cgroups: int = 100) -> list[Sample]:
    """The agent's shape: per tick and cgroup container_cpu (7 fields), container_memory (5)
    and container_pressure x3 (8), with the container tags of a Kubernetes pod."""
    out: list[Sample] = []
    tick = 0
    while len(out) < points:
        ts = T0 + tick * S + 1234
        for c in range(cgroups):
            tags = {"node": "bench-node", "cgroup": f"/kubepods.slice/pod{c:04d}.slice",
                    "level": "pod", "qos": "burstable", "class": "LS" if c % 3 else "BE",
                    "pod_uid": f"0000{c:04d}-aaaa-bbbb-cccc-dddddddddddd",
                    "pod": f"app-{c:03d}-7f9c", "namespace": f"team-{c % 7}"}
            u = (c * 7 + tick) % 100 / 100
            out.append(Sample("container_cpu", tags, {
                "usage_cores": u, "usage_seconds_total": tick * u + 1.5, "limit_cores": 2.0,
                "periods": 10.0, "throttled_periods": float(c % 3), "throttled_ratio": 0.1 * u,
                "throttled_seconds": 0.01 * u}, ts))
            out.append(Sample("container_memory", tags, {
                "usage_bytes": 1e8 + c * 1e6 + tick, "working_set_bytes": 9e7 + c,
                "rss_bytes": 8e7 + c, "cache_bytes": 1e7 + tick, "limit_bytes": 5.36870912e8},
                ts))
            for resource in ("cpu", "memory", "io"):
                out.append(Sample("container_pressure", {**tags, "resource": resource}, {
                    "some_avg10": u, "some_avg60": u / 2, "some_total": 1e6 + tick,
                    "full_avg10": u / 3, "full_avg60": u / 4, "full_total": 5e5 + tick,
                    "some_rate": u * 10, "full_rate": u * 5}, ts))
        tick += 1
    return out[:points]


def bare_http(server: InfluxServer, db: str, bodies: list[bytes], points: int) -> float:
    """Points/s posting pre-built line protocol, one request per batch, no compression."""
    import base64

    http = urllib3.PoolManager(retries=False)
    auth = base64.b64encode(f"{server.username}:{server.password}".encode()).decode()
    url = f"{server.url}/write?db={db}&precision=ns"
    headers = {"Authorization": f"Basic {auth}", "Content-Type": "text/plain; charset=utf-8"}
    started = time.perf_counter()
    for body in bodies:
        response = http.request("POST", url, body=body, headers=headers)
        if response.status != 204:
            raise RuntimeError(f"bare POST: HTTP {response.status}: {response.data[:200]!r}")
    elapsed = time.perf_counter() - started
    http.clear()
    return points / elapsed


def wait_for_room(store: InfluxStore) -> None:
    """Keep one batch in flight and one ready, as an agent that produces no faster than the
    server takes would: the sustained rate, not a burst parked in the spool."""
    while store.backlog > BATCH:
        time.sleep(0.0005)


def sloguard_store(server: InfluxServer, db: str, samples: list[Sample],
                   use_gzip: bool | str, data_dir: Path) -> float:
    """Points/s through InfluxStore, fed 5,000 samples per write() as a busy agent would."""
    cfg = StoreConfig(kind="influxdb", url=server.url, database=db, username=server.username,
                      password=server.password, batch_size=BATCH, gzip=use_gzip, api="v1")
    store = InfluxStore(cfg, data_dir)
    try:
        started = time.perf_counter()
        for i in range(0, len(samples), BATCH):
            wait_for_room(store)
            store.write(samples[i:i + BATCH])
        if not store.flush(300):
            raise RuntimeError(f"not flushed: {store.status()}")
        elapsed = time.perf_counter() - started
        if store.points_sent != len(samples):
            raise RuntimeError(f"sent {store.points_sent} of {len(samples)}: {store.status()}")
    finally:
        store.close()
    return len(samples) / elapsed


def sloguard_prebuilt(server: InfluxServer, db: str, lines: list[str], data_dir: Path) -> float:
    """Points/s through InfluxStore's batching and sending alone, fed the pre-built lines."""
    cfg = StoreConfig(kind="influxdb", url=server.url, database=db, username=server.username,
                      password=server.password, batch_size=BATCH, gzip=False, api="v1")
    store = InfluxStore(cfg, data_dir)
    try:
        started = time.perf_counter()
        for i in range(0, len(lines), BATCH):
            wait_for_room(store)
            store.write_lines(lines[i:i + BATCH])
        if not store.flush(300):
            raise RuntimeError(f"not flushed: {store.status()}")
        elapsed = time.perf_counter() - started
    finally:
        store.close()
    return len(lines) / elapsed


def read_latency(server: InfluxServer, tmp: Path, reads: int) -> tuple[float, float, int]:
    """Median ms to read the last 5 minutes of one series into pandas: InfluxQL, embedded."""
    db = server.create_database("bench_read")
    samples = agent_samples(100 * 5 * 600)  # 10 minutes of 100 cgroups
    cfg = StoreConfig(kind="influxdb", url=server.url, database=db, username=server.username,
                      password=server.password, batch_size=BATCH, api="v1")
    influx = InfluxStore(cfg, tmp / "read")
    embedded = EmbeddedStore(tmp / "read.db", retention_s=10**9, max_size=1 << 34)
    try:
        influx.write(samples)
        embedded.write(samples)
        if not influx.flush(300):
            raise RuntimeError(f"not flushed: {influx.status()}")
        end = T0 + 600 * S
        query = WindowQuery("container_cpu", end - 300 * S, end, fields=("usage_cores",),
                            matchers=(Matcher("cgroup", "=", "/kubepods.slice/pod0042.slice"),))
        rows = len(influx.read(query))
        assert rows == len(embedded.read(query)) == 300, rows
        timings: dict[str, list[float]] = {"influx": [], "embedded": []}
        for _ in range(reads):
            for name, store in (("influx", influx), ("embedded", embedded)):
                started = time.perf_counter()
                store.read(query)
                timings[name].append((time.perf_counter() - started) * 1000)
        return statistics.median(timings["influx"]), statistics.median(timings["embedded"]), rows
    finally:
        influx.close()
        embedded.close()


def series_cost(server: InfluxServer, series: int) -> tuple[float, float]:
    """Server memory and disk per series of the agent's container tags: `series` new series
    (as that many short-lived containers would leave behind), one point each."""
    db = server.create_database("bench_series")
    time.sleep(1.0)
    before = server.rss_bytes()
    disk_before = sum(f.stat().st_size for f in server.workdir.rglob("*") if f.is_file())
    encoder = LineEncoder()
    lines = []
    for i in range(series):
        tags = {"node": "bench-node", "cgroup": f"/kubepods.slice/kubepods-burstable.slice/"
                f"kubepods-burstable-pod{i:08d}_aaaa_bbbb_cccc_dddddddddddd.slice/"
                f"cri-containerd-{i:064x}.scope", "level": "container", "qos": "burstable",
                "class": "LS", "pod_uid": f"{i:08d}-aaaa-bbbb-cccc-dddddddddddd",
                "container_id": f"{i:064x}", "pod": f"app-{i % 500:03d}-{i:06x}",
                "namespace": f"team-{i % 7}", "container": "main"}
        lines.append(encoder.line(Sample("container_cpu", tags, {"usage_cores": 0.5}, T0 + i)))
    bodies = [("\n".join(lines[i:i + BATCH]) + "\n").encode()
              for i in range(0, len(lines), BATCH)]
    bare_http(server, db, bodies, len(lines))
    time.sleep(2.0)
    after = server.rss_bytes()
    disk_after = sum(f.stat().st_size for f in server.workdir.rglob("*") if f.is_file())
    return (after - before) / series, (disk_after - disk_before) / series


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--points", type=int, default=200_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--reads", type=int, default=50)
    parser.add_argument("--series", type=int, default=50_000)
    args = parser.parse_args()
    missing = missing_message("influxd", "influxdb")
    if missing:
        sys.exit(missing)

    log(f"[1/4] building {args.points} samples of the agent's shape")
    samples = agent_samples(args.points)
    encoder = LineEncoder()
    lines = [encoder.line(s) for s in samples]
    bodies = [("\n".join(lines[i:i + BATCH]) + "\n").encode()
              for i in range(0, len(lines), BATCH)]
    mb = sum(len(b) for b in bodies) / 1e6
    log(f"      {len(bodies)} batches of {BATCH}, {mb:.1f} MB of line protocol")

    results: dict[str, list[float]] = {"bare": [], "gzip": [], "plain": [], "lines": []}
    cpu: dict[str, list[float]] = {name: [] for name in results}  # us of CPU per point
    server_cpu: dict[str, list[float]] = {name: [] for name in results}
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="sloguard-bench-influx-") as tmp, \
            InfluxServer() as server:
        log(f"[2/4] InfluxDB {server.version()} on {server.url}")
        run = 0
        for repeat in range(args.repeats):
            for name in ("bare", "gzip", "plain", "lines"):
                run += 1
                db = server.create_database(f"bench_{run}")
                cpu0, server0 = time.process_time(), server.cpu_seconds()
                if name == "bare":
                    rate = bare_http(server, db, bodies, len(lines))
                elif name == "lines":
                    rate = sloguard_prebuilt(server, db, lines, Path(tmp) / f"run{run}")
                else:
                    rate = sloguard_store(server, db, samples, True if name == "gzip" else "auto",
                                          Path(tmp) / f"run{run}")
                results[name].append(rate)
                cpu[name].append((time.process_time() - cpu0) / len(lines) * 1e6)
                server_cpu[name].append((server.cpu_seconds() - server0) / len(lines) * 1e6)
                log(f"[3/4] repeat {repeat + 1}/{args.repeats} {name:>5}: {rate:,.0f} points/s")
        log(f"[4/4] reading 5 minutes of one series, {args.reads} times")
        influx_ms, embedded_ms, rows = read_latency(server, Path(tmp), args.reads)
        log(f"[4/4] {args.series} container series: what each costs the server")
        rss_per_series, disk_per_series = series_cost(server, args.series)

    bare = statistics.median(results["bare"])
    print(f"\n{args.points:,} points of the agent's shape in batches of {BATCH:,} to InfluxDB "
          f"on loopback (median of {args.repeats}); reference: the same pre-built line "
          "protocol posted by a bare urllib3 client in the same run\n")
    print("| writer | points/s | x bare HTTP | target | client CPU µs/point | "
          "server CPU µs/point |")
    print("|---|---|---|---|---|---|")
    table = (("bare", "bare urllib3 POST of pre-built line protocol"),
            ("plain", "sloguard InfluxStore from Samples (default here: `gzip: auto` does "
                      "not compress on loopback)"),
            ("gzip", "sloguard InfluxStore from Samples, `gzip: true`"),
            ("lines", "(batching and sending alone: InfluxStore fed the pre-built lines, "
                      "`gzip: false`)"))
    for name, label in table:
        rate = statistics.median(results[name])
        target = "" if name == "bare" else (
            ">= 0.8: " + ("met" if rate / bare >= 0.8 else "NOT met"))
        print(f"| {label} | {rate:,.0f} | {rate / bare:.2f} | {target} | "
              f"{statistics.median(cpu[name]):.2f} | {statistics.median(server_cpu[name]):.2f} |")
    print(f"\n(1-minute load average when the runs started: {load:.2f} on "
          f"{os.cpu_count()} CPUs)")
    print(f"\nRead the last 5 minutes of one series ({rows} points) into pandas, median of "
          f"{args.reads}:\n")
    print("| store | ms | x embedded |")
    print("|---|---|---|")
    print(f"| embedded SQLite | {embedded_ms:.2f} | 1.00 |")
    print(f"| InfluxDB 1.6.7, InfluxQL over /query | {influx_ms:.2f} | "
          f"{influx_ms / embedded_ms:.2f} |")
    print(f"\nCost of one series of container tags on the server ({args.series:,} series, "
          f"one point each; inmem index): {rss_per_series / 1024:.1f} KiB of RSS, "
          f"{disk_per_series:.0f} bytes on disk (WAL, before compaction)")


if __name__ == "__main__":
    main()
