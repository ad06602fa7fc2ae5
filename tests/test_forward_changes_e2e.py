"""The forwarder against a real `sloguard server`: it sends changes (not every firing incident
every interval), withdraws the incidents its node deleted (only its own), halves a batch the
server refuses as too large and passes over, counted and logged, an item the server refuses
alone, and a kill between the server's 200 and the cursor's write duplicates nothing."""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
from test_agent_e2e import AgentProcess, _free_port
from test_cluster_e2e import INGEST, UI, ServerProcess, wait_for

from sloguard.actuators.ledger import AuditEntry, Ledger
from sloguard.core.incidents import FIRING, PENDING, Incident
from sloguard.forwarder import ForwardConfig, Forwarder
from sloguard.store.incidents_db import IncidentStore

SMALL_BODY = 3000  # the server's max_body in these tests: a handful of incidents a request


def _server(tmp_path: Path, binary: str, max_body: int | None = None) -> ServerProcess:
    config = tmp_path / "server.yaml"
    config.write_text(f"ui:\n  token: {UI}\nserver:\n  ingest_token_env: SLOGUARD_TEST_INGEST\n"
                      + (f"  max_body: {max_body}\n" if max_body else ""))
    return ServerProcess(binary, config, tmp_path / "server-data", tmp_path / "server.log",
                         _free_port())


def _incident(n: int, node: str = "node-a", state: str = FIRING, summary: str = "") -> Incident:
    now = time.time_ns()
    return Incident(id=f"{node}-inc-{n:03d}", fingerprint=f"fp-{n}", rule="R", group="g",
                    severity="warning", node=node, state=state, series={"n": str(n)},
                    started_ns=now, updated_ns=now, summary=summary or f"incident {n}")


def _audit(n: int, node: str = "node-a") -> AuditEntry:
    return AuditEntry(time.time_ns(), node, f"{node}-inc-{n:03d}", "p", 0, "notify", "apply",
                      True, "skipped", "t", "d", "r")


def _metric(server: ServerProcess, name: str, **labels: str) -> float:
    shown = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    match = re.search(rf"^{name}\{{{re.escape(shown)}\}} (\S+)$", server.get("/metrics").text,
                      re.M)
    return float(match.group(1)) if match else 0.0


def _held(server: ServerProcess) -> dict[str, dict]:
    return {i["id"]: i for i in server.get("/api/incidents?limit=1000").json()["incidents"]}


class Node:
    """An agent's stores and forwarder, without the agent: the test decides what changes."""

    def __init__(self, tmp_path: Path, name: str, url: str, **cfg) -> None:
        home = tmp_path / name
        home.mkdir(exist_ok=True)
        self.home, self.name, self.url, self.cfg = home, name, url, cfg
        self.incidents = IncidentStore(home / "incidents.db")
        self.ledger = Ledger(home / "actuators.db")
        self.forwarder = self.start()

    def start(self, forwarder: type[Forwarder] = Forwarder) -> Forwarder:
        """A forwarder as a (re)started agent builds it: cursors read from the data dir."""
        cfg = ForwardConfig(url=self.url, token=INGEST, **self.cfg)
        self.forwarder = forwarder(cfg, self.name, self.incidents, self.ledger, self.home)
        return self.forwarder

    def cursor(self) -> dict:
        return json.loads((self.home / "forward-cursor.json").read_text())


@pytest.fixture
def small_server(tmp_path, sloguard_bin, monkeypatch):
    monkeypatch.setenv("SLOGUARD_TEST_INGEST", INGEST)
    server = _server(tmp_path, sloguard_bin, SMALL_BODY)
    yield server
    server.terminate()


