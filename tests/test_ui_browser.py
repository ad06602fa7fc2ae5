"""The web UI in a real headless Chromium (Debian's), driven by Playwright.

The agent here is real (its engine, stores and ladder), fed samples directly instead of by its
collectors, and served by uvicorn on loopback. Screenshots are kept in test-artifacts/.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest
from conftest import need
from support.uiserver import HOSTILE_POD, served_agent

from sloguard.core.samples import Sample

S = 1_000_000_000
ARTIFACTS = Path(__file__).resolve().parent.parent / "test-artifacts"


def _chromium() -> str | None:
    return shutil.which("chromium")


@pytest.fixture
def served(tmp_path):
    with served_agent(tmp_path) as pair:
        yield pair


def test_list_open_an_incident_and_see_its_chart(served):
    need(_chromium() is not None, "Debian's chromium is not installed "
                                  "(scripts/browser-testenv.sh installs it)")
    from playwright.sync_api import sync_playwright

    agent, url = served
    [incident] = agent.incidents.query(limit=10)
    assert incident.state == "resolved" and incident.actions
    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=_chromium(), args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1280, "height": 1000})
        page.goto(url + "/")
        row = page.locator("tbody tr", has_text="ls/LSSlow")
        assert row.count() == 1 and "resolved" in row.inner_text()
        page.screenshot(path=str(ARTIFACTS / "incidents.png"), full_page=True)
        row.get_by_role("link").click()
        page.wait_for_url(f"**/incidents/{incident.id}")
        page.wait_for_function("window.sloguardChart && window.sloguardChart.drawn", timeout=10000)
        chart = page.evaluate("""() => {
            const c = window.sloguardChart;
            return {points: c.data.x.length,
                    values: c.data.value.filter(v => v !== null).length,
                    thresholds: c.data.threshold.filter(v => v !== null).length,
                    actions: c.data.actions.length,
                    canvas: document.querySelectorAll('#chart canvas').length};
        }""")
        assert chart["points"] >= 60 and chart["values"] == 60  # every stored sample
        assert chart["thresholds"] > 0 and chart["actions"] == len(incident.actions)
        assert chart["canvas"] >= 1
        # the canvas has the series drawn on it: not a blank rectangle
        painted = page.evaluate("""() => {
            const c = document.querySelector('#chart canvas');
            const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
            let n = 0; for (let i = 3; i < d.length; i += 4) if (d[i] > 0) n++;
            return n;
        }""")
        assert painted > 1000
        timeline = page.locator("#timeline").inner_text()
        assert "notify" in timeline and "evidence" in timeline
        # hostile strings from the cluster (pod name) and a rule (annotation) are text
        assert HOSTILE_POD in page.locator("dl").inner_text()
        assert "<script>window.__xss=2</script>see the wiki" in page.locator("dl").inner_text()
        assert page.evaluate("() => window.__xss") is None
        page.screenshot(path=str(ARTIFACTS / "incident.png"), full_page=True)
        browser.close()


def test_series_api_of_an_incident(served):
    import httpx

    agent, url = served
    [incident] = agent.incidents.query(limit=10)
    body = httpx.get(f"{url}/api/incidents/{incident.id}/series", timeout=10).json()
    assert body["field"] == "p99" and body["expr"] == 'lat{class="LS"}'
    values = [v for v in body["value"] if v is not None]
    assert len(values) == 60 and max(values) == 40.0
    assert body["fired"] and body["resolved"] and body["fired"] < body["resolved"]
    assert 10.0 in body["threshold"]
    assert httpx.get(f"{url}/api/incidents/nope/series", timeout=10).status_code == 404
    vendored = httpx.get(f"{url}/static/vendor/uPlot.iife.min.js", timeout=10)
    assert vendored.status_code == 200 and "uPlot" in vendored.text[:2000]


def test_filters_live_updates_and_the_other_pages(served):
    need(_chromium() is not None, "Debian's chromium is not installed "
                                  "(scripts/browser-testenv.sh installs it)")
    from playwright.sync_api import sync_playwright

    agent, url = served
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=_chromium(), args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.goto(url + "/")
        page.select_option("select[name=state]", "firing")  # htmx swaps the table in place
        page.wait_for_function(
            "document.querySelector('#incidents').innerText.includes('No incidents match')")
        # a new incident fires while the page is open: the live table picks it up
        now = time.time_ns()
        for second in range(4):
            sample = Sample("lat", {"node": "ui-node", "class": "LS", "pod": "web-2"},
                            {"p99": 50.0}, now + second * S)
            agent.store.write([sample])
            agent.windows.add([sample])
            agent.engine.evaluate(now + second * S)
        assert [i.state for i in agent.incidents.query(state="firing")] == ["firing"]
        page.wait_for_function(
            "document.querySelector('#incidents').innerText.includes('web-2')", timeout=12000)
        assert "web-1" not in page.locator("#incidents").inner_text()  # still filtered

        page.goto(url + "/rules")
        rules = page.locator("#rules").inner_text()
        assert "ls/LSSlow" in rules and "ls-interference" in rules and "threshold" in rules
        page.goto(url + "/actions")
        audit = page.locator("#audit").inner_text()
        assert "apply notify" in audit and "of policy ls-interference" in audit
        page.goto(url + "/node")
        components = page.locator("#components").inner_text()
        assert "store:embedded" in components and "actuators" in components
        page.screenshot(path=str(ARTIFACTS / "node.png"), full_page=True)
        browser.close()


def test_a_change_point_is_marked_on_the_incident_chart(tmp_path):
    """A change-point rule's incident carries when the level changed; the chart marks it."""
    import httpx
    from support.uiserver import feed

    rules = """\
groups:
  - name: shift
    rules:
      - alert: LevelShift
        expr: lat{class="LS"}
        field: p99
        aggregate: last
        window: 2s
        detector: changepoint
        params: {window: 120, min_relative: 0.5}
"""
    with served_agent(tmp_path, history=False) as (agent, url):
        (tmp_path / "rules" / "r.yaml").write_text(rules)
        import os

        os.utime(tmp_path / "rules" / "r.yaml", (1, 1))
        agent._reload_rules()
        agent.engine.sync_windows(None, time.time_ns())
        start = time.time_ns() - 200 * S
        feed(agent, "web-3", [10.0 + (i % 3) * 0.3 for i in range(100)]
             + [30.0 + (i % 3) * 0.3 for i in range(30)], start)
        [incident] = agent.incidents.query(rule="LevelShift")
        body = httpx.get(f"{url}/api/incidents/{incident.id}/series", timeout=10).json()
        assert body["changes"] == [(start + 100 * S) / 1e9]  # the first point of the new level


