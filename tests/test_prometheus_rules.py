"""The Prometheus files deploy/prometheus/ ships, against a real Prometheus and real agents.

promtool (Debian's, 2.42) must accept the alerting rules and both scrape configs. Then a real
Prometheus, configured from the shipped static scrape config (targets and token path replaced)
and evaluating the shipped rules with only their `for:` shortened, scrapes three real `sloguard
run` agents; each alert must fire for the agent whose condition the test caused, and for no
other: a rule file that does not load, a store locked under the agent, an InfluxDB that does
not answer (its spool overflowing), a lever that fails (an API server that refuses), eBPF that
cannot attach, an agent killed, and no agent left to scrape. A rule whose expression names a
metric the agent does not export would never fire, which is what this catches.
"""

from __future__ import annotations

import shutil
import signal
import sqlite3
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import need
from support.influxenv import free_port
from support.prometheus import (
    PrometheusServer,
    kubernetes_sd_supported,
    missing_message,
    promtool,
    with_for,
)
from test_agent_e2e import AgentProcess

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = ROOT / "deploy" / "prometheus"
RULES_FILE = "sloguard-alerts.yaml"
TOKEN = "prometheus-test-token"  # the agents' ui.token, the scrape's credentials_file

ALWAYS_ON = """\
groups:
  - name: guard-test
    rules:
      - alert: AlwaysOn
        expr: node_memory
        field: total
        aggregate: last
        window: 2s
        params: {above: 0}
        for: 0s
        severity: warning
        policy: failing
"""
NEVER_ON = ALWAYS_ON.replace("AlwaysOn", "NeverOn").replace("above: 0", "above: 1e30").replace(
    "        policy: failing\n", "")
FAILING_POLICY = """\
policies:
  - name: failing
    steps:
      - step: cordon
"""
# Nothing listens on port 1: every request of the Kubernetes client is refused at once.
REFUSING_KUBECONFIG = """\
apiVersion: v1
kind: Config
clusters: [{name: gone, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: agent, user: {token: nothing}}]
contexts: [{name: gone, context: {cluster: gone, user: agent}}]
current-context: gone
"""


@pytest.fixture(scope="module", autouse=True)
def _prometheus_installed() -> None:
    missing = missing_message()
    need(not missing, missing)


# -- promtool -----------------------------------------------------------------------------------


def test_the_shipped_rules_pass_promtool():
    done = promtool("check", "rules", str(SHIPPED / RULES_FILE))
    assert done.returncode == 0, done.stdout + done.stderr
    alerts = [r["alert"] for g in yaml.safe_load((SHIPPED / RULES_FILE).read_text())["groups"]
              for r in g["rules"]]
    assert f"SUCCESS: {len(alerts)} rules found" in done.stdout


def _checkable(tmp_path: Path, name: str, edit: Callable[[dict[str, Any]], None] = lambda c: None
               ) -> Path:
    """The shipped config beside the shipped rules in a temp dir, its token file pointed at one
    that exists (promtool checks that it does), and edited by `edit`."""
    config = yaml.safe_load((SHIPPED / name).read_text())
    (tmp_path / "token").write_text(TOKEN)
    for job in config["scrape_configs"]:
        job["authorization"]["credentials_file"] = str(tmp_path / "token")
    edit(config)
    (tmp_path / RULES_FILE).write_text((SHIPPED / RULES_FILE).read_text())
    path = tmp_path / name
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def test_the_static_scrape_config_passes_promtool(tmp_path):
    done = promtool("check", "config", str(_checkable(tmp_path, "prometheus-static.yaml")))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS: 1 rule files found" in done.stdout, done.stdout  # checked with it


