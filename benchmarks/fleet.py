"""A fleet of 1,000 forwarding agents against two `sloguard server` replicas on one PostgreSQL.

Why this exists: issue #24 ("proof at fleet size") asks whether the cluster server takes a
whole fleet's incidents, at what latency and cost, and whether faults on the server side lose
or duplicate anything. The unit and end-to-end tests prove the parts with a handful of agents;
only a fleet shows the queueing, the backoff of a thousand forwarders at once and what a
replica or database restart does under that load. It is a benchmark, not a test (its figures
depend on the machine): tests/test_fleet_bench.py runs it at tiny scale so that it keeps
working.

What runs, all on loopback:
- PostgreSQL 15 from initdb in a temp dir (tests/support/postgres.py), with its own durable
  defaults (fsync and synchronous commit on, unlike the tests' server), so that "nothing lost"
  means what it would in a deployment.
- Two real `sloguard server` processes (the console script, `server.database` set) sharing it.
- A round-robin TCP proxy (a process of this script) in front of both, standing in for the
  Kubernetes Service: the forwarder takes one URL, and a Service is what gives an agent a
  replica that is alive. Each forwarder request is a new connection (urllib), so requests
  alternate between replicas; a replica that refuses the connection is skipped, as a Service
  drops an endpoint that is not ready. A request in flight on a killed replica fails, and the
  forwarder's next round (after its backoff) reaches the other one.
- `--workers` processes with `--agents` simulated agents between them. Each agent is the real
  code an agent forwards with: its own IncidentStore and Ledger (SQLite files, in /dev/shm by
  default: a real node has a disk of its own, and 1,000 nodes' fsyncs on one VM disk would
  measure that disk) and a real `Forwarder` with the node's own name and the default
  interval, batch and refresh. A thread pool per worker calls `Forwarder.round()` when it is
  due, waiting `Forwarder.next_wait()` between rounds as the forwarder's own thread does (the
  interval from when the round was due, with its jitter; the backoff after failures),
  instead of 1,000 threads. `_post` is wrapped to
  time each request at the client. A traffic model makes the changes the forwarders send: on
  each evaluation tick (`--tick`) an agent may raise a pending incident; a pending one fires
  (with a first ladder rung: an action on the incident and an audit entry) or is deleted
  (sent as a withdrawal); a firing one gains evidence each tick (saved, numbered only when
  news or every `refresh`), may escalate (a second rung), and resolves (its rungs undone:
  audit entries). Documents are about 2 KB with their labels, suspects and evidence.

Phases: a warm-up of one forward interval (the agents' first rounds), shown apart; steady
state (`--steady` s); a burst in which 10% of the nodes fire `--burst-incidents` incidents
each at the same moment; during it one replica is killed (-9) (`--kill-at` s into the
burst) and restarted `--replica-down` s later (as its Deployment would), and PostgreSQL is
restarted with `pg_ctl restart -m fast` (`--pg-restart-at`); the burst ends when the replica
is back. Then the drain: every agent ends its incidents (resolves
the firing ones, withdraws the pending ones) and the forwarders run until every cursor has
caught up with its stores; the time that takes from the end of the faults is the figure.

Checks (exit 1 if any fails): each agent's IncidentStore at the end against the database:
every incident present once, at the same updated_ns and state, none the agent deleted still
there, none extra; each agent's audit entries present once per (node, source id) with their
time and kind; no forwarder passed an item over. Then the database is filled to
`--list-incidents` with benchmarks/cluster_list.py's incidents and the incident list is timed
through the proxy against the running replicas (the fleet still sending its heartbeats):
its slowest p95 must be under 300 ms.

Printed: ingest request latency p50/p99 per phase (at the client), requests failed by kind and
rounds retried, CPU seconds per node per minute of the replicas and of PostgreSQL (psutil,
sampled each second; the agents' and the proxy's apart), database size per 1,000 incidents
(pg_total_relation_size), the time to drain after the faults, and progress lines while it
runs. With --plot, docs/fleet.png: the ingest latency over time with the faults marked.

Run it from the repository root (as root or as a user that can run PostgreSQL; about 2.5
minutes at full size on 2 cores, the fill to 100,000 incidents included):

    .venv/bin/python benchmarks/fleet.py --plot
    .venv/bin/python benchmarks/fleet.py --agents 100 --steady 30 --burst 30 --list-incidents 0
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import heapq
import itertools
import json
import multiprocessing as mp
import os
import random
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # support/postgres.py
sys.path.insert(0, str(ROOT / "benchmarks"))  # cluster_list.py

BURST_SHARE = 0.10  # of the nodes firing at once
INGEST_ENV = "SLOGUARD_FLEET_INGEST_TOKEN"
PASSWORD_ENV = "SLOGUARD_FLEET_PG_PASSWORD"


# -- authentication: the one place that knows how agents prove who they are ------------------

def ingest_auth(nodes: list[str]) -> tuple[str, dict[str, str], dict[str, str]]:
    """How the servers check the agents' ingest requests: the `server:` lines of their config,
    the environment they need, and each node's token. One shared `server.ingest_token` today;
    per-node tokens change only this function."""
    token = "fleet-ingest-" + os.urandom(8).hex()
    return f"  ingest_token_env: {INGEST_ENV}\n", {INGEST_ENV: token}, \
        dict.fromkeys(nodes, token)


# -- the simulated agents (worker processes) ---------------------------------------------------

def _classify(exc: BaseException) -> str:
    """A failed request's kind, for the counts: HTTP status, reset, timeout, unreachable."""
    from sloguard.forwarder import CutOff, TooLarge

    text = str(exc)
    if isinstance(exc, TooLarge):
        return "http 413"
    if isinstance(exc, CutOff):
        return "reset"
    if text.startswith("HTTP "):
        return "http " + text.split()[1]
    if "timed out" in text:
        return "timeout"
    if "refused" in text:
        return "refused"
    if "reset" in text or "closed" in text or "disconnect" in text.lower():
        return "reset"
    return "unreachable"


def _make_forwarder_class(record):
    """The real Forwarder with its request timed at the client: `record(wall_s, ms, outcome,
    bytes)` for every POST, taken or not."""
    from sloguard.forwarder import Forwarder

    class TimedForwarder(Forwarder):
        def _post(self, data: bytes) -> None:
            wall, start = time.time(), time.perf_counter()
            try:
                super()._post(data)
            except Exception as exc:
                record(wall, (time.perf_counter() - start) * 1000, _classify(exc), len(data))
                raise
            record(wall, (time.perf_counter() - start) * 1000, "ok", len(data))

    return TimedForwarder