def test_the_suspects_table_and_their_signals_chart(tmp_path):
    """An incident with suspects: the page lists them with every clue, and charts the first
    suspects' CPU against the LS signal (the data from /api/incidents/{id}/suspects/series)."""
    need(_chromium() is not None, "Debian's chromium is not installed "
                                  "(scripts/browser-testenv.sh installs it)")
    import httpx
    from playwright.sync_api import sync_playwright
    from support.uiserver import feed

    be = {"/be/antagonist": lambda s: 1.9 if s >= 40 else 0.0,
          "/be/napper": lambda s: 0.02}
    hostile = '<img src=x onerror="window.__xss=3">antagonist'  # a pod name is anyone's
    name = {"/be/antagonist": hostile, "/be/napper": "napper"}
    with served_agent(tmp_path, history=False) as (agent, url):
        start = time.time_ns() - 120 * S
        agent.store.write([Sample("container_cpu", {"node": agent.node, "cgroup": cg,
                                                    "class": "BE", "level": "cgroup",
                                                    "workload": name[cg]},
                                  {"usage_cores": f(s)}, start + s * S)
                           for cg, f in be.items() for s in range(70)])
        feed(agent, "web-1", [40.0 if s >= 40 else 2.0 + (s % 3) for s in range(70)], start)
        agent.attributor.inventory = lambda: [
            {"cgroup": cg, "class": "BE", "level": "cgroup", "workload": name[cg]} for cg in be]
        agent.attributor.tick(start + 70 * S, agent.engine.firing())
        [incident] = agent.incidents.query(rule="LSSlow")
        assert incident.suspects and incident.suspects[0]["cgroup"] == "/be/antagonist"
        body = httpx.get(f"{url}/api/incidents/{incident.id}/suspects/series",
                         timeout=10).json()
        assert body["error"] == "" and body["suspects"][0]["name"] == hostile
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=_chromium(), args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 1280, "height": 1400})
            page.goto(f"{url}/incidents/{incident.id}")
            rows = page.locator("#suspects tbody tr")
            assert hostile in rows.nth(0).inner_text()  # shown as text
            assert "co_movement" in rows.nth(0).inner_text()
            page.wait_for_function("window.sloguardSuspectsChart && "
                                   "window.sloguardSuspectsChart.drawn", timeout=10000)
            drawn = page.evaluate("""() => {
                const c = window.sloguardSuspectsChart;
                return {series: c.chart.series.length, points: c.data.x.length,
                        canvas: document.querySelectorAll('#suspects-chart canvas').length};
            }""")
            assert drawn["series"] == 2 + len(body["suspects"]) and drawn["points"] >= 60
            assert drawn["canvas"] >= 1
            assert hostile in page.locator("#suspects-chart").inner_text()  # the legend
            assert page.evaluate("() => window.__xss") is None
            ARTIFACTS.mkdir(exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "incident-suspects.png"), full_page=True)
            browser.close()


