"""The agent as a process: it scrapes a real instrumented service, and the shipped SLO rule fires
when latency is injected; services push observations and line protocol through the
authenticated receive endpoint, and mistakes come back as 4xx naming the field or line."""

from __future__ import annotations

import gzip
import json
import time

import httpx
from support.latency_service import LatencyService, Traffic, closed_port
from test_agent_e2e import AgentProcess

from sloguard.store import WindowQuery
from sloguard.store.embedded import open_store

TOKEN = "e2e-token-5b1f0c"


def stop(agent: AgentProcess) -> None:
    """SIGTERM, and never leave the agent behind, even when it does not exit in time."""
    try:
        agent.terminate()
    finally:
        if agent.proc.poll() is None:
            agent.proc.kill()
            agent.proc.wait()


def test_shipped_slo_rule_fires_when_scraped_latency_is_injected(tmp_path, sloguard_bin):
    refused = closed_port()
    with LatencyService() as svc, Traffic(f"{svc.url}/work"):
        config = tmp_path / "sloguard.yaml"
        config.write_text(
            "node_name: app-e2e\n"
            "interval: 500ms\n"
            "collectors: {cgroups: {enabled: false}}\n"
            "app_latency:\n"
            "  scrape_interval: 1s\n"
            "  probe_interval: 1s\n"
            "  timeout: 800ms\n"
            "  targets:\n"
            f"    - {{service: web, url: '{svc.url}/metrics', namespace: shop}}\n"
            "  probes:\n"
            f"    - {{service: '<script>x</script>', kind: tcp, address: '127.0.0.1:{refused}'}}\n"
            "slos:\n"
            "  - {service: web, namespace: shop, percentile: p99, latency_ms: 50,"
            " error_rate: 0.01, window: 3s}\n"
        )  # no rules.paths: the shipped rules
        agent = AgentProcess(sloguard_bin, config, tmp_path / "data", tmp_path / "agent.log")
        try:
            def component():
                body = agent.get("/readyz").json()
                return next(c for c in body["components"] if c["name"] == "app_latency")

            def scraped():
                targets = {t["kind"]: t for t in component()["details"]["targets"]}
                return targets if targets.get("scrape", {}).get("up") else None

            targets = agent.wait_for(scraped, 20, "the service was never scraped")
            assert targets["scrape"]["service"] == "web"
            assert targets["scrape"]["last_duration_s"] > 0
            assert targets["scrape"]["reads"].startswith("histogram http_request_duration")
            def refused_reported():
                tcp = [t for t in component()["details"]["targets"] if t["kind"] == "tcp"]
                return tcp and tcp[0]["up"] is False

            agent.wait_for(refused_reported, 20, "the refused probe was never reported")
            status = component()
            assert not status["ok"] and "connection refused" in status["reason"]
            assert agent.get("/readyz").status_code == 200  # a down target is not unready
            rules = {r["key"] for r in agent.get("/api/rules").json()["rules"]}
            assert {"ls-slo/LSLatencySLOBreach", "ls-error-budget/LSErrorBudgetBurn",
                    "probes/ProbeFailing"} <= rules
            time.sleep(3)
            assert not [i for i in agent.incidents() if i["rule"] == "LSLatencySLOBreach"]

            svc.delay = 0.2  # 200 ms against a 50 ms objective
            injected = time.monotonic()

            def breach():
                return [i for i in agent.incidents(state="firing")
                        if i["rule"] == "LSLatencySLOBreach"]

            [incident] = agent.wait_for(breach, 60, "the SLO rule never fired")
            took = time.monotonic() - injected
            assert incident["series"]["service"] == "web"
            assert incident["series"]["namespace"] == "shop"
            assert incident["severity"] == "critical"
            assert incident["summary"].startswith("web: p99 latency at ")
            assert incident["evidence"][-1]["value"] > 2  # over 100 ms: more than 2x the target
            print(f"LSLatencySLOBreach fired {took:.1f}s after the injection (for: 15s)")

            metrics = agent.get("/metrics").text
            assert (f'sloguard_target_up{{kind="scrape",service="web",target="{svc.url}/metrics"}}'
                    " 1.0") in metrics
            assert "sloguard_target_scrape_duration_seconds{" in metrics
            page = agent.get("/node").text
            assert "Application targets" in page and f"{svc.url}/metrics" in page
            assert "&lt;script&gt;x&lt;/script&gt;" in page and "<script>x" not in page
        finally:
            stop(agent)
    store = open_store(tmp_path / "data", 3600, 10**9)
    try:
        now = time.time_ns()
        rows = store.read_samples(WindowQuery("app_latency", now - 600 * 10**9, now))
        assert rows and all(r.tags["service"] == "web" for r in rows)
        assert max(r.fields["p99"] for r in rows) >= 100
        slo = store.read_samples(WindowQuery("app_slo", now - 600 * 10**9, now))
        assert slo and max(r.fields["latency_ratio"] for r in slo) > 2
        assert store.read_samples(WindowQuery("probe", now - 600 * 10**9, now))
    finally:
        store.close()


