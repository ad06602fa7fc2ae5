"""The JSON API fuzzed against its own OpenAPI schema with schemathesis: no input makes it fail.

The agent behind it is real (stores, engine, ladder) with an incident in it, so the generated
requests reach real queries, not empty tables. On loopback without a token (reading open,
changes refused), and listening beyond loopback with every token configured (the UI's and the
receive endpoint's), both with and without the tokens: no request gives a 5xx.
"""

from __future__ import annotations

import time

import pytest
import schemathesis
from hypothesis import HealthCheck, settings

from sloguard.core.samples import Sample

S = 1_000_000_000
RULES = """\
groups:
  - name: ls
    rules:
      - alert: LSSlow
        expr: lat{class="LS"}
        field: p99
        aggregate: last
        window: 2s
        params: {above: 10}
        policy: ls-interference
"""


UI_TOKEN = "fuzz-ui-token"
RECEIVE_TOKEN = "fuzz-receive-token"
WITH_TOKENS = f"""\
listen: 0.0.0.0:8080
ui: {{token: {UI_TOKEN}, auth_failures_per_minute: 10000}}
app_latency:
  receive: {{enabled: true, token: {RECEIVE_TOKEN}}}
slos:
  - {{service: checkout, latency_ms: 50}}
"""


def _agent_app(tmp, extra: str = ""):
    from sloguard.agent import Agent
    from sloguard.settings import load_settings
    from sloguard.ui.app import create_app

    (tmp / "rules").mkdir()
    (tmp / "rules" / "r.yaml").write_text(RULES)
    config = tmp / "c.yaml"
    config.write_text(
        f"node_name: fuzz-node\ndata_dir: {tmp / 'data'}\nrules:\n  paths: [{tmp / 'rules'}]\n"
        "collectors:\n  node: {enabled: false}\n  cgroups: {enabled: false}\n" + extra)
    agent = Agent(load_settings(config).settings)
    agent._reload_rules()
    now = time.time_ns()
    for second in range(5):
        sample = Sample("lat", {"node": "fuzz-node", "class": "LS", "pod": "web'\"<>"},
                        {"p99": 50.0}, now + second * S)
        agent.store.write([sample])
        agent.windows.add([sample])
        agent.engine.evaluate(now + second * S)
        agent.ladder.tick(now + second * S, agent.engine.firing())
    assert agent.incidents.query()
    agent.start()  # a live loop: /healthz and /readyz answer as on a working node
    return agent, create_app(agent, manage_lifecycle=False)


@pytest.fixture(scope="module")
def api_app(tmp_path_factory):
    # schemathesis' ASGI client sends Host: testserver, which the loopback Host check (DNS
    # rebinding) refuses unless listed
    agent, app = _agent_app(tmp_path_factory.mktemp("fuzz"), "ui: {allowed_hosts: [testserver]}\n")
    yield app
    agent.stop()


@pytest.fixture(scope="module")
def api_app_with_tokens(tmp_path_factory):
    agent, app = _agent_app(tmp_path_factory.mktemp("fuzz-tokens"), WITH_TOKENS)
    yield app
    agent.stop()


def test_no_input_breaks_the_api(api_app):
    from hypothesis import given

    schema = schemathesis.openapi.from_asgi("/openapi.json", api_app)
    operations = [result.ok() for result in schema.get_all_operations()]
    paths = {op.path for op in operations}
    assert {"/api/incidents", "/api/incidents/{incident_id}", "/api/actions"} <= paths
    for operation in operations:
        @given(case=operation.as_strategy())
        @settings(max_examples=60, deadline=None, database=None,
                  suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
        def fuzz(case):
            case.call_and_validate()

        fuzz()


def _counting(operation, headers, count, failures, mode):
    """A hypothesis test of one operation that counts requests and 5xx answers in `count`."""
    from hypothesis import given

    @given(case=operation.as_strategy())
    @settings(max_examples=40, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
    def fuzz(case):
        response = case.call(headers={**(case.headers or {}), **headers})
        count[0] += 1
        if response.status_code >= 500:
            count[1] += 1
            failures.append(f"{mode} {case.method} {case.formatted_path}: "
                            f"{response.status_code} {response.text[:200]}")

    return fuzz


def test_no_input_gives_a_5xx_with_tokens_configured(api_app_with_tokens):
    """Every operation of the OpenAPI, each token sent (the endpoint's own: the receive
    endpoints take theirs, not the UI's) and none; the figures are printed."""
    schema = schemathesis.openapi.from_asgi("/openapi.json", api_app_with_tokens,
                                            headers={"Authorization": f"Bearer {UI_TOKEN}"})
    operations = [result.ok() for result in schema.get_all_operations()]
    paths = {op.path for op in operations}
    assert {"/api/incidents", "/api/silences", "/readyz", "/api/v1/observations"} <= paths
    counts = {"authenticated": [0, 0], "unauthenticated": [0, 0]}  # requests, 5xx
    failures: list[str] = []
    for mode in counts:
        for operation in operations:
            token = RECEIVE_TOKEN if operation.path.startswith("/api/v1/") else UI_TOKEN
            headers = {"Authorization": f"Bearer {token}"} if mode == "authenticated" else {}

            fuzz = _counting(operation, headers, counts[mode], failures, mode)
            fuzz()
    print(f"\nschemathesis with tokens: {len(operations)} operations; " + "; ".join(
        f"{mode}: {n} requests, {bad} 5xx" for mode, (n, bad) in counts.items()))
    assert counts["unauthenticated"][0] > 0 and counts["authenticated"][0] > 0
    assert not failures, failures[:10]
