"""The cluster view with real processes: two `sloguard run` agents forward to one
`sloguard server`; the server is stopped and started again while the agents go on, and nothing
is lost or duplicated; the ingest token is its own (a wrong one, or the UI's, is refused)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import httpx
from test_agent_e2e import AgentProcess, _free_port

INGEST = "ingest-secret-token"
UI = "ui-secret-token"
FRESH_NS = 3 * 10**9  # forward.refresh (1 s) and a few forwarding intervals of 300 ms
RULES = """\
groups:
  - name: cluster
    rules:
      - alert: AlwaysLoaded
        expr: node_load
        field: load1
        aggregate: last
        window: 2s
        params: {above: -1}
        for: 0s
        severity: warning
        policy: ls-interference
        annotations:
          summary: "load {{ $value }}"
"""


class ServerProcess:
    def __init__(self, binary: str, config: Path, data: Path, log: Path, port: int) -> None:
        self.url = f"http://127.0.0.1:{port}"
        self.http = httpx.Client(base_url=self.url, timeout=5)  # as AgentProcess's, for the polls
        self.log = log
        with open(log, "ab") as out:
            self.proc = subprocess.Popen(
                [binary, "server", "-c", str(config), "--data-dir", str(data),
                 "--listen", f"127.0.0.1:{port}"], stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.log.read_text()[-3000:]
            try:
                if self.http.get("/healthz", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise AssertionError(f"server never healthy: {self.log.read_text()[-3000:]}")

    def get(self, path: str) -> httpx.Response:
        return self.http.get(path)

    def terminate(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=30)


def wait_for(check, timeout: float, what: str, *logs: Path):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            result = check()
            if result:
                return result
        except httpx.HTTPError:
            pass
        time.sleep(0.25)
    tails = "\n".join(f"--- {log}\n{log.read_text()[-2000:]}" for log in logs)
    raise AssertionError(f"{what}\n{tails}")


def _agent(tmp_path: Path, binary: str, name: str, server_url: str) -> AgentProcess:
    home = tmp_path / name
    (home / "rules").mkdir(parents=True)
    (home / "rules" / "r.yaml").write_text(RULES)
    config = home / "sloguard.yaml"
    config.write_text(
        f"node_name: {name}\ninterval: 300ms\n"
        f"rules:\n  paths: [{home / 'rules'}]\n"
        "collectors:\n  cgroups: {enabled: false}\n"
        f"ui:\n  token: {UI}\n"
        f"forward:\n  url: {server_url}\n  token_env: SLOGUARD_TEST_INGEST\n"
        "  interval: 300ms\n  batch: 2\n  refresh: 1s\n")  # the evidence trails by 1 s at most
    return AgentProcess(binary, config, home / "data", home / "agent.log")


def _view(server: ServerProcess) -> tuple[list[dict], list[dict]]:
    incidents = server.get("/api/incidents?limit=1000").json()["incidents"]
    actions = server.get("/api/actions?limit=5000").json()["actions"]
    return incidents, actions


def _same(server: ServerProcess, agents: list[AgentProcess]) -> bool:
    """The server holds exactly the incidents and actions the agents hold, each incident in
    the same state with the same actions. A firing incident is saved on every evaluation (its
    `updated_ns` moves each tick) but sent only when it is news or every `forward.refresh`, so
    the server's copy may trail by that and a few forwarding intervals:
    the agents are read first, and the server's copy must be no older than `FRESH_NS` before
    theirs."""
    want_incidents, want_actions = [], []
    for agent in agents:
        want_incidents += agent.incidents(limit=1000)
        want_actions += [(a["node"], a["kind"], a["status"])
                         for a in agent.get("/api/actions?limit=5000").json()["actions"]]
    incidents, actions = _view(server)
    held = {i["id"]: i for i in incidents}
    if len(held) != len(incidents) or set(held) != {i["id"] for i in want_incidents}:
        return False
    for want in want_incidents:
        got = held[want["id"]]
        if (got["state"], len(got["actions"])) != (want["state"], len(want["actions"])):
            return False
        if got["updated_ns"] < want["updated_ns"] - FRESH_NS:
            return False
    return sorted((a["node"], a["kind"], a["status"]) for a in actions) == sorted(want_actions)


def test_two_agents_one_server_nothing_lost_nothing_twice(tmp_path, sloguard_bin, monkeypatch):
    monkeypatch.setenv("SLOGUARD_TEST_INGEST", INGEST)
    port = _free_port()
    server_config = tmp_path / "server.yaml"
    server_config.write_text(f"ui:\n  token: {UI}\nserver:\n  ingest_token_env: "
                             "SLOGUARD_TEST_INGEST\n  stale_after: 30s\n")
    server_data, server_log = tmp_path / "server-data", tmp_path / "server.log"
    server = ServerProcess(sloguard_bin, server_config, server_data, server_log, port)
    agents: list[AgentProcess] = []
    try:
        agents = [_agent(tmp_path, sloguard_bin, name, server.url)
                  for name in ("node-a", "node-b")]
        logs = [server_log, *(a.log for a in agents)]

        def both_nodes_with_actions():
            incidents, actions = _view(server)
            return ({i["node"] for i in incidents} == {"node-a", "node-b"}
                    and {a["node"] for a in actions} == {"node-a", "node-b"}
                    and _same(server, agents))

        wait_for(both_nodes_with_actions, 30, "the server never saw both nodes", *logs)
        incidents, actions = _view(server)
        assert {i["rule"] for i in incidents} == {"AlwaysLoaded"}
        # the shipped policy's first rungs (notify, then the first lever in the same tick),
        # in shadow mode: nothing acted
        assert "notify" in {a["kind"] for a in actions}
        assert all(a["status"] in ("skipped", "proposed") for a in actions)
        ready = server.get("/readyz").json()
        nodes = {c["name"]: c for c in ready["components"]}
        assert set(nodes) == {"node:node-a", "node:node-b"} and nodes["node:node-a"]["ok"]
        assert "last seen" in nodes["node:node-a"]["reason"]
        assert nodes["node:node-a"]["details"]["lag_s"] < 30
        page = server.get("/")
        assert "node-a" in page.text and "node-b" in page.text
        forward = next(c for c in agents[0].get("/readyz").json()["components"]
                       if c["name"] == "forward")
        assert forward["ok"] and forward["details"]["last_success_ns"]
        assert 'sloguard_forward_sent_total{kind="incidents"}' in agents[0].get("/metrics").text

        # the incident page on the server: no samples here, said so, and no change forms
        one = incidents[0]
        series = server.get(f"/api/incidents/{one['id']}/series").json()
        assert series["x"] == [] and "keeps no samples" in series["error"]
        html = server.get(f"/incidents/{one['id']}").text
        assert "cluster view" in html and 'id="ack-form"' not in html
        refused = httpx.post(f"{server.url}/api/incidents/{one['id']}/ack",
                             json={"author": "sre"},
                             headers={"Authorization": f"Bearer {UI}"}, timeout=5)
        assert refused.status_code == 409 and "node's agent" in refused.json()["detail"]

        # tokens: a wrong one and the UI's cannot ingest; the ingest token cannot read the UI
        body = {"node": "intruder", "incidents": [], "actions": []}
        for token in ("wrong", UI):
            answer = httpx.post(server.url + "/api/v1/ingest", json=body, timeout=5,
                                headers={"Authorization": f"Bearer {token}"})
            assert answer.status_code == 401, (token, answer.text)
        assert httpx.post(server.url + "/api/v1/ingest", json=body, timeout=5).status_code == 401
        bad = httpx.post(server.url + "/api/v1/ingest", timeout=5,
                         json={"node": "x", "incidents": [{"id": 3}], "actions": []},
                         headers={"Authorization": f"Bearer {INGEST}"})
        assert bad.status_code == 422
        assert any(d["field"].startswith("incidents.0") for d in bad.json()["detail"])
        huge = httpx.post(server.url + "/api/v1/ingest", timeout=5,
                          content=b"{" + b" " * (9 * 1024**2) + b"}",
                          headers={"Authorization": f"Bearer {INGEST}",
                                   "Content-Type": "application/json"})
        assert huge.status_code == 413

        # the server goes away; the agents go on, and their state changes meanwhile
        assert server.terminate() == 0
        a, b = agents
        wait_for(lambda: not next(c for c in a.get("/readyz").json()["components"]
                                  if c["name"] == "forward")["ok"], 20,
                 "the forwarder never noticed the server was away", *logs)
        (tmp_path / "node-a" / "rules" / "broken.yaml").write_text("groups: [{name: 1}]\n")
        wait_for(lambda: a.incidents(rule="RulesInvalid"), 30, "no RulesInvalid on node-a",
                 *logs)
        [b_incident] = b.incidents(rule="AlwaysLoaded")
        acked = httpx.post(f"{b.url}/api/incidents/{b_incident['id']}/ack",
                           json={"author": "sre", "comment": "looking"}, timeout=5,
                           headers={"Authorization": f"Bearer {UI}"})
        assert acked.status_code == 200, acked.text
        forward = next(c for c in a.get("/readyz").json()["components"]
                       if c["name"] == "forward")
        assert forward["details"]["backlog"]["incidents"] >= 1
        assert "cannot reach" in forward["reason"]

        server = ServerProcess(sloguard_bin, server_config, server_data, server_log, port)
        wait_for(lambda: _same(server, agents), 60,
                 "after the restart the server does not hold exactly the agents' state", *logs)
        incidents, actions = _view(server)
        assert len({i["id"] for i in incidents}) == len(incidents)
        assert any(i["rule"] == "RulesInvalid" and i["node"] == "node-a" for i in incidents)
        acked_here = next(i for i in incidents if i["id"] == b_incident["id"])
        assert acked_here["annotations"]["acknowledged_by"] == "sre"  # made while away
        assert 'sloguard_ingested_total{kind="actions",outcome="stored"}' in server.get(
            "/metrics").text
    finally:
        for agent in agents:
            if agent.proc.poll() is None:
                agent.terminate()
        if server.proc.poll() is None:
            server.terminate()


def test_server_refuses_to_start_without_an_ingest_token(tmp_path, sloguard_bin):
    config = tmp_path / "server.yaml"
    config.write_text("server:\n  max_body: 1MiB\n")
    done = subprocess.run([sloguard_bin, "server", "-c", str(config), "--data-dir",
                           str(tmp_path / "d")], capture_output=True, text=True, timeout=30,
                          env={**os.environ})
    assert done.returncode == 2 and "server.ingest_token" in done.stderr
