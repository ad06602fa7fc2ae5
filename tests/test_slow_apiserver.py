"""A slow API server never holds up the agent's beat (issue #19).

The real agent process talks to the real apiserver through a proxy that adds 5 s to every
request. While a policy of the shipped kind cordons and evicts through it, the
collection and evaluation ticks must keep their interval, and the local lever (SCHED_IDLE)
must not wait behind the API calls. (The machine's load decides how long the calls take in
all; the ticks must not care.)
"""

from __future__ import annotations

import json
import re
import urllib.parse
from pathlib import Path

from kubernetes import client
from support.fault_sweep import Agent, Sweep
from support.slow_proxy import SlowProxy

POLICY = """\
policies:
  - name: guard
    undo_hold: 1s
    steps:
      - step: cordon
      - step: evict
        params: {per_hour: 5, per_incident: 1}
      - step: suppress
        levers:
          - step: cpu_idle
"""


def _histogram(metrics: str, name: str) -> dict[str, float]:
    """le -> cumulative count of a Prometheus histogram in the exposition text."""
    found = re.findall(rf'^{name}_bucket\{{le="([^"]+)"\}} (\S+)$', metrics, re.M)
    return {le: float(count) for le, count in found}


def test_ticks_keep_their_interval_while_every_api_call_takes_5s(
        kube, kube_agent, real_cgroups, sloguard_bin, tmp_path):
    server = urllib.parse.urlsplit(kube.server)
    proxy = SlowProxy((server.hostname, server.port), delay=5.0)
    config = json.loads(Path(kube_agent.kubeconfig()).read_text())
    config["clusters"][0]["cluster"]["server"] = f"https://{server.hostname}:{proxy.port}"
    slow = tmp_path / "slow.kubeconfig"
    slow.write_text(json.dumps(config))
    sweep = Sweep(sloguard_bin, kube.api_client(), str(slow), kube_agent.audit, real_cgroups,
                  tmp_path)
    here = tmp_path / "run"
    here.mkdir()
    node, namespace = "slow-node", "slow-ns"
    sweep._make_node(node, namespace)
    be, ls = real_cgroups.create("slow/be"), real_cgroups.create("slow/ls")
    real_cgroups.prioritise(ls)
    path = sweep._config(here, node, be, ls)
    settings = json.loads(path.read_text())
    settings["interval"] = "2s"
    settings["kubernetes"]["timeout"] = "30s"
    path.write_text(json.dumps(settings))
    (here / "policies" / "guard.yaml").write_text(POLICY)
    agent = Agent(sloguard_bin, path, here / "data", here / "agent.log", {})
    core = client.CoreV1Api(kube.api_client())
    try:
        assert agent.up(30)
        hog = real_cgroups.spawn(ls)
        assert agent.wait(lambda: agent.firing(), 30), "never fired"
        idle = sweep.cpu_root / be / "cpu.idle"
        # the local lever is the last rung, behind three slow API steps, and comes within
        # seconds: their `after` counts from when each was started, not from its reply
        assert agent.wait(lambda: idle.read_text().strip() == "1", 15), "cpu_idle waited"

        def evicted() -> bool:
            try:
                pods = core.list_namespaced_pod(namespace).items
            except client.ApiException:  # the test apiserver, starved on a loaded machine
                return False
            return any(p.metadata.deletion_timestamp for p in pods)

        assert agent.wait(evicted, 240), "the API steps never completed"
        assert core.read_node(node).spec.unschedulable is True
        metrics = agent.http.get("/metrics", timeout=10).text
        buckets = _histogram(metrics, "sloguard_tick_duration_seconds")
        # every tick within 2.5 s, 1.25x the interval: one that waited on the API would have
        # taken 5 s or more
        assert buckets["2.5"] == buckets["+Inf"] > 10, buckets
        hog.kill()
        hog.wait()
        assert agent.wait(lambda: core.read_node(node).spec.unschedulable is not True, 120)
        assert agent.terminate() == 0
    finally:
        if agent.proc.poll() is None:
            agent.proc.kill()
        proxy.close()
        sweep._remove_node(node, namespace)
