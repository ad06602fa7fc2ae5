"""Who may read and change: the bearer token for the API, a login and CSRF for the browser."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import httpx
import pytest
from conftest import need
from support.uiserver import served_agent

TOKEN = "s3cret-token-for-tests"


def _resolved(agent):
    [incident] = agent.incidents.query(limit=10)
    return incident


def test_changes_are_disabled_without_a_token(tmp_path):
    with served_agent(tmp_path) as (agent, url):
        incident = _resolved(agent)
        reply = httpx.post(f"{url}/api/incidents/{incident.id}/ack",
                           json={"author": "ann"}, timeout=10)
        assert reply.status_code == 403 and "ui.token" in reply.json()["detail"]
        assert httpx.get(f"{url}/api/incidents", timeout=10).status_code == 200  # loopback


def test_bearer_token_acknowledges_and_resolves(tmp_path):
    from support.uiserver import feed

    with served_agent(tmp_path, f"ui:\n  token: {TOKEN}\n") as (agent, url):
        now = time.time_ns()
        feed(agent, "web-9", [50.0] * 4, now)
        [firing] = agent.incidents.query(state="firing")
        ack = f"{url}/api/incidents/{firing.id}/ack"
        assert httpx.post(ack, json={"author": "ann"}, timeout=10).status_code == 401
        wrong = {"Authorization": "Bearer nope"}
        assert httpx.post(ack, json={"author": "ann"}, headers=wrong,
                          timeout=10).status_code == 401
        right = {"Authorization": f"Bearer {TOKEN}"}
        assert httpx.post(ack, json={"author": ""}, headers=right,
                          timeout=10).status_code == 422  # who did it must be said
        body = httpx.post(ack, json={"author": "ann", "comment": "looking"}, headers=right,
                          timeout=10).json()
        assert body["annotations"]["acknowledged_by"] == "ann"
        assert body["state"] == "firing" and body["actions"][-1]["step"] == "acknowledge"
        # the live incident carries it: the next evaluation does not lose the acknowledgement
        feed(agent, "web-9", [50.0], now + 4 * 10**9)
        assert agent.incidents.get(firing.id).annotations["acknowledged_by"] == "ann"
        resolve = f"{url}/api/incidents/{firing.id}/resolve"
        done = httpx.post(resolve, json={"author": "bob", "comment": "fixed the cron job"},
                          headers=right, timeout=10).json()
        assert done["state"] == "resolved" and done["annotations"]["resolved_by"] == "bob"
        assert httpx.post(resolve, json={"author": "bob"}, headers=right,
                          timeout=10).status_code == 409
        assert httpx.post(f"{url}/api/incidents/nope/ack", json={"author": "a"},
                          headers=right, timeout=10).status_code == 404
        assert TOKEN not in httpx.get(f"{url}/readyz", timeout=10).text


def test_beyond_loopback_reading_needs_the_token_too(tmp_path):
    config = f"listen: 0.0.0.0:8999\nui:\n  token: {TOKEN}\n"
    with served_agent(tmp_path, config) as (_, url):
        assert httpx.get(f"{url}/api/incidents", timeout=10).status_code == 401
        assert httpx.get(f"{url}/metrics", timeout=10).status_code == 401
        page = httpx.get(f"{url}/rules", timeout=10)
        assert page.status_code == 303 and page.headers["location"] == "/login?next=/rules"
        assert httpx.get(f"{url}/healthz", timeout=10).status_code in (200, 503)  # probes
        ok = httpx.get(f"{url}/api/incidents", timeout=10,
                       headers={"Authorization": f"Bearer {TOKEN}"})
        assert ok.status_code == 200 and ok.json()["incidents"]


def test_the_config_refuses_to_expose_an_agent_without_a_token(tmp_path):
    from sloguard.core.config import ConfigError
    from sloguard.settings import load_settings

    config = tmp_path / "c.yaml"
    config.write_text("listen: 0.0.0.0:8080\n")
    with pytest.raises(ConfigError, match=rf"{config}:1: listen: 0.0.0.0 is not loopback"):
        load_settings(config)
    secret = tmp_path / "token"
    secret.write_text(TOKEN + "\n")
    config.write_text(f"listen: 0.0.0.0:8080\nui:\n  token_file: {secret}\n")
    assert load_settings(config).settings.ui.resolved_token() == TOKEN


def test_browser_login_acknowledge_and_csrf(tmp_path):
    need(shutil.which("chromium") is not None, "Debian's chromium is not installed "
                                               "(scripts/browser-testenv.sh installs it)")
    from playwright.sync_api import sync_playwright
    from support.uiserver import feed

    with served_agent(tmp_path, f"ui:\n  token: {TOKEN}\n") as (agent, url):
        feed(agent, "web-7", [50.0] * 4, time.time_ns())
        [firing] = agent.incidents.query(state="firing")
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=shutil.which("chromium"),
                                        args=["--no-sandbox"])
            page = browser.new_page()
            page.goto(f"{url}/incidents/{firing.id}")
            page.get_by_role("link", name="Log in").click()
            page.fill("input[name=token]", "wrong")
            page.click("button[type=submit]")
            assert page.locator("#login-failed").is_visible()
            page.fill("input[name=token]", TOKEN)
            page.click("button[type=submit]")
            page.wait_for_url(f"**/incidents/{firing.id}")  # back where it started
            page.fill("#ack-form input[name=author]", "carol")
            page.fill("#ack-form input[name=comment]", "on it <b>now</b>")
            page.get_by_role("button", name="acknowledge").click()
            page.wait_for_url(f"**/incidents/{firing.id}")
            timeline = page.locator("#timeline").inner_text()
            assert "acknowledge" in timeline and "by carol: on it <b>now</b>" in timeline
            assert agent.incidents.get(firing.id).annotations["acknowledged_by"] == "carol"
            # a forged cross-site form carries the cookie but not the session's CSRF token
            forged = page.request.post(f"{url}/incidents/{firing.id}/resolve",
                                       form={"author": "mallory"}, max_redirects=0)
            assert forged.status == 403 and "CSRF" in forged.text()
            assert agent.incidents.get(firing.id).state == "firing"
            cookies = page.context.cookies()
            [session] = [c for c in cookies if c["name"] == "sloguard_session"]
            assert session["httpOnly"] and session["sameSite"] == "Strict"
            assert TOKEN not in page.content()
            # silence it from the browser, logged in, and see the silence listed
            page.goto(f"{url}/silences")
            page.fill("textarea[name=matchers]", 'alertname="LSSlow"\npod="web-7"')
            page.fill("input[name=duration]", "30m")
            page.fill("input[name=created_by]", "carol")
            page.fill("input[name=comment]", "rolling out a fix <i>now</i>")
            page.get_by_role("button", name="silence").click()
            page.wait_for_url(f"{url}/silences")
            listed = page.locator("#silences").inner_text()
            assert "active" in listed and 'pod="web-7"' in listed
            assert "rolling out a fix <i>now</i>" in listed  # escaped, shown as text
            [silence] = agent.silences.list(None, time.time_ns())
            assert silence.created_by == "carol"
            artifacts = Path(__file__).resolve().parent.parent / "test-artifacts"
            artifacts.mkdir(exist_ok=True)
            page.screenshot(path=str(artifacts / "silences.png"), full_page=True)
            page.get_by_role("button", name="expire").click()
            page.wait_for_url(f"{url}/silences")
            assert "expired" in page.locator("#silences").inner_text()
            browser.close()
        evil = httpx.post(f"{url}/login", data={"token": TOKEN, "next": "//evil.example/x"},
                          timeout=10)
        assert evil.status_code == 303 and evil.headers["location"] == "/"
