"""The UI and API against hostile clients (issue #19): what /readyz tells a stranger, DNS
rebinding, guessing the token, TLS, and malformed values that must not become a 500."""

from __future__ import annotations

import logging
import ssl
import subprocess
from pathlib import Path

import httpx
import pytest
from support.uiserver import served_agent

TOKEN = "s3cret-token-for-tests"
BEARER = {"Authorization": f"Bearer {TOKEN}"}
EXPOSED = f"listen: 0.0.0.0:8999\nui:\n  token: {TOKEN}\n"
# A target that names a pod and a forwarder whose URL carries credentials: what /readyz and
# the logs must not give away.
SECRETS = """\
app_latency:
  targets:
    - {service: checkout-secret-svc, url: "http://127.0.0.1:9/metrics", pod: pay-7f9-secret}
forward:
  url: "http://fwduser:fwd-pass-secret@127.0.0.1:9/base?apikey=fwd-key-secret"
  token: ingest-token-secret
"""


def test_readyz_off_loopback_reveals_nothing_without_the_token(tmp_path):
    with served_agent(tmp_path, EXPOSED + SECRETS, history=False) as (agent, url):
        agent.app_latency._record(agent.app_latency.static[0],
                                  "HTTP 500 Internal Server Error", 0.01)
        stranger = httpx.get(f"{url}/readyz", timeout=10)
        assert stranger.status_code in (200, 503)
        body = stranger.json()
        assert {c["name"] for c in body["components"]} >= {"app_latency", "forward", "rules"}
        assert all(set(c) == {"name", "ok"} for c in body["components"])
        for secret in ("checkout-secret-svc", "pay-7f9-secret", "127.0.0.1:9", "fwd-pass",
                       "fwd-key", "Internal Server Error", "ui-node"):
            assert secret not in stranger.text, secret
        insider = httpx.get(f"{url}/readyz", headers=BEARER, timeout=10).text
        assert "checkout-secret-svc" in insider and "Internal Server Error" in insider
        assert "fwd-pass-secret" not in insider and "fwd-key-secret" not in insider
        assert "http://***@127.0.0.1:9/base?***" in insider


def test_the_forwarder_url_is_redacted_in_logs_and_status(tmp_path, caplog):
    with served_agent(tmp_path, SECRETS, history=False) as (agent, _):
        caplog.set_level(logging.INFO, logger="sloguard.forwarder")
        agent.forwarder.round()  # nothing listens on port 9: a logged failure
        status = agent.forwarder.status()
        assert status.ok is False and "cannot reach http://***@127.0.0.1:9/base?***" in \
            status.reason
        shown = caplog.text + status.reason + str(status.details)
        assert "127.0.0.1:9" in caplog.text
        for secret in ("fwd-pass-secret", "fwd-key-secret", "ingest-token-secret", "fwduser"):
            assert secret not in shown, secret


def test_a_host_header_check_defeats_dns_rebinding(tmp_path):
    config = "ui:\n  allowed_hosts: [sloguard.example.org]\n"
    with served_agent(tmp_path, config, history=False) as (_, url):
        port = url.rpartition(":")[2]
        for host in ("attacker.example", f"attacker.example:{port}", "127.0.0.1.nip.io",
                     "[::2]", "localhost.attacker.example"):
            rebound = httpx.get(f"{url}/api/incidents", headers={"Host": host}, timeout=10)
            assert rebound.status_code == 400, host
            assert "ui.allowed_hosts" in rebound.json()["detail"]
        for host in (f"127.0.0.1:{port}", f"localhost:{port}", "[::1]", "127.0.0.2",
                     "sloguard.example.org", "SLOGUARD.example.org.:8080"):
            assert httpx.get(f"{url}/api/incidents", headers={"Host": host},
                             timeout=10).status_code == 200, host


