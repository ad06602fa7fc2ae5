"""Real HTTP services for the application-latency tests.

`LatencyService` is a small service as LS services are instrumented: every request to /work
sleeps for the current `delay` and is timed by a real prometheus-client Histogram (and counted by
status code), and /metrics serves that registry with the format the scraper asks for. The test
changes `delay`, `error_ratio` or the page itself (`override`, `metrics_delay`) while it runs.
`Traffic` keeps requests flowing from client threads.
"""

from __future__ import annotations

import random
import socket
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.exposition import choose_encoder

BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class LatencyService:
    def __init__(self, buckets: tuple[float, ...] = BUCKETS) -> None:
        self.registry = CollectorRegistry()
        self.histogram = Histogram("http_request_duration_seconds", "Request latency",
                                   ["handler"], buckets=buckets, registry=self.registry)
        self.requests = Counter("http_requests", "Requests by status", ["code"],
                                registry=self.registry)
        self.delay = 0.001
        self.error_ratio = 0.0
        self.metrics_delay = 0.0
        self.override: str | None = None  # serve this text on /metrics instead
        self.force_text = False  # ignore the scraper's Accept (text format only)
        service = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                if self.path.startswith("/metrics"):
                    self._metrics()
                else:
                    self._work()

            def _work(self) -> None:
                started = time.perf_counter()
                time.sleep(service.delay)
                code = "500" if random.random() < service.error_ratio else "200"
                service.histogram.labels("/work").observe(time.perf_counter() - started)
                service.requests.labels(code).inc()
                self._send(int(code), b"ok\n", "text/plain")

            def _metrics(self) -> None:
                if service.metrics_delay:
                    time.sleep(service.metrics_delay)
                if service.override is not None:
                    self._send(200, service.override.encode(), "text/plain; version=0.0.4")
                    return
                accept = "" if service.force_text else self.headers.get("Accept", "")
                encoder, content_type = choose_encoder(accept)
                self._send(200, encoder(service.registry), content_type)

            def _send(self, code: int, body: bytes, content_type: str) -> None:
                try:
                    self.send_response(code)
                    self.send_header("Content-Type", content_type)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except OSError:  # the client gave up (a scrape timeout): nothing to do
                    pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> LatencyService:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Traffic:
    """Client threads requesting `url` back to back until stopped."""

    def __init__(self, url: str, clients: int = 2) -> None:
        self.url = url
        self.sent = 0
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(clients)]
        for thread in self._threads:
            thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                with urllib.request.urlopen(self.url, timeout=10) as response:
                    response.read()
            except (urllib.error.URLError, OSError):
                pass  # a 500 or a busy server: keep going
            self.sent += 1
            time.sleep(0.002)

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=15)

    def __enter__(self) -> Traffic:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def closed_port() -> int:
    """A loopback port nothing listens on (connections are refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class SilentServer:
    """Accepts connections and never answers: a hung target."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._held: list[socket.socket] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        self.sock.settimeout(0.2)
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self._held.append(conn)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        for conn in self._held:
            conn.close()
        self.sock.close()
