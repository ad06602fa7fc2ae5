"""The crash sweep: a whole episode of the real agent process, killed (SIGKILL) at each write
point in turn (sloguard/core/failpoints.py), restarted, and checked.

One episode: an LS cgroup gets busy, the rule fires, the policy climbs (SCHED_IDLE on the BE
cgroup, cordon, reduce the node's BE capacity, evict one BE pod), the load stops, the rung are
undone. A run with `kill=N` kills the agent at the N-th write point it passes; the agent is then
started again (no faults), the load is stopped, and once the episode is over the invariant is
checked: every cgroup file and node field is back to its original value, at most one pod was
evicted (the policy's per_incident budget) and it is in the ledger's audit, the node was
cordoned at most once, and no intent is left. Each run has its own node, pods, cgroups and data
directory, so runs cannot hide each other's leftovers.

Used by tests/test_crash_consistency.py (every point of one episode) and
benchmarks/fault_sweep.py (the same, with progress and a summary of figures).
"""

from __future__ import annotations

import concurrent.futures
import datetime
import json
import os
import signal
import socket
import sqlite3
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from kubernetes import client

from sloguard.actuators.capacity import parse

BATCH_CPU = "kubernetes.io/batch-cpu"
CAPACITY = {"cpu": "4", "pods": "110", BATCH_CPU: "8000"}
ALLOCATABLE = {"cpu": "4", "pods": "110", BATCH_CPU: "7500"}
CLASS = "koordinator.sh/qosClass"

RULES = """\
groups:
  - name: sweep
    rules:
      - alert: LSBusy
        expr: container_cpu{class="LS", workload="svc"}
        field: usage_cores
        aggregate: mean
        window: 1s
        params: {above: 0.3, recover_below: 0.15}
        for: 0s
        recover_for: 500ms
        severity: critical
        policy: guard
        labels: {resource: cpu}
"""