def test_the_cluster_front_page_shows_the_fleet(tmp_path):
    """`sloguard server`'s front page: the three sections of the fleet summary, with a node and
    a workload named to run script, shown as text (in the SVG chart too); the suffering
    node's link opens its firing incidents."""
    need(_chromium() is not None, "Debian's chromium is not installed "
                                  "(scripts/browser-testenv.sh installs it)")
    import socket
    import threading

    import uvicorn
    from playwright.sync_api import sync_playwright

    from sloguard.cluster import ClusterServer
    from sloguard.core.incidents import Incident
    from sloguard.settings import load_settings
    from sloguard.ui.app import create_app

    evil_node = '<script>window.__xss=1</script>n'
    evil_pod = '<img src=x onerror="window.__xss=2">'
    config = tmp_path / "server.yaml"
    config.write_text(f"data_dir: {tmp_path / 'data'}\nserver:\n  ingest_token: agents\n")
    server = ClusterServer(load_settings(config).settings)
    now = time.time_ns()

    def incident(node: str, n: int, ago_s: int, state: str, severity: str,
                 pods: list[str]) -> Incident:
        started = now - ago_s * S
        return Incident(
            id=f"{node}-{n}", fingerprint=f"fp{n}", rule="LSSlow", group="ls",
            severity=severity, node=node, state=state, series={}, started_ns=started,
            updated_ns=started + S, fired_ns=started + S, summary=f"slow on {node}",
            suspects=[{"cgroup": f"/be/{p}", "score": 0.8, "rank": k + 1, "resource": "cpu",
                       "workload": {"pod": p, "namespace": "batch"}, "clues": []}
                      for k, p in enumerate(pods)])

    server.ingest(evil_node, [incident(evil_node, 1, 600, "firing", "critical", [evil_pod]),
                              incident(evil_node, 2, 5 * 3600, "resolved", "warning",
                                       [evil_pod, "etl"])], [], now, {})
    server.ingest("node-b", [incident("node-b", k, 3600 * k + 60, "resolved", "info", ["etl"])
                             for k in range(1, 4)], [], now, {})
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    web = uvicorn.Server(uvicorn.Config(create_app(server, manage_lifecycle=False),
                                        host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=web.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not web.started and time.monotonic() < deadline:
        time.sleep(0.05)
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=_chromium(), args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 1280, "height": 1200})
            page.goto(f"http://127.0.0.1:{port}/")
            suffering = page.locator("#suffering tbody tr")
            assert suffering.count() == 1  # node-b has nothing firing
            row = suffering.nth(0).inner_text()
            assert evil_node in row and "critical" in row and "\t1\t" in row
            # the chart: a row per node, bars with titles, the names as text
            svg = page.locator("#per-node svg")
            assert svg.get_attribute("role") == "img"
            assert page.locator("#per-node svg rect").count() == 5  # 5 incidents, 5 buckets
            titles = page.evaluate(
                "() => [...document.querySelectorAll('#per-node svg title')]"
                ".map(t => t.textContent)")
            assert evil_node in titles and "node-b" in titles
            assert any(t.startswith(evil_node + ", ") and t.endswith(": 1 incident")
                       for t in titles)
            # the same counts as a table, behind its summary
            assert page.locator("#per-node-table").inner_text() == ""
            page.get_by_text("the counts as a table").click()
            table = page.locator("#per-node-table tbody tr")
            assert [r.inner_text().split("\t")[0] for r in table.all()] == [
                "node-b", evil_node]  # the most incidents first
            assert table.nth(0).inner_text().split("\t")[-1] == "3"
            culprits = [r.inner_text().split("\t") for r in
                        page.locator("#culprits tbody tr").all()]
            assert culprits == [["batch/etl", "3", "4", "2"],  # first 3 times, named 4
                                [f"batch/{evil_pod}", "2", "2", "1"]]
            assert page.evaluate("() => window.__xss") is None
            assert page.locator("#fleet script, #fleet img").count() == 0
            page.screenshot(path=str(ARTIFACTS / "cluster-fleet.png"), full_page=True)
            suffering.nth(0).get_by_role("link").click()
            page.wait_for_url(lambda u: "node=" in u and "state=firing" in u)
            assert page.locator("select[name=state]").input_value() == "firing"
            listed = page.locator("#incidents tbody tr")
            assert listed.count() == 1 and evil_node in listed.inner_text()
            page.goto(f"http://127.0.0.1:{port}/?range=1h")
            assert page.locator("#per-node svg rect").count() == 1  # only the last hour's
            assert page.evaluate("() => window.__xss") is None
            browser.close()
    finally:
        web.should_exit = True
        thread.join(10)
        server.stop()