def test_the_kubernetes_scrape_config_passes_promtool_and_selects_the_daemonsets_pods(tmp_path):
    """Debian's Prometheus is built without Kubernetes discovery: there, the rest of the job
    (authorization, relabelling, the rule file) is checked with the discovery replaced by a
    file one, and the discovery block is compared with the DaemonSet it must find. A promtool
    that has Kubernetes discovery checks the file as shipped."""
    daemonset = yaml.safe_load((ROOT / "deploy/base/daemonset.yaml").read_text())
    pod = daemonset["spec"]["template"]
    labels = pod["metadata"]["labels"]
    [agent] = [c for c in pod["spec"]["containers"] if c["name"] == "agent"]
    port_names = {p["name"] for p in agent["ports"]}
    job = yaml.safe_load((SHIPPED / "prometheus-kubernetes.yaml").read_text())[
        "scrape_configs"][0]
    [sd] = job["kubernetes_sd_configs"]
    assert sd["role"] == "pod"
    assert sd["namespaces"]["names"] == [daemonset["metadata"]["namespace"]]
    [selector] = sd["selectors"]
    assert selector["role"] == "pod"
    wanted = dict(pair.split("=") for pair in selector["label"].split(","))
    assert wanted.items() <= labels.items(), (wanted, labels)
    [keep] = [r for r in job["relabel_configs"] if r.get("action") == "keep"]
    assert keep["source_labels"] == ["__meta_kubernetes_pod_container_port_name"]
    assert keep["regex"] in port_names

    def without_kubernetes_sd(config: dict[str, Any]) -> None:
        if not kubernetes_sd_supported():
            for each in config["scrape_configs"]:
                del each["kubernetes_sd_configs"]
                each["file_sd_configs"] = [{"files": [str(tmp_path / "targets.json")]}]

    path = _checkable(tmp_path, "prometheus-kubernetes.yaml", without_kubernetes_sd)
    done = promtool("check", "config", str(path))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS: 1 rule files found" in done.stdout, done.stdout


# -- a real Prometheus scraping real agents -----------------------------------------------------


def _agent(root: Path, name: str, sloguard_bin: str, config: str,
           files: dict[str, str] | None = None) -> AgentProcess:
    """`sloguard run` with `config` (its rules in root/name/rules, the files given beside)."""
    home = root / name
    (home / "rules").mkdir(parents=True)
    (home / "rules" / "guard.yaml").write_text(NEVER_ON)
    for rel, text in (files or {}).items():
        (home / rel).parent.mkdir(parents=True, exist_ok=True)
        (home / rel).write_text(text)
    (root / "token").write_text(TOKEN)
    (home / "sloguard.yaml").write_text(
        f"node_name: {name}\ninterval: 500ms\n"
        f"rules: {{paths: [{home / 'rules'}]}}\n"
        f"ui: {{token_file: {root / 'token'}}}\n" + config)
    return AgentProcess(sloguard_bin, home / "sloguard.yaml", home / "data", home / "agent.log")


def _prometheus_config(root: Path, targets: dict[str, AgentProcess]) -> str:
    """The shipped static scrape config, scraping `targets` every second: only the targets,
    their node labels, the token's path and the intervals are the test's."""
    config = yaml.safe_load((SHIPPED / "prometheus-static.yaml").read_text())
    config["global"] = {"scrape_interval": "1s", "scrape_timeout": "1s",
                        "evaluation_interval": "1s"}
    [job] = config["scrape_configs"]
    job["authorization"]["credentials_file"] = str(root / "token")
    job["static_configs"] = [{"targets": [f"127.0.0.1:{agent.port}"], "labels": {"node": name}}
                             for name, agent in targets.items()]
    return yaml.safe_dump(config, sort_keys=False)


