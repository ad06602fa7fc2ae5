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

from sloguard.core.cpulist import format_cpulist, parse_cpulist
from sloguard.lab.agent import (
    BE_CGROUP,
    LS_CGROUP,
    LabAgent,
    free_port,
    way_standing,
    way_targets,
)
from sloguard.lab.antagonists import Antagonist, EpisodeRun, LabSetupError
from sloguard.lab.cgroups import LabCgroup, pids_in
from sloguard.lab.kube import LabNode
from sloguard.lab.pods import PodAntagonist, PodPlacement
from sloguard.lab.programs import ProgramJob
from sloguard.lab.scenario import (
    INNOCENTS,
    BeSpec,
    LsSpec,
    ScenarioSpec,
    antagonist_cgroups,
    be_cgroups,
    innocent_cgroup,
    timeline,
)

PUSH_EVERY_S = 0.5
# Pushed as a histogram (as a service's metrics library would): 10 us to 10 s, 10% apart, so a
# percentile read from it is within 10% of the raw one, and a push costs the node little (raw
# values cost the agent and the relay tens of ms per push at 5000 requests/s)
BOUNDS_MS = np.round(0.01 * 1.1 ** np.arange(146), 6)
Progress = Callable[[float, str], None]
# Once the load stops, the incidents resolve (recover_for 20 s) and the shipped policy lifts
# a rung per undo_hold (15 s): five rungs and a relapse back-off fit in this.
RELEASE_TIMEOUT_S = 300.0


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
    # the innocent BE jobs' runs: name, cgroup, bogo_ops, seconds
    innocents: list[dict[str, Any]] = field(default_factory=list)
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
    ls = set(parse_cpulist(ls_cpus))
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
        self.pusher: threading.Thread | None = None

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
        pusher = self.pusher = threading.Thread(target=self._push_loop, daemon=True,
                                                name="lab-push")
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

    def _push_loop(self) -> None:  # a thread started by run(): it inherits run's CPUs
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


def refuse_a_second_lab() -> None:
    """Two labs would share the lab cgroups, and the second's teardown kills the first's."""
    for rel in (BE_CGROUP, LS_CGROUP):
        if pids := pids_in(rel):
            raise LabSetupError(f"cgroup {rel} has processes: another lab is running (or a "
                                f"killed one left them: kill {' '.join(map(str, pids))})")


