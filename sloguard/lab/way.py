"""One way of a scenario: the LS service under load, the antagonists on schedule, the agent.

The three ways of a scenario differ only in what runs beside the LS service: nothing
(baseline), the antagonists with the agent in shadow mode (unguarded: it detects and proposes,
changes nothing, so its detection delays are measured too), the antagonists with the agent
acting (guarded). Each way starts from fresh cgroups and a fresh agent (no lever learnt in an
earlier way carries over), and the schedule is anchored on one start time shared by the load
generator and the antagonists.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from sloguard.lab.agent import BE_CGROUP, LS_CGROUP, LabAgent, free_port
from sloguard.lab.antagonists import Antagonist, EpisodeRun, LabSetupError
from sloguard.lab.cgroups import LabCgroup
from sloguard.lab.kube import LabNode
from sloguard.lab.loadgen import cpu_set
from sloguard.lab.scenario import ScenarioSpec, timeline

PUSH_EVERY_S = 0.5
# Pushed as a histogram (as a service's metrics library would): 10 us to 10 s, 10% apart, so a
# percentile read from it is within 10% of the raw one, and a push costs the node little (raw
# values cost the agent and the relay tens of ms per push at 5000 requests/s)
BOUNDS_MS = np.round(0.01 * 1.1 ** np.arange(146), 6)
Progress = Callable[[float, str], None]


@dataclass
class WayResult:
    scenario: str
    way: str
    start_ns: int
    seconds: float
    episodes: list[EpisodeRun]
    incidents: list[dict[str, Any]] = field(default_factory=list)
    actions: list[dict[str, Any]] = field(default_factory=list)
    client: str = ""
    push_errors: int = 0
    records: np.ndarray = field(default_factory=lambda: np.zeros((0, 3), dtype=np.int64))

    def save(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        np.save(directory / "records.npy", self.records)
        data = asdict(self)
        data.pop("records")
        (directory / "way.json").write_text(json.dumps(data, indent=1))

    @classmethod
    def load(cls, directory: Path) -> WayResult:
        data = json.loads((directory / "way.json").read_text())
        data["episodes"] = [EpisodeRun(**e) for e in data["episodes"]]
        return cls(**data, records=np.load(directory / "records.npy"))


def shared_cpus(ls_cpus: str, allowed: set[int] | None = None) -> set[int]:
    """The node's shared CPUs: every CPU the lab may use but the LS service's own. The LS
    service models a pod with exclusive cores (Koordinator LSR, kubelet's static CPU manager),
    where node daemons and other pods do not run; so the lab keeps its client (loadgen.py: a
    client on the server's core preempts it), its relay and the agent there. BE may still run
    on the LS cores until a lever moves it. Empty (no restriction) when the LS service has no
    cores of its own or nothing else is left."""
    allowed = os.sched_getaffinity(0) if allowed is None else allowed
    ls = cpu_set(ls_cpus)
    rest = allowed - ls
    return rest if ls and rest else set()


class Relay(threading.Thread):
    """Reads the load generator's records; pushes each half second's latencies to the agent.
    Both its threads keep to `cpus` (the client's CPUs): they are the measuring apparatus, not
    a part of the node the LS service should have to share its core with."""

    def __init__(self, stdout: Any, agent: LabAgent | None, cpus: set[int] | None = None) -> None:
        super().__init__(daemon=True, name="lab-relay")
        self.stdout = stdout
        self.agent = agent
        self.chunks: list[np.ndarray] = []
        self.push_errors = 0
        self._pending: list[np.ndarray] = []
        self._lock = threading.Lock()
        self._done = threading.Event()
        self.cpus = cpus or set()
        self.pinned = ""

    def _pin(self) -> None:
        """Pin the calling thread (not the lab process: the processes it starts must not
        inherit the client's CPUs); what came of it goes into the way's `client` note."""
        if not self.cpus:
            self.pinned = "any CPU"
            return
        try:
            os.sched_setaffinity(threading.get_native_id(), self.cpus)
            self.pinned = "CPUs " + ",".join(map(str, sorted(self.cpus)))
        except OSError as exc:
            self.pinned = f"any CPU: pinning refused ({exc.strerror})"

    def run(self) -> None:
        self._pin()
        pusher = threading.Thread(target=self._push_loop, daemon=True, name="lab-push")
        pusher.start()
        leftover = b""
        while chunk := self.stdout.read1(1 << 16):
            data = leftover + chunk
            usable = len(data) - len(data) % 24
            leftover = data[usable:]
            if usable:
                records = np.frombuffer(data[:usable], dtype="<i8").reshape(-1, 3)
                with self._lock:
                    self.chunks.append(records)
                    self._pending.append(records)
        self._done.set()
        pusher.join(timeout=5)

    def _push_loop(self) -> None:
        self._pin()
        last = time.monotonic()
        while not self._done.wait(PUSH_EVERY_S):
            now = time.monotonic()
            with self._lock:
                pending, self._pending = self._pending, []
            if self.agent is None or not pending:
                last = now
                continue
            records = np.concatenate(pending)
            answered = records[records[:, 2] >= 0]
            latency_ms = (answered[:, 2] - answered[:, 0]) / 1e6
            counts = np.bincount(np.searchsorted(BOUNDS_MS, latency_ms, side="left"),
                                 minlength=len(BOUNDS_MS) + 1)
            try:
                self.agent.push_histogram(BOUNDS_MS.tolist(), counts.tolist(), now - last,
                                          lost=int(len(records) - len(answered)))
            except OSError:
                self.push_errors += 1
            last = now

    def records(self) -> np.ndarray:
        with self._lock:
            if not self.chunks:
                return np.zeros((0, 3), dtype=np.int64)
            return np.concatenate(self.chunks).astype(np.int64)


def start_redis(cgroup: LabCgroup, workdir: Path) -> tuple[subprocess.Popen, int]:
    binary = shutil.which("redis-server")
    if binary is None:
        raise LabSetupError("redis-server is not installed: apt-get install redis-server "
                            "(or run scripts/lab-testenv.sh)")
    port = free_port()
    log = open(workdir / "redis.log", "ab")  # noqa: SIM115 - the child keeps it
    proc = cgroup.spawn([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                         "--appendonly", "no", "--protected-mode", "yes"],
                        stdout=log, stderr=subprocess.STDOUT)
    log.close()
    deadline = time.monotonic() + 10
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return proc, port
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError(
                    f"redis-server did not start; see {workdir / 'redis.log'}") from None
            time.sleep(0.05)


def run_way(spec: ScenarioSpec, way: str, workdir: Path, progress: Progress,
            kubeconfig: str | None = None, lead_s: float = 3.0) -> WayResult:
    workdir.mkdir(parents=True, exist_ok=True)
    episodes, total = timeline(spec)
    ls_cgroup, be_cgroup = LabCgroup(LS_CGROUP), LabCgroup(BE_CGROUP)
    redis = agent = loadgen = None
    node: LabNode | None = None
    running: list[Antagonist] = []
    try:
        if spec.ls.cpus:
            ls_cgroup.pin(spec.ls.cpus)
        redis, port = start_redis(ls_cgroup, workdir)
        if kubeconfig:
            node = LabNode(kubeconfig, "sloguard-lab")
        cpus = shared_cpus(spec.ls.cpus)
        agent = LabAgent(workdir, guarded=(way == "guarded"), slo=spec.ls.slo,
                         kubeconfig=kubeconfig, node="sloguard-lab", cpus=cpus)
        agent.wait_ready()
        start_ns = time.time_ns() + int(lead_s * 1e9)
        loadgen = subprocess.Popen(
            [sys.executable, "-m", "sloguard.lab.loadgen", "--port", str(port),
             "--rate", str(spec.ls.rate), "--duration", str(total), "--keys", str(spec.ls.keys),
             "--value-size", str(spec.ls.value_size), "--rt-priority", str(spec.ls.rt_priority),
             "--start-ns", str(start_ns), "--cpus", ",".join(map(str, sorted(cpus)))],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        relay = Relay(loadgen.stdout, agent, cpus)
        relay.start()
        runs: list[EpisodeRun] = []
        for episode in episodes:
            _sleep_until(start_ns + int(episode.start_s * 1e9), start_ns, total, way, progress)
            if way == "baseline":  # the same periods, nothing run: the ground truth's shadow
                _sleep_until(start_ns + int(episode.end_s * 1e9), start_ns, total, way,
                             progress)
                runs.append(EpisodeRun(episode.antagonist, start_ns + int(episode.start_s * 1e9),
                                       start_ns + int(episode.end_s * 1e9), 0.0, 0))
                continue
            antagonist = Antagonist(episode.antagonist, episode.end_s - episode.start_s,
                                    spec.be, be_cgroup, workdir)
            running.append(antagonist)
            _sleep_until(start_ns + int(episode.end_s * 1e9), start_ns, total, way, progress)
            runs.append(antagonist.finish())
            running.remove(antagonist)
        _sleep_until(start_ns + int(total * 1e9), start_ns, total, way, progress)
        _, err = loadgen.communicate(timeout=60)
        relay.join(timeout=10)
        if loadgen.returncode != 0:
            raise RuntimeError(f"the load generator failed ({loadgen.returncode}): "
                               f"{err.decode(errors='replace')[-2000:]}")
        time.sleep(1.5)  # the agent's last evaluation of what was pushed
        result = WayResult(spec.name, way, start_ns, total, runs,
                           incidents=agent.incidents(), actions=agent.actions(),
                           client=f"{err.decode(errors='replace').strip().splitlines()[0]}"
                                  f"; relay on {relay.pinned}; agent on {agent.placement()}",
                           push_errors=relay.push_errors, records=relay.records())
        result.save(workdir)
        return result
    finally:
        for antagonist in running:
            antagonist.kill()
        if loadgen is not None and loadgen.poll() is None:
            loadgen.kill()
            loadgen.wait()
        if agent is not None:
            agent.stop()  # before the cgroups go: its last undo must find them
        if redis is not None:
            redis.kill()
            redis.wait()
        with contextlib.suppress(OSError):
            be_cgroup.remove()
        with contextlib.suppress(OSError):
            ls_cgroup.remove()
        if node is not None:
            node.remove()


def _sleep_until(deadline_ns: int, start_ns: int, total: float, way: str,
                 progress: Progress) -> None:
    while (left := deadline_ns - time.time_ns()) > 0:
        time.sleep(min(0.5, left / 1e9))
        done = max(0.0, (time.time_ns() - start_ns) / 1e9)
        progress(min(1.0, done / total), way)