POLICY = """\
policies:
  - name: guard
    undo_hold: 250ms
    stale_after: 30s
    steps:
      - step: suppress
        levers:
          - step: cpu_idle
      - step: cordon
      - step: reduce_capacity
        params: {percent: 50}
      - step: evict
        params: {per_hour: 5, per_incident: 1}
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class RunResult:
    kill: int  # the write point the agent was killed at (0: none)
    point: str  # its name ("" when the run passed no such point)
    killed: bool
    violations: list[str] = field(default_factory=list)
    points: list[str] = field(default_factory=list)  # every point the first process passed
    seconds: float = 0.0


def _retried(call: Callable[[], Any], tries: int = 4) -> Any:
    """An admin call of the test itself, retried: on a loaded machine the test apiserver
    sometimes gives up on a request (504 after its 1 min request timeout). The agent's own
    calls are never retried here: that is what the sweep tests."""
    for attempt in range(tries):
        try:
            return call()
        except client.ApiException as exc:
            if exc.status is None or exc.status < 500 or attempt == tries - 1:
                raise
        time.sleep(1)
    raise AssertionError("unreachable")


class Sweep:
    """What stays the same across the runs: the apiserver, the cgroups helper, the binary."""

    def __init__(self, sloguard_bin: str, admin: client.ApiClient, kubeconfig: str,
                 audit: Callable[[], list[dict[str, Any]]], cgroups: Any, workdir: Path,
                 progress: Callable[[str], None] = lambda line: None) -> None:
        self.bin = sloguard_bin
        self.core = client.CoreV1Api(admin)
        self.kubeconfig = kubeconfig
        self.audit = audit
        self.cgroups = cgroups
        self.workdir = workdir
        self.progress = progress
        self.cpu_root = next(r for r in cgroups.hierarchies() if (r / "cpu.shares").exists()
                             or (r / "cpu.weight").exists())

    # -- one run -----------------------------------------------------------------------------

    def run(self, kill: int = 0, timeout: float = 60.0) -> RunResult:
        started = time.monotonic()
        suffix = uuid.uuid4().hex[:6]
        node, namespace = f"sweep-{suffix}", f"sweep-{suffix}"
        here = self.workdir / f"run-{kill:03d}-{suffix}"
        here.mkdir(parents=True)
        self._make_node(node, namespace)
        be = self.cgroups.create(f"{suffix}/be")
        ls = self.cgroups.create(f"{suffix}/ls")
        original = self._cgroup_values(be)
        config = self._config(here, node, be, ls)
        points_log = here / "points.log"
        agent = Agent(self.bin, config, here / "data", here / "agent.log",
                      {"SLOGUARD_FAILPOINT_LOG": str(points_log),
                       **({"SLOGUARD_FAILPOINT_KILL": str(kill)} if kill else {})})
        hog: subprocess.Popen | None = None
        result = RunResult(kill, "", False)
        try:
            ledger = here / "data" / "actuators.db"
            # the load only once the agent is up: a busy loop started beside a Python process
            # that is still importing starves it on a loaded two-core machine
            agent.up(timeout)
            hog = self.cgroups.spawn(ls)
            climbed = agent.wait(lambda: _audit_has(ledger, "evict", "apply", "done"), timeout)
            if climbed:
                hog.kill()
                hog.wait()
                agent.wait(lambda: _settled(ledger) and not agent.firing(), timeout)
            def restarted(killed: Agent) -> Agent:
                """Killed: the agent again, without faults, once the episode has ended."""
                if hog is not None and hog.poll() is None:
                    hog.kill()
                    hog.wait()
                killed.http.close()
                fresh = Agent(self.bin, config, here / "data", here / "agent.log", {})
                fresh.up(timeout)
                if not fresh.wait(lambda: _settled(ledger) and not fresh.firing(), timeout):
                    result.violations.append("the episode never ended after the restart")
                return fresh

            if agent.proc.poll() is not None:
                result.killed = agent.proc.returncode == -signal.SIGKILL
                agent = restarted(agent)
            elif not climbed:
                result.violations.append("the policy never reached evict")
            code = agent.terminate()
            if (code == -signal.SIGKILL and kill and not result.killed
                    and len(_points(points_log)) >= kill):
                # the kill point came after the episode looked over to the checks above: the
                # ledger's last write (put_descent) follows the episode's end (a CI run,
                # 2026-12-07, killed at #76 of 76). A kill all the same: start again, check.
                result.killed = True
                agent = restarted(agent)
                code = agent.terminate()
            if code != 0:
                result.violations.append(f"the agent exited {code} on SIGTERM")
            result.points = [p.replace(node, "NODE") for p in _points(points_log)]
            if kill and kill <= len(result.points):
                result.point = result.points[kill - 1]
            result.violations += self._check(node, namespace, be, original, ledger)
        finally:
            if hog is not None and hog.poll() is None:
                hog.kill()
                hog.wait()
            agent.http.close()
            if agent.proc.poll() is None:
                agent.proc.kill()
                agent.proc.wait()
            self._remove_node(node, namespace)
        result.seconds = time.monotonic() - started
        return result

    def run_all(self, kills: list[int], workers: int = 3) -> Iterator[RunResult]:
        """One run per kill point, `workers` at a time, results in the order of `kills`.

        Runs share nothing but the apiserver and the cgroup helper, which is safe to call
        from threads (each has its own node, namespace, cgroups, agent process and data
        directory), and most of a run is waiting on the agent's 250 ms ticks. Measured on
        this 2-core machine for the 76 points of one episode (2026-12-03): one at a time
        677 s (inside the full suite, CI simulation); side by side, alone, 409 s with two
        and 349 s with three (load average 3.6, 0 violations). Three is the default since a
        fresh machine's CI measured 45 min against its 45 min budget: the third saves about
        a minute, and a whole run then took ~14 s (349 s x 3 / 76), each of its waits
        allowing 60 s. The runs are CPU-bound (two cores busy): a kept HTTP client for the
        polls and shorter holds (undo_hold 250 ms, recover_for 500 ms) took the sweep from 486 s
        to 398 s alone in one slow hour (2026-12-03).
        Runs not yet started are cancelled when the caller stops early (a failed assertion,
        ^C), instead of the sweep running on to its end."""
        pool = concurrent.futures.ThreadPoolExecutor(workers)
        try:
            yield from pool.map(lambda kill: self.run(kill=kill), kills)
        finally:
            pool.shutdown(cancel_futures=True)

    # -- the world of one run ----------------------------------------------------------------

    def _make_node(self, node: str, namespace: str) -> None:
        _retried(lambda: self.core.create_node(client.V1Node(
            metadata=client.V1ObjectMeta(name=node))))
        _retried(lambda: self.core.patch_node_status(node, {"status": {
            "capacity": CAPACITY, "allocatable": ALLOCATABLE}}))
        _retried(lambda: self.core.create_namespace(client.V1Namespace(
            metadata=client.V1ObjectMeta(name=namespace))))
        for name, label, cpu in (("batch-a", "BE", "1"), ("batch-b", "BE", "2"),
                                 ("web", "LS", "2")):
            self._pod(node, namespace, name, label, cpu)

    def _pod(self, node: str, namespace: str, name: str, label: str, cpu: str) -> None:
        """A pod bound to the node, and the kubelet's part: Running and Ready."""
        resources = client.V1ResourceRequirements(requests={"cpu": cpu}, limits={"cpu": cpu})
        _retried(lambda: self.core.create_namespaced_pod(namespace, client.V1Pod(
            metadata=client.V1ObjectMeta(name=name, labels={CLASS: label}),
            spec=client.V1PodSpec(node_name=node, termination_grace_period_seconds=30,
                                  containers=[client.V1Container(
                                      name="main", image="registry.invalid/x:1",
                                      resources=resources)]))))
        now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        _retried(lambda: self.core.patch_namespaced_pod_status(name, namespace, {"status": {
            "phase": "Running", "qosClass": "Guaranteed", "startTime": now,
            "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": now}]}}))

    def _remove_node(self, node: str, namespace: str) -> None:
        try:
            for pod in self.core.list_namespaced_pod(namespace).items:
                self.core.delete_namespaced_pod(pod.metadata.name, namespace,
                                                grace_period_seconds=0)
            self.core.delete_namespace(namespace)
            self.core.delete_node(node)
        except client.ApiException:
            pass

    def _config(self, here: Path, node: str, be: str, ls: str) -> Path:
        (here / "rules").mkdir()
        (here / "rules" / "sweep.yaml").write_text(RULES)
        (here / "policies").mkdir()
        (here / "policies" / "guard.yaml").write_text(POLICY)
        config = here / "sloguard.yaml"
        config.write_text(json.dumps({
            "node_name": node,
            "interval": "250ms",
            "rules": {"paths": [str(here / "rules")]},
            "actuators": {"dry_run": False, "policies": [str(here / "policies")]},
            "kubernetes": {"enabled": True, "kubeconfig": self.kubeconfig, "refresh": "5s"},
            "collectors": {
                "ebpf": {"enabled": False}, "cpi": {"enabled": False},
                "cgroups": {"include": [], "rediscover": "1s", "declare": [
                    {"path": ls, "class": "LS", "name": "svc"},
                    {"path": be, "class": "BE", "name": "batch"}]}},
        }))
        return config

    def _cgroup_values(self, be: str) -> dict[str, str]:
        values = {}
        for name in ("cpu.idle", "cpu.shares", "cpu.weight"):
            path = self.cpu_root / be / name
            if path.exists():
                values[name] = path.read_text().strip()
        return values

    # -- the invariant -----------------------------------------------------------------------

    def _check(self, node: str, namespace: str, be: str, original: dict[str, str],
               ledger: Path) -> list[str]:
        bad: list[str] = []
        now = self._cgroup_values(be)
        for name, value in original.items():
            if now.get(name) != value:
                bad.append(f"{be}/{name} is {now.get(name)}, was {value}")
        obj = _retried(lambda: self.core.read_node(node))
        if obj.spec.unschedulable:
            bad.append("the node is still cordoned")
        marks = [k for k in (obj.metadata.annotations or {}) if k.startswith("sloguard.io/")]
        if marks:
            bad.append(f"sloguard's marks left on the node: {marks}")
        for field_name, want in (("capacity", CAPACITY), ("allocatable", ALLOCATABLE)):
            have = dict(getattr(obj.status, field_name) or {})
            if parse(have.get(BATCH_CPU, "0")) != parse(want[BATCH_CPU]):
                bad.append(f"{field_name} {BATCH_CPU} is {have.get(BATCH_CPU)}, was "
                           f"{want[BATCH_CPU]}")
        evictions = [e for e in self.audit()
                     if e.get("objectRef", {}).get("subresource") == "eviction"
                     and e.get("objectRef", {}).get("namespace") == namespace
                     and e.get("verb") == "create" and e.get("stage") == "ResponseComplete"
                     and e.get("responseStatus", {}).get("code") in (200, 201)]
        evicted = {e["objectRef"]["name"] for e in evictions}
        if len(evictions) > 1:
            bad.append(f"{len(evictions)} evictions for one incident (budget 1): {evicted}")
        cordons = _retried(lambda: self.core.list_namespaced_event(
            "default", field_selector=f"involvedObject.name={node},reason=SloguardCordoned"))
        if len(cordons.items) > 1:
            bad.append(f"cordoned {len(cordons.items)} times")
        if not ledger.exists():
            return [*bad, "the agent never opened its ledger (see its log)"]
        with sqlite3.connect(ledger) as conn:
            recorded = conn.execute("SELECT count(*) FROM audit WHERE kind = 'evict' AND "
                                    "action = 'apply' AND status = 'done'").fetchone()[0]
            intents = conn.execute("SELECT kind FROM intents").fetchall()
            rungs = conn.execute("SELECT kind FROM rungs").fetchall()
            episodes = conn.execute("SELECT policy FROM episodes").fetchall()
        if recorded != len(evictions):
            bad.append(f"the ledger's audit records {recorded} evictions, the apiserver "
                       f"{len(evictions)}")
        if intents:
            bad.append(f"intents left: {intents}")
        if rungs:
            bad.append(f"rungs left in force: {rungs}")
        if episodes:
            bad.append(f"episodes left open: {episodes}")
        return bad


