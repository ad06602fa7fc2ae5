"""Node identity on the cluster server (`server.node_tokens_file`): a node's token names the
node, and it can post nothing under another node's name: not as the body's node, not in an
incident or an audit entry, not by withdrawing or overwriting another node's incident. Run
against a real `sloguard server` process, with the real forwarder and a real agent; the map is
changed and broken while the server runs."""

from __future__ import annotations

import hashlib
import os
import subprocess
from dataclasses import asdict
from pathlib import Path

import httpx
import pytest
from test_agent_e2e import _free_port
from test_cluster_e2e import RULES, UI, ServerProcess, wait_for
from test_forward_changes_e2e import _audit, _held, _incident, _metric

from sloguard.actuators.ledger import Ledger
from sloguard.forwarder import ForwardConfig, Forwarder
from sloguard.store.incidents_db import IncidentStore
from sloguard.ui.node_tokens import NodeTokensError, load_node_tokens

TOKEN_A = "node-a-token-0123456789abcdef"
TOKEN_B = "node-b-token-0123456789abcdef"
TOKEN_C = "node-c-token-0123456789abcdef"
SHARED = "shared-ingest-token-0123456789"
INGEST = "/api/v1/ingest"


def sha(token: str) -> str:
    return "sha256:" + hashlib.sha256(token.encode()).hexdigest()


def write_map(path: Path, text: str) -> None:
    """As the kubelet updates a mounted Secret: a new file renamed into place."""
    tmp = path.with_suffix(".new")
    tmp.write_text(text)
    os.replace(tmp, path)


def post(server: ServerProcess, token: str, body: dict) -> httpx.Response:
    return httpx.post(server.url + INGEST, json={"incidents": [], "actions": [], **body},
                      headers={"Authorization": f"Bearer {token}"}, timeout=5)


def action(n: int, node: str) -> dict:
    return {**asdict(_audit(n, node)), "id": n}


def readyz_component(server: ServerProcess) -> dict:
    ready = server.get("/readyz").json()
    return next(c for c in ready["components"] if c["name"] == "node-tokens")


@pytest.fixture
def start_server(tmp_path, sloguard_bin):
    """Starts a real server whose node-token map holds `tokens_text` (its path is the
    server's `tokens`, to change while it runs), with the shared ingest token configured
    too: refused unless `allow_shared_token`. Stopped after the test, however it ends."""
    started: list[ServerProcess] = []

    def start(tokens_text: str, allow_shared_token: bool = False) -> ServerProcess:
        tokens = tmp_path / "node-tokens"
        write_map(tokens, tokens_text)
        config = tmp_path / "server.yaml"
        config.write_text(f"ui:\n  token: {UI}\nserver:\n  node_tokens_file: {tokens}\n"
                          f"  ingest_token: {SHARED}\n"
                          + ("  allow_shared_token: true\n" if allow_shared_token else ""))
        server = ServerProcess(sloguard_bin, config, tmp_path / "server-data",
                               tmp_path / "server.log", _free_port())
        server.tokens = tokens
        started.append(server)
        return server

    yield start
    for server in started:
        server.terminate()


@pytest.fixture
def node_server(start_server):
    """A real server whose map gives node-a a token in clear and node-b only its SHA-256; the
    shared ingest token is configured too, and must be refused (allow_shared_token is off)."""
    return start_server(
        f"# the nodes' own tokens\nnode-a {TOKEN_A}\n\nnode-b   {sha(TOKEN_B)}\n")


