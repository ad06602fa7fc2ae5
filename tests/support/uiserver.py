"""A real agent (stores, engine, ladder; collectors off) served by uvicorn on loopback, with a
few minutes of a slow LS series already evaluated: what the UI and API tests look at."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

S = 1_000_000_000
HOSTILE_POD = '<img src=x onerror="window.__xss=1">web-1'
RULES = """\
groups:
  - name: ls
    rules:
      - alert: LSSlow
        expr: lat{class="LS"}
        field: p99
        aggregate: last
        window: 2s
        params: {above: 10, recover_below: 5}
        for: 2s
        recover_for: 3s
        severity: critical
        policy: ls-interference
        annotations:
          summary: "{{ $labels.pod }} p99 {{ $value }} ms"
          runbook: "<script>window.__xss=2</script>see the wiki"
"""


def feed(agent: Any, pod: str, values: list[float], start_ns: int) -> None:
    from sloguard.core.samples import Sample

    for second, value in enumerate(values):
        now = start_ns + second * S
        sample = Sample("lat", {"node": agent.node, "class": "LS", "pod": pod}, {"p99": value},
                        now)
        agent.store.write([sample])
        agent.windows.add([sample])
        agent.engine.evaluate(now)
        agent.ladder.tick(now, agent.engine.firing())


@contextmanager
def served_agent(tmp_path: Path, extra_config: str = "",
                 history: bool = True) -> Iterator[tuple[Any, str]]:
    import uvicorn

    from sloguard.agent import Agent
    from sloguard.settings import load_settings
    from sloguard.ui.app import create_app, server_options

    (tmp_path / "rules").mkdir(exist_ok=True)
    (tmp_path / "rules" / "r.yaml").write_text(RULES)
    config = tmp_path / "c.yaml"
    config.write_text(
        f"node_name: ui-node\ndata_dir: {tmp_path / 'data'}\n"
        f"rules:\n  paths: [{tmp_path / 'rules'}]\n"
        "collectors:\n  node: {enabled: false}\n  cgroups: {enabled: false}\n" + extra_config)
    agent = Agent(load_settings(config).settings)
    agent._reload_rules()
    if history:  # quiet, slow for 25 s, quiet again: one resolved incident
        feed(agent, HOSTILE_POD, [40.0 if 20 <= s < 45 else 2.0 + (s % 3) for s in range(60)],
             time.time_ns() - 120 * S)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    tls = server_options(agent.settings)  # as `sloguard run` serves it
    server = uvicorn.Server(uvicorn.Config(create_app(agent, manage_lifecycle=False),
                                           host="127.0.0.1", port=port, log_level="warning",
                                           **tls))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.started, "uvicorn did not start"
    try:
        yield agent, f"{'https' if tls else 'http'}://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)
