"""The cluster front page's fleet summary (store/cluster_db.py's three queries, ui/fleet.py's
API), against both stores: SQLite in a temp dir, and a real PostgreSQL from initdb
(tests/support/postgres.py). Incidents of several nodes, with suspects, are ingested through
the stores' own ingest; every expected figure is computed here, in Python, from the same
incidents (names by core/suspects.py's workload_name, which the stores' SQL reimplements), so
the SQL is checked against an independent answer, not against itself."""

from __future__ import annotations

import random
import time
from collections import Counter, defaultdict

import pytest
from fastapi.testclient import TestClient

from sloguard.core.incidents import SEVERITIES, Evidence, Incident
from sloguard.core.suspects import Suspect
from sloguard.store import pg_migrations
from sloguard.store.cluster_db import MAX_BUCKETS, MAX_TOP, fleet_summary

S = 10**9
H = 3600 * S
NOW = 1_800_000_000 * S
HOSTILE_NODE = '<script>window.__xss=1</script>node'
HOSTILE_POD = '<img src=x onerror="window.__xss=2">'
# Workloads as attribution names them: every branch of workload_name.
WORKLOADS = [
    ("/kubepods/besteffort/pod1/c1", {"pod": "batch-1", "namespace": "jobs"}),
    ("/kubepods/besteffort/pod1/c2", {"pod": "batch-1", "namespace": "jobs"}),  # same pod
    ("/kubepods/besteffort/pod2", {"pod": "spark-7"}),  # no namespace
    ("/be/declared", {"workload": "nightly-etl", "pod": ""}),
    ("/be/bare", {}),  # only its cgroup
    ("/be/override", {"cgroup": "/not/this/one", "workload": ""}),
    ("/kubepods/besteffort/pod3", {"pod": HOSTILE_POD, "namespace": "/evil"}),
    ("/kubepods/besteffort/pod4", {"pod": "ñandú-0", "namespace": "ü"}),
]


def _suspect(cgroup: str, rank: int, workload: dict[str, str]) -> dict:
    return {"cgroup": cgroup, "score": 0.9 - rank / 10, "rank": rank, "resource": "cpu",
            "workload": dict(workload), "clues": []}


def _incident(node: str, n: int, started_ns: int, state: str, severity: str,
              suspects: list[dict], fired_ns: int | None = None) -> Incident:
    return Incident(id=f"{node}-{n:05d}", fingerprint=f"fp-{n}", rule="LSSlow", group="ls",
                    severity=severity, node=node, state=state, series={"pod": "web"},
                    started_ns=started_ns, updated_ns=started_ns + S, fired_ns=fired_ns,
                    summary="slow", suspects=suspects)


def _name(suspect: dict) -> str:
    return Suspect.from_dict(suspect).name