class Agent:
    """One node: its stores, its forwarder, and the traffic model that changes its incidents
    as an agent's rules and ladder would (the model runs under `lock`, as an agent's loop is
    one thread; the forwarder's rounds run beside it, as its thread does)."""

    def __init__(self, name: str, home: Path, url: str, token: str, args: Any,
                 forwarder_class: type, seed: int) -> None:
        from sloguard.actuators.ledger import Ledger
        from sloguard.forwarder import ForwardConfig
        from sloguard.store.incidents_db import IncidentStore

        home.mkdir(parents=True, exist_ok=True)
        self.name = name
        self.incidents = IncidentStore(home / "incidents.db", refresh_s=args.refresh)
        self.ledger = Ledger(home / "actuators.db")
        cfg = ForwardConfig(url=url, token=token, interval=args.interval, refresh=args.refresh)
        self.forwarder = forwarder_class(cfg, name, self.incidents, self.ledger, home)
        self.rng = random.Random(seed)
        self.p_new = args.new_per_hour / 3600 * args.tick  # new incidents a tick, per node
        self.open: dict[str, dict[str, Any]] = {}  # id -> {"incident", "ticks", "rungs"}
        self.quiet = False
        self.lock = threading.Lock()

    # the model

    def _new(self, now_ns: int, firing: bool) -> None:
        from sloguard.core.incidents import FIRING, PENDING, Evidence, Incident, new_incident_id

        rng = self.rng
        pod = f"ls-{rng.randrange(40)}"
        incident = Incident(
            id=new_incident_id(now_ns), fingerprint=f"{self.name}/{pod}/p99",
            rule=rng.choice(("LatencySLOBurn", "CPUThrottlingLS", "RunQueueDelay",
                             "MemoryReclaimStall")),
            group="interference", severity=rng.choice(("warning", "warning", "critical")),
            node=self.name, state=FIRING if firing else PENDING,
            series={"cgroup": f"/kubepods/burstable/pod-{pod}", "measurement": "app_latency"},
            started_ns=now_ns, updated_ns=now_ns, fired_ns=now_ns if firing else None,
            summary=f"p99 latency of {pod} above its SLO while best-effort jobs ran",
            labels={"namespace": "shop", "pod": pod, "slo": "checkout-p99",
                    "team": "payments"},
            annotations={"runbook": "https://runbooks.example.invalid/interference"},
            affected=[{"namespace": "shop", "pod": pod, "container": "app"}],
            policy="ls-interference",
            signal={"measurement": "app_latency", "field": "p99", "aggregate": "p99",
                    "window": "30s"},
            suspects=[{"workload": f"batch/job-{rng.randrange(200)}", "share": 0.6,
                       "evidence": "run-queue wait charged to it"},
                      {"workload": f"batch/job-{rng.randrange(200)}", "share": 0.25,
                       "evidence": "memory reclaim stalls"}],
            suspects_ns=now_ns)
        incident.add_evidence(Evidence(now_ns, 0.2 + rng.random() / 5, 0.2,
                                       "p99 above the objective"))
        live = {"incident": incident, "ticks": 0, "rungs": 0,
                "lasts": rng.randint(3, 12)}
        self.open[incident.id] = live
        if firing:
            self._rung(live, now_ns)
        self.incidents.save(incident)

    def _rung(self, live: dict[str, Any], now_ns: int, undo: bool = False) -> None:
        """A ladder step on the incident and its audit entry, as the ladder records both."""
        from sloguard.core.audit import AuditEntry
        from sloguard.core.incidents import ActionRecord

        incident = live["incident"]
        rung = live["rungs"] if undo else live["rungs"] + 1
        kind = ("cpu_idle", "cpu_weight", "evict")[min(rung, 3) - 1]
        target = f"/kubepods/besteffort/pod-job-{self.rng.randrange(200)}"
        status = "undone" if undo else "done"
        incident.actions.append(ActionRecord(now_ns, kind, target, False, status,
                                             f"{kind} {'restored' if undo else 'applied'}"))
        self.ledger.audit(AuditEntry(now_ns, self.name, incident.id, "ls-interference", rung,
                                     kind, "undo" if undo else "apply", False, "done", target,
                                     f"{kind} on {target}", "p99 above the objective"))
        live["rungs"] = rung - 1 if undo else rung

    def _resolve(self, live: dict[str, Any], now_ns: int) -> None:
        from sloguard.core.incidents import RESOLVED, Evidence

        incident = live["incident"]
        while live["rungs"]:
            self._rung(live, now_ns, undo=True)
        incident.state, incident.resolved_ns, incident.updated_ns = RESOLVED, now_ns, now_ns
        incident.add_evidence(Evidence(now_ns, 0.15, 0.2, "back under the objective"))
        self.incidents.save(incident)
        del self.open[incident.id]

    def tick(self) -> None:
        """One evaluation: every open incident moves on; maybe a new one."""
        from sloguard.core.incidents import FIRING, PENDING, Evidence

        with self.lock:
            if self.quiet:
                return
            now_ns = time.time_ns()
            for live in list(self.open.values()):
                incident = live["incident"]
                live["ticks"] += 1
                incident.updated_ns = now_ns
                if incident.state == PENDING:
                    if self.rng.random() < 0.25:  # the condition went away before `for`
                        self.incidents.delete(incident.id, self.name)
                        del self.open[incident.id]
                        continue
                    incident.state, incident.fired_ns = FIRING, now_ns
                    self._rung(live, now_ns)
                elif live["ticks"] >= live["lasts"]:
                    self._resolve(live, now_ns)
                    continue
                elif live["ticks"] == 3 and self.rng.random() < 0.3:
                    self._rung(live, now_ns)  # the first rung was not enough
                incident.add_evidence(Evidence(now_ns, 0.2 + self.rng.random() / 5, 0.2,
                                               "p99 above the objective"))
                self.incidents.save(incident)
            if self.rng.random() < self.p_new:
                self._new(now_ns, firing=False)

    def burst(self, count: int) -> None:
        """`count` incidents firing at once, each with its first rung applied."""
        with self.lock:
            if not self.quiet:
                for _ in range(count):
                    self._new(time.time_ns(), firing=True)

    def quiesce(self) -> None:
        """The end of the run: firing incidents resolve, pending ones are withdrawn, and the
        model stops, so that the stores hold what the database must hold at the end."""
        from sloguard.core.incidents import PENDING

        with self.lock:
            self.quiet = True
            now_ns = time.time_ns()
            for live in list(self.open.values()):
                if live["incident"].state == PENDING:
                    self.incidents.delete(live["incident"].id, self.name)
                    del self.open[live["incident"].id]
                else:
                    self._resolve(live, now_ns)

    # what the checks need

    def behind(self) -> int:
        """Changes and audit entries not yet taken by the server (by the cursors)."""
        cursor = self.forwarder.cursor
        return (self.incidents.count_changed_since(cursor["incidents"], self.name)
                + self.ledger.count_after(cursor["actions"]))

    def expected(self) -> dict[str, Any]:
        held = self.incidents.query(limit=10**9)
        audit = self.ledger.audit_after(0, 10**9)
        return {"incidents": {i.id: [i.state, i.updated_ns] for i in held},
                "audit": {str(a.id): [a.time_ns, a.kind, a.action] for a in audit},
                "sent": dict(self.forwarder.sent), "skipped": dict(self.forwarder.skipped)}


