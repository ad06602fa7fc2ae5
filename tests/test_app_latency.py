"""The application-latency collector against real HTTP services: scraped p99 follows injected
latency, probes see a server slow down and one refuse, and a hung or malformed target is
reported while the others go on."""

from __future__ import annotations

import itertools
import shutil
import ssl
import subprocess
import threading
import time
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from conftest import need
from prometheus_client import CollectorRegistry, generate_latest
from support.latency_service import LatencyService, Traffic, closed_port

from sloguard.collectors.app_latency import AppLatencyCollector
from sloguard.collectors.config import AppLatencyConfig, SloConfig


class Run:
    """A started collector and everything it handed to the agent so far."""

    def __init__(self, collector: AppLatencyCollector) -> None:
        self.collector = collector
        self.samples: list = []
        self.collect_seconds: list[float] = []

    def poll(self) -> list:
        started = time.perf_counter()
        new = self.collector.collect(time.time_ns())
        self.collect_seconds.append(time.perf_counter() - started)
        self.samples.extend(new)
        return new

    def of(self, measurement: str, **tags: str) -> list:
        return [s for s in self.samples if s.measurement == measurement
                and all(s.tags.get(k) == v for k, v in tags.items())]

    def status(self, url: str) -> dict:
        targets = self.collector.status().details["targets"]
        return next((t for t in targets if t["target"] == url), {"up": None, "last_error": ""})

    def wait(self, check, timeout: float, what: str):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.poll()
            result = check()
            if result:
                return result
            time.sleep(0.1)
        raise AssertionError(f"{what}; status: {self.collector.status()}")


@contextmanager
def collecting(config: dict, slos: list[dict] | None = None, registry=None):
    cfg = AppLatencyConfig.model_validate({"jitter": 0.05, **config})
    collector = AppLatencyCollector(
        "test-node", cfg, [SloConfig.model_validate(s) for s in slos or []], registry=registry)
    collector.start()
    try:
        yield Run(collector)
    finally:
        collector.stop()


def test_p99_follows_injected_latency_within_one_interval():
    interval = 1.0
    with LatencyService() as svc, Traffic(f"{svc.url}/work"), collecting(
            {"scrape_interval": interval, "timeout": 0.9,
             "targets": [{"service": "web", "url": f"{svc.url}/metrics", "namespace": "shop"}]},
            slos=[{"service": "web", "latency_ms": 50, "window": "3s"}]) as run:
        tags = {"service": "web", "target": f"{svc.url}/metrics"}
        run.wait(lambda: len(run.of("app_latency", **tags)) >= 2, 15, "no baseline samples")
        baseline = run.of("app_latency", **tags)[-1]
        assert baseline.fields["p99"] < 100 and baseline.fields["requests"] > 0
        assert baseline.tags == {**tags, "node": "test-node", "namespace": "shop", "class": "LS"}
        assert baseline.fields["slo_latency_ms"] == 50
        assert {"p50", "p90", "p99", "p999", "rate", "requests", "errors",
                "error_rate"} <= baseline.fields.keys()

        svc.delay = 0.2  # 200 ms: the (100, 250] ms bucket
        injected = time.time_ns()

        def after_one_interval():
            """The first sample whose interval began after the injection (+100 ms for the
            requests already running): one interval's requests, all of them slow."""
            ordered = sorted(run.of("app_latency", **tags), key=lambda s: s.time_ns)
            for before, sample in itertools.pairwise(ordered):
                if before.time_ns > injected + 100_000_000:
                    return sample
            return None

        slow = run.wait(after_one_interval, 10, "no scrape one interval after the injection")
        assert 100 <= slow.fields["p99"] <= 250, slow.fields  # the bucket holding 200 ms
        # only that interval's requests: all slow (a cumulative histogram would keep the
        # thousands of fast ones from before and leave p50 low)
        assert 100 <= slow.fields["p50"] <= 250 and slow.fields["rate"] < 50, slow.fields
        first = min((s for s in run.of("app_latency", **tags)
                     if s.time_ns > injected and s.fields.get("p99", 0) >= 100),
                    key=lambda s: s.time_ns)
        lag = (first.time_ns - injected) / 1e9
        assert lag <= (slow.time_ns - injected) / 1e9  # never later than that scrape
        assert lag < 3 * interval  # a sanity bound, generous for a loaded machine
        slo = run.wait(lambda: [s for s in run.of("app_slo", service="web")
                                if s.time_ns > injected and s.fields.get("latency_ratio", 0) > 1],
                       10, "the SLO signal never moved")[0]
        assert slo.fields["target_ms"] == 50 and slo.tags["percentile"] == "p99"
        assert slo.fields["latency_ms"] == slo.fields["latency_ratio"] * 50

        svc.delay = 0.001
        healed = time.time_ns()
        run.wait(lambda: [s for s in run.of("app_latency", **tags)
                          if s.time_ns > healed + 1.3e9 and s.fields.get("p99", 999) < 100],
                 10, "p99 never came back down")
        print(f"p99 followed injected latency after {lag:.2f}s "
              f"(scrape interval {interval:g}s)")


