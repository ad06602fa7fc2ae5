"""A lab session: every scenario asked for, each run its three ways, then the report.

Results are kept per way (records.npy and way.json under out/<scenario>/<way>/, with the agent's
log and data; out/<scenario>/run-<k>/<way>/ when the session repeats its scenarios), so a report
can be rebuilt without running again (`sloguard lab --report-only`).
"""

from __future__ import annotations

import os
import platform
import shutil
import time
from collections.abc import Callable
from pathlib import Path

from sloguard.lab.antagonists import LabSetupError, stress_ng
from sloguard.lab.pods import PodPlacement
from sloguard.lab.report import ScenarioReport, ScenarioRuns, build, markdown
from sloguard.lab.scenario import WAYS, ScenarioSpec, timeline
from sloguard.lab.way import WayResult, refuse_a_second_lab, run_way

Progress = Callable[[str, int, float, str], None]  # scenario, run, fraction of its way, way


def preflight(specs: list[ScenarioSpec] = ()) -> None:
    """What the lab needs, checked before anything starts (each missing part named), the
    scenarios' own programs among it: a missing one would otherwise be found mid-session."""
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
    for spec in specs:
        for name, program in spec.be.programs.items():
            if shutil.which(program.argv[0]) is None:
                problems.append(f"scenario {spec.name!r}, program {name!r}: "
                                f"{program.argv[0]!r} is not installed or not on PATH")
    if problems:
        raise LabSetupError("; ".join(problems))
    refuse_a_second_lab()


def session_seconds(specs: list[ScenarioSpec], repeats: int = 1) -> float:
    return repeats * sum(timeline(s)[1] * len(s.ways) for s in specs)


def run_dir(out: Path, scenario: str, run: int, repeats: int) -> Path:
    """Where one run of a scenario keeps its ways: out/<scenario> for a single run (as before
    repeats existed), out/<scenario>/run-<k> when repeated."""
    return out / scenario if repeats == 1 else out / scenario / f"run-{run}"


def clear_results(folder: Path) -> None:
    """Remove what an earlier session kept for a scenario (its run-<k> and way folders only:
    `--out` may be a directory that holds other things too)."""
    if not folder.is_dir():
        return
    for directory in [*folder.glob("run-*"), *(folder / way for way in WAYS)]:
        if directory.is_dir() and (directory.name in WAYS or directory.name[4:].isdigit()):
            shutil.rmtree(directory)


KUBE_SUFFIX = "-kube"


def with_pods(specs: list[ScenarioSpec]) -> list[ScenarioSpec]:
    """Each scenario, then its twin run as pods on the node (`<name>-kube`): both in one
    session, so the report compares them measured minutes apart on the same machine."""
    return [twin for spec in specs for twin in (
        spec, spec.model_copy(update={"name": spec.name + KUBE_SUFFIX}))]


def run_session(specs: list[ScenarioSpec], out: Path, progress: Progress,
                kubeconfig: str | None = None, repeats: int = 1,
                pods: PodPlacement | None = None) -> list[ScenarioRuns]:
    """Every scenario's three ways, `repeats` times. Runs go round the scenarios (1st run of
    each, then the 2nd...) so a slow drift of the machine spreads over all of them. With
    `pods`, the scenarios named `<name>-kube` (`with_pods`) run as pods on its node."""
    preflight(specs)
    if pods is not None:
        pods.check()
    names = [spec.name for spec in specs]
    if len(set(names)) != len(names):
        raise ValueError(f"a scenario named twice: {', '.join(names)} (use --repeat)")
    out.mkdir(parents=True, exist_ok=True)
    for spec in specs:  # a scenario's results from an earlier session would mix with these
        clear_results(out / spec.name)
    runs: dict[str, list[ScenarioReport]] = {spec.name: [] for spec in specs}
    scenarios: list[ScenarioRuns] = []
    for k in range(1, repeats + 1):
        for spec in specs:
            results: dict[str, WayResult] = {}
            for way in spec.ways:
                results[way] = run_way(
                    spec, way, run_dir(out, spec.name, k, repeats) / way,
                    lambda f, w, name=spec.name, k=k: progress(name, k, f, w),
                    kubeconfig=kubeconfig,
                    pods=pods if spec.name.endswith(KUBE_SUFFIX) else None)
            runs[spec.name].append(build(spec, results))
        # after every round, so an interrupted session still leaves a report of what ran
        scenarios = [ScenarioRuns(spec, runs[spec.name]) for spec in specs]
        write_report(scenarios, out, kubeconfig)
    return scenarios


def load_session(specs: list[ScenarioSpec], out: Path) -> list[ScenarioRuns]:
    """The runs kept under `out` for each scenario (a single run's ways, or every run-<k>)."""
    scenarios = []
    for spec in specs:
        folder = out / spec.name
        numbered = sorted((d for d in folder.glob("run-*") if d.name[4:].isdigit()),
                          key=lambda d: int(d.name[4:])) if folder.is_dir() else []
        reports, numbers = [], []
        for directory in numbered or [folder]:
            results = {way: WayResult.load(directory / way) for way in spec.ways
                       if (directory / way / "way.json").exists()}
            if results:
                reports.append(build(spec, results))
                numbers.append(int(directory.name[4:]) if numbered else 1)
        if reports:
            scenarios.append(ScenarioRuns(spec, reports, numbers))
    return scenarios


def write_report(scenarios: list[ScenarioRuns], out: Path, kubeconfig: str | None) -> Path:
    header = "\n".join([
        "# sloguard interference lab report",
        "",
        f"Run {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} on {platform.node()} "
        f"({os.cpu_count()} CPUs, Linux {platform.release()}). Kubernetes steps: "
        + ("acted on the API server of " + kubeconfig if kubeconfig else
           "shadow mode (no API server given)") + ". How to read it: docs/lab.md.",
    ])
    path = out / "report.md"
    path.write_text(markdown(scenarios, out, header))
    return path