class Guarded:
    """The agents, the Prometheus watching them, and what the test did to them."""

    def __init__(self, root: Path, agents: dict[str, AgentProcess],
                 prometheus: PrometheusServer) -> None:
        self.root, self.agents, self.prometheus = root, agents, prometheus

    def firing(self) -> set[tuple[str, str]]:
        """(alert, node) of every alert firing now."""
        return {(a["labels"]["alertname"], a["labels"].get("node", ""))
                for a in self.prometheus.alerts() if a["state"] == "firing"}

    def wait_firing(self, want: set[tuple[str, str]], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if want <= self.firing():
                return
            time.sleep(0.5)
        logs = {name: a.log.read_text()[-1500:] for name, a in self.agents.items()}
        rules = [(r["name"], r["health"], r.get("lastError")) for r in self.prometheus.rules()]
        raise AssertionError(f"{what}: wanted {sorted(want)}, firing {sorted(self.firing())}; "
                             f"all alerts: {self.prometheus.alerts()}; rules: {rules}; "
                             f"agent logs: {logs}")


@pytest.fixture(scope="module")
def guarded(tmp_path_factory) -> Iterator[Guarded]:
    sloguard_bin = shutil.which("sloguard", path=str(Path(sys.executable).parent))
    assert sloguard_bin, "the sloguard console script is not installed in this environment"
    root = tmp_path_factory.mktemp("guarded")
    agents: dict[str, AgentProcess] = {}
    prometheus = None
    try:
        # the agent the test breaks step by step; no eBPF asked of it
        agents["plain"] = _agent(root, "plain", sloguard_bin,
                                 "collectors: {cgroups: {include: []}, ebpf: {enabled: false}}\n")
        # InfluxDB that refuses every write, a spool that overflows at once
        agents["influx"] = _agent(
            root, "influx", sloguard_bin,
            f"store: {{kind: influxdb, url: 'http://127.0.0.1:{free_port()}', api: v1, "
            "database: sloguard, spool_max_size: 1KiB, max_backoff: 1s, flush_interval: 500ms}\n"
            "collectors: {cgroups: {include: []}, ebpf: {enabled: false}}\n")
        # a rule always firing, its policy's cordon refused by the API server, eBPF that
        # cannot load (no kernel tree to compile against, or no BCC at all)
        lever = root / "lever"
        agents["lever"] = _agent(
            root, "lever", sloguard_bin,
            f"kubernetes: {{enabled: true, kubeconfig: {lever / 'kubeconfig'}, timeout: 2s}}\n"
            f"actuators: {{dry_run: false, policies: [{lever / 'policies'}]}}\n"
            "collectors: {cgroups: {include: []}, "
            f"ebpf: {{enabled: true, kernel_source: {root / 'no-such-tree'}}}}}\n",
            files={"rules/always.yaml": ALWAYS_ON, "policies/failing.yaml": FAILING_POLICY,
                   "kubeconfig": REFUSING_KUBECONFIG})
        shipped = (SHIPPED / RULES_FILE).read_text()
        prometheus = PrometheusServer(_prometheus_config(root, agents),
                                      files={RULES_FILE: with_for(shipped, "1s")})
        prometheus.start()
        yield Guarded(root, agents, prometheus)
    finally:
        if prometheus is not None:
            prometheus.close()
        for agent in agents.values():
            if agent.proc.poll() is None:
                agent.proc.kill()
                agent.proc.wait()


def test_each_shipped_alert_fires_for_the_agent_whose_condition_was_caused(guarded):
    prom = guarded.prometheus
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        targets = prom.targets()
        if len(targets) == 3 and all(t["health"] == "up" for t in targets):
            break
        time.sleep(0.25)
    else:
        raise AssertionError(f"the agents were never all scraped: {prom.targets()}")
    shipped = {r["alert"] for g in yaml.safe_load((SHIPPED / RULES_FILE).read_text())["groups"]
               for r in g["rules"]}
    assert {r["name"] for r in prom.rules()} == shipped
    caused = {("SloguardRuleFilesRejected", "plain"), ("SloguardStoreWritesFailing", "plain"),
              ("SloguardInfluxWritesFailing", "influx"), ("SloguardSamplesDropped", "influx"),
              ("SloguardActionsFailing", "lever"), ("SloguardEbpfDetached", "lever")}
    # a shipped alert this test does not cause is an alert nobody has seen fire
    assert {a for a, _ in caused} | {"SloguardAgentDown", "SloguardAgentsMissing"} == shipped

    time.sleep(3)  # a few scrapes and evaluations of the plain agent as it is
    assert not [a for a in prom.alerts() if a["labels"].get("node") == "plain"]

    # the plain agent, healthy so far, now: a rule file that does not load, and its store
    # locked by another process (every write waits out SQLite's busy timeout and fails)
    plain = guarded.agents["plain"]
    rules_dir = plain.log.parent / "rules"
    (rules_dir / "broken.yaml").write_text("groups:\n  - name: broken\n    rules: [{alert: X\n")
    blocker = sqlite3.connect(plain.log.parent / "data" / "samples.db", timeout=10)
    blocker.execute("BEGIN EXCLUSIVE")
    try:
        guarded.wait_firing(caused, 45, "the alerts of the conditions caused")
        assert guarded.firing() == caused  # and none elsewhere
        for rule in prom.rules():
            assert rule["health"] == "ok", rule
    finally:
        blocker.rollback()
        blocker.close()

    plain.proc.send_signal(signal.SIGKILL)
    plain.proc.wait(timeout=10)
    guarded.wait_firing({("SloguardAgentDown", "plain")}, 20, "the killed agent")
    assert not {n for a, n in guarded.firing() if a == "SloguardAgentDown"} - {"plain"}

    # no target left: a DaemonSet deleted, or a discovery that no longer finds its pods
    prom.reload(_prometheus_config(guarded.root, {}))
    guarded.wait_firing({("SloguardAgentsMissing", "")}, 20, "no target at all")