def worker_main(conn: Any, spec: dict[str, Any]) -> None:
    """A worker process: its agents, a scheduler over them, and commands from the main
    process on `conn` (burst, quiesce, status, expected, stop)."""
    import logging

    # each failed request is counted by kind; its warning line, 1,000 agents over, is noise
    logging.basicConfig(level=logging.ERROR, format="agent process: %(name)s: %(message)s")
    args = argparse.Namespace(**spec["args"])
    latencies: list[tuple[float, float, str, int]] = []
    lat_lock = threading.Lock()
    counts = {"rounds": 0, "rounds_failed": 0}

    def record(wall: float, ms: float, outcome: str, size: int) -> None:
        with lat_lock:
            latencies.append((wall, ms, outcome, size))

    forwarder_class = _make_forwarder_class(record)
    home = Path(spec["home"])
    agents = [Agent(name, home / name, spec["url"], spec["tokens"][name], args,
                    forwarder_class, spec["seed"] * 100_003 + n)
              for n, name in enumerate(spec["nodes"])]
    index = {a.name: n for n, a in enumerate(agents)}

    heap: list[tuple[float, int, str, int, Any]] = []
    order = itertools.count()
    cond = threading.Condition()
    stopping = threading.Event()
    pool = ThreadPoolExecutor(max_workers=args.threads, thread_name_prefix="agent")

    def at(due: float, kind: str, n: int, arg: Any = None) -> None:
        with cond:
            heapq.heappush(heap, (due, next(order), kind, n, arg))
            cond.notify()

    def job(kind: str, n: int, arg: Any, due: float) -> None:
        agent = agents[n]
        try:
            if kind == "round":
                try:
                    agent.forwarder.round()
                except Exception as exc:  # as Forwarder._loop: a bug must not end forwarding
                    agent.forwarder.failures += 1
                    agent.forwarder.last_error = f"{exc.__class__.__name__}: {exc}"
                with lat_lock:
                    counts["rounds"] += 1
                    counts["rounds_failed"] += bool(agent.forwarder.failures)
                if not stopping.is_set():
                    # as Forwarder._loop, counted from when the round was due: an agent's own
                    # thread starts it then, where here it may have waited for a free thread
                    wait = agent.forwarder.next_wait(time.monotonic() - due)
                    at(time.monotonic() + wait, "round", n)
            elif kind == "tick":
                agent.tick()
                if not stopping.is_set() and not agent.quiet:
                    at(time.monotonic() + args.tick, "tick", n)
            elif kind == "burst":
                agent.burst(arg)
            elif kind == "quiesce":
                agent.quiesce()
        except Exception:
            traceback.print_exc()

    def schedule() -> None:
        while not stopping.is_set():
            with cond:
                while not stopping.is_set() and (not heap or heap[0][0] > time.monotonic()):
                    cond.wait(max(0.0, heap[0][0] - time.monotonic()) if heap else 1.0)
                if stopping.is_set():
                    return
                due, _, kind, n, arg = heapq.heappop(heap)
            pool.submit(job, kind, n, arg, due)

    now = time.monotonic()
    rng = random.Random(spec["seed"])
    for n in range(len(agents)):  # agents started at random moments, as a DaemonSet's are
        at(now + rng.uniform(0, args.interval), "round", n)
        at(now + rng.uniform(0, args.tick), "tick", n)
    scheduler = threading.Thread(target=schedule, name="scheduler", daemon=True)
    scheduler.start()
    conn.send(("ready", len(agents)))

    while True:
        command, arg = conn.recv()
        if command == "burst":
            for name, count in arg.items():
                at(0.0, "burst", index[name], count)
            conn.send(("ok", None))
        elif command == "quiesce":
            for n in range(len(agents)):
                at(0.0, "quiesce", n)
            conn.send(("ok", None))
        elif command == "status":
            with lat_lock:
                taken, latencies[:] = list(latencies), []
                done = dict(counts)
            behind = [a.behind() for a in agents] if arg else []
            conn.send(("status", {"latencies": taken, **done,
                                  "behind_agents": sum(1 for b in behind if b),
                                  "behind_items": sum(behind),
                                  "quiet": all(a.quiet and not a.open for a in agents)}))
        elif command == "expected":
            conn.send(("expected", {a.name: a.expected() for a in agents}))
        elif command == "stop":
            stopping.set()
            with cond:
                cond.notify_all()
            pool.shutdown(wait=True, cancel_futures=True)
            for agent in agents:
                agent.incidents.close()
                agent.ledger.close()
            conn.send(("stopped", None))
            return


# -- the proxy -----------------------------------------------------------------------------------

def proxy_main(port: int, backends: list[int], counters: Any, ready: Any) -> None:
    """Round-robin TCP proxy: each connection to the next backend that accepts it (a Service
    with its endpoints). counters: [connections, backend connects refused]."""
    turn = itertools.count()

    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            with contextlib.suppress(Exception):
                writer.close()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        counters[0] += 1
        first = next(turn)
        for k in range(len(backends)):
            try:
                up_reader, up_writer = await asyncio.open_connection(
                    "127.0.0.1", backends[(first + k) % len(backends)])
                break
            except OSError:
                counters[1] += 1
        else:
            writer.close()
            return
        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    async def serve() -> None:
        server = await asyncio.start_server(handle, "127.0.0.1", port, backlog=1024)
        ready.set()
        async with server:
            await server.serve_forever()

    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    asyncio.run(serve())