class LabStage:
    """What every lab measurement stands on (a scenario's way, benchmarks/lab_levers.py's
    cells): fresh LS and BE cgroups, redis in the LS one on the LS cores, its open-loop client
    and relay on the shared CPUs, optionally the agent, and one teardown that leaves nothing
    behind whatever failed: antagonists, client, agent (before the cgroups go: its last undo
    must find them), redis, cgroups."""

    def __init__(self, ls: LsSpec, workdir: Path, pods: PodPlacement | None = None) -> None:
        refuse_a_second_lab()
        workdir.mkdir(parents=True, exist_ok=True)
        self.ls, self.workdir = ls, workdir
        self.ls_cgroup = LabCgroup(LS_CGROUP)
        try:
            self.be_cgroup = LabCgroup(BE_CGROUP)
        except OSError:
            with contextlib.suppress(OSError):
                self.ls_cgroup.remove()
            raise
        self.cpus = shared_cpus(ls.cpus)
        self.pods = pods  # LS and BE as pods on a real node (`--kube`), else processes here
        self.redis: subprocess.Popen | None = None
        self.host, self.port = "127.0.0.1", 0
        self.ls_note = ""
        self.agent: LabAgent | None = None
        self.loadgen: subprocess.Popen | None = None
        self.relay: Relay | None = None
        self._client_log = workdir / "loadgen.log"
        self.running: list[Antagonist | PodAntagonist | ProgramJob] = []
        self.more_be: dict[str, LabCgroup] = {}  # BE cgroups beside the first (attribution)

    def __enter__(self) -> LabStage:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: object) -> None:
        try:
            self.close()
        except Exception as failed:
            if exc is None:
                raise
            exc.add_note(f"the lab's teardown failed too: {failed!r}")  # the first error wins

    def start_ls(self) -> None:
        if self.pods is not None:
            self.host, self.port, self.ls_note = self.pods.start_ls(self.ls)
            return
        if self.ls.cpus:
            self.ls_cgroup.pin(self.ls.cpus)
        self.redis, self.port = start_redis(self.ls_cgroup, self.workdir)

    def antagonist(self, kind: str, duration: float, be: BeSpec, cgroup: str = BE_CGROUP,
                   args: list[str] | None = None) -> Antagonist | PodAntagonist | ProgramJob:
        """One stressor, or a program of `be.programs`: in the BE cgroup (or another BE cgroup
        of the lab's, for a second antagonist or an innocent job), or as a BE pod on the
        node."""
        if self.pods is not None:
            if cgroup != BE_CGROUP or args is not None:
                raise LabSetupError("several BE workloads at once (innocents, antagonists "
                                    "together) do not run as pods yet: run the scenario "
                                    "without --kube")
            if kind in be.programs:
                raise LabSetupError(f"program {kind!r}: programs of be.programs do not run "
                                    "as pods yet: run the scenario without --kube")
            return self.pods.antagonist(kind, duration, be, self.workdir)
        if cgroup == BE_CGROUP:
            where = self.be_cgroup
        else:
            where = self.more_be.get(cgroup) or self.more_be.setdefault(cgroup,
                                                                         LabCgroup(cgroup))
        if kind in be.programs:
            return ProgramJob(kind, be.programs[kind].argv, duration, where, self.workdir)
        return Antagonist(kind, duration, be, where, self.workdir, args)

    def check(self) -> None:
        """Raise a running program's error now (ProgramJob.check): the way stops, and the
        teardown takes everything down."""
        for job in self.running:
            if isinstance(job, ProgramJob):
                job.check()

    def start_client(self, duration: float, start_ns: int) -> Relay:
        """The load generator from `start_ns` for `duration` s; the relay pushes its latencies
        to the agent when there is one."""
        ls = self.ls
        with self._client_log.open("wb") as log:  # stdout is the relay's alone
            self.loadgen = subprocess.Popen(
                [sys.executable, "-m", "sloguard.lab.loadgen", "--host", self.host,
                 "--port", str(self.port),
                 "--rate", str(ls.rate), "--duration", str(duration), "--keys", str(ls.keys),
                 "--value-size", str(ls.value_size), "--rt-priority", str(ls.rt_priority),
                 "--start-ns", str(start_ns), "--cpus", format_cpulist(self.cpus)],
                stdout=subprocess.PIPE, stderr=log)
        self.relay = Relay(self.loadgen.stdout, self.agent, self.cpus)
        self.relay.start()
        return self.relay

    def finish_client(self, timeout: float = 60) -> str:
        """Wait for the client's end; its note (priority, CPUs) or RuntimeError with its
        stderr."""
        assert self.loadgen is not None and self.relay is not None
        self.loadgen.wait(timeout=timeout)
        self.relay.join(timeout=10)
        text = self._client_log.read_text(errors="replace")
        if self.loadgen.returncode != 0:
            raise RuntimeError(f"the load generator failed ({self.loadgen.returncode}): "
                               f"{text[-2000:]}")
        return (text.strip().splitlines() or ["(no note)"])[0]

    def close(self) -> None:
        """Every part goes even when one refuses: the first error is raised at the end."""
        errors: list[BaseException] = []

        def attempt(undo: Callable[[], object]) -> None:
            try:
                undo()
            except Exception as exc:  # kept, raised once the rest is gone
                errors.append(exc)

        for antagonist in self.running:
            attempt(antagonist.kill)
        self.running.clear()
        if self.loadgen is not None and self.loadgen.poll() is None:
            attempt(self.loadgen.kill)
            attempt(self.loadgen.wait)
        if self.agent is not None:
            attempt(self.agent.stop)
        if self.redis is not None and self.redis.poll() is None:
            attempt(self.redis.kill)
            attempt(self.redis.wait)
        if self.pods is not None:
            attempt(self.pods.close)
        for cgroup in (*self.more_be.values(), self.be_cgroup, self.ls_cgroup):
            with contextlib.suppress(OSError):
                cgroup.remove()
        if errors:
            raise errors[0]


