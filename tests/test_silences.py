"""Silences from the API, the UI form and the CLI: validation, who may change them (the UI
token; a browser logs in with it), CSRF on forms, and escaping of everything shown."""

from __future__ import annotations

import re
import subprocess
import time

import pytest
from fastapi.testclient import TestClient
from test_agent_e2e import AgentProcess

from sloguard.agent import Agent
from sloguard.settings import load_settings
from sloguard.ui.app import create_app

LOOPBACK = ("127.0.0.1", 40000)
REMOTE = ("10.1.2.3", 40000)
TOKEN = "s3cret-token"
BEARER = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
def make_client(tmp_path):
    agents = []

    def make(config: str = f"ui: {{token: {TOKEN}}}\n", client: tuple[str, int] = LOOPBACK,
             bearer: bool = True) -> TestClient:
        cfg = tmp_path / "sloguard.yaml"
        cfg.write_text("collectors: {cgroups: {include: []}, node: {enabled: false}}\n" + config)
        agent = Agent(load_settings(cfg, {"data_dir": ("--data-dir", tmp_path / "data")})
                      .settings)
        agents.append(agent)
        # the Host a browser on this machine sends (the loopback Host check refuses others)
        return TestClient(create_app(agent, manage_lifecycle=False), client=client,
                          base_url="http://127.0.0.1", headers=BEARER if bearer else None)

    yield make
    for agent in agents:
        agent.alerting.db.close()
        agent.store.close()


def new(**overrides):
    body = {"matchers": ['alertname="LSCpuStall"', "node=worker-7"], "created_by": "alice",
            "comment": "deploying web", "duration": "2h"}
    return {**body, **overrides}


def test_api_create_list_get_expire(make_client):
    client = make_client()
    created = client.post("/api/silences", json=new())
    assert created.status_code == 201, created.text
    silence = created.json()
    assert silence["state"] == "active"
    assert silence["matchers"] == ['alertname="LSCpuStall"', 'node="worker-7"']
    assert silence["ends_ns"] - silence["starts_ns"] == 2 * 3600 * 10**9
    later = client.post("/api/silences", json=new(starts_at="2099-01-01T00:00:00Z",
                                                  duration=None, ends_at="2099-01-02T00:00:00"))
    assert later.status_code == 201 and later.json()["state"] == "pending"
    assert {s["state"] for s in client.get("/api/silences").json()["silences"]} == {
        "active", "pending"}
    assert client.get(f"/api/silences/{silence['id']}").json()["comment"] == "deploying web"
    expired = client.delete(f"/api/silences/{silence['id']}")
    assert expired.status_code == 200 and expired.json()["state"] == "expired"
    assert [s["id"] for s in client.get("/api/silences?state=expired").json()["silences"]] == [
        silence["id"]]
    assert client.delete("/api/silences/nope").status_code == 404
    assert client.get("/api/silences/nope").status_code == 404
    assert client.get("/api/silences?state=bogus").status_code == 422


@pytest.mark.parametrize(("body", "message"), [
    (new(matchers=[]), "at least 1"),
    (new(matchers=['pod=~"("']), "invalid regex"),
    (new(matchers=['pod=~".*"']), "would mute every alert"),
    (new(comment=" "), "needs a comment"),
    (new(created_by=""), "needs an author"),
    (new(duration=None), "give ends_at or duration"),
    (new(duration="soon"), "not a duration"),
    (new(duration=None, ends_at="2001-01-01T00:00:00Z"), "must end after it starts"),
])
def test_api_refuses_bad_silences(make_client, body, message):
    response = make_client().post("/api/silences", json=body)
    assert response.status_code == 422 and message in response.text, response.text


def test_changes_need_the_token(make_client, tmp_path):
    token = tmp_path / "ui-token"
    token.write_text("s3cret-token\n")
    client = make_client(f"ui: {{token_file: {token}}}\n", bearer=False)
    assert client.post("/api/silences", json=new()).status_code == 401
    wrong = {"Authorization": "Bearer nope"}
    assert client.post("/api/silences", json=new(), headers=wrong).status_code == 401
    created = client.post("/api/silences", json=new(), headers=BEARER)
    assert created.status_code == 201
    assert client.get("/api/silences").status_code == 200  # reading, on loopback: allowed
    assert client.delete(f"/api/silences/{created.json()['id']}").status_code == 401
    assert client.delete(f"/api/silences/{created.json()['id']}",
                         headers=BEARER).status_code == 200