def test_a_hung_target_never_delays_the_others_nor_the_agent():
    with LatencyService() as fast, LatencyService() as hung, Traffic(f"{fast.url}/work"):
        hung.metrics_delay = 30  # sleeps far beyond its timeout
        fast.force_text = True  # the text format here, OpenMetrics in the other tests
        with collecting({"targets": [
                {"service": "hung", "url": f"{hung.url}/metrics", "interval": 3, "timeout": 3},
                {"service": "fast", "url": f"{fast.url}/metrics", "interval": 0.5,
                 "timeout": 0.4}]}) as run:
            run.wait(lambda: run.status(f"{hung.url}/metrics")["up"] is False, 20,
                     "the hung target never timed out")
            mark = time.time_ns()
            run.wait(lambda: len([s for s in run.of("app_latency", service="fast")
                                  if s.time_ns > mark]) >= 8, 30, "the fast target stalled")
            status = run.status(f"{hung.url}/metrics")
            assert status["up"] is False and status["last_error"] == "timed out after 3s"
            assert 2.9 < status["last_duration_s"] < 5
            assert not run.of("app_latency", service="hung")
            times = sorted(s.time_ns for s in run.of("app_latency", service="fast"))
            gaps = [(b - a) / 1e9 for a, b in itertools.pairwise(times)]
            # scraped every 0.5 s throughout, while the hung one held its 3 s timeouts; a
            # scraper that waited for it would leave gaps of 3 s
            assert max(gaps) < 2.5, gaps
            assert run.status(f"{fast.url}/metrics")["up"] is True
            component = run.collector.status()
            assert not component.ok and "1 of 2 targets down" in component.reason
            run.wait(lambda: run.status(f"{hung.url}/metrics")["attempts"] >= 2, 15,
                     "the hung target was not retried")
            assert max(run.collect_seconds) < 1  # the agent's loop never waits for the network


def test_malformed_page_is_reported_then_recovers():
    with LatencyService() as svc, Traffic(f"{svc.url}/work"):
        svc.override = "this is { not prometheus\n"
        url = f"{svc.url}/metrics"
        with collecting({"scrape_interval": 0.5, "timeout": 0.4,
                         "targets": [{"service": "web", "url": url}]}) as run:
            run.wait(lambda: run.status(url)["up"] is False, 10, "never scraped")
            assert run.status(url)["last_error"].startswith("malformed exposition")
            assert "malformed exposition" in run.collector.status().reason
            svc.override = ('# TYPE x histogram\nx_bucket{le="1"} 5\nx_bucket{le="2"} 3\n'
                            'x_bucket{le="+Inf"} 5\n')
            run.wait(lambda: "go down" in run.status(url)["last_error"], 10, "not re-read")
            svc.override = None
            run.wait(lambda: run.of("app_latency", service="web"), 10, "never recovered")
            assert run.status(url)["up"] is True and run.status(url)["failures"] >= 2
            assert run.collector.status().ok


