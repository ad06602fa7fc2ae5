"""Real programs as the lab's BE jobs (`be.programs`): the scenario file's checks, and a
program run over and over in a real cgroup, its runs counted."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from conftest import need

from sloguard.lab.antagonists import LabSetupError
from sloguard.lab.cgroups import LabCgroup
from sloguard.lab.programs import ProgramJob
from sloguard.lab.scenario import (
    ScenarioError,
    ScenarioSpec,
    be_cgroups,
    load_scenario,
    shortened,
    timeline,
)

SCENARIO = """\
name: mine
be:
  programs:
    compress: {argv: [xz, -9, -c, /usr/bin/python3]}
    checksum: {argv: [sha256sum, /usr/bin/python3]}
  innocents:
    - {name: sums, program: checksum}
    - {name: sleepy, kind: sleepy}
schedule:
  quiet: 5s
  episodes:
    - {antagonist: compress, duration: 10s}
    - {antagonist: [cpu, compress], duration: 10s}
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "scenario.yaml"
    path.write_text(text)
    return path


def test_a_scenario_names_its_own_programs_as_antagonists_and_innocents(tmp_path: Path):
    spec = load_scenario(write(tmp_path, SCENARIO))
    episodes, _ = timeline(spec)
    assert [e.antagonist for e in episodes] == ["compress", "cpu+compress"]
    assert spec.be.innocents[0].job == "checksum" and spec.be.innocents[1].job == "sleepy"
    assert spec.be.programs["compress"].argv[:2] == ["xz", "-9"]  # a word, not YAML's number
    assert spec.culprits
    # the agent knows each BE cgroup by what runs there
    assert dict(be_cgroups(spec, "lab/be")) == {
        "lab/be": "be", "lab/be-compress": "compress",
        "lab/be-innocent-sums": "sums", "lab/be-innocent-sleepy": "sleepy"}
    assert shortened(spec, quiet=1, episode=2).schedule.episodes[1].kinds == ["cpu", "compress"]


@pytest.mark.parametrize(("text", "line", "problem"), [
    (SCENARIO.replace("{antagonist: compress, duration: 10s}",
                      "{antagonist: compres, duration: 10s}"),
     12, r"'compres' is neither a stress-ng kind .* nor a program of be.programs "
         r"\(checksum, compress\)"),
    (SCENARIO.replace("program: checksum", "program: sha"), 7,
     r"innocent 'sums': no program 'sha' in be.programs \(checksum, compress\)"),
    (SCENARIO.replace("{name: sleepy, kind: sleepy}",
                      "{name: sleepy, kind: sleepy, program: compress}"), 8,
     r"innocent 'sleepy': give `kind` or `program`, one of them"),
    (SCENARIO.replace("    checksum:", "    cache:"), 3,
     r"program name 'cache' is a stress-ng kind's"),
    (SCENARIO.replace("argv: [sha256sum, /usr/bin/python3]", "argv: []"), 5, r"argv"),
    (SCENARIO.replace("xz, -9, -c", "xz, 1.50, -c"), 4, r"YAML read a number here"),
    (SCENARIO.replace("checksum", "innocent-sums"), 3,
     r"'innocent-' begins the innocents' cgroups"),
    (SCENARIO.replace("{name: sums,", "{name: checksum,"), 2,
     r"innocent 'checksum' has a program's name"),
])
def test_a_wrong_program_is_reported_at_its_line(tmp_path: Path, text: str, line: int,
                                                 problem: str):
    path = write(tmp_path, text)
    with pytest.raises(ScenarioError, match=problem) as caught:
        load_scenario(path)
    assert f"{path}:{line}:" in str(caught.value)


def test_a_spec_built_in_code_is_checked_too():
    with pytest.raises(ValueError, match=r"episodes.0.antagonist: 'tar' is neither"):
        ScenarioSpec.model_validate({"name": "x", "schedule": {
            "episodes": [{"antagonist": "tar", "duration": 5}]}})


# -- real runs in a real cgroup ----------------------------------------------------------------

@pytest.fixture
def cgroup():
    need(os.geteuid() == 0, "creating cgroups needs root")
    made = LabCgroup(f"sloguard-labtest-{os.getpid()}/program")
    yield made
    made.remove()
    assert not any(path.exists() for path in made.paths())