def test_a_batch_too_large_is_halved_and_an_item_too_large_alone_passed_over(
        tmp_path, small_server, caplog):
    server = small_server
    caplog.set_level(logging.INFO, logger="sloguard.forwarder")
    # the forwarder does not know the server's limit: the 413s teach it
    node = Node(tmp_path, "node-a", server.url, max_body=16 * 1024**2)
    for n in range(12):
        node.incidents.save(_incident(n))
        if n == 5:  # in the middle: nothing behind it may wait on it
            node.incidents.save(_incident(99, summary="x" * (2 * SMALL_BODY)))
        node.ledger.audit(_audit(n))
    everything = sum(len(json.dumps(c.incident.to_dict()))
                     for c in node.incidents.changed_since(0, limit=1000))
    assert everything > 3 * SMALL_BODY  # more than one request's worth

    node.forwarder.round()
    assert node.forwarder.last_error == "", node.forwarder.last_error
    held = _held(server)
    assert set(held) == {f"node-a-inc-{n:03d}" for n in range(12)}
    assert len(server.get("/api/actions?limit=100").json()["actions"]) == 12
    status = node.forwarder.status().details
    assert status["skipped"] == {"incidents": 1, "withdrawn": 0, "actions": 0}
    assert status["skipped_latest"][0]["id"] == "node-a-inc-099"
    assert status["sent"]["incidents"] == 12 and status["sent"]["actions"] == 12
    assert status["max_bytes"] < 2 * SMALL_BODY  # lowered by the 413s it met
    assert any("node-a-inc-099" in r.getMessage() and "too large" in r.getMessage()
               for r in caplog.records if r.levelno == logging.ERROR)
    cursor = node.cursor()
    assert cursor["incidents"] == node.incidents.last_seq()
    assert cursor["actions"] == node.ledger.last_audit_id()
    assert cursor["skipped"][0]["id"] == "node-a-inc-099"  # kept across a restart

    # never retried: more rounds send nothing and are refused nothing more
    refused = _metric(server, "sloguard_ingest_refused_total", reason="too_large")
    assert refused >= 2
    for _ in range(3):
        node.forwarder.round()
    assert _metric(server, "sloguard_ingest_refused_total", reason="too_large") == refused
    assert node.forwarder.status().details["backlog"] == {"incidents": 0, "actions": 0}

    # its next change, small enough, is sent as any other
    node.incidents.save(_incident(99, summary="smaller now"))
    node.forwarder.round()
    assert _held(server)["node-a-inc-099"]["summary"] == "smaller now"

    # a forwarder told the server's limit splits before sending: not one 413
    other = Node(tmp_path, "node-b", server.url, max_body=SMALL_BODY)
    for n in range(12):
        other.incidents.save(_incident(n, node="node-b"))
    other.forwarder.round()
    assert other.forwarder.last_error == ""
    assert {i for i in _held(server) if i.startswith("node-b")} == {
        f"node-b-inc-{n:03d}" for n in range(12)}
    assert _metric(server, "sloguard_ingest_refused_total", reason="too_large") == refused


def test_a_body_cut_off_unread_is_halved_too(tmp_path, sloguard_bin, monkeypatch):
    """A server refusing a body by its Content-Length closes the connection before a large one
    is written: the client sees a reset, not the 413 (here from 20 MB on loopback)."""
    monkeypatch.setenv("SLOGUARD_TEST_INGEST", INGEST)
    server = _server(tmp_path, sloguard_bin, 1024**2)
    try:
        node = Node(tmp_path, "node-a", server.url, max_body=64 * 1024**2)
        for n in range(200):
            node.incidents.save(_incident(n, summary="x" * 100_000))
        node.forwarder.round()
        assert node.forwarder.last_error == "", node.forwarder.last_error
        assert len(_held(server)) == 200
        assert node.forwarder.status().details["skipped"]["incidents"] == 0
    finally:
        server.terminate()


def test_an_item_the_server_refuses_as_invalid_is_passed_over_not_retried(
        tmp_path, sloguard_bin, monkeypatch, caplog):
    """An audit entry over the server's 10,000-character field limit is refused with a 422:
    the batch is halved until it is alone, it is passed over with the server's reason, and
    the entries and incidents around it arrive (it used to be retried for ever, holding back
    everything behind it)."""
    monkeypatch.setenv("SLOGUARD_TEST_INGEST", INGEST)
    server = _server(tmp_path, sloguard_bin)
    caplog.set_level(logging.INFO, logger="sloguard.forwarder")
    try:
        node = Node(tmp_path, "node-a", server.url)
        for n in range(6):
            node.incidents.save(_incident(n))
            node.ledger.audit(_audit(n))
            if n == 2:
                long = _audit(n)
                long.detail = "d" * 20_000
                node.ledger.audit(long)
        node.forwarder.round()
        assert node.forwarder.last_error == "", node.forwarder.last_error
        assert set(_held(server)) == {f"node-a-inc-{n:03d}" for n in range(6)}
        actions = server.get("/api/actions?limit=100").json()["actions"]
        assert len(actions) == 6 and all(len(a["detail"]) < 100 for a in actions)
        status = node.forwarder.status().details
        assert status["skipped"] == {"incidents": 0, "withdrawn": 0, "actions": 1}
        skipped = status["skipped_latest"][0]
        assert skipped["refused"] == "invalid" and "HTTP 422" in skipped["why"]
        assert "actions.0.detail" in skipped["why"]  # the server's detail names the field
        assert any("refused alone as invalid" in r.getMessage()
                   for r in caplog.records if r.levelno == logging.ERROR)
        refused = _metric(server, "sloguard_ingest_refused_total", reason="invalid")
        assert refused >= 1
        for _ in range(2):  # never retried
            node.forwarder.round()
        assert _metric(server, "sloguard_ingest_refused_total", reason="invalid") == refused
        assert node.forwarder.backlog() == {"incidents": 0, "actions": 0}
    finally:
        server.terminate()


