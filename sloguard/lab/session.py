"""A lab session: every scenario asked for, each run its three ways, then the report.

Results are kept per way (records.npy and way.json under out/<scenario>/<way>/, with the agent's
log and data), so a report can be rebuilt without running again (`sloguard lab --report-only`).
"""

from __future__ import annotations

import os
import platform
import shutil
import time
from collections.abc import Callable
from pathlib import Path

from sloguard.lab.agent import BE_CGROUP, LS_CGROUP
from sloguard.lab.antagonists import LabSetupError, stress_ng
from sloguard.lab.cgroups import pids_in
from sloguard.lab.report import ScenarioReport, build, markdown
from sloguard.lab.scenario import ScenarioSpec, timeline
from sloguard.lab.way import WayResult, run_way

Progress = Callable[[str, float, str], None]  # scenario, fraction of its way, way


def preflight() -> None:
    """What the lab needs, checked before anything starts (each missing part named)."""
    problems = []
    if os.geteuid() != 0:
        problems.append("root is needed: the lab creates cgroups and runs the load generator "
                        "at real-time priority")
    try:
        stress_ng()
    except LabSetupError as exc:
        problems.append(str(exc))
    if shutil.which("redis-server") is None:
        problems.append("redis-server is not installed: apt-get install redis-server "
                        "(or run scripts/lab-testenv.sh)")
    if problems:
        raise LabSetupError("; ".join(problems))
    for rel in (BE_CGROUP, LS_CGROUP):
        if pids := pids_in(rel):
            raise LabSetupError(f"cgroup {rel} has processes: another lab is running (or a "
                                f"killed one left them: kill {' '.join(map(str, pids))})")


def session_seconds(specs: list[ScenarioSpec]) -> float:
    return sum(timeline(s)[1] * len(s.ways) for s in specs)


def run_session(specs: list[ScenarioSpec], out: Path, progress: Progress,
                kubeconfig: str | None = None) -> list[ScenarioReport]:
    preflight()
    out.mkdir(parents=True, exist_ok=True)
    reports = []
    for spec in specs:
        results: dict[str, WayResult] = {}
        for way in spec.ways:
            results[way] = run_way(spec, way, out / spec.name / way,
                                   lambda f, w, name=spec.name: progress(name, f, w),
                                   kubeconfig=kubeconfig)
        reports.append(build(spec, results))
    write_report(reports, out, kubeconfig)
    return reports


def load_session(specs: list[ScenarioSpec], out: Path) -> list[ScenarioReport]:
    reports = []
    for spec in specs:
        results = {way: WayResult.load(out / spec.name / way) for way in spec.ways
                   if (out / spec.name / way / "way.json").exists()}
        if results:
            reports.append(build(spec, results))
    return reports


def write_report(reports: list[ScenarioReport], out: Path, kubeconfig: str | None) -> Path:
    header = "\n".join([
        "# sloguard interference lab report",
        "",
        f"Run {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} on {platform.node()} "
        f"({os.cpu_count()} CPUs, Linux {platform.release()}). Kubernetes steps: "
        + ("acted on the API server of " + kubeconfig if kubeconfig else
           "shadow mode (no API server given)") + ". How to read it: docs/lab.md.",
    ])
    path = out / "report.md"
    path.write_text(markdown(reports, out, header))
    return path
