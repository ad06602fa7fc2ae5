"""Scrapes and probes against hostile targets, and tenants against each other (issue #19):
redirects stay on the target's host, link-local and metadata addresses are refused, errors
quote nothing a target wrote, and a pod feeds only its own namespace's SLOs."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from sloguard.collectors.app_probe import probe_http, probe_tcp
from sloguard.collectors.app_scrape import ScrapeError, scrape
from sloguard.collectors.app_targets import Target
from sloguard.collectors.exposition import ExpositionError, ReadSpec
from sloguard.collectors.http_client import HttpError, forbidden, networks, request

SECRET = "TARGET-WROTE-THIS"
PAGE = """\
# TYPE rpc_latency_seconds histogram
rpc_latency_seconds_bucket{le="0.01"} 5
rpc_latency_seconds_bucket{le="0.1"} 9
rpc_latency_seconds_bucket{le="+Inf"} 10
rpc_latency_seconds_sum 0.5
rpc_latency_seconds_count 10
"""


class Hostile(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    other = ""  # another server's base URL, for redirects

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        port = self.server.server_address[1]
        routes = {
            "/elsewhere": (302, f"{self.other}/metrics"),
            "/other-port": (302, f"http://127.0.0.1:{port + 1}/metrics"),
            "/alias": (301, f"http://127.0.0.2:{port}/metrics"),
            "/metadata": (307, "http://169.254.169.254/latest/meta-data/"),
            "/same": (302, "/metrics"),
            "/absolute-same": (302, f"http://127.0.0.1:{port}/metrics"),
            "/bad-location": (302, "http://[::1/metrics"),
        }
        if self.path in routes:
            code, where = routes[self.path]
            self.send_response(code)
            self.send_header("Location", where)
            self.send_header("Content-Length", "0")
            self.end_headers()
        elif self.path == "/metrics":
            self._send(200, "OK", PAGE.encode())
        elif self.path == "/broken":
            self._send(200, "OK", (PAGE + f"{SECRET}{{oops\n").encode())
        elif self.path == "/charset":
            self._send(200, "OK", b"\xff\xfe" + SECRET.encode(), "text/plain; charset=utf-8")
        else:
            self._send(500, f"{SECRET} reason", f"{SECRET} body".encode())

    def _send(self, code: int, reason: str, body: bytes,
              content_type: str = "text/plain; version=0.0.4") -> None:
        self.send_response(code, reason)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def servers():
    started = []

    def start(handler=Hostile, host="127.0.0.1"):
        srv = ThreadingHTTPServer((host, 0), handler)
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        started.append(srv)
        return f"http://{host}:{srv.server_address[1]}"

    yield start
    for srv in started:
        srv.shutdown()
        srv.server_close()


def _target(url: str, kind: str = "scrape") -> Target:
    return Target(kind=kind, service="svc", url=url, interval=5, timeout=2,
                  read=ReadSpec(metric=None, labels=(), unit="auto", error_metric=None,
                                error_label="code", error_match="5.."))


def _scrape(url: str):
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1) as pool:
        return asyncio.run(scrape(_target(url), 1024**2, pool))


def test_redirects_never_leave_the_targets_host(servers):
    class Redirecting(Hostile):
        pass

    Redirecting.other = servers()  # another server on this machine: another port
    url = servers(Redirecting)
    for path in ("/same", "/absolute-same"):
        assert _scrape(f"{url}{path}").metric == "rpc_latency_seconds"
    for path, where in (("/elsewhere", "127.0.0.1:"), ("/other-port", "127.0.0.1:"),
                        ("/alias", "127.0.0.2:"), ("/metadata", "169.254.169.254:80")):
        with pytest.raises(ScrapeError, match=f"redirect to another host \\({where}.*refused"):
            _scrape(f"{url}{path}")
    with pytest.raises(ScrapeError, match="redirect to a malformed URL"):
        _scrape(f"{url}/bad-location")
    probe = asyncio.run(probe_http(_target(f"{url}/alias", "http")))
    assert not probe.success and "redirect to another host" in probe.error


def test_link_local_and_metadata_addresses_are_refused_unless_configured():
    started = time.monotonic()
    for url in ("http://169.254.169.254/latest/meta-data/", "http://[fe80::1]:80/",
                "http://[::ffff:169.254.169.254]/", "http://100.100.100.200/",
                "http://168.63.129.16/", "http://[fd00:ec2::254]/"):
        with pytest.raises(HttpError, match=r"refused to connect .*app_latency.allow_addresses"):
            asyncio.run(request("GET", url))
    tcp = asyncio.run(probe_tcp(_target("169.254.169.254:80", "tcp")))
    assert not tcp.success and "link-local" in tcp.error
    assert time.monotonic() - started < 5  # refused before any connection is tried
    allowed = networks(["169.254.0.0/16", "fd00:ec2::254"])
    assert forbidden("169.254.169.254", allowed) == ""
    assert forbidden("fd00:ec2::254", allowed) == ""
    assert "metadata" in forbidden("100.100.100.200", allowed)
    assert forbidden("127.0.0.1") == "" and forbidden("10.0.0.7") == ""


def test_allow_addresses_is_validated_by_name(tmp_path):
    from sloguard.core.config import ConfigError
    from sloguard.settings import load_settings

    config = tmp_path / "c.yaml"
    config.write_text("app_latency:\n  allow_addresses: [169.254.169.254/32, nonsense]\n")
    with pytest.raises(ConfigError, match=r"c.yaml:2: app_latency.allow_addresses: .*'nonsense' "
                                          "is not an address or network"):
        load_settings(config)
    config.write_text("app_latency:\n  allow_addresses: [169.254.0.0/16]\n")
    assert load_settings(config).settings.app_latency.allow_addresses == ["169.254.0.0/16"]


def test_error_messages_quote_no_response_body(servers):
    url = servers()
    errors = []
    for path in ("/missing", "/broken", "/charset"):
        with pytest.raises((ScrapeError, ExpositionError)) as caught:
            _scrape(f"{url}{path}")
        errors.append(str(caught.value))
    assert errors[0] == "HTTP 500 Internal Server Error"
    assert errors[1] == "malformed exposition: line 7 does not parse as Prometheus text or " \
                        "OpenMetrics"
    assert errors[2].startswith("page is not valid utf-8: byte 0")
    # not HTTP at all: h11's complaint would quote the bytes
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)

    def answer():
        conn, _ = listener.accept()
        conn.recv(65536)
        conn.sendall(f"{SECRET} {SECRET}\r\n\r\n".encode())
        conn.close()

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    with pytest.raises(HttpError) as caught:
        asyncio.run(request("GET", f"http://127.0.0.1:{listener.getsockname()[1]}/"))
    thread.join(5)
    listener.close()
    errors.append(str(caught.value))
    assert errors[3].startswith("malformed HTTP response (")
    assert not [e for e in errors if SECRET in e], errors


# -- tenants ---------------------------------------------------------------------------------

class _Pods:
    """The pod listing the collector reads (PodMetadataCache's interface): pods of two
    tenants, both calling themselves `checkout`."""

    def __init__(self, pods):
        self._pods = pods

    def pods(self):
        return list(self._pods)


def test_a_pod_annotation_feeds_only_slos_of_its_own_namespace(servers):
    from sloguard.collectors.app_latency import AppLatencyCollector
    from sloguard.collectors.config import AppLatencyConfig, SloConfig
    from sloguard.core.pods import PodMeta

    def notes():
        return {"sloguard.io/scrape": "true", "sloguard.io/port": servers().rpartition(":")[2],
                "sloguard.io/service": "checkout"}

    pods = _Pods([PodMeta("fake-checkout", "tenant-b", "uid-b", annotations=notes(),
                          ip="127.0.0.1", phase="Running"),
                  PodMeta("checkout-1", "shop", "uid-s", annotations=notes(),
                          ip="127.0.0.1", phase="Running")])
    cfg = AppLatencyConfig(scrape_interval=0.2, timeout=1)
    slos = [SloConfig(service="checkout", latency_ms=50),  # any namespace
            SloConfig(service="checkout", namespace="payments", latency_ms=50),
            SloConfig(service="checkout", namespace="shop", latency_ms=80)]
    collector = AppLatencyCollector("n1", cfg, slos, pods=pods)
    collector.start()
    try:
        samples, deadline = [], time.monotonic() + 15
        while time.monotonic() < deadline:
            time.sleep(0.3)
            samples.extend(collector.collect(time.time_ns()))
            scraped = {s.tags.get("namespace") for s in samples if s.measurement == "app_latency"}
            if scraped >= {"tenant-b", "shop"}:
                break
        assert scraped >= {"tenant-b", "shop"}, collector.status()
        slo = [s for s in samples if s.measurement == "app_slo"]
        assert slo and {s.tags.get("namespace") for s in slo} == {"shop"}
        assert {s.fields["target_ms"] for s in slo} == {80.0}
        by_ns = {s.tags["namespace"]: s.fields for s in samples if s.measurement == "app_latency"}
        assert "slo_latency_ms" not in by_ns["tenant-b"]
        assert by_ns["shop"]["slo_latency_ms"] == 80.0
    finally:
        collector.stop()


def test_ls_labels_count_only_in_trusted_namespaces(tmp_path):
    from sloguard.core.pods import PodMeta, pod_class
    from sloguard.settings import load_settings

    label = "koordinator.sh/qosClass"

    def pod(namespace, value, qos):
        return PodMeta("p", namespace, "u", labels={label: value}, qos_class=qos)

    trusted = ["prod"]
    assert pod_class(pod("prod", "LS", "BestEffort"), "", label, trusted) == "LS"
    assert pod_class(pod("tenant", "LS", "BestEffort"), "", label, trusted) == "BE"
    assert pod_class(pod("tenant", "LS", "Burstable"), "", label, trusted) == "LS"  # QoS says
    assert pod_class(pod("tenant", "BE", "Guaranteed"), "", label, trusted) == "BE"
    assert pod_class(pod("tenant", "LS", "BestEffort"), "", label) == "LS"  # unset: all
    config = tmp_path / "c.yaml"
    config.write_text("collectors:\n  cgroups:\n    trusted_namespaces: [prod, ''] \n")
    with pytest.raises(Exception, match=r"trusted_namespaces.1"):
        load_settings(config)


def test_the_agent_starts_one_scraper_thread(tmp_path, caplog):
    """Agent.start() starts its collectors, the app-latency one among them, and then the
    app-latency collector once more: two threads scraped every target twice, and the second
    took over the first one's wake-up event (the first then died on it)."""
    import threading

    from sloguard.agent import Agent
    from sloguard.settings import load_settings

    config = tmp_path / "c.yaml"
    config.write_text(f"node_name: n1\ndata_dir: {tmp_path / 'data'}\n"
                      "collectors:\n  node: {enabled: false}\n  cgroups: {enabled: false}\n"
                      "app_latency:\n  probes:\n    - {service: s, kind: tcp, "
                      "address: '127.0.0.1:9', interval: 0.2}\n")
    agent = Agent(load_settings(config).settings)
    agent.start()
    try:
        scrapers = [t for t in threading.enumerate() if t.name == "app-latency"]
        time.sleep(2.5)  # past a round of target discovery (RESOLVE_S) in each thread
        assert len(scrapers) == 1, scrapers
        assert "scraper stopped" not in caplog.text
    finally:
        agent.stop()