def test_token_guessing_is_rate_limited_and_logged(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="sloguard.ui.auth")
    config = EXPOSED.replace("ui:\n", "ui:\n  auth_failures_per_minute: 3\n")
    with served_agent(tmp_path, config, history=False) as (_, url):
        wrong = {"Authorization": "Bearer guess"}
        for _ in range(3):
            assert httpx.get(f"{url}/api/incidents", headers=wrong,
                             timeout=10).status_code == 401
        for headers in (wrong, BEARER):  # locked out: even the right token waits
            limited = httpx.get(f"{url}/api/incidents", headers=headers, timeout=10)
            assert limited.status_code == 429
            assert 1 <= int(limited.headers["Retry-After"]) <= 60
        login = httpx.post(f"{url}/login", data={"token": TOKEN}, timeout=10)
        assert login.status_code == 429  # the login form is the same door
        assert httpx.get(f"{url}/healthz", timeout=10).status_code in (200, 503)
    lines = [r.getMessage() for r in caplog.records if r.name == "sloguard.ui.auth"]
    assert lines == ["authentication failed: wrong bearer token from 127.0.0.1 on "
                     "/api/incidents",
                     "authentication: 127.0.0.1 failed 3 times within 60s: its credentials are "
                     "refused (429) until the window has passed"]
    assert "guess" not in caplog.text and TOKEN not in caplog.text


def test_wrong_logins_are_rate_limited(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="sloguard.ui.auth")
    config = f"ui:\n  token: {TOKEN}\n  auth_failures_per_minute: 2\n"
    with served_agent(tmp_path, config, history=False) as (_, url):
        for _ in range(2):
            failed = httpx.post(f"{url}/login", data={"token": "guess"}, timeout=10)
            assert failed.status_code == 303 and "failed=true" in failed.headers["location"]
        assert httpx.post(f"{url}/login", data={"token": TOKEN}, timeout=10).status_code == 429
    assert "wrong token at /login from 127.0.0.1" in caplog.text


def _certificate(tmp_path: Path) -> tuple[Path, Path]:
    cert, key = tmp_path / "ui.crt", tmp_path / "ui.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    return cert, key


def test_tls_for_the_ui_with_secure_cookies(tmp_path):
    cert, key = _certificate(tmp_path)
    config = (f"ui:\n  token: {TOKEN}\n  tls_cert_file: {cert}\n  tls_key_file: {key}\n")
    with served_agent(tmp_path, config, history=False) as (_, url):
        assert url.startswith("https://")
        with pytest.raises(httpx.ConnectError):  # not trusted without the CA
            httpx.get(f"{url}/healthz", timeout=10)
        trusted = ssl.create_default_context(cafile=str(cert))
        with httpx.Client(verify=trusted, timeout=10) as client:
            assert client.get(f"{url}/api/incidents").status_code == 200
            login = client.post(f"{url}/login", data={"token": TOKEN})
            cookie = login.headers["set-cookie"].lower()
            assert login.status_code == 303 and "secure" in cookie and "httponly" in cookie
        with pytest.raises(httpx.RemoteProtocolError):  # plain HTTP gets no answer
            httpx.get(url.replace("https://", "http://") + "/healthz", timeout=10)


def test_tls_needs_both_files_readable(tmp_path):
    from sloguard.core.config import ConfigError
    from sloguard.settings import load_settings

    cert, _ = _certificate(tmp_path)
    config = tmp_path / "c.yaml"
    config.write_text(f"ui:\n  tls_cert_file: {cert}\n")
    with pytest.raises(ConfigError, match="tls_cert_file and tls_key_file together"):
        load_settings(config)
    config.write_text(f"ui:\n  tls_cert_file: {cert}\n  tls_key_file: {tmp_path}/nope\n")
    with pytest.raises(ConfigError, match=r"tls_key_file .*nope cannot be read"):
        load_settings(config)


