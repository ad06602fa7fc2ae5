"""`sloguard server` on PostgreSQL (server.database), against a real server started from
initdb by the `postgres_server` fixture (tests/support/postgres.py): the schema's numbered
migrations (from empty, again, by replicas starting at once, refused when the database is
newer than the code), and two real `sloguard server` replicas sharing one database while
batches are sent through both at once: either serves the same list, nothing duplicated, each
incident at its newest copy."""

from __future__ import annotations

import os
import random
import subprocess
import threading
from pathlib import Path

import httpx
import psycopg
import pytest
from test_agent_e2e import _free_port
from test_cluster_e2e import ServerProcess

from sloguard.core.audit import AuditEntry
from sloguard.core.config import ConfigError
from sloguard.core.incidents import Incident
from sloguard.settings import load_settings
from sloguard.store import StoreError
from sloguard.store.cluster_pg import PostgresClusterDB
from sloguard.store.pg_migrations import LATEST, STEPS, SchemaTooNew, migrate

INGEST = "ingest-secret-token"
PASSWORD_ENV = "SLOGUARD_TEST_PG_PASSWORD"


def _incident(node: str, n: int, updated_ns: int, state: str = "firing") -> dict:
    return {"id": f"{node}-inc-{n}", "fingerprint": f"fp-{n}", "rule": f"Rule{n % 3}",
            "group": "g", "severity": ("info", "warning", "critical")[n % 3], "node": node,
            "state": state, "series": {}, "started_ns": 1_000_000 + n * 1000,
            "updated_ns": updated_ns, "summary": f"copy of {updated_ns}"}


def _action(node: str, source_id: int) -> dict:
    return {"id": source_id, "time_ns": 2_000_000 + source_id, "node": node,
            "incident": f"{node}-inc-{source_id % 5}", "policy": "p", "rung": 1,
            "kind": "cpu_idle", "action": "apply", "dry_run": True, "status": "proposed",
            "target": "/be", "detail": "", "reason": "test"}


def _db(server, url: str, pool: int = 2) -> PostgresClusterDB:
    return PostgresClusterDB(url, server.password, pool, where="test")


def _versions(server, url: str) -> list[int]:
    with psycopg.connect(url, password=server.password) as conn:
        return [r[0] for r in conn.execute(
            "SELECT version FROM schema_migrations ORDER BY version")]