@pytest.mark.parametrize("code", [413, 422])
def test_a_proxy_refusing_everything_loses_nothing(tmp_path, code):
    """A 413 (or 422) for every request (a misconfigured proxy, a server that refuses this
    agent's bodies) is not about any one item: nothing is passed over, the cursor stays, the
    round fails and is retried."""

    class Refuses(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("content-length", 0)))
            self.send_response(code)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args) -> None:
            pass

    proxy = ThreadingHTTPServer(("127.0.0.1", 0), Refuses)
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    try:
        node = Node(tmp_path, "node-a", f"http://127.0.0.1:{proxy.server_port}")
        for n in range(3):
            node.incidents.save(_incident(n))
        node.forwarder.round()
        assert f"HTTP {code}" in node.forwarder.last_error
        assert node.forwarder.status().details["skipped"]["incidents"] == 0
        assert node.forwarder.cursor["incidents"] == 0
        assert node.forwarder.backlog()["incidents"] == 3
    finally:
        proxy.shutdown()


class KilledAfterThePost(BaseException):
    """The agent dies after the server answered 200, before the cursor is on disk."""


def test_killed_before_the_cursor_is_written_nothing_is_lost_nor_duplicated(
        tmp_path, small_server):
    server = small_server

    class DiesAtTheCursor(Forwarder):
        def _save_cursor(self) -> None:
            raise KilledAfterThePost

    node = Node(tmp_path, "node-a", server.url, max_body=SMALL_BODY)
    for n in range(3):
        node.incidents.save(_incident(n))
        node.ledger.audit(_audit(n))
    dying = node.start(DiesAtTheCursor)
    with pytest.raises(KilledAfterThePost):
        dying.round()
    assert len(_held(server)) >= 1  # the server took the first request
    node.start().round()  # the restarted agent, from the cursor on disk
    assert set(_held(server)) == {f"node-a-inc-{n:03d}" for n in range(3)}
    actions = server.get("/api/actions?limit=100").json()["actions"]
    assert sorted(a["incident"] for a in actions) == [f"node-a-inc-{n:03d}" for n in range(3)]
    assert _metric(server, "sloguard_ingested_total", kind="actions",
                   outcome="duplicate") >= 1  # it was sent again, and kept once
    assert node.cursor()["incidents"] == node.incidents.last_seq()


def test_a_deleted_incident_is_withdrawn_only_from_its_own_node(tmp_path, small_server):
    server = small_server
    node = Node(tmp_path, "node-a", server.url, max_body=SMALL_BODY)
    node.incidents.save(_incident(1, state=PENDING))
    node.incidents.save(_incident(2))
    node.forwarder.round()
    assert set(_held(server)) == {"node-a-inc-001", "node-a-inc-002"}

    # another node's forwarder cannot withdraw node-a's incident
    answer = httpx.post(f"{server.url}/api/v1/ingest", timeout=5,
                        headers={"Authorization": f"Bearer {INGEST}"},
                        json={"node": "node-b", "withdrawn": ["node-a-inc-002"]})
    assert answer.status_code == 200 and answer.json()["withdrawn_unknown"] == 1
    assert "node-a-inc-002" in _held(server)

    assert node.incidents.delete("node-a-inc-001")  # a pending incident that never fired
    assert node.forwarder.backlog()["incidents"] == 1
    node.forwarder.round()
    assert set(_held(server)) == {"node-a-inc-002"}
    assert node.forwarder.status().details["sent"]["withdrawn"] == 1
    assert _metric(server, "sloguard_ingested_total", kind="incidents",
                   outcome="withdrawn") == 1


RULES = """\
groups:
  - name: changes
    rules:
      - alert: AlwaysLoaded
        expr: node_load
        field: load1
        aggregate: last
        window: 2s
        params: {above: -1}
        for: 0s
        severity: warning
        annotations:
          summary: "load {{ $value }}"
      - alert: NeverFires
        expr: node_load
        field: load1
        aggregate: last
        window: 2s
        params: {above: -1}
        for: 1h
        severity: info
"""


