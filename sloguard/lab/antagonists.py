"""BE antagonists: stress-ng stressors run in the BE cgroup for one episode each.

stress-ng reports what it got done (bogo-ops) in a YAML file when it ends; that is the BE
throughput a guardrail costs, compared between the unguarded and the guarded way.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from sloguard.lab.cgroups import LabCgroup
from sloguard.lab.scenario import BeSpec, stress_args


class LabSetupError(Exception):
    """Something the lab needs is missing on this machine (the message says how to get it)."""


def stress_ng() -> str:
    found = shutil.which("stress-ng")
    if found is None:
        raise LabSetupError("stress-ng is not installed: apt-get install stress-ng "
                            "(or run scripts/lab-testenv.sh)")
    return found


@dataclass
class EpisodeRun:
    antagonist: str
    started_ns: int
    ended_ns: int
    bogo_ops: float
    returncode: int
    parts: dict[str, float] = field(default_factory=dict)  # bogo-ops per kind, when several

    @property
    def seconds(self) -> float:
        return (self.ended_ns - self.started_ns) / 1e9


class Antagonist:
    """One running stress-ng; `finish` waits for its own timeout and reads its metrics."""

    def __init__(self, antagonist: str, duration: float, be: BeSpec, cgroup: LabCgroup,
                 workdir: Path, args: list[str] | None = None) -> None:
        """`args`: stress-ng's stressor arguments, when not the antagonist kind's (an
        innocent BE job's)."""
        self.antagonist = antagonist
        self.cgroup = cgroup.rel
        self.metrics = workdir / f"stress-{antagonist}-{time.time_ns()}.yaml"
        temp = workdir / "stress-tmp"
        temp.mkdir(parents=True, exist_ok=True)
        stressor = args if args is not None else stress_args(antagonist, be)
        argv = [stress_ng(), *stressor, "--timeout", f"{duration:g}s",
                "--metrics-brief", "--yaml", str(self.metrics), "--temp-path", str(temp)]
        self.log = open(workdir / "stress-ng.log", "ab")  # noqa: SIM115 - closed in finish
        self.started_ns = time.time_ns()
        self.proc = cgroup.spawn(argv, stdout=self.log, stderr=subprocess.STDOUT)

    def finish(self, timeout: float = 30.0) -> EpisodeRun:
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.send_signal(signal.SIGINT)
            code = self.proc.wait(timeout=10)
        ended = time.time_ns()
        self.log.close()
        return EpisodeRun(self.antagonist, self.started_ns, ended, bogo_ops(self.metrics), code)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


def bogo_ops(path: Path) -> float:
    """Total bogo-ops of a stress-ng --yaml report (0 when it wrote none: it was killed)."""
    try:
        document = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError):
        return 0.0
    return float(sum(float(m.get("bogo-ops", 0)) for m in document.get("metrics") or []))
