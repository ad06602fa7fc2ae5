"""The JSON API fuzzed against its own OpenAPI schema with schemathesis: no input makes it fail.

The agent behind it is real (stores, engine, ladder) with an incident in it, so the generated
requests reach real queries, not empty tables.
"""

from __future__ import annotations

import time

import pytest
import schemathesis
from hypothesis import HealthCheck, settings

from sloguard.samples import Sample

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


@pytest.fixture(scope="module")
def api_app(tmp_path_factory):
    from sloguard.agent import Agent
    from sloguard.config import load_settings
    from sloguard.ui.app import create_app

    tmp = tmp_path_factory.mktemp("fuzz")
    (tmp / "rules").mkdir()
    (tmp / "rules" / "r.yaml").write_text(RULES)
    config = tmp / "c.yaml"
    config.write_text(
        f"node_name: fuzz-node\ndata_dir: {tmp / 'data'}\nrules:\n  paths: [{tmp / 'rules'}]\n"
        "collectors:\n  node: {enabled: false}\n  cgroups: {enabled: false}\n")
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
    yield create_app(agent, manage_lifecycle=False)
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