def test_receive_endpoint_authenticates_validates_and_feeds_the_rules(tmp_path, sloguard_bin):
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    config = tmp_path / "sloguard.yaml"
    config.write_text(
        "node_name: push-e2e\n"
        "interval: 500ms\n"
        "collectors: {cgroups: {enabled: false}}\n"
        f"app_latency: {{receive: {{enabled: true, token_file: '{token_file}',"
        " max_body: 64KiB}}\n"
        "slos:\n  - {service: pushed, latency_ms: 100, error_rate: 0.01, window: 5s}\n"
    )
    agent = AgentProcess(sloguard_bin, config, tmp_path / "data", tmp_path / "agent.log")
    auth = {"Authorization": f"Bearer {TOKEN}"}
    try:
        def post(path, body, headers=None, **kw):
            return httpx.post(agent.url + path, content=body, headers=headers or {},
                              timeout=10, **kw)

        good = json.dumps({"observations": [
            {"service": "pushed", "latency_ms": [300.0] * 50, "errors": 1}]})
        assert post("/api/v1/observations", good).status_code == 401
        wrong = post("/api/v1/observations", good, {"Authorization": "Bearer nope"})
        assert wrong.status_code == 401 and wrong.headers["www-authenticate"] == "Bearer"
        big = post("/api/v1/write", "m f=1\n" * 20_000, auth)
        assert big.status_code == 413 and "max_body" in big.json()["detail"]
        bomb = post("/api/v1/write", gzip.compress(b"m f=1\n" * 50_000),
                    {**auth, "Content-Encoding": "gzip"})
        assert bomb.status_code == 413  # the limit holds after decompression too
        bad = post("/api/v1/observations", json.dumps({"observations": [
            {"service": "pushed", "latency_ms": [1.0]},
            {"service": "pushed", "latency_ms": [1.0, -4.0]}]}), auth)
        assert bad.status_code == 422
        assert "observations.1: latency_ms.1: must be a finite number >= 0" in bad.json()["detail"]
        both = post("/api/v1/observations", json.dumps({"observations": [
            {"service": "x", "latency_ms": [1], "percentiles": {"p99": 2}}]}), auth)
        assert both.status_code == 422 and "exactly one of" in both.json()["detail"]
        assert post("/api/v1/observations", "{not json", auth).status_code == 400
        line = post("/api/v1/write", "app_latency,service=a p99=1\napp_latency,service=a p99=x",
                    auth)
        assert line.status_code == 400
        assert line.json()["detail"].startswith("line 2, column 27: field 'p99'")
        other = post("/api/v1/write", "cpu,host=a usage=1", auth)
        assert other.status_code == 400 and "'cpu' is not accepted" in other.json()["detail"]
        untagged = post("/api/v1/write", "app_latency p99=1", auth)
        assert "needs a `service` tag" in untagged.json()["detail"]

        ok = post("/api/v1/observations", good, auth)
        assert ok.status_code == 200 and ok.json() == {"accepted": 1}
        written = post("/api/v1/write?precision=ms",
                       f"app_latency,service=lp\\ svc,namespace=n1 p99=42.5,requests=10i "
                       f"{time.time_ns() // 10**6}\n", auth)
        assert written.status_code == 204, written.text

        def breach():
            post("/api/v1/observations", good, auth)  # keep the service slow
            return [i for i in agent.incidents(state="firing")
                    if i["rule"] == "LSLatencySLOBreach"]

        [incident] = agent.wait_for(breach, 60, "pushed latency never fired the SLO rule")
        assert incident["series"]["service"] == "pushed"
        component = next(c for c in agent.get("/readyz").json()["components"]
                         if c["name"] == "app_latency")
        received = component["details"]["received"]
        assert received["observations"] >= 2 and received["points"] == 1
        assert received["rejected"]["observations unauthenticated"] == 1
        assert received["rejected"]["write too_large"] == 2
        metrics = agent.get("/metrics").text
        assert 'sloguard_receive_rejected_total{endpoint="observations",reason="bad_token"} 1.0' \
            in metrics
        token_file.write_text("rotated-token\n")  # a rotated Secret is picked up
        assert post("/api/v1/observations", good, auth).status_code == 401
        assert post("/api/v1/observations", good,
                    {"Authorization": "Bearer rotated-token"}).status_code == 200
    finally:
        stop(agent)
    assert TOKEN not in (tmp_path / "agent.log").read_text()
    store = open_store(tmp_path / "data", 3600, 10**9)
    try:
        now = time.time_ns()
        rows = store.read_samples(WindowQuery("app_latency", now - 600 * 10**9, now))
        pushed = [r for r in rows if r.tags["service"] == "pushed"]
        assert pushed and (pushed[0].tags["target"], pushed[0].tags["node"]) == (
            "push", "push-e2e")
        assert pushed[0].fields["p99"] == 300 and pushed[0].fields["errors"] == 1
        [lp] = [r for r in rows if r.tags["service"] == "lp svc"]
        assert lp.fields == {"p99": 42.5, "requests": 10.0} and lp.tags["namespace"] == "n1"
    finally:
        store.close()


