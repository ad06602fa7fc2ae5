"""The real sloguard agent, run for one way of a lab scenario.

It is the agent users run (`sloguard run`, a child process) with the shipped rules and the
shipped escalation policy; only what makes it see the lab differs from a node's config: the lab
cgroups are declared LS and BE (there are no kubepods here), the LS service's objective is the
scenario's, and the load generator's latencies reach it through the receive endpoint, as a
service's own pushes would.

Kubernetes steps (cordon, reduce_capacity, evict) go to the API server of a kubeconfig when one
is given, on a Node object the lab registers for the run; without one they run in shadow mode
(`dry_run: true` on those steps in the lab's copy of the policy), so the audit shows what they
would have done.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from sloguard.actuators.config import default_policy_paths
from sloguard.actuators.kinds import StepRegistry

KUBE_STEPS = ("cordon", "reduce_capacity", "evict")
SERVICE = "redis-lab"
LS_CGROUP = "sloguard-lab/ls"
BE_CGROUP = "sloguard-lab/be"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@functools.cache
def per_workload_levers() -> tuple[str, ...]:
    """The step kinds that act on BE workloads one by one (`per_workload`,
    actuators/step.py): the ones a policy may point at `target: suspects`. Read from the step
    registry, so a new lever joins the lab's ways without a list here to keep up."""
    registry = StepRegistry(use_entry_points=False)
    return tuple(kind for kind in registry.names()
                 if getattr(registry.get(kind), "per_workload", False))


def way_targets(way: str) -> dict[str, str]:
    """The lever targets a guarded way sets over the shipped policies' own: none for
    `guarded`; every per-workload lever on the tier (`guarded-tier`) or at the suspects
    (`guarded-suspects`); or the mixed policy (`guarded-mixed`): SCHED_IDLE tier-wide (it cost
    BE nothing measurable in the lab, and the first ranking at firing has no evidence yet),
    the levers that take CPU, cache or memory away on the suspects first."""
    levers = per_workload_levers()
    if way == "guarded-tier":
        return dict.fromkeys(levers, "tier")
    if way == "guarded-suspects":
        return dict.fromkeys(levers, "suspects")
    if way == "guarded-mixed":
        return {lever: "tier" if lever == "cpu_idle" else "suspects" for lever in levers}
    return {}


def way_standing(way: str) -> bool | None:
    """Whether a guarded way keeps SCHED_IDLE standing (`guarded-standing`: in force at all
    times, docs/actuators.md), none at all (`guarded-episodic`: every lever from the
    ladder, as before standing levers), or the shipped policies' own (None)."""
    return {"guarded-standing": True, "guarded-episodic": False}.get(way)


def lab_policies(target: Path, kube: bool, targets: dict[str, str] | None = None,
                 standing: bool | None = None) -> Path:
    """The shipped policies, copied; without an API server, the Kubernetes steps in shadow
    mode; each lever kind in `targets` at the target it names (`suspects`: the first
    suspect, then the next, then the tier: docs/attribution.md); `standing` (way_standing):
    SCHED_IDLE standing in the policy that has it as a lever, or no standing lever at all."""
    targets = targets or {}
    target.mkdir(parents=True, exist_ok=True)
    for source in default_policy_paths():
        path = Path(source)
        files = sorted(path.glob("*.yaml")) if path.is_dir() else [path]
        for file in files:
            document = yaml.safe_load(file.read_text())
            for policy in document.get("policies", []):
                if standing is False:
                    policy.pop("standing", None)
                elif standing and any(lever.get("step") == "cpu_idle"
                                      for step in policy.get("steps", [])
                                      for lever in step.get("levers", [])):
                    policy["standing"] = [{"step": "cpu_idle"}]
                for step in policy.get("steps", []):
                    if not kube and step.get("step") in KUBE_STEPS:
                        step["dry_run"] = True
                    for lever in [step, *step.get("levers", [])]:
                        if lever.get("step") in targets:
                            lever["target"] = targets[lever["step"]]
            (target / file.name).write_text(yaml.safe_dump(document, sort_keys=False))
    return target


def agent_config(workdir: Path, port: int, guarded: bool, slo: Any,
                 kubeconfig: str | None, node: str, pods: bool = False,
                 be_cgroups: list[tuple[str, str]] | None = None, ebpf: bool = False,
                 targets: dict[str, str] | None = None, standing: bool | None = None) -> Path:
    """`be_cgroups`: the BE cgroups to declare (path, name); by default the one BE cgroup.
    `ebpf`: run the eBPF programs (attribution's run-queue blame needs them); off otherwise,
    as compiling them costs each way several CPU-seconds right before the schedule.
    `targets`: the lever targets over the shipped policies' own (way_targets); `standing`:
    way_standing."""
    token = workdir / "receive.token"
    token.write_text(secrets.token_hex(16))
    # Pods are found as on any node (the kubelet's kubepods, classes from the API); the lab's
    # own cgroups are declared. Both walked every 2 s: each episode starts a new BE pod.
    cgroups: dict[str, Any] = {"rediscover": "2s"} if pods else {
        "include": [LS_CGROUP.split("/")[0]],
        "declare": [{"path": LS_CGROUP, "class": "LS", "name": "redis"},
                    *({"path": rel, "class": "BE", "name": name}
                      for rel, name in be_cgroups or [(BE_CGROUP, "stress-ng")])],
        "rediscover": "2s",
    }
    config = {
        "node_name": node,
        "listen": f"127.0.0.1:{port}",
        "interval": "1s",
        "collectors": {
            "cgroups": cgroups,
            "ebpf": {"enabled": ebpf},
        },
        "kubernetes": {"enabled": kubeconfig is not None, "kubeconfig": kubeconfig},
        "actuators": {
            "dry_run": not guarded,
            "policies": [str(lab_policies(workdir / "policies", kubeconfig is not None,
                                          targets, standing))],
        },
        "app_latency": {"pods": {"enabled": False},
                        "receive": {"enabled": True, "token_file": str(token)}},
        "slos": [{"service": SERVICE, "percentile": slo.percentile,
                  "latency_ms": slo.latency_ms, "window": slo.window}],
    }
    path = workdir / "agent.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