def test_a_real_agent_sends_changes_and_withdraws_a_dropped_pending_incident(
        tmp_path, sloguard_bin, monkeypatch):
    """One firing and one pending incident, both saved on every 300 ms evaluation: the server
    hears of them when they change, not every interval. A restarted agent drops its pending
    incident (its `for` would span the downtime): the server drops it too."""
    monkeypatch.setenv("SLOGUARD_TEST_INGEST", INGEST)
    server = _server(tmp_path, sloguard_bin)
    home = tmp_path / "node-a"
    (home / "rules").mkdir(parents=True)
    (home / "rules" / "r.yaml").write_text(RULES)
    config = home / "sloguard.yaml"
    config.write_text(
        f"node_name: node-a\ninterval: 300ms\nrules:\n  paths: [{home / 'rules'}]\n"
        f"collectors:\n  cgroups: {{enabled: false}}\nui:\n  token: {UI}\n"
        f"forward:\n  url: {server.url}\n  token_env: SLOGUARD_TEST_INGEST\n"
        "  interval: 300ms\n")  # forward.refresh: its default, 60 s
    agent = None
    try:
        agent = AgentProcess(sloguard_bin, config, home / "data", home / "agent.log")
        logs = (tmp_path / "server.log", agent.log)

        def both_held():
            held = _held(server).values()
            if {i["state"] for i in held} == {FIRING, PENDING}:
                return {i["rule"]: i for i in held}
            return None

        first = wait_for(both_held, 30, "the server never held both incidents", *logs)
        time.sleep(2)  # the first rungs of a firing incident are news; let them pass
        stored = _metric(server, "sloguard_ingested_total", kind="incidents", outcome="stored")
        evaluations = agent.get("/metrics").text
        time.sleep(6)  # 20 evaluations and 20 forwarding intervals
        more = _metric(server, "sloguard_ingested_total", kind="incidents",
                       outcome="stored") - stored
        assert evaluations != agent.get("/metrics").text  # the agent went on evaluating
        # each incident was saved on each of the 20 evaluations: every interval would be 40
        assert more <= 2, more
        assert len(agent.incidents(limit=10)) == 2

        assert agent.terminate() == 0
        agent = AgentProcess(sloguard_bin, config, home / "data", home / "agent.log")
        pending_id = first["NeverFires"]["id"]

        def withdrawn():
            held = _held(server)
            # exactly the agent's incidents, in the same states (the firing one's evidence
            # may trail by forward.refresh)
            return (pending_id not in held and first["AlwaysLoaded"]["id"] in held
                    and {(i["id"], i["state"]) for i in held.values()}
                    == {(i["id"], i["state"]) for i in agent.incidents(limit=10)})

        wait_for(withdrawn, 30, "the dropped pending incident is still on the server", *logs)
        assert _metric(server, "sloguard_ingested_total", kind="incidents",
                       outcome="withdrawn") == 1
    finally:
        if agent is not None and agent.proc.poll() is None:
            agent.terminate()
        server.terminate()


def test_the_wait_between_rounds_backs_off_and_is_spread(tmp_path):
    """next_wait is what _loop waits and what benchmarks/fleet.py schedules 1,000 forwarders
    by: the interval, doubled for each failure in a row, never past MAX_BACKOFF_S, each within
    +-JITTER of that and not the same every time (agents held up together must drift apart);
    a taken round's interval counts from its start, so a slow server does not move its phase."""
    from sloguard.forwarder import JITTER, MAX_BACKOFF_S

    node = Node(tmp_path, "node-a", "http://127.0.0.1:9", interval=2.0)
    for failures, nominal in ((0, 2.0), (1, 2.0), (2, 4.0), (3, 8.0), (6, MAX_BACKOFF_S),
                              (50, MAX_BACKOFF_S)):
        node.forwarder.failures = failures
        waits = [node.forwarder.next_wait() for _ in range(50)]
        assert all(nominal * (1 - JITTER) <= w <= nominal * (1 + JITTER) for w in waits)
        assert len(set(waits)) > 40, waits
    # after a round that took 1 s (a slow server), the next starts an interval after its
    # start, not its end; after one longer than the interval, half an interval after its end
    node.forwarder.failures = 0
    assert all(2.0 * (1 - JITTER) - 1 <= node.forwarder.next_wait(1.0) <= 2.0 * (1 + JITTER) - 1
               for _ in range(50))
    assert node.forwarder.next_wait(30.0) == 1.0
    node.forwarder.failures = 2  # a failed round: backoff from its end, however long it took
    assert all(4.0 * (1 - JITTER) <= node.forwarder.next_wait(9.0) <= 4.0 * (1 + JITTER)
               for _ in range(50))