def _wait_for_a_run(cgroup: LabCgroup, processes: int = 1) -> None:
    deadline = time.monotonic() + 5
    while len(cgroup.pids()) < processes and time.monotonic() < deadline:
        time.sleep(0.02)


@pytest.mark.root
def test_a_program_runs_again_until_its_time_and_only_whole_runs_count(cgroup, tmp_path):
    argv = ["sh", "-c", "cat /proc/self/cgroup >&2; echo discarded; sleep 0.3"]
    job = ProgramJob("where", argv, 2.0, cgroup, tmp_path)
    run = job.finish()
    # 2 s of 0.3 s runs: 5 or 6 whole runs (the one cut by the end is not counted)
    assert 4 <= run.bogo_ops <= 6, run
    assert 1.9 <= run.seconds <= 3.0, run
    lines = [line for line in (tmp_path / "program-where.log").read_text().splitlines()
             if ":cpu:" in line or ":memory:" in line]
    assert lines and all(line.endswith(cgroup.rel) for line in lines)  # every run inside
    assert "discarded" not in (tmp_path / "program-where.log").read_text()  # stdout is not kept
    assert not cgroup.pids()


@pytest.mark.root
@pytest.mark.parametrize("whom", ["the program", "a shell's last command"])
def test_a_run_killed_by_sigkill_is_lost_and_the_job_goes_on(cgroup, tmp_path, whom):
    # a shell reports its last command's SIGKILL as exit code 137
    argv = ["sleep", "0.5"] if whom == "the program" else ["sh", "-c", "sleep 0.5; exit $?"]
    job = ProgramJob("victim", argv, 2.5, cgroup, tmp_path)
    _wait_for_a_run(cgroup)
    time.sleep(0.05)  # the shell has started its sleep
    for pid in cgroup.pids():
        if Path(f"/proc/{pid}/comm").read_text().strip() == "sleep":
            os.kill(pid, 9)  # as an OOM kill under a memory lever would
    run = job.finish()
    assert job.killed == 1
    assert 2 <= run.bogo_ops <= 4, run  # it went on running after the kill


@pytest.mark.root
@pytest.mark.parametrize(("argv", "problem"), [
    (["sh", "-c", "kill -SEGV $$"], r"program 'crash' died of signal 11"),
    (None, r"program 'crash' could not start: .*Exec format error"),
])
def test_a_crash_or_a_program_that_cannot_start_stops_the_job_at_once(cgroup, tmp_path, argv,
                                                                        problem):
    if argv is None:  # a script without its #! line
        script = tmp_path / "no-shebang"
        script.write_text("echo hello\n")
        script.chmod(0o755)
        argv = [str(script)]
    job = ProgramJob("crash", argv, 30.0, cgroup, tmp_path)
    started = time.monotonic()
    # the way polls check() every half second: it hears of it long before the job's end
    with pytest.raises(LabSetupError, match=problem):
        while time.monotonic() - started < 5:
            job.check()
            time.sleep(0.05)
    assert time.monotonic() - started < 2
    job.kill()
    assert not cgroup.pids()


@pytest.mark.root
def test_a_program_that_fails_stops_its_job_and_says_why(cgroup, tmp_path):
    job = ProgramJob("broken", ["sh", "-c", "echo no input file >&2; exit 3"], 5.0, cgroup,
                     tmp_path)
    started = time.monotonic()
    with pytest.raises(LabSetupError, match=r"(?s)program 'broken' exited with 3.*no input "
                                            r"file"):
        job.finish()
    assert time.monotonic() - started < 2  # the way is not spent on a job that cannot run
    with pytest.raises(LabSetupError, match="'no-such-program' is not installed"):
        ProgramJob("gone", ["no-such-program"], 1.0, cgroup, tmp_path)


@pytest.mark.root
def test_killing_a_job_mid_run_leaves_nothing_in_its_cgroup(cgroup, tmp_path):
    # what the shell started in the background outlives killing the shell: the cgroup's
    # sweep must find it
    job = ProgramJob("long", ["sh", "-c", "sleep 30 & sleep 30; wait"], 30.0, cgroup, tmp_path)
    _wait_for_a_run(cgroup, processes=3)  # the shell, both sleeps
    assert len(cgroup.pids()) == 3
    job.kill()
    assert not cgroup.pids()