class LabAgent:
    """`sloguard run` as a child; talks to it over its API."""

    def __init__(self, workdir: Path, guarded: bool, slo: Any, kubeconfig: str | None = None,
                 node: str = "sloguard-lab", cpus: set[int] | None = None,
                 pods: bool = False, be_cgroups: list[tuple[str, str]] | None = None,
                 ebpf: bool = False, targets: dict[str, str] | None = None,
                 standing: bool | None = None) -> None:
        self.workdir = workdir
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        config = agent_config(workdir, self.port, guarded, slo, kubeconfig, node, pods,
                              be_cgroups, ebpf, targets, standing)
        self.token = (workdir / "receive.token").read_text().strip()
        binary = shutil.which("sloguard", path=str(Path(sys.executable).parent)) or "sloguard"
        self.log = open(workdir / "agent.log", "ab")  # noqa: SIM115 - closed in stop
        argv = [binary, "run", "-c", str(config), "--data-dir", str(workdir / "data")]
        taskset = shutil.which("taskset")
        # on the shared CPUs from its first thread on (way.shared_cpus): traced on the LS
        # core, the agent's bursts (a push handled, a tick) preempted redis
        self.cpus = sorted(cpus) if cpus and taskset else []
        if self.cpus:
            argv = [taskset, "-c", ",".join(map(str, self.cpus)), *argv]
        self.proc = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT)

    def placement(self) -> str:
        """Where the running agent may run, as the kernel says (for the way's notes)."""
        try:
            cpus = sorted(os.sched_getaffinity(self.proc.pid))
        except OSError:
            return "unknown CPUs"
        return "CPUs " + ",".join(map(str, cpus))

    def wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.get("/healthz")
                return
            except OSError:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"the agent exited ({self.proc.returncode}); see "
                                       f"{self.workdir / 'agent.log'}") from None
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the agent did not answer in {timeout:g}s; see "
                                       f"{self.workdir / 'agent.log'}") from None
                time.sleep(0.2)

    def wait_ebpf(self, timeout: float = 120.0) -> str:
        """Wait for the eBPF programs to be attached (or refused): they compile in a child
        process after the agent answers, and a way must not start while they are compiling.
        What /readyz said in the end (empty: attached)."""
        deadline = time.monotonic() + timeout
        reason = "not loaded yet"
        while time.monotonic() < deadline:
            try:
                ready = self.get_any("/readyz")
            except OSError:
                ready = {}
            status = next((c for c in ready.get("components", [])
                           if c.get("name") == "collector:ebpf"), None)
            if status is not None:
                reason = status.get("reason", "")
                if "not loaded yet" not in reason:
                    return reason
            time.sleep(0.5)
        return reason

    def get_any(self, path: str) -> Any:
        """Like `get`, but an error status's body too (/readyz answers 503 while not ready)."""
        try:
            return self.get(path)
        except urllib.error.HTTPError as exc:
            return json.loads(exc.read() or b"null")

    def get(self, path: str, **query: Any) -> Any:
        url = self.base + path + ("?" + urllib.parse.urlencode(query) if query else "")
        with urllib.request.urlopen(url, timeout=10) as response:
            return json.loads(response.read() or b"null")

    def push_histogram(self, bounds_ms: list[float], counts: list[int], interval_s: float,
                       lost: int = 0) -> None:
        """The LS service's latencies, as its own push to the agent on its node would be: a
        histogram (counts per bucket, the last above every bound); lost requests as errors."""
        body = json.dumps({"observations": [{
            "service": SERVICE, "class": "LS", "target": "lab-client",
            "histogram": {"bounds_ms": bounds_ms, "counts": counts}, "errors": lost,
            "interval_s": interval_s, "requests": sum(counts) + lost}]}).encode()
        request = urllib.request.Request(
            self.base + "/api/v1/observations", data=body, method="POST",
            headers={"Authorization": f"Bearer {self.token}",
                     "Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=5) as response:
            response.read()

    def in_force(self) -> list[dict[str, Any]]:
        """The rungs really applied and not yet undone (shadow-mode proposals left out, and
        standing levers, which are never undone while configured)."""
        return [r for r in self.get("/api/policies")["in_force"]
                if r["status"] == "done" and not r["dry_run"]
                and not r["policy"].startswith("standing:")]

    def wait_released(self, timeout: float) -> list[dict[str, Any]]:
        """Wait until the agent has undone every rung (its own undo, as on a node: the
        incidents resolve, then a rung per `undo_hold`); what is still in force at `timeout`."""
        deadline = time.monotonic() + timeout
        while (left := self.in_force()) and time.monotonic() < deadline:
            time.sleep(1)
        return left

    def incidents(self) -> list[dict[str, Any]]:
        return self.get("/api/incidents", limit=1000)["incidents"]

    def actions(self) -> list[dict[str, Any]]:
        return self.get("/api/actions", limit=5000)["actions"]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        with contextlib.suppress(OSError):
            self.log.close()