class Agent:
    """`sloguard run` as a process, with extra environment."""

    def __init__(self, binary: str, config: Path, data: Path, log: Path,
                 env: dict[str, str]) -> None:
        self.command = [binary, "run", "-c", str(config), "--data-dir", str(data)]
        self.env = {**os.environ, **env}
        self.log = log
        self._launch()

    def _launch(self) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        # one client for the run's polls: httpx.get() makes a client, and with it a TLS
        # context, per call, 57 ms of CPU against 2.5 ms on a kept client (measured here,
        # 2026-12-03); at ten polls a second, three runs side by side, that was most of a core
        self.http = httpx.Client(base_url=self.url, timeout=5)
        self.log_from = self.log.stat().st_size if self.log.exists() else 0
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen([*self.command, "--listen", f"127.0.0.1:{self.port}"],
                                         stdout=out, stderr=subprocess.STDOUT, env=self.env)

    def up(self, timeout: float) -> bool:
        """Healthy within `timeout`. The port _free_port found free can be taken before the
        agent binds it (runs side by side open connections from the same ephemeral range:
        a CI run, 2026-12-08, lost one restarted agent so, exit 3): such an agent is started
        again on another port, its write points of the attempt forgotten."""
        for _ in range(3):
            if self.wait(self.healthy, timeout):
                return True
            with open(self.log, "rb") as log:
                log.seek(self.log_from)
                lost_port = b"address already in use" in log.read()
            if self.proc.poll() is None or not lost_port:
                return False
            self.http.close()
            points = self.env.get("SLOGUARD_FAILPOINT_LOG")
            if points and os.path.exists(points):
                os.truncate(points, 0)
            self._launch()
        return False

    def wait(self, check: Callable[[], bool], timeout: float) -> bool:
        """True once `check` holds; False when the process died first or time ran out."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            try:
                if check():
                    return True
            except (httpx.HTTPError, sqlite3.Error, OSError):
                pass
            time.sleep(0.1)
        return False

    def healthy(self) -> bool:
        return self.http.get("/healthz").status_code == 200

    def firing(self) -> bool:
        body = self.http.get("/api/incidents", params={"state": "firing"}).json()
        return bool(body["incidents"])

    def terminate(self) -> int:
        self.http.close()
        if self.proc.poll() is not None:
            return self.proc.returncode
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()


def _connect(path: Path) -> sqlite3.Connection:
    if not path.exists():
        raise sqlite3.OperationalError("no ledger yet")
    return sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=1)


def _audit_has(ledger: Path, kind: str, action: str, status: str) -> bool:
    with _connect(ledger) as conn:
        return conn.execute("SELECT 1 FROM audit WHERE kind = ? AND action = ? AND status = ? "
                            "LIMIT 1", (kind, action, status)).fetchone() is not None


def _settled(ledger: Path) -> bool:
    """The episode is over in the ledger: nothing in force, no intent, no episode open."""
    with _connect(ledger) as conn:
        return all(conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0] == 0
                   for table in ("rungs", "intents", "episodes"))


def _points(log: Path) -> list[str]:
    if not log.exists():
        return []
    names = []
    for line in log.read_text().splitlines():
        _, _, name = line.partition(" ")
        names.append(name)
    return names