def test_malformed_cookies_and_csrf_tokens_never_give_a_500(tmp_path):
    config = f"ui:\n  token: {TOKEN}\n  auth_failures_per_minute: 1000\n"
    with served_agent(tmp_path, config) as (agent, url):
        [incident] = agent.incidents.query(limit=10)
        for value in ("9999999999.é", "é.abc", "٣٣٣٣٣٣٣٣٣٣.x", "1.\udcff", "99999999999999999.x"):
            raw = f"sloguard_session={value}".encode("utf-8", "surrogateescape")
            for method, path in (("GET", f"/incidents/{incident.id}"), ("GET", "/silences"),
                                 ("POST", f"/incidents/{incident.id}/ack")):
                reply = httpx.request(method, f"{url}{path}", headers=[(b"cookie", raw)],
                                      data={"author": "a", "csrf": "x"}, timeout=10)
                assert reply.status_code < 500, (value, path, reply.text)
        with httpx.Client(base_url=url, timeout=10) as browser:
            assert browser.post("/login", data={"token": TOKEN}).status_code == 303
            for csrf in ("é", "ünïcödé" * 10, "\u0000"):
                reply = browser.post(f"/incidents/{incident.id}/ack",
                                     data={"author": "a", "csrf": csrf})
                assert reply.status_code == 403, (csrf, reply.text)
                reply = browser.post("/silences", data={"matchers": 'a="b"', "csrf": csrf,
                                                        "created_by": "a", "comment": "c"})
                assert reply.status_code == 403, (csrf, reply.text)
            reply = browser.post(f"/incidents/{incident.id}/ack",
                                 data={"author": "a", "csrf": "x"},
                                 headers={"Origin": "http://["})
            assert reply.status_code == 403


def test_far_future_silence_ends_are_refused_by_name(tmp_path):
    with served_agent(tmp_path, f"ui:\n  token: {TOKEN}\n", history=False) as (_, url):
        base = {"matchers": ['alertname="LSSlow"'], "created_by": "ann", "comment": "c"}
        for extra, field in (({"ends_at": "9999-12-31T23:59:59Z"}, "ends_at"),
                             ({"ends_at": "2263-01-01T00:00:00"}, "ends_at"),
                             ({"starts_at": "0001-01-01T00:00:00Z", "duration": "1h"},
                              "starts_at"),
                             ({"duration": "99999999w"}, "duration"),
                             ({"duration": "inf"}, "duration"),
                             ({"duration": "nan"}, "duration")):
            reply = httpx.post(f"{url}/api/silences", json={**base, **extra}, headers=BEARER,
                               timeout=10)
            assert reply.status_code == 422, (extra, reply.text)
            assert field in reply.text, (extra, reply.text)
        fine = httpx.post(f"{url}/api/silences", json={**base, "ends_at": "2262-01-01T00:00:00Z"},
                          headers=BEARER, timeout=10)
        assert fine.status_code == 201, fine.text
        assert httpx.get(f"{url}/silences", timeout=10).status_code == 200


def test_wrong_ingest_tokens_are_rate_limited_too(tmp_path, caplog):
    from fastapi.testclient import TestClient

    from sloguard.cluster import ClusterServer
    from sloguard.settings import load_settings
    from sloguard.ui.app import create_app

    caplog.set_level(logging.WARNING, logger="sloguard.ui.auth")
    config = tmp_path / "server.yaml"
    config.write_text(f"data_dir: {tmp_path / 'data'}\nui:\n  token: {TOKEN}\n"
                      "  auth_failures_per_minute: 2\nserver:\n  ingest_token: agents-token\n")
    server = ClusterServer(load_settings(config).settings)
    with TestClient(create_app(server, manage_lifecycle=False),
                    base_url="http://127.0.0.1") as client:
        body = {"node": "n1", "incidents": [], "actions": []}
        right = {"Authorization": "Bearer agents-token"}
        assert client.post("/api/v1/ingest", json=body, headers=right).status_code == 200
        for _ in range(2):
            assert client.post("/api/v1/ingest", json=body,
                               headers={"Authorization": "Bearer guess"}).status_code == 401
        limited = client.post("/api/v1/ingest", json=body, headers=right)
        assert limited.status_code == 429 and int(limited.headers["Retry-After"]) >= 1
    assert "wrong ingest token from testclient on /api/v1/ingest" in caplog.text