def test_a_nodes_token_posts_only_that_nodes_incidents(tmp_path, node_server):
    server = node_server
    a1, b1 = _incident(1, "node-a"), _incident(1, "node-b")
    assert post(server, TOKEN_A, {"node": "node-a",
                                  "incidents": [a1.to_dict()]}).status_code == 200
    assert post(server, TOKEN_B, {"node": "node-b", "incidents": [b1.to_dict()],
                                  "actions": [action(1, "node-b")]}
                ).status_code == 200
    assert set(_held(server)) == {a1.id, b1.id}

    # node-a's token, and anything of the batch naming node-b: refused whole, 403, nothing kept
    a2, b2 = _incident(2, "node-a"), _incident(2, "node-b")
    attempts = {
        "node": {"node": "node-b", "incidents": [b2.to_dict()]},
        "incidents.1.node": {"node": "node-a", "incidents": [a2.to_dict(), b2.to_dict()]},
        "actions.0.node": {"node": "node-a", "incidents": [a2.to_dict()],
                           "actions": [action(7, "node-b")]},
    }
    for field, body in attempts.items():
        answer = post(server, TOKEN_A, body)
        assert answer.status_code == 403, (field, answer.text)
        detail = answer.json()["detail"]
        assert detail.startswith(f"{field}: 'node-b' is not 'node-a'"), detail
        assert TOKEN_A not in answer.text
    assert set(_held(server)) == {a1.id, b1.id}  # not even node-a's a2 of those batches
    assert len(server.get("/api/actions?limit=100").json()["actions"]) == 1
    assert _metric(server, "sloguard_ingest_refused_total", reason="wrong_node") == 3
    log = (tmp_path / "server.log").read_text()
    assert "node node-a's token sent a batch whose node is 'node-b'" in log
    assert TOKEN_A not in log and TOKEN_B not in log

    # withdrawing node-b's incident, or overwriting it by its id, with node-a's token
    withdraw = post(server, TOKEN_A, {"node": "node-a", "withdrawn": [b1.id]})
    assert withdraw.status_code == 200 and withdraw.json()["withdrawn_unknown"] == 1
    taken = _incident(1, "node-a", summary="node-a's copy")
    taken.id, taken.updated_ns = b1.id, b1.updated_ns + 10**9
    overwrite = post(server, TOKEN_A, {"node": "node-a", "incidents": [taken.to_dict()]})
    assert overwrite.status_code == 200 and overwrite.json()["incidents_foreign"] == 1
    held = _held(server)[b1.id]
    assert (held["node"], held["summary"]) == ("node-b", b1.summary)

    # a wrong token, none, the shared one (a map is configured), the UI's: 401
    for headers in ({"Authorization": "Bearer not-a-node-token-at-all"}, {},
                    {"Authorization": f"Bearer {SHARED}"}, {"Authorization": f"Bearer {UI}"},
                    {"Authorization": f"Basic {TOKEN_A}"}):
        answer = httpx.post(server.url + INGEST, json={"node": "node-a"}, headers=headers,
                            timeout=5)
        assert answer.status_code == 401, (headers, answer.text)
    # node-b's token given as a hash works with the token itself; the hash is no token
    assert post(server, sha(TOKEN_B), {"node": "node-b"}).status_code == 401
    ready = readyz_component(server)
    assert ready["ok"] and ready["details"]["nodes"] == 2


def test_the_map_changed_at_runtime_takes_effect_and_a_broken_one_keeps_the_old(
        tmp_path, node_server):
    server = node_server
    assert post(server, TOKEN_C, {"node": "node-c"}).status_code == 401
    # node-c added, node-a's token rotated (its old one must stop working)
    write_map(server.tokens, f"node-a {sha(TOKEN_A + 'v2')}\nnode-b {sha(TOKEN_B)}\n"
                             f"node-c {TOKEN_C}\n")
    wait_for(lambda: post(server, TOKEN_C, {"node": "node-c"}).status_code == 200, 10,
             "node-c's token never accepted", tmp_path / "server.log")
    assert post(server, TOKEN_A, {"node": "node-a"}).status_code == 401
    assert post(server, TOKEN_A + "v2", {"node": "node-a"}).status_code == 200

    # broken: line 3 has a third field. The whole file is refused, the map before it kept
    write_map(server.tokens, f"node-a {TOKEN_A}\nnode-b {sha(TOKEN_B)}\n"
                             f"node-d {TOKEN_C} extra\n")
    wait_for(lambda: not readyz_component(server)["ok"], 10,
             "the broken map was never reported", tmp_path / "server.log")
    ready = readyz_component(server)
    assert f"{server.tokens}:3: expected `NODE TOKEN`" in ready["reason"], ready
    assert "previous map is in force" in ready["reason"]
    assert TOKEN_C not in ready["reason"] and TOKEN_A not in ready["reason"]
    assert post(server, TOKEN_C, {"node": "node-c"}).status_code == 200  # still the old map
    assert post(server, TOKEN_A, {"node": "node-a"}).status_code == 401
    log = (tmp_path / "server.log").read_text()
    assert f"{server.tokens}:3:" in log and TOKEN_C not in log

    # removed (an unmounted Secret): kept too, and said so
    server.tokens.unlink()
    wait_for(lambda: "does not exist" in readyz_component(server)["reason"], 10,
             "the missing map was never reported", tmp_path / "server.log")
    assert post(server, TOKEN_C, {"node": "node-c"}).status_code == 200
    # fixed
    write_map(server.tokens, f"node-a {TOKEN_A}\n")
    wait_for(lambda: readyz_component(server)["ok"], 10, "the fixed map was never taken",
             tmp_path / "server.log")
    assert post(server, TOKEN_C, {"node": "node-c"}).status_code == 401
    assert post(server, TOKEN_A, {"node": "node-a"}).status_code == 200