def test_probes_see_a_server_slow_down_and_one_refuse():
    refused = closed_port()
    with LatencyService() as svc:
        work = f"{svc.url}/work"
        registry = CollectorRegistry()
        with collecting({"probe_interval": 0.5, "timeout": 0.4, "probes": [
                {"service": "web", "kind": "http", "url": work},
                {"service": "web", "kind": "tcp", "address": f"127.0.0.1:{svc.port}"},
                {"service": "gone", "kind": "http", "url": f"http://127.0.0.1:{refused}/"},
                {"service": "gone", "kind": "tcp", "address": f"127.0.0.1:{refused}"}]},
                registry=registry) as run:
            def probes(**tags):
                return run.of("probe", **tags)

            run.wait(lambda: len(probes(target=work)) >= 2, 10, "no probes")
            fast = probes(target=work)[-1]
            assert fast.fields["success"] == 1 and fast.fields["status_code"] == 200
            assert fast.fields["latency_ms"] < 1000
            assert fast.tags["kind"] == "http" and fast.tags["service"] == "web"

            svc.delay = 0.2  # slower, still within the timeout
            mark = time.time_ns()
            slow = run.wait(lambda: [p for p in probes(target=work) if p.time_ns > mark + 0.5e9],
                            10, "no probe after the slowdown")[0]
            assert slow.fields["success"] == 1 and slow.fields["latency_ms"] >= 200

            svc.delay = 2.0  # beyond the timeout: a failure, with the time waited
            mark = time.time_ns()
            failed = run.wait(lambda: [p for p in probes(target=work)
                                       if p.time_ns > mark + 0.5e9], 10, "no failed probe")[0]
            assert failed.fields["success"] == 0 and 350 <= failed.fields["latency_ms"] < 2000
            assert failed.fields["failures"] >= 1
            assert run.status(work)["last_error"] == "timed out after 0.4s"

            for target in (f"http://127.0.0.1:{refused}/", f"127.0.0.1:{refused}"):
                gone = run.wait(lambda t=target: probes(target=t), 10, "no refused probe")
                assert gone[-1].fields["success"] == 0
                assert run.status(target)["last_error"] == "connection refused"
            tcp = probes(target=f"127.0.0.1:{svc.port}")
            assert tcp and all(p.fields["success"] == 1 for p in tcp)
            metrics = generate_latest(registry).decode()
            assert (f'sloguard_target_up{{kind="tcp",service="gone",target="127.0.0.1:{refused}"}}'
                    " 0.0") in metrics
            assert "sloguard_target_scrape_duration_seconds{" in metrics
            assert "sloguard_target_failures_total{" in metrics


def test_https_targets_and_probes_verify_certificates(tmp_path):
    need(shutil.which("openssl") is not None, "openssl makes the test certificate")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-keyout", str(key), "-out", str(cert), "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True, timeout=60)
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            body = (b'# TYPE t_seconds histogram\nt_seconds_bucket{le="0.1"} 1\n'
                    b't_seconds_bucket{le="+Inf"} 1\nt_seconds_count 1\n')
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"https://127.0.0.1:{server.server_address[1]}/metrics"
    try:
        with collecting({"probe_interval": 0.5, "scrape_interval": 0.5, "timeout": 0.45,
                         "targets": [{"service": "tls", "url": url, "ca_file": str(cert)}],
                         "probes": [
                             {"service": "tls", "kind": "http", "url": url,
                              "ca_file": str(cert)},
                             {"service": "untrusted", "kind": "http", "url": url}]}) as run:
            def trusted():
                return [p for p in run.of("probe", service="tls") if p.fields["success"] == 1]

            run.wait(trusted, 10, "the probe with the CA never succeeded")
            run.wait(lambda: run.of("probe", service="untrusted"), 10, "no untrusted probe")
            assert run.of("probe", service="untrusted")[-1].fields["success"] == 0
            statuses = {t["service"]: t for t in run.collector.status().details["targets"]
                        if t["kind"] == "http"}
            assert statuses["untrusted"]["last_error"].startswith("TLS certificate not trusted")
            run.wait(lambda: run.status(url)["up"], 10, "the https scrape never succeeded")
    finally:
        server.shutdown()
        server.server_close()