def test_without_a_token_changes_are_disabled(make_client):
    for where in (LOOPBACK, REMOTE):
        refused = make_client("", client=where, bearer=False).post("/api/silences", json=new())
        assert refused.status_code == 403 and "ui.token" in refused.text


def test_json_api_refuses_form_encoded_bodies(make_client):
    # what a cross-site <form> can send without a CORS preflight
    response = make_client().post("/api/silences", content="matchers=a",
                                  headers={"Content-Type": "text/plain"})
    assert response.status_code == 422


def _login(client: TestClient) -> str:
    """Log in as a browser does; the CSRF token of the session, from the page."""
    assert client.post("/login", data={"token": TOKEN, "next": "/silences"},
                       follow_redirects=False).status_code == 303
    page = client.get("/silences")
    return re.search(r'name="csrf" value="([0-9a-f]+)"', page.text).group(1)


def test_form_needs_a_login_and_its_csrf_token_and_refuses_cross_site(make_client):
    client = make_client(bearer=False)
    page = client.get("/silences").text
    assert "Log in" in page and 'name="matchers"' not in page  # no form before a login
    form = {"matchers": 'alertname="Disk"\nnode=worker-7', "duration": "30m",
            "created_by": "bob", "comment": "disk swap"}
    assert client.post("/silences", data=form).status_code == 401
    csrf = _login(client)
    assert client.post("/silences", data={**form, "csrf": "forged"}).status_code == 403
    cross = client.post("/silences", data={**form, "csrf": csrf},
                        headers={"Origin": "https://evil.example"})
    assert cross.status_code == 403
    done = client.post("/silences", data={**form, "csrf": csrf}, follow_redirects=False)
    assert done.status_code == 303
    [silence] = client.get("/api/silences").json()["silences"]
    assert silence["matchers"] == ['alertname="Disk"', 'node="worker-7"']
    bad = client.post("/silences", data={**form, "csrf": csrf, "matchers": "pod=~'('"})
    assert bad.status_code == 422 and "invalid regex" in bad.text
    expire = client.post(f"/silences/{silence['id']}/expire", data={"csrf": csrf},
                         follow_redirects=False)
    assert expire.status_code == 303
    assert client.get(f"/api/silences/{silence['id']}").json()["state"] == "expired"


def test_everything_shown_is_escaped(make_client):
    client = make_client()
    client.post("/api/silences", json=new(
        matchers=['pod="<img src=x onerror=alert(1)>"'],
        comment="<script>alert('c')</script>", created_by="<b>mallory</b>"))
    page = client.get("/silences").text
    assert "<script>alert" not in page and "<img src=x" not in page and "<b>mallory" not in page
    assert "&lt;script&gt;" in page and "&lt;img src=x onerror=alert(1)&gt;" in page


def test_incident_links_from_slack_lead_to_the_incident_page(make_client):
    assert make_client().get("/incidents/abc-1").status_code == 404  # no such incident


def test_cli_against_a_running_agent(tmp_path, sloguard_bin):
    token = tmp_path / "ui-token"
    token.write_text("cli-token")
    config = tmp_path / "sloguard.yaml"
    config.write_text(f"interval: 500ms\nui: {{token_file: {token}}}\n"
                      "collectors: {cgroups: {include: []}}\n")
    agent = AgentProcess(sloguard_bin, config, tmp_path / "data", tmp_path / "agent.log")

    def cli(*args: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run([sloguard_bin, "silence", *args, "-c", str(config),
                               "--url", agent.url], capture_output=True, text=True,
                              check=check, timeout=30)

    try:
        silence_id = cli("add", "alertname=LSCpuStall", 'node="worker-7"', "-m", "deploy",
                         "-d", "30m", "-a", "carol").stdout.strip()
        assert re.fullmatch(r"[0-9a-f]{32}", silence_id)
        listed = cli("list").stdout
        assert silence_id in listed and "active" in listed and "by carol: deploy" in listed
        refused = cli("add", 'pod=~".*"', "-m", "x", check=False)
        assert refused.returncode == 1 and "would mute every alert" in refused.stderr
        assert cli("expire", silence_id).stdout.strip() == f"{silence_id} expired"
        assert silence_id not in cli("list").stdout
        assert "expired" in cli("list", "--all").stdout
        token.write_text("another")  # the agent re-reads its token file; the CLI's is stale
        time.sleep(0.1)
        stale = subprocess.run(
            [sloguard_bin, "silence", "add", "a=b", "-m", "x", "--url", agent.url],
            capture_output=True, text=True, timeout=30)
        assert stale.returncode == 1 and "HTTP 401" in stale.stderr
    finally:
        agent.terminate()