def test_the_forwarder_with_its_nodes_token_end_to_end(tmp_path, node_server):
    """The real forwarder with node-a's token delivers node-a's incidents, audit entries and
    withdrawals; the same forwarder configured as node-b with node-a's token gets 403 and
    keeps everything to send (its cursor does not move)."""
    server = node_server
    (tmp_path / "a-token").write_text(TOKEN_A + "\n")

    def forwarder(name: str) -> Forwarder:
        home = tmp_path / name
        home.mkdir()
        cfg = ForwardConfig(url=server.url, token_file=str(tmp_path / "a-token"))
        return Forwarder(cfg, name, IncidentStore(home / "incidents.db"),
                         Ledger(home / "actuators.db"), home)

    a = forwarder("node-a")
    for n in range(3):
        a.incidents.save(_incident(n, "node-a"))
        a.ledger.audit(_audit(n, "node-a"))
    a.incidents.delete("node-a-inc-002")
    a.round()
    assert a.last_error == "", a.last_error
    assert set(_held(server)) == {"node-a-inc-000", "node-a-inc-001"}
    assert {x["node"] for x in server.get("/api/actions?limit=10").json()["actions"]} == \
        {"node-a"}
    assert a.sent == {"incidents": 2, "withdrawn": 1, "actions": 3}

    impostor = forwarder("node-b")
    impostor.incidents.save(_incident(9, "node-b"))
    impostor.round()
    assert "HTTP 403" in impostor.last_error and "is not 'node-a'" in impostor.last_error
    assert impostor.cursor == {"incidents": 0, "actions": 0}
    assert "node-b-inc-009" not in _held(server)


def test_a_real_agent_forwards_with_its_own_token(tmp_path, node_server, sloguard_bin):
    from test_agent_e2e import AgentProcess

    server = node_server
    home = tmp_path / "node-b"
    (home / "rules").mkdir(parents=True)
    (home / "rules" / "r.yaml").write_text(RULES)
    (home / "token").write_text(TOKEN_B)  # as a hostPath file provisioned with the node
    config = home / "sloguard.yaml"
    config.write_text(
        f"node_name: node-b\ninterval: 300ms\nrules:\n  paths: [{home / 'rules'}]\n"
        "collectors:\n  cgroups: {enabled: false}\n"
        f"forward:\n  url: {server.url}\n  token_file: {home / 'token'}\n"
        "  interval: 300ms\n")
    agent = AgentProcess(sloguard_bin, config, home / "data", home / "agent.log")
    try:
        wait_for(lambda: any(i["node"] == "node-b" and i["rule"] == "AlwaysLoaded"
                             for i in _held(server).values()), 30,
                 "the agent's incident never reached the server", agent.log,
                 tmp_path / "server.log")
        forward = next(c for c in agent.get("/readyz").json()["components"]
                       if c["name"] == "forward")
        assert forward["ok"], forward
    finally:
        agent.terminate()