def run_way(spec: ScenarioSpec, way: str, workdir: Path, progress: Progress,
            kubeconfig: str | None = None, lead_s: float = 3.0,
            pods: PodPlacement | None = None) -> WayResult:
    """One way; with `pods`, LS and BE run as pods on that real node (and the Kubernetes steps
    act on it, through `kubeconfig`), else as processes in the lab's cgroups."""
    episodes, total = timeline(spec)
    node: LabNode | None = None
    node_name = pods.node if pods is not None else "sloguard-lab"
    try:
        with LabStage(spec.ls, workdir, pods) as stage:
            stage.start_ls()
            if kubeconfig:
                node = LabNode(kubeconfig, node_name)
            agent = stage.agent = LabAgent(workdir, guarded=way.startswith("guarded"),
                                           slo=spec.ls.slo, kubeconfig=kubeconfig,
                                           node=node_name, cpus=stage.cpus,
                                           pods=pods is not None,
                                           be_cgroups=be_cgroups(spec, BE_CGROUP),
                                           ebpf=spec.culprits,
                                           targets=way_targets(way),
                                           standing=way_standing(way))
            agent.wait_ready()
            if spec.culprits:
                agent.wait_ebpf()
            start_ns = time.time_ns() + int(lead_s * 1e9)
            relay = stage.start_client(total, start_ns)
            innocents = []
            for innocent in [] if way == "baseline" else spec.be.innocents:
                job = stage.antagonist(innocent.job, total + lead_s, spec.be,
                                       innocent_cgroup(innocent.name, BE_CGROUP),
                                       INNOCENTS[innocent.kind] if innocent.kind else None)
                stage.running.append(job)  # at once: the next one may fail to start
                innocents.append((innocent, job))
            runs: list[EpisodeRun] = []
            for episode in episodes:
                begin_ns = start_ns + int(episode.start_s * 1e9)
                end_ns = start_ns + int(episode.end_s * 1e9)
                _sleep_until(begin_ns, start_ns, total, way, progress, stage.check)
                if way == "baseline":  # the same periods, nothing run: the ground truth's shadow
                    _sleep_until(end_ns, start_ns, total, way, progress, stage.check)
                    runs.append(EpisodeRun(episode.antagonist, begin_ns, end_ns, 0.0, 0))
                    continue
                together = []
                for kind, cgroup in antagonist_cgroups(episode.kinds, BE_CGROUP).items():
                    job = stage.antagonist(kind, episode.end_s - episode.start_s, spec.be,
                                           cgroup)
                    stage.running.append(job)
                    together.append(job)
                _sleep_until(end_ns, start_ns, total, way, progress, stage.check)
                runs.append(_together([job.finish() for job in together]))
                for job in together:
                    stage.running.remove(job)
            _sleep_until(start_ns + int(total * 1e9), start_ns, total, way, progress,
                         stage.check)
            client = stage.finish_client()
            innocent_runs = []
            for spec_of, job in innocents:
                done = job.finish()
                stage.running.remove(job)
                innocent_runs.append({"name": spec_of.name, "kind": spec_of.job,
                                      "cgroup": "/" + innocent_cgroup(spec_of.name, BE_CGROUP),
                                      "bogo_ops": done.bogo_ops, "seconds": done.seconds})
            time.sleep(1.5)  # the agent's last evaluation of what was pushed
            if pods is not None:
                # The kubelet's QoS cgroups and the node outlive the way (the lab's own cgroups
                # do not): the agent must have lifted every rung before it stops.
                progress(1.0, way)
                if left := agent.wait_released(RELEASE_TIMEOUT_S):
                    raise RuntimeError(
                        "the agent still holds " + ", ".join(f"{r['kind']} ({r['target']})"
                                                             for r in left)
                        + f" {RELEASE_TIMEOUT_S:g} s after the way; see "
                        f"{workdir / 'agent.log'}")
            result = WayResult(spec.name, way, start_ns, total, runs,
                               incidents=agent.incidents(), actions=agent.actions(),
                               client=f"{client}; relay on {relay.pinned}; "
                                      f"agent on {agent.placement()}"
                                      + (f"; LS and BE as pods on node {node_name} (redis on "
                                         f"{stage.ls_note})" if pods is not None else ""),
                               push_errors=relay.push_errors, innocents=innocent_runs,
                               records=relay.records())
            result.save(workdir)
            return result
    finally:
        if node is not None:
            node.remove()


def _together(parts: list[EpisodeRun]) -> EpisodeRun:
    """One episode's record of its antagonists run at once."""
    if len(parts) == 1:
        return parts[0]
    return EpisodeRun("+".join(p.antagonist for p in parts), min(p.started_ns for p in parts),
                      max(p.ended_ns for p in parts), sum(p.bogo_ops for p in parts),
                      max(p.returncode for p in parts),
                      {p.antagonist: p.bogo_ops for p in parts})


def _sleep_until(deadline_ns: int, start_ns: int, total: float, way: str,
                 progress: Progress, check: Callable[[], None]) -> None:
    while (left := deadline_ns - time.time_ns()) > 0:
        check()
        time.sleep(min(0.5, left / 1e9))
        done = max(0.0, (time.time_ns() - start_ns) / 1e9)
        progress(min(1.0, done / total), way)