# -- the main process -------------------------------------------------------------------------

class Replica:
    """One `sloguard server` process on a fixed port (restarted on the same one)."""

    def __init__(self, n: int, port: int, config: Path, work: Path, env: dict[str, str]) -> None:
        self.n, self.port, self.config, self.work, self.env = n, port, config, work, env
        self.proc: subprocess.Popen | None = None
        self.log = work / f"replica-{n}.log"

    def start(self) -> None:
        binary = Path(sys.executable).with_name("sloguard")
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                [str(binary), "server", "-c", str(self.config), "--data-dir",
                 str(self.work / f"data-{self.n}"), "--listen", f"127.0.0.1:{self.port}"],
                stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **self.env})

    def wait_healthy(self, timeout: float = 60.0) -> None:
        import httpx

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"replica {self.n} exited: {self.log.read_text()[-2000:]}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"http://127.0.0.1:{self.port}/healthz",
                             timeout=2).status_code == 200:
                    return
            time.sleep(0.2)
        raise RuntimeError(f"replica {self.n} never healthy: {self.log.read_text()[-2000:]}")

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


class CpuSampler:
    """CPU seconds (user + system) of process groups, by sampling each process in a group's
    trees every second and keeping each one's latest reading: a process that exits (a killed
    replica, a backend of the restarted PostgreSQL) keeps what it used until its last sample,
    so at most a second of it is missed."""

    def __init__(self, roots: dict[str, Any]) -> None:
        self.roots = roots  # group -> callable returning its root pids now
        self.seen: dict[tuple[str, int, float], float] = {}
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def sample(self) -> None:
        import psutil

        for group, pids in self.roots.items():
            for pid in pids():
                try:
                    root = psutil.Process(pid)
                    procs = [root, *root.children(recursive=True)]
                except psutil.Error:
                    continue
                for proc in procs:
                    try:
                        with proc.oneshot():
                            times, created = proc.cpu_times(), proc.create_time()
                    except psutil.Error:
                        continue
                    with self.lock:
                        self.seen[(group, proc.pid, created)] = times.user + times.system

    def totals(self) -> dict[str, float]:
        out = dict.fromkeys(self.roots, 0.0)
        with self.lock:
            for (group, _, _), seconds in self.seen.items():
                out[group] += seconds
        return out

    def _run(self) -> None:
        while not self.stop.wait(1.0):
            self.sample()


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class Fleet:
    """The main process: everything started, the phases, the figures and the checks."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.t0 = time.monotonic()
        self.marks: list[tuple[str, float]] = []  # fault moments, wall time
        self.latencies: list[tuple[float, float, str, int]] = []
        self.rounds = {"rounds": 0, "rounds_failed": 0}
        self.phase_cpu: dict[str, dict[str, float]] = {}
        self.phase_span: dict[str, tuple[float, float]] = {}
        self.failures: list[str] = []
        self.faults_over = time.time()  # both faults recovered from: set by _faults
        self.pg_restarted = time.time()  # set by _faults
        self.backlog: list[tuple[float, int]] = []  # (wall, items the agents have not sent)

    def say(self, line: str) -> None:
        print(f"[{time.monotonic() - self.t0:6.1f}s] {line}", flush=True)

    # the pieces

    def start(self) -> None:
        from support.postgres import PostgresServer

        args = self.args
        self.work = Path(tempfile.mkdtemp(prefix="sloguard-fleet-"))
        shm = Path("/dev/shm")
        base = Path(args.agent_dir) if args.agent_dir else (
            shm if shm.is_dir() and os.access(shm, os.W_OK) else self.work)
        self.homes = Path(tempfile.mkdtemp(prefix="sloguard-fleet-agents-", dir=base))
        self.say(f"PostgreSQL from initdb (durable defaults), work dir {self.work}, "
                 f"agents' stores in {self.homes}")
        self.pg = PostgresServer(durable=True)
        self.pg.start()
        self.url = self.pg.create_database()
        self.nodes = [f"fleet-{n:04d}" for n in range(args.agents)]
        server_auth, auth_env, self.tokens = ingest_auth(self.nodes)
        config = self.work / "server.yaml"
        config.write_text(f"server:\n{server_auth}  database: {self.url}\n"
                          f"  database_password_env: {PASSWORD_ENV}\n")
        env = {**auth_env, PASSWORD_ENV: self.pg.password}
        from support.influxenv import free_port

        self.replicas = [Replica(n, free_port(), config, self.work, env) for n in range(2)]
        for replica in self.replicas:  # one at a time: the first migrates the schema
            replica.start()
            replica.wait_healthy()
        self.proxy_port = free_port()
        ctx = mp.get_context("spawn")
        self.proxy_counters = ctx.Array("q", 2)
        ready = ctx.Event()
        self.proxy = ctx.Process(target=proxy_main, daemon=True, args=(
            self.proxy_port, [r.port for r in self.replicas], self.proxy_counters, ready))
        self.proxy.start()
        ready.wait(30)
        self.say(f"two replicas on ports {self.replicas[0].port}, {self.replicas[1].port}; "
                 f"round-robin proxy on {self.proxy_port}")

        self.sampler = CpuSampler({
            "replicas": lambda: [r.proc.pid for r in self.replicas
                                 if r.proc and r.proc.poll() is None],
            "postgres": lambda: [p] if (p := self.pg.postmaster_pid()) else [],
            "proxy": lambda: [self.proxy.pid],
            "agents": lambda: [w.pid for w in self.workers],
        })
        self.workers: list[Any] = []
        self.pipes: list[Any] = []
        share = [self.nodes[k::args.workers] for k in range(args.workers)]
        plain = {k: v for k, v in vars(args).items() if isinstance(v, int | float | str)}
        for k, nodes in enumerate(share):
            parent, child = ctx.Pipe()
            spec = {"args": plain, "nodes": nodes, "home": str(self.homes),
                    "url": f"http://127.0.0.1:{self.proxy_port}", "seed": args.seed * 31 + k,
                    "tokens": {n: self.tokens[n] for n in nodes}}
            worker = ctx.Process(target=worker_main, args=(child, spec), daemon=True)
            worker.start()
            self.workers.append(worker)
            self.pipes.append(parent)
        self.sampler.thread.start()
        started = time.monotonic()
        for pipe in self.pipes:
            kind, _ = pipe.recv()
            assert kind == "ready", kind
        self.say(f"{args.agents} agents in {args.workers} processes "
                 f"({args.threads} threads each) ready in {time.monotonic() - started:.1f} s")

    def ask(self, command: str, arg: Any = None) -> list[Any]:
        for pipe in self.pipes:
            pipe.send((command, arg))
        return [pipe.recv()[1] for pipe in self.pipes]

    def status(self) -> dict[str, Any]:
        """The requests timed since the last call, and how far behind the agents are."""
        replies = self.ask("status", True)
        out = {"behind_agents": 0, "behind_items": 0, "quiet": True, "new": []}
        rounds = {"rounds": 0, "rounds_failed": 0}
        for reply in replies:
            out["new"] += reply["latencies"]
            for key in rounds:
                rounds[key] += reply[key]
            out["behind_agents"] += reply["behind_agents"]
            out["behind_items"] += reply["behind_items"]
            out["quiet"] = out["quiet"] and reply["quiet"]
        self.rounds = rounds
        self.latencies += out["new"]
        self.backlog.append((time.time(), out["behind_items"]))
        return out

    def progress(self, phase: str, seconds: float, stop_when: Any = None) -> dict[str, Any]:
        """Run `seconds` in `phase` (or until `stop_when(status)`): the backlog polled every
        second, a progress line every --progress seconds; the last status."""
        end = time.monotonic() + seconds
        new: list[tuple[float, float, str, int]] = []
        printed = time.monotonic()
        while True:
            time.sleep(max(0.0, min(1.0, end - time.monotonic())))
            status = self.status()
            new += status["new"]
            now = time.monotonic()
            done = now >= end or (stop_when is not None and stop_when(status))
            if now - printed >= self.args.progress - 0.01 or done:
                ok = [ms for _, ms, outcome, _ in new if outcome == "ok"]
                self.say(f"{phase:<7} {len(new) / max(now - printed, 0.001):6.1f} req/s  "
                         f"p50 {pct(ok, 0.5):6.1f} ms  p99 {pct(ok, 0.99):7.1f} ms  "
                         f"failed {len(new) - len(ok):4d}  agents behind "
                         f"{status['behind_agents']:4d} ({status['behind_items']} items)")
                new, printed = [], now
            if done:
                return status

    def begin(self, phase: str) -> None:
        self.sampler.sample()
        self.phase_cpu[phase] = self.sampler.totals()
        self.phase_span[phase] = (time.time(), 0.0)

    def end(self, phase: str) -> None:
        self.sampler.sample()
        after = self.sampler.totals()
        self.phase_cpu[phase] = {k: after[k] - v for k, v in self.phase_cpu[phase].items()}
        self.phase_span[phase] = (self.phase_span[phase][0], time.time())

    def mark(self, what: str, label: str = "") -> None:
        """A moment of the run: said now, and drawn on the plot as `label` (if any)."""
        if label:
            self.marks.append((label, time.time()))
        self.say(f"*** {what}")

    # the phases

    def run(self) -> int:
        args = self.args
        # the agents' first rounds (each node's first request inserts its record) while the
        # last workers are still opening their stores: not the steady state, shown apart
        self.begin("warm-up")
        self.progress("warm-up", args.interval)
        self.end("warm-up")
        self.begin("steady")
        self.progress("steady", args.steady)
        self.end("steady")

        self.begin("burst")
        rng = random.Random(args.seed)
        firing = rng.sample(self.nodes, max(1, round(len(self.nodes) * BURST_SHARE)))
        by_worker: list[dict[str, int]] = [{} for _ in self.pipes]
        for node in firing:  # the nodes were dealt to the workers in turn
            by_worker[self.nodes.index(node) % len(self.pipes)][node] = args.burst_incidents
        for pipe, part in zip(self.pipes, by_worker, strict=True):
            pipe.send(("burst", part))
        for pipe in self.pipes:
            pipe.recv()
        self.mark(f"burst: {len(firing)} nodes fire {args.burst_incidents} incidents each",
                  "burst")
        burst_start = time.monotonic()
        victim = self.replicas[0]
        faults = threading.Thread(target=self._faults_or_failure, args=(victim, burst_start),
                                  daemon=True)
        faults.start()
        self.progress("burst", args.burst, stop_when=lambda _: not faults.is_alive())
        faults.join()
        self.end("burst")

        self.begin("drain")
        self.ask("quiesce")
        self.mark("drain: every agent ends its incidents; waiting for every cursor", "drain")
        drain_start = time.time()
        status = self.progress("drain", args.drain_timeout, stop_when=lambda st: (
            st["quiet"] and st["behind_items"] == 0))
        if not (status["quiet"] and status["behind_items"] == 0):
            self.failures.append(f"not drained after {args.drain_timeout:g} s: "
                                 f"{status['behind_items']} items behind")
        self.drained_at = time.time()
        self.drained = self.drained_at - drain_start
        self.end("drain")
        self.say(f"drained: every cursor caught up {self.drained:.1f} s after the agents' "
                 "last change")
        expected = {}
        for part in self.ask("expected"):
            expected.update(part)
        self.check(expected)
        self.figures(expected)
        if args.list_incidents:
            self.list_timing()
        return 1 if self.failures else 0

    def _faults_or_failure(self, victim: Replica, start: float) -> None:
        try:
            self._faults(victim, start)
        except Exception as exc:
            traceback.print_exc()
            self.failures.append(f"the faults did not go as planned: {exc}")

    def _faults(self, victim: Replica, start: float) -> None:
        args = self.args

        def until(offset: float) -> None:
            time.sleep(max(0.0, start + offset - time.monotonic()))

        until(args.kill_at)
        victim.kill()
        self.mark(f"replica {victim.n} killed (-9)", "replica killed")
        until(args.pg_restart_at)
        self.mark("PostgreSQL: pg_ctl restart -m fast", "PostgreSQL restart")
        self.pg_restarted = time.time()
        began = time.monotonic()
        self.pg.restart("fast")
        self.mark(f"PostgreSQL back ({time.monotonic() - began:.1f} s)")
        until(args.kill_at + args.replica_down)
        victim.start()
        victim.wait_healthy()
        self.mark(f"replica {victim.n} restarted and healthy", "replica back")
        self.faults_over = time.time()  # the later of the two: PostgreSQL was back before

    # the results

    def check(self, expected: dict[str, dict[str, Any]]) -> None:
        import psycopg

        with psycopg.connect(self.url, password=self.pg.password) as conn:
            rows = conn.execute("SELECT id, node, state, updated_ns FROM incidents "
                                "WHERE node LIKE 'fleet-%'").fetchall()
            twice = conn.execute("SELECT count(*) - count(DISTINCT id) FROM incidents"
                                 ).fetchone()[0]
            audit = conn.execute("SELECT node, source_id, time_ns, kind, action FROM audit "
                                 "WHERE node LIKE 'fleet-%'").fetchall()
            audit_twice = conn.execute(
                "SELECT count(*) FROM (SELECT 1 FROM audit GROUP BY node, source_id "
                "HAVING count(*) > 1) t").fetchone()[0]
        held = {}
        for incident_id, node, state, updated_ns in rows:
            held.setdefault(incident_id, []).append((node, state, updated_ns))
        want = {(node, i): tuple(v) for node, e in expected.items()
                for i, v in e["incidents"].items()}
        want_ids = {i for _, i in want}
        lost = [i for (_, i) in want if i not in held]
        extra = [i for i in held if i not in want_ids]  # withdrawn, or never an agent's
        stale = [i for (node, i), (state, updated) in want.items()
                 if i in held and held[i][0] != (node, state, updated)]
        duplicated = twice + sum(len(v) - 1 for v in held.values())
        got_audit: dict[tuple[str, int], list[tuple]] = {}
        for node, source, time_ns, kind, action in audit:
            got_audit.setdefault((node, source), []).append((time_ns, kind, action))
        want_audit = {(node, int(s)): tuple(v) for node, e in expected.items()
                      for s, v in e["audit"].items()}
        audit_lost = [k for k in want_audit if k not in got_audit]
        audit_extra = [k for k in got_audit if k not in want_audit]
        audit_wrong = [k for k, v in want_audit.items()
                       if k in got_audit and got_audit[k][0] != v]
        audit_dup = audit_twice + sum(len(v) - 1 for v in got_audit.values())
        skipped = sum(sum(e["skipped"].values()) for e in expected.values())
        self.counts = {"incidents": len(want), "audit": len(want_audit)}
        print()
        print(f"checks against the {len(expected)} agents' stores:")
        results = [
            (f"incidents: {len(want)} held by the agents, {len(held)} in the database",
             True),
            (f"incidents lost: {len(lost)}", not lost),
            (f"incidents duplicated: {duplicated}", duplicated == 0),
            (f"incidents in the database the agents do not hold (withdrawn or unknown): "
             f"{len(extra)}", not extra),
            (f"incidents at another updated_ns or state than the agent's: {len(stale)}",
             not stale),
            (f"audit entries: {len(want_audit)} recorded by the agents, {len(audit)} in "
             "the database", True),
            (f"audit entries lost: {len(audit_lost)}", not audit_lost),
            (f"audit entries duplicated: {audit_dup}", audit_dup == 0),
            (f"audit entries the agents did not record: {len(audit_extra)}", not audit_extra),
            (f"audit entries differing from the agent's: {len(audit_wrong)}", not audit_wrong),
            (f"items a forwarder passed over: {skipped}", skipped == 0),
        ]
        for text, ok in results:
            print(f"  {'ok  ' if ok else 'FAIL'} {text}")
            if not ok:
                self.failures.append(text)
        for name, sample in (("lost", lost), ("extra", extra), ("stale", stale),
                             ("audit lost", audit_lost), ("audit extra", audit_extra)):
            if sample:
                print(f"       e.g. {name}: {sample[:5]}")

    def figures(self, expected: dict[str, dict[str, Any]]) -> None:
        import psycopg

        args = self.args
        with psycopg.connect(self.url, password=self.pg.password) as conn:
            inc_bytes, inc_rows = conn.execute(
                "SELECT pg_total_relation_size('incidents'), count(*) FROM incidents"
            ).fetchone()
            aud_bytes, aud_rows = conn.execute(
                "SELECT pg_total_relation_size('audit'), count(*) FROM audit").fetchone()
            db_bytes = conn.execute("SELECT pg_database_size(current_database())").fetchone()[0]
        sent = {"incidents": 0, "withdrawn": 0, "actions": 0}
        for e in expected.values():
            for k in sent:
                sent[k] += e["sent"][k]
        print()
        print(f"fleet: {args.agents} agents in {args.workers} processes, forward interval "
              f"{args.interval:g} s, evaluation tick {args.tick:g} s, "
              f"{args.new_per_hour:g} new incidents per node-hour; burst: "
              f"{round(args.agents * BURST_SHARE)} nodes x {args.burst_incidents} incidents")
        print(f"sent by the forwarders (taken by the server): {sent['incidents']} incident "
              f"changes, {sent['withdrawn']} withdrawals, {sent['actions']} audit entries")
        print()
        print(f"{'phase':<8} {'s':>5} {'requests':>9} {'req/s':>6} {'p50 ms':>7} {'p99 ms':>8} "
              f"{'max ms':>8} {'failed':>7}")
        spans = dict(self.phase_span)
        for phase, (start, end) in spans.items():
            rows = [r for r in self.latencies if start <= r[0] < end]
            ok = [ms for _, ms, outcome, _ in rows if outcome == "ok"]
            rate = len(rows) / (end - start)
            print(f"{phase:<8} {end - start:>5.0f} {len(rows):>9} {rate:>6.1f} "
                  f"{pct(ok, 0.5):>7.1f} {pct(ok, 0.99):>8.1f} {max(ok, default=0):>8.1f} "
                  f"{len(rows) - len(ok):>7}")
        ok_all = [ms for _, ms, outcome, _ in self.latencies if outcome == "ok"]
        print(f"{'all':<8} {'':>5} {len(self.latencies):>9} {'':>6} {pct(ok_all, 0.5):>7.1f} "
              f"{pct(ok_all, 0.99):>8.1f} {max(ok_all, default=0):>8.1f} "
              f"{len(self.latencies) - len(ok_all):>7}")
        kinds: dict[str, int] = {}
        for _, _, outcome, _ in self.latencies:
            if outcome != "ok":
                kinds[outcome] = kinds.get(outcome, 0) + 1
        refused = sum(n for kind, n in kinds.items() if kind.startswith("http"))
        print(f"requests refused by a server (HTTP 4xx/5xx): {refused}; failed, by kind: "
              f"{kinds or 'none'}; forwarder rounds that failed "
              f"(their batch retried on the next round, after the backoff): "
              f"{self.rounds['rounds_failed']} of {self.rounds['rounds']}; proxy: "
              f"{self.proxy_counters[1]} connections to a dead replica sent to the other, of "
              f"{self.proxy_counters[0]}")
        print()
        print("CPU seconds per node per minute (user + system, sampled each second):")
        print(f"{'phase':<8} {'replicas':>10} {'postgres':>10} {'agents':>10} {'proxy':>10}")
        for phase, cpu in self.phase_cpu.items():
            start, end = spans[phase]
            minutes = (end - start) / 60
            per = {k: v / args.agents / minutes for k, v in cpu.items()}
            print(f"{phase:<8} {per['replicas']:>10.4f} {per['postgres']:>10.4f} "
                  f"{per['agents']:>10.4f} {per['proxy']:>10.4f}")
        steady = self.phase_cpu["steady"]
        span = spans["steady"][1] - spans["steady"][0]
        share = {k: f"{v / span * 100:.0f}%" for k, v in steady.items()}
        print(f"steady state: replicas {share['replicas']} of a core, PostgreSQL "
              f"{share['postgres']}, the agents' processes {share['agents']}, the proxy "
              f"{share['proxy']}")
        print()
        print(f"database: incidents {inc_rows} rows, {inc_bytes / 1e6:.2f} MB with indexes, "
              f"{inc_bytes / max(inc_rows, 1) * 1000 / 1e6:.2f} MB per 1,000 incidents; audit "
              f"{aud_rows} rows, {aud_bytes / 1e6:.2f} MB, "
              f"{aud_bytes / max(aud_rows, 1) * 1000 / 1e6:.2f} MB per 1,000 entries; "
              f"the whole database {db_bytes / 1e6:.1f} MB")
        half = (spans["steady"][0] + spans["steady"][1]) / 2
        print("bunching of the requests (autocorrelation of the starts per 0.25 s at the "
              f"forward interval, {args.interval:g} s; 0: spread, 1: agents in step): "
              f"steady state's first half {self.bunching(spans['steady'][0], half):.2f}, "
              f"second half {self.bunching(half, spans['steady'][1]):.2f}, from PostgreSQL's "
              f"restart to the drain {self.bunching(self.pg_restarted, spans['burst'][1]):.2f}")
        steady_start, steady_end = spans["steady"]
        usual = max((b for w, b in self.backlog if steady_start <= w <= steady_end),
                    default=0)
        burst_start, burst_end = spans["burst"]
        peak = max((b for w, b in self.backlog if burst_start <= w <= burst_end), default=0)
        print(f"backlog (changes and audit entries not yet taken by the server, polled each "
              f"second): at most {usual} in steady state, {peak} in the burst")
        print(f"drain: every cursor caught up {self.drained_at - self.faults_over:.1f} s after "
              f"the faults were over (the killed replica healthy again; every agent ended its "
              f"incidents then), {self.drained:.1f} s after the agents' last change")
        if args.plot:
            self.plot()

    def bunching(self, start: float, end: float) -> float:
        """How much the agents' requests come in step, one forward interval apart (forwarders
        that wait a fixed interval after rounds a stall held up together stay together)."""
        import numpy as np

        bins = int((end - start) * 4)
        lag = int(self.args.interval * 4)
        if bins <= 2 * lag:
            return float("nan")
        counts = np.zeros(bins)
        for wall, *_ in self.latencies:
            if start <= wall < end:
                counts[min(int((wall - start) * 4), bins - 1)] += 1
        counts -= counts.mean()
        power = float((counts * counts).sum())
        return float((counts[:-lag] * counts[lag:]).sum()) / power if power else 0.0

    def plot(self) -> None:
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            print("--plot: matplotlib is not installed here: no plot")
            return
        base = min((r[0] for r in self.latencies), default=time.time())
        ok = [(w - base, ms) for w, ms, outcome, _ in self.latencies if outcome == "ok"]
        bad = [(w - base, ms) for w, ms, outcome, _ in self.latencies if outcome != "ok"]
        fig, ax = plt.subplots(figsize=(11, 4.5))
        if ok:  # a sample of them: every point of a long run makes a heavy image
            shown = random.Random(0).sample(ok, min(len(ok), 4000))
            ax.scatter(*zip(*shown, strict=True), s=2, alpha=0.3, color="tab:blue",
                       label=f"request taken ({len(shown)} of {len(ok)})")
        if bad:
            ax.scatter(*zip(*bad, strict=True), s=8, color="tab:red", marker="x",
                       label="request failed")
        seconds: dict[int, list[float]] = {}
        for t, ms in ok:
            seconds.setdefault(int(t), []).append(ms)
        xs = sorted(seconds)
        for q, color in ((0.5, "black"), (0.99, "tab:orange")):
            ax.plot(xs, [pct(seconds[x], q) for x in xs], color=color, linewidth=1,
                    label=f"p{int(q * 100)} per second")
        merged: list[tuple[str, float]] = []
        for what, wall in self.marks:  # moments a second apart share a line
            if merged and wall - merged[-1][1] < 1.5:
                merged[-1] = (f"{merged[-1][0]}, {what}", merged[-1][1])
            else:
                merged.append((what, wall))
        for what, wall in merged:
            ax.axvline(wall - base, color="tab:gray", linestyle="--", linewidth=0.8)
            ax.text(wall - base, 0.98, what + " ", rotation=90, fontsize=7, va="top",
                    ha="right", transform=ax.get_xaxis_transform())
        if self.backlog:
            twin = ax.twinx()
            twin.step([w - base for w, _ in self.backlog], [b for _, b in self.backlog],
                      where="post", color="tab:green", linewidth=1)
            twin.set_ylabel("items not yet taken (green)", color="tab:green")
            twin.set_ylim(bottom=0)
        ax.set_yscale("log")
        ax.set_xlabel("seconds")
        ax.set_ylabel("ingest request ms (client)")
        ax.set_title(f"{self.args.agents} agents -> proxy -> 2 sloguard server replicas -> "
                     "PostgreSQL 15")
        ax.legend(loc="lower left", fontsize=7, markerscale=3)
        fig.tight_layout()
        out = ROOT / "docs" / "fleet.png"
        fig.savefig(out, dpi=100)
        print(f"plot: {out}")

    def list_timing(self) -> None:
        """benchmarks/cluster_list.py's incidents up to --list-incidents in this database,
        then the list timed through the proxy against both running replicas."""
        import httpx
        from cluster_list import TARGET_MS, fill, timed

        from sloguard.store.cluster_pg import PostgresClusterDB

        args = self.args
        db = PostgresClusterDB(self.url, self.pg.password, 2, where="fleet")
        with db.pool.connection() as conn:
            held = conn.execute("SELECT count(*) FROM incidents").fetchone()[0]
        more = -(-max(0, args.list_incidents - held) // 100) * 100  # 100 nodes, as many each
        self.say(f"filling {more} incidents (benchmarks/cluster_list.py's) on top of the "
                 f"fleet's {held}, the agents still sending heartbeats ...")
        fill_s = fill(db, more, 100) if more else 0.0
        with db.pool.connection() as conn:
            conn.execute("ANALYZE")
            held, size = conn.execute("SELECT count(*), pg_total_relation_size('incidents') "
                                      "FROM incidents").fetchone()
        db.close()
        print(f"\ndatabase with {held} incidents (all but the fleet's in cluster_list.py's "
              f"shape): {size / 1e6:.0f} MB with indexes, {size / held * 1000 / 1e6:.2f} MB per "
              "1,000 incidents")
        print(f"\nincident list with {held} incidents (filled in {fill_s:.0f} s), whole HTTP "
              f"requests through the proxy, {args.reads} each, while {args.agents} agents "
              "send their heartbeats:")
        print(f"{'request':<36} {'median ms':>10} {'p95 ms':>8}")
        worst = 0.0
        with httpx.Client(base_url=f"http://127.0.0.1:{self.proxy_port}", timeout=30) as client:
            for label, path in (("/api/incidents (first page, 100)", "/api/incidents"),
                                ("?state=firing", "/api/incidents?state=firing"),
                                ("?node=fleet-0042", "/api/incidents?node=fleet-0042"),
                                ("HTML incident list", "/")):
                median, p95, _ = timed(client, path, args.reads)
                worst = max(worst, p95)
                print(f"{label:<36} {median:>10.1f} {p95:>8.1f}")
        ok = worst < TARGET_MS
        print(f"  {'ok  ' if ok else 'FAIL'} the slowest p95 is {worst:.1f} ms "
              f"(target < {TARGET_MS:.0f} ms)")
        if not ok:
            self.failures.append(f"incident list p95 {worst:.1f} ms")

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.sampler.stop.set()
        if getattr(self, "pipes", None):
            with contextlib.suppress(Exception):
                self.ask("stop")
        for worker in getattr(self, "workers", []):
            worker.join(30)
            if worker.is_alive():
                worker.kill()
        if getattr(self, "proxy", None) is not None:
            self.proxy.terminate()
            self.proxy.join(10)
        for replica in getattr(self, "replicas", []):
            replica.stop()
        if getattr(self, "pg", None) is not None:
            self.pg.close()
        if getattr(self, "homes", None) is not None:
            shutil.rmtree(self.homes, ignore_errors=True)
        if getattr(self, "work", None) is not None:
            if self.failures and not self.args.keep:
                self.args.keep = True  # the replicas' logs say why
            if self.args.keep:
                (self.work / "timeline.json").write_text(json.dumps({
                    "requests": self.latencies, "marks": self.marks,
                    "backlog": self.backlog}))
                print(f"kept: {self.work} (the replicas' logs; timeline.json: every request, "
                      "the faults, the backlog)")
            else:
                shutil.rmtree(self.work, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--agents", type=int, default=1000)
    parser.add_argument("--workers", type=int, default=4, help="processes the agents share")
    parser.add_argument("--threads", type=int, default=16, help="per worker process")
    parser.add_argument("--interval", type=float, default=5.0,
                        help="forward.interval (the default)")
    parser.add_argument("--refresh", type=float, default=60.0,
                        help="forward.refresh (the default)")
    parser.add_argument("--tick", type=float, default=5.0,
                        help="seconds between evaluations of a simulated agent's incidents")
    parser.add_argument("--new-per-hour", type=float, default=8.0,
                        help="new (pending) incidents per node-hour in steady state")
    parser.add_argument("--steady", type=float, default=60.0, help="seconds")
    parser.add_argument("--burst", type=float, default=120.0,
                        help="at most this many seconds: the burst ends when the faults are "
                             "over (the killed replica back)")
    parser.add_argument("--burst-incidents", type=int, default=5,
                        help="incidents each bursting node fires at once")
    parser.add_argument("--kill-at", type=float, default=5.0,
                        help="seconds into the burst the replica is killed")
    parser.add_argument("--pg-restart-at", type=float, default=12.0,
                        help="seconds into the burst PostgreSQL is restarted")
    parser.add_argument("--replica-down", type=float, default=20.0,
                        help="seconds the killed replica stays down")
    parser.add_argument("--drain-timeout", type=float, default=240.0)
    parser.add_argument("--list-incidents", type=int, default=100_000,
                        help="fill to this many and time the list (0: skip)")
    parser.add_argument("--reads", type=int, default=30)
    parser.add_argument("--progress", type=float, default=5.0, help="seconds between lines")
    parser.add_argument("--seed", type=int, default=24)
    parser.add_argument("--agent-dir", help="where the agents' stores go (default /dev/shm)")
    parser.add_argument("--plot", action="store_true", help="save docs/fleet.png")
    parser.add_argument("--keep", action="store_true", help="keep the work dir (logs)")
    args = parser.parse_args()
    if args.pg_restart_at + 5 > args.kill_at + args.replica_down:
        parser.error("the killed replica must come back after PostgreSQL has: --kill-at + "
                     "--replica-down at least --pg-restart-at + 5")

    from support.postgres import missing_message

    missing = missing_message()
    if missing:
        print(missing, file=sys.stderr)
        return 2
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # 3 files per SQLite store
    print(f"{time.strftime('%Y-%m-%d %H:%M:%S')}  load average "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}  {os.cpu_count()} CPUs")
    fleet = Fleet(args)
    try:
        fleet.start()
        code = fleet.run()
    finally:
        fleet.close()
    print("\nresult: " + ("every check passed" if code == 0 else
                          "FAILED: " + "; ".join(fleet.failures)))
    return code


if __name__ == "__main__":
    raise SystemExit(main())