def test_the_shared_token_during_a_migration(tmp_path, start_server):
    """allow_shared_token: agents not yet given their own token go on with the shared one
    (and the body's node is trusted for them), while a node's own token is bound to it."""
    server = start_server(f"node-a {TOKEN_A}\n", allow_shared_token=True)
    assert post(server, SHARED, {"node": "node-z"}).status_code == 200
    mixed = post(server, SHARED, {"node": "node-z",
                                  "incidents": [_incident(1, "node-y").to_dict()]})
    assert mixed.status_code == 422 and mixed.json()["detail"][0]["field"] == \
        "incidents.0.node"
    assert post(server, TOKEN_A, {"node": "node-z"}).status_code == 403
    assert post(server, TOKEN_A, {"node": "node-a"}).status_code == 200
    assert "allow_shared_token is on" in (tmp_path / "server.log").read_text()


def test_a_map_that_never_loaded_lets_no_node_in(start_server):
    """Fail closed: a broken map at start is reported, and neither a token in it nor the
    shared token gets in."""
    server = start_server(f"node-a {TOKEN_A}\nnode-a {TOKEN_B}\n")
    ready = readyz_component(server)
    assert not ready["ok"] and "no node can post" in ready["reason"]
    assert f"{server.tokens}:2: node node-a is already given at line 1" in ready["reason"]
    for token in (TOKEN_A, TOKEN_B, SHARED):
        assert post(server, token, {"node": "node-a"}).status_code == 401


@pytest.mark.parametrize(("text", "error"), [
    (f"node-a {TOKEN_A}\nnode-b\n", ":2: expected `NODE TOKEN`"),
    (f"node-a {TOKEN_A}\nnode-b {TOKEN_A}\n", ":2: node node-b has the same token as node "
                                              "node-a (line 1)"),
    (f"node-a {sha(TOKEN_A)}\nnode-b {TOKEN_A}\n", ":2: node node-b has the same token"),
    ("node-a sha256:abc\n", ":1: node node-a: sha256: must be followed by 64 hex digits"),
    ("node-a short\n", ":1: node node-a: a token must have 16 to 8192 characters"),
    (f"no/de {TOKEN_A}\n", ":1: the node name is not a valid node name"),
    ("# nothing\n\n", ": holds no node"),
    (b"node-a \xff\xfe-not-utf8\n", ":1: not UTF-8"),
])
def test_a_malformed_map_is_named_by_file_and_line_never_by_token(tmp_path, text, error):
    path = tmp_path / "tokens"
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    with pytest.raises(NodeTokensError) as caught:
        load_node_tokens(path)
    assert str(caught.value).startswith(f"{path}"), caught.value
    assert error in str(caught.value), caught.value
    assert TOKEN_A not in str(caught.value) and "short" not in str(caught.value)


def test_a_directory_given_for_the_file_is_named(tmp_path):
    from sloguard.ui.node_tokens import NodeTokens

    (tmp_path / "mount").mkdir()
    (tmp_path / "mount" / "tokens").write_text(f"node-a {TOKEN_A}\n")
    tokens = NodeTokens(str(tmp_path / "mount"))
    status = tokens.status()
    assert not status.ok and "is a directory: give the file in it" in status.reason
    assert tokens.node_of(TOKEN_A) is None
    assert NodeTokens(str(tmp_path / "mount" / "tokens")).node_of(TOKEN_A) == "node-a"


def test_a_map_too_large_is_refused_before_it_is_read_whole(tmp_path):
    path = tmp_path / "tokens"
    with open(path, "w") as f:
        f.write(f"node-a {TOKEN_A}\n")
        f.write("#" * (5 * 1024**2))
    with pytest.raises(NodeTokensError, match="larger than"):
        load_node_tokens(path)


def test_allow_shared_token_needs_a_map_and_a_shared_token(tmp_path, sloguard_bin):
    config = tmp_path / "server.yaml"
    config.write_text(f"server:\n  ingest_token: {SHARED}\n  allow_shared_token: true\n")
    done = subprocess.run([sloguard_bin, "server", "-c", str(config), "--data-dir",
                           str(tmp_path / "d")], capture_output=True, text=True, timeout=30)
    assert done.returncode == 2
    assert f"{config}:3: server.allow_shared_token: needs ingest_token and the nodes' own" \
        in done.stderr
    assert SHARED not in done.stderr