class ExposedAgent(AgentProcess):
    """The agent listening beyond loopback (all addresses), where the UI wants its own token."""

    def __init__(self, binary: str, config, data, log) -> None:
        super().__init__(binary, config, data, log, host="0.0.0.0")


def test_receive_token_and_ui_token_are_separate_off_loopback(tmp_path, sloguard_bin):
    config = tmp_path / "sloguard.yaml"
    config.write_text(
        "interval: 500ms\n"
        "collectors: {cgroups: {enabled: false}}\n"
        "ui: {token: ui-token-7a1}\n"
        f"app_latency: {{receive: {{enabled: true, token: {TOKEN}}}}}\n"
    )
    agent = ExposedAgent(sloguard_bin, config, tmp_path / "data", tmp_path / "agent.log")
    try:
        body = json.dumps({"observations": [{"service": "web", "latency_ms": [5.0]}]})

        def post(token):
            return httpx.post(f"{agent.url}/api/v1/observations", content=body, timeout=10,
                              headers={"Authorization": f"Bearer {token}"})

        assert httpx.get(f"{agent.url}/api/incidents", timeout=10).status_code == 401
        assert post(TOKEN).status_code == 200  # pushers need not hold the UI's token
        assert post("ui-token-7a1").status_code == 401  # nor may the UI's token push
        assert httpx.post(f"{agent.url}/api/v1/write", content="app_latency,service=w p99=1",
                          timeout=10).status_code == 401
    finally:
        stop(agent)