def _fleet(seed: int, nodes: list[str], per_node: int) -> list[Incident]:
    """Incidents over the last 30 h (some before the 24 h range), of every state and
    severity, most with 0-3 suspects drawn from WORKLOADS."""
    rng = random.Random(seed)
    out = []
    for node in nodes:
        for n in range(rng.randint(per_node // 2, per_node)):
            started = NOW - rng.randint(1, 30 * 3600) * S
            state = rng.choice(("firing", "resolved", "resolved", "pending"))
            fired = started + rng.randint(0, 600) * S if state != "pending" else None
            if state == "firing" and rng.random() < 0.2:
                fired = None  # an older agent's incident: firing since its start
            picked = rng.sample(WORKLOADS, rng.choice((0, 1, 1, 2, 3)))
            suspects = [_suspect(cg, rank + 1, w) for rank, (cg, w) in enumerate(picked)]
            out.append(_incident(node, n, started, state, rng.choice(SEVERITIES), suspects,
                                 fired))
    return out


def _ingest(db, incidents: list[Incident]) -> None:
    by_node = defaultdict(list)
    for incident in incidents:
        by_node[incident.node].append(incident)
    for node, batch in by_node.items():
        for k in range(0, len(batch), 200):
            db.ingest(node, batch[k:k + 200], [], sent_ns=NOW, backlog={})


def _expected(incidents: list[Incident], since: int, until: int, width: int, buckets: int):
    """Each section as the page defines it, computed from the incidents themselves."""
    firing = defaultdict(list)
    for i in incidents:
        if i.state == "firing":
            firing[i.node].append(i)
    suffering = sorted(
        ((node, len(found), max(SEVERITIES.index(i.severity) for i in found),
          min(i.fired_ns or i.started_ns for i in found)) for node, found in firing.items()),
        key=lambda r: (-r[2], -r[1], r[3], r[0]))
    suffering = [(node, n, SEVERITIES[worst], since_ns) for node, n, worst, since_ns in suffering]
    counts: dict[str, list[int]] = defaultdict(lambda: [0] * buckets)
    first, named, nodes = Counter(), defaultdict(set), defaultdict(set)
    for i in incidents:
        if not since <= i.started_ns < until:
            continue
        counts[i.node][(i.started_ns - since) // width] += 1
        names = [_name(s) for s in i.suspects]
        if names:
            first[names[0]] += 1
        for name in names:
            named[name].add(i.id)
            nodes[name].add(i.node)
    per_node = sorted(((node, sum(c), c) for node, c in counts.items()),
                      key=lambda r: (-r[1], r[0]))
    culprits = sorted(((w, first[w], len(named[w]), len(nodes[w])) for w in named),
                      key=lambda r: (-r[1], -r[2], r[0]))
    return suffering, per_node, culprits


@pytest.mark.parametrize("limit", [3, 50])
def test_the_summary_is_what_the_incidents_say(cluster_db, limit):
    nodes = [f"node-{k}" for k in range(7)] + [HOSTILE_NODE]
    incidents = _fleet(24, nodes, 40)
    _ingest(cluster_db, incidents)
    since, until, buckets = NOW - 24 * H, NOW, 24
    suffering, per_node, culprits = _expected(incidents, since, until, H, buckets)
    assert len(suffering) > 3 and len(per_node) > 3 and len(culprits) > 3  # limits bite
    summary = fleet_summary(cluster_db, since, until, buckets, limit)

    assert [(n.node, n.firing, n.worst, n.since_ns) for n in summary.suffering] == \
        suffering[:limit]
    assert summary.suffering_total == len(suffering)

    timeline = summary.timeline
    assert (timeline.since_ns, timeline.bucket_ns, timeline.buckets) == (since, H, buckets)
    assert [(n.node, n.total, n.counts) for n in timeline.nodes] == per_node[:limit]
    rest = per_node[limit:]
    assert timeline.other_nodes == len(rest)
    assert timeline.other.counts == [sum(r[2][b] for r in rest) for b in range(buckets)]
    assert timeline.total == sum(1 for i in incidents if since <= i.started_ns < until)

    assert [(c.workload, c.first, c.named, c.nodes) for c in summary.culprits] == \
        culprits[:limit]
    assert summary.culprits_total == len(culprits)
    # the names are workload_name's: every branch of it, the pod named by two cgroups once
    assert {c[0] for c in culprits} <= {_name(_suspect(cg, 1, w)) for cg, w in WORKLOADS}
    assert "jobs/batch-1" in {c[0] for c in culprits}


def test_ranges_outside_and_buckets_and_limits_are_bounded(cluster_db):
    incidents = _fleet(7, [f"n{k:03d}" for k in range(120)], 4)
    # a hundred and twenty workloads, each named first once, and one named by every node
    for k, incident in enumerate(incidents):
        incident.suspects = [_suspect(f"/be/w{k % 120}", 1, {"workload": f"w{k % 120}"}),
                             _suspect("/be/everywhere", 2, {"workload": "everywhere"})]
    _ingest(cluster_db, incidents)
    summary = fleet_summary(cluster_db, NOW - 30 * H, NOW + S, 10_000, 10_000)
    assert len(summary.suffering) <= MAX_TOP and len(summary.timeline.nodes) == MAX_TOP
    assert summary.timeline.buckets == MAX_BUCKETS
    assert all(len(n.counts) == MAX_BUCKETS for n in summary.timeline.nodes)
    assert len(summary.culprits) == MAX_TOP and summary.culprits_total == 121
    assert summary.timeline.total == len(incidents) and summary.timeline.other_nodes == 70
    # the most named first come first: "everywhere", named by every incident but never
    # first, is counted among the 121 and ranked after them
    assert "everywhere" not in {c.workload for c in summary.culprits}
    firsts = Counter(f"w{k % 120}" for k in range(len(incidents)))
    want = sorted(firsts.items(), key=lambda kv: (-kv[1], kv[0]))[:MAX_TOP]
    assert [(c.workload, c.first, c.named) for c in summary.culprits] == [
        (w, n, n) for w, n in want]
    last = fleet_summary(cluster_db, NOW - 30 * H, NOW + S, 1, 1)
    assert [c.workload for c in last.culprits] == [want[0][0]]
    # a range with nothing in it: empty lists, no error
    empty = fleet_summary(cluster_db, NOW + H, NOW + 2 * H, 4, 5)
    assert empty.timeline.nodes == [] and empty.timeline.total == 0 and empty.culprits == []
    assert empty.timeline.other.counts == [0, 0, 0, 0]


def test_documents_json_cannot_hold_are_stored_and_summarised(cluster_db):
    """jsonb refuses \\u0000 and NaN, SQLite's JSON NaN: the incident is stored all the same
    (its suspects unread), and the summary still answers."""
    suspects = [_suspect("/be/a", 1, {"workload": "a"})]
    nul = _incident("n1", 1, NOW - H, "firing", "critical", suspects, NOW - H)
    nul.summary = "nul \x00 inside"
    nan = _incident("n1", 2, NOW - H, "firing", "warning", suspects, NOW - 2 * H)
    nan.evidence = [Evidence(NOW - H, float("nan"), 1.0)]
    fine = _incident("n2", 3, NOW - H, "firing", "info", suspects, NOW - 3 * H)
    stored = cluster_db.ingest("n1", [nul, nan], [], NOW, {})
    cluster_db.ingest("n2", [fine], [], NOW, {})
    assert stored["incidents"] == 2
    assert cluster_db.incidents.get(nul.id).summary == "nul \x00 inside"
    summary = fleet_summary(cluster_db, NOW - 24 * H, NOW, 24, 10)
    firing = {n.node: (n.firing, n.worst) for n in summary.suffering}
    assert firing == {"n1": (2, "critical"), "n2": (1, "info")}
    assert summary.timeline.total == 3
    # the NUL's document is JSON to SQLite, not to jsonb: named once or twice, never lost
    assert summary.culprits[0].workload == "a" and summary.culprits[0].first in (1, 2)


def test_a_database_of_step_two_gets_its_summary_columns(postgres_server, postgres_db,
                                                         monkeypatch):
    """Step 3 adds generated columns to a table that already holds incidents: they are
    filled from the documents already there, not only for new ones."""
    from sloguard.store.cluster_pg import PostgresClusterDB

    with monkeypatch.context() as patch:
        patch.setattr(pg_migrations, "STEPS", pg_migrations.STEPS[:2])
        patch.setattr(pg_migrations, "LATEST", 2)
        old = PostgresClusterDB(postgres_db, postgres_server.password, 1, where="test")
        old.ingest("n1", [_incident("n1", 1, NOW - H, "firing", "warning",
                                    [_suspect(cg, r + 1, w)
                                     for r, (cg, w) in enumerate(WORKLOADS[:3])], NOW - H)],
                   [], NOW, {})
        old.close()
    db = PostgresClusterDB(postgres_db, postgres_server.password, 1, where="test")
    try:
        summary = fleet_summary(db, NOW - 2 * H, NOW, 2, 10)
        assert [(c.workload, c.first, c.named) for c in summary.culprits] == [
            ("jobs/batch-1", 1, 1), ("spark-7", 0, 1)]
        assert summary.suffering[0].since_ns == NOW - H
        with db.pool.connection() as conn:
            assert conn.execute("SELECT max(version) FROM schema_migrations").fetchone()[0] == 3
    finally:
        db.close()


# -- the API ---------------------------------------------------------------------------------


@pytest.fixture
def server(tmp_path):
    from sloguard.cluster import ClusterServer
    from sloguard.settings import load_settings

    config = tmp_path / "server.yaml"
    config.write_text(f"data_dir: {tmp_path / 'data'}\nlisten: 0.0.0.0:8080\n"
                      "ui:\n  token: ui-token\n  allowed_hosts: [127.0.0.1]\n"
                      "server:\n  ingest_token: agents\n")
    made = ClusterServer(load_settings(config).settings)
    yield made
    made.stop()


def test_the_summary_api(server):
    from sloguard.ui.app import create_app

    incidents = _fleet(5, ["a", "b", "c"], 20)
    shift = time.time_ns() - NOW - 60 * S  # the API's range ends now
    for i in incidents:
        i.started_ns += shift
        i.fired_ns = i.fired_ns + shift if i.fired_ns else None
    _ingest(server.db, incidents)
    bearer = {"Authorization": "Bearer ui-token"}
    with TestClient(create_app(server, manage_lifecycle=False),
                    base_url="http://127.0.0.1") as client:
        assert client.get("/api/cluster/summary").status_code == 401  # as the rest of /api/
        body = client.get("/api/cluster/summary?range=24h&buckets=12&limit=2",
                          headers=bearer).json()
        assert body["range"] == "24h" and len(body["per_node"]["buckets"]) == 12
        assert body["per_node"]["bucket_ns"] == 2 * H
        assert len(body["per_node"]["nodes"]) == 2 and body["per_node"]["other"]["nodes"] == 1
        in_day = [i for i in incidents if i.started_ns >= body["since_ns"]]
        assert body["per_node"]["total"] == len(in_day)
        assert len(body["culprits"]["workloads"]) <= 2
        assert body["suffering"]["total"] == len({i.node for i in incidents
                                                  if i.state == "firing"})
        for bad, param in (("range=abc", "range"), ("range=1m", "range"),
                           ("range=91d", "range"), ("range=0h", "range"),
                           ("buckets=0", "buckets"), (f"buckets={MAX_BUCKETS + 1}", "buckets"),
                           ("limit=0", "limit"), (f"limit={MAX_TOP + 1}", "limit"),
                           ("limit=x", "limit")):
            refused = client.get(f"/api/cluster/summary?{bad}", headers=bearer)
            assert refused.status_code == 422, bad
            assert [e["loc"] for e in refused.json()["detail"]] == [["query", param]], bad
        assert "/api/cluster/summary" in client.get("/openapi.json",
                                                    headers=bearer).json()["paths"]
        page = client.get("/?range=7d", headers=bearer).text
        assert "Nodes suffering now" in page and "Most-named culprits, last 7d" in page
        assert client.get("/fragments/fleet?range=nonsense", headers=bearer).status_code == 200


def test_an_agent_has_no_fleet_summary(tmp_path):
    import httpx
    from support.uiserver import served_agent

    with served_agent(tmp_path, history=False) as (agent, url):
        assert agent.fleet_summary(0, 1, 1, 1) is None
        assert httpx.get(f"{url}/api/cluster/summary", timeout=10).status_code == 404
        assert "Nodes suffering now" not in httpx.get(url + "/", timeout=10).text


def test_names_in_sql_are_workload_names(cluster_db):
    """Each shape of suspect, first in an incident of its own: the stores' SQL names it as
    core/suspects.py does."""
    incidents = [_incident("n", k, NOW - H, "resolved", "info", [_suspect(cg, 1, w)])
                 for k, (cg, w) in enumerate(WORKLOADS)]
    _ingest(cluster_db, incidents)
    culprits = fleet_summary(cluster_db, NOW - 2 * H, NOW, 1, 50).culprits
    want = Counter(_name(i.suspects[0]) for i in incidents)
    assert {c.workload: c.first for c in culprits} == dict(want)
    assert "evil/" + HOSTILE_POD in want and "jobs/batch-1" in want and "/be/override" in want