def test_migrations_from_empty_then_again(postgres_server, postgres_db):
    with psycopg.connect(postgres_db, password=postgres_server.password,
                         autocommit=True) as conn:
        assert migrate(conn, "test") == (0, [s.version for s in STEPS])
        assert migrate(conn, "test") == (LATEST, [])  # idempotent: nothing applied twice
        tables = {r[0] for r in conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public'")}
        indexes = {r[0] for r in conn.execute(
            "SELECT indexname FROM pg_indexes WHERE schemaname = 'public'")}
    assert {"schema_migrations", "incidents", "audit", "nodes"} <= tables
    assert {"incidents_by_time", "incidents_by_state", "incidents_by_node"} <= indexes
    assert _versions(postgres_server, postgres_db) == [s.version for s in STEPS]


def test_replicas_starting_at_once_migrate_once(postgres_server, postgres_db):
    """Without the advisory lock, the second CREATE TABLE fails (or the version row's insert
    does): every replica must start, and each step be recorded once."""
    opened, errors = [], []
    barrier = threading.Barrier(4)

    def start() -> None:
        barrier.wait()
        try:
            opened.append(_db(postgres_server, postgres_db, pool=1))
        except Exception as exc:
            errors.append(exc)

    threads = [threading.Thread(target=start) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for db in opened:
        db.close()
    assert not errors, errors
    assert len(opened) == 4
    assert _versions(postgres_server, postgres_db) == [s.version for s in STEPS]


def test_a_database_newer_than_the_code_is_refused(postgres_server, postgres_db, tmp_path,
                                                   sloguard_bin):
    _db(postgres_server, postgres_db).close()
    with psycopg.connect(postgres_db, password=postgres_server.password,
                         autocommit=True) as conn:
        conn.execute("INSERT INTO schema_migrations (version, description) VALUES (%s, %s)",
                     (LATEST + 1, "from the future"))
    with pytest.raises(SchemaTooNew, match=f"version {LATEST + 1}, newer than this "
                                           f"sloguard's {LATEST}"):
        _db(postgres_server, postgres_db)
    # the replica itself: a configuration error, exit 2, the reason on stderr, no password
    config = _server_config(tmp_path, postgres_db)
    done = subprocess.run([sloguard_bin, "server", "-c", str(config), "--data-dir",
                           str(tmp_path / "d"), "--listen", f"127.0.0.1:{_free_port()}"],
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, PASSWORD_ENV: postgres_server.password})
    assert done.returncode == 2, done.stderr
    assert "server.database" in done.stderr and "newer than this sloguard" in done.stderr
    assert postgres_server.password not in done.stderr + done.stdout
    assert _versions(postgres_server, postgres_db)[-1] == LATEST + 1  # left as it was


def test_ingest_is_idempotent_and_keeps_the_newest_copy(cluster_db):
    db = cluster_db
    incidents = [Incident(**_incident("n1", n, updated_ns=10)) for n in range(5)]
    actions = [(i, AuditEntry(**{k: v for k, v in _action("n1", i).items() if k != "id"}))
               for i in range(1, 4)]
    first = db.ingest("n1", incidents, actions, sent_ns=5, backlog={"incidents": 2})
    none_withdrawn = {"withdrawn": 0, "withdrawn_unknown": 0, "incidents_foreign": 0}
    assert first == {"incidents": 5, "incidents_stale": 0, "actions": 3,
                     "actions_duplicate": 0, **none_withdrawn}
    again = db.ingest("n1", incidents, actions, sent_ns=6, backlog={"incidents": 0})
    assert again == {"incidents": 5, "incidents_stale": 0, "actions": 0,
                     "actions_duplicate": 3, **none_withdrawn}  # the same updated_ns: again
    older = Incident(**{**_incident("n1", 0, updated_ns=9), "summary": "older"})
    newer = Incident(**{**_incident("n1", 1, updated_ns=11), "summary": "newer"})
    mixed = db.ingest("n1", [older, newer, newer], [], sent_ns=4, backlog={"incidents": 9})
    assert mixed == {"incidents": 1, "incidents_stale": 2, "actions": 0,
                     "actions_duplicate": 0, **none_withdrawn}
    assert db.incidents.get("n1-inc-0").summary == "copy of 10"
    assert db.incidents.get("n1-inc-1").summary == "newer"
    assert len(db.ledger.audit_log()) == 3
    seen = db.nodes()["n1"]
    assert (seen["incidents"], seen["actions"]) == (11, 3)
    assert seen["sent_ns"] == 6 and seen["backlog"] == {"incidents": 0}  # the later batch's
    assert db.incidents.counts_by_state()["firing"] == 5
    # keyset pages: together the whole list, newest first, nothing twice
    pages, before = [], None
    while page := db.incidents.query(limit=2, before=before):
        pages += page
        before = (page[-1].started_ns, page[-1].id)
    assert [i.id for i in pages] == [i.id for i in db.incidents.query(limit=100)]
    assert [i.id for i in pages] == [f"n1-inc-{n}" for n in range(4, -1, -1)]


def test_a_node_withdraws_its_own_incidents_only(cluster_db):
    """Withdrawals (a pending incident the node deleted) remove the sender's own incidents;
    another node's id, or one never received, is left alone and counted, in either store."""
    db = cluster_db
    db.ingest("n1", [Incident(**_incident("n1", n, updated_ns=10)) for n in range(3)], [],
              sent_ns=1, backlog={})
    db.ingest("n2", [Incident(**_incident("n2", 0, updated_ns=10))], [], sent_ns=1,
              backlog={})
    stored = db.ingest("n2", [], [], sent_ns=2, backlog={},
                       withdrawn=["n1-inc-0", "n2-inc-0", "never-sent"])
    assert (stored["withdrawn"], stored["withdrawn_unknown"]) == (1, 2)
    assert db.incidents.get("n1-inc-0") is not None and db.incidents.get("n2-inc-0") is None
    again = db.ingest("n2", [], [], sent_ns=3, backlog={}, withdrawn=["n2-inc-0"])
    assert (again["withdrawn"], again["withdrawn_unknown"]) == (0, 1)  # sent twice: once
    assert sorted(i.id for i in db.incidents.query(limit=10)) == [
        "n1-inc-0", "n1-inc-1", "n1-inc-2"]


def test_a_node_cannot_overwrite_another_nodes_incident_by_its_id(cluster_db):
    """An incident id another node holds is left alone (counted foreign), however new the
    copy: node identity would mean little if n2 could take n1's incident by sending its id."""
    db = cluster_db
    db.ingest("n1", [Incident(**_incident("n1", 0, updated_ns=10))], [], sent_ns=1,
              backlog={})
    taken = Incident(**{**_incident("n2", 0, updated_ns=99), "id": "n1-inc-0",
                        "summary": "n2's copy"})
    own = Incident(**_incident("n2", 1, updated_ns=10))
    stored = db.ingest("n2", [taken, own], [], sent_ns=2, backlog={})
    assert (stored["incidents"], stored["incidents_foreign"], stored["incidents_stale"]) == \
        (1, 1, 0)
    held = db.incidents.get("n1-inc-0")
    assert (held.node, held.summary) == ("n1", "copy of 10")
    assert db.incidents.get("n2-inc-1").node == "n2"
    assert db.nodes()["n2"]["incidents"] == 1
    # its own node still updates it
    newer = Incident(**_incident("n1", 0, updated_ns=11))
    assert db.ingest("n1", [newer], [], sent_ns=3, backlog={})["incidents"] == 1
    assert db.incidents.get("n1-inc-0").summary == "copy of 11"


def test_the_lists_filters_mean_the_same_on_either_store(cluster_db):
    """The incident list's and the audit log's filters (one SQL text for both stores,
    store/filters.py), each held to the answer computed here. A filter given as "" matches
    nothing in the incident list but is left out in the audit log, as the API has had them."""
    db = cluster_db
    incidents = [Incident(**_incident(node, n, updated_ns=10,
                                      state=("firing", "resolved")[n % 2]))
                 for node in ("n1", "n2") for n in range(6)]
    for node in ("n1", "n2"):
        actions = [(i, AuditEntry(**{**{k: v for k, v in _action(node, i).items() if k != "id"},
                                     "kind": ("cpu_idle", "cordon")[i % 2]}))
                   for i in range(1, 6)]
        db.ingest(node, [i for i in incidents if i.node == node], actions, sent_ns=1,
                  backlog={})
    newest = sorted(incidents, key=lambda i: (i.started_ns, i.id), reverse=True)

    def ids(**filters) -> list[str]:
        return [i.id for i in db.incidents.query(limit=100, **filters)]

    for column in ("state", "severity", "rule", "node"):
        for value in {getattr(i, column) for i in incidents}:
            assert ids(**{column: value}) == [
                i.id for i in newest if getattr(i, column) == value], (column, value)
        assert ids(**{column: ""}) == [], column
    span = {"since_ns": 1_002_000, "until_ns": 1_004_000}
    assert ids(**span) == ["n2-inc-3", "n1-inc-3", "n2-inc-2", "n1-inc-2"]
    assert ids(**span, state="firing", node="n2") == ["n2-inc-2"]
    assert ids(before=(1_003_000, "n2-inc-3"), since_ns=1_002_000) == [
        "n1-inc-3", "n2-inc-2", "n1-inc-2"]
    assert [i.id for i in db.incidents.query(limit=3)] == [i.id for i in newest[:3]]

    def audit(**filters) -> list[tuple[str, int, str]]:
        return [(e.node, e.time_ns, e.kind) for e in db.ledger.audit_log(**filters)]

    everything = [(node, 2_000_000 + i, ("cpu_idle", "cordon")[i % 2])
                  for node in ("n2", "n1") for i in range(5, 0, -1)]  # the newest id first
    assert audit() == everything
    assert audit(kind="", incident="") == everything
    assert audit(kind="cordon") == [e for e in everything if e[2] == "cordon"]
    assert audit(incident="n1-inc-2") == [("n1", 2_000_002, "cpu_idle")]
    assert audit(since_ns=2_000_004) == [e for e in everything if e[1] >= 2_000_004]
    assert audit(since_ns=2_000_002, kind="cordon", limit=3) == [
        ("n2", 2_000_005, "cordon"), ("n2", 2_000_003, "cordon"), ("n1", 2_000_005, "cordon")]
    assert audit(kind="nothing-of-that-kind") == []


def _server_config(tmp_path: Path, url: str) -> Path:
    config = tmp_path / "server.yaml"
    config.write_text(f"ui:\n  token: ui-token\nserver:\n  ingest_token: {INGEST}\n"
                      f"  database: {url}\n  database_password_env: {PASSWORD_ENV}\n"
                      "  database_pool: 3\n")
    return config


def test_two_replicas_on_one_database_serve_the_same_list(postgres_server, postgres_db,
                                                          tmp_path, sloguard_bin,
                                                          monkeypatch):
    monkeypatch.setenv(PASSWORD_ENV, postgres_server.password)
    config = _server_config(tmp_path, postgres_db)
    replicas = [ServerProcess(sloguard_bin, config, tmp_path / f"data-{n}",
                              tmp_path / f"server-{n}.log", _free_port()) for n in range(2)]
    logs = [r.log for r in replicas]
    try:
        # Four nodes each send 30 incidents in versions 1..3 and 40 audit entries, in batches
        # that go to both replicas at once, shuffled: resends and out-of-order copies.
        rng = random.Random(24)
        batches = []
        for node in ("n1", "n2", "n3", "n4"):
            for version in (1, 2, 3):
                incidents = [_incident(node, n, updated_ns=version * 100 + n)
                             for n in range(30)]
                actions = [_action(node, i) for i in range(1, 41)]
                for start in range(0, 30, 10):
                    batches.append({"node": node, "sent_ns": version,
                                    "incidents": incidents[start:start + 10],
                                    "actions": actions[start:start + 20]})
        batches = batches * 2
        rng.shuffle(batches)
        answers, failures = [], []
        headers = {"Authorization": f"Bearer {INGEST}"}

        def send(replica: ServerProcess, share: list[dict]) -> None:
            with httpx.Client(base_url=replica.url, timeout=30, headers=headers) as client:
                for body in share:
                    response = client.post("/api/v1/ingest", json=body)
                    if response.status_code != 200:
                        failures.append(response.text)
                    else:
                        answers.append(response.json())

        threads = [threading.Thread(target=send, args=(replicas[n % 2], batches[n::4]))
                   for n in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not failures, failures[:3]
        assert sum(a["incidents"] + a["incidents_stale"] for a in answers) == 4 * 90 * 2
        assert sum(a["actions"] for a in answers) == 4 * 40  # each entry stored once

        lists = [r.get("/api/incidents?limit=1000").json()["incidents"] for r in replicas]
        assert lists[0] == lists[1]
        assert len(lists[0]) == len({i["id"] for i in lists[0]}) == 4 * 30
        for item in lists[0]:  # the newest copy, whatever order the copies came in
            n = int(item["id"].rsplit("-", 1)[1])
            assert item["updated_ns"] == 300 + n and item["summary"] == f"copy of {300 + n}"
        actions = [r.get("/api/actions?limit=5000").json()["actions"] for r in replicas]
        assert actions[0] == actions[1]
        assert sorted((a["node"], a["time_ns"]) for a in actions[0]) == sorted(
            (node, 2_000_000 + i) for node in ("n1", "n2", "n3", "n4") for i in range(1, 41))
        # keyset pages through the API, from either replica, make up the same list
        paged, before = [], None
        for n in range(100):
            query = "/api/incidents?limit=7" + (f"&before={before}" if before else "")
            page = replicas[n % 2].get(query).json()
            paged += page["incidents"]
            before = page.get("next")
            if not before:
                break
        assert [i["id"] for i in paged] == [i["id"] for i in lists[0]]
        # what PostgreSQL cannot hold is answered as nothing found, not a 500
        assert replicas[1].get("/api/incidents?before=9999999999999999999:x").status_code == 422
        assert replicas[1].get("/api/incidents?rule=a%00b").json()["incidents"] == []
        assert replicas[1].get("/api/incidents/a%00b").status_code == 404
        assert replicas[1].get("/api/actions?incident=a%00b").json()["actions"] == []
        # what a node last reported is in the database, so both replicas show every node,
        # n5 too, which only ever reached the first
        five = httpx.post(f"{replicas[0].url}/api/v1/ingest", headers=headers, timeout=30,
                          json={"node": "n5", "sent_ns": 3, "incidents": [], "actions": []})
        assert five.status_code == 200, five.text
        for replica in replicas:
            nodes = {c["name"]: c for c in replica.get("/readyz").json()["components"]
                     if c["name"].startswith("node:")}
            assert set(nodes) == {f"node:n{n}" for n in range(1, 6)}
            assert all(c["ok"] and c["details"]["sent_ns"] == 3 for c in nodes.values())
        assert all(r.terminate() == 0 for r in replicas)
        assert not any((tmp_path / f"data-{n}" / "nodes.json").exists() for n in range(2))
        for log in logs:
            assert postgres_server.password not in log.read_text()
    finally:
        for replica in replicas:
            if replica.proc.poll() is None:
                replica.terminate()


def test_bad_database_settings_are_named_by_field(tmp_path, monkeypatch):
    def load(server: str):
        config = tmp_path / "s.yaml"
        config.write_text(f"server:\n  ingest_token: t\n{server}")
        return load_settings(config)

    with pytest.raises(ConfigError) as refused:
        load("  database: postgresql://u:hunter2secret@db:5432/sg\n")
    assert "server.database" in str(refused.value) and "password" in str(refused.value)
    assert "hunter2secret" not in str(refused.value)
    with pytest.raises(ConfigError, match=r"server\.database: must be a postgresql://"):
        load("  database: mysql://db/sg\n")
    with pytest.raises(ConfigError, match="database_password"):
        load("  database_password_env: X\n")  # a password without a database
    settings = load(f"  database: postgresql://u@127.0.0.1:1/sg\n"
                    f"  database_password_file: {tmp_path / 'absent'}\n").settings
    from sloguard.cluster import open_cluster_db

    with pytest.raises(StoreError, match=r"server\.database_password_file .*absent"):
        open_cluster_db(settings)
    assert settings.server.database_where() == "PostgreSQL 127.0.0.1:1/sg"
