"""The interference lab: its parts against real redis, stress-ng and cgroups, and a short run of
a whole scenario (three ways, the real agent) that asserts the direction of the effects."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from sloguard.cli import app
from sloguard.core.cpulist import parse_cpulist
from sloguard.lab.agent import LS_CGROUP
from sloguard.lab.analysis import mitigated_spans, p99_timeline, stalled, way_stats
from sloguard.lab.antagonists import EpisodeRun, LabSetupError, bogo_ops
from sloguard.lab.cgroups import LabCgroup, hierarchies, pids_in
from sloguard.lab.report import build
from sloguard.lab.scenario import (
    SCENARIO_DIR,
    LsSpec,
    ScenarioError,
    find_scenario,
    load_scenario,
    shortened,
    timeline,
)
from sloguard.lab.session import clear_results, load_session
from sloguard.lab.way import LabStage, Relay, WayResult, run_way, shared_cpus, start_redis

# latency and throughput are measured here: these run last, never beside the background
# Kubernetes build of `make test` (conftest.run_phase)
pytestmark = pytest.mark.timing
ROOT = os.geteuid() == 0
BENCH = Path(__file__).resolve().parent.parent / "benchmarks"
HAVE_TOOLS = shutil.which("redis-server") is not None and shutil.which("stress-ng") is not None
needs_lab = pytest.mark.skipif(
    not (ROOT and HAVE_TOOLS),
    reason="needs root, redis-server and stress-ng (scripts/lab-testenv.sh)")


# -- scenarios ------------------------------------------------------------------------------

def test_shipped_scenarios_load_and_cover_the_issue_antagonists() -> None:
    names = {p.stem for p in SCENARIO_DIR.glob("*.yaml")}
    assert {"cpu", "cache", "io", "vm"} <= names
    for name in names:
        spec = load_scenario(find_scenario(name))
        episodes, total = timeline(spec)
        assert spec.ways == (["baseline", "unguarded", "guarded", "guarded-tier"]
                             if spec.culprits else ["baseline", "unguarded", "guarded"])
        assert episodes[0].start_s == spec.schedule.quiet
        assert total == pytest.approx(episodes[-1].end_s + spec.schedule.quiet)


def test_a_broken_scenario_names_file_line_and_field(tmp_path: Path, monkeypatch) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("name: bad\nschedule:\n  quiet: 5s\n  episodes:\n"
                    "    - {antagonist: gpu, duration: 10s}\n")
    with pytest.raises(ScenarioError) as caught:
        load_scenario(path)
    assert f"{path}:5:" in str(caught.value)
    assert "antagonist" in str(caught.value)
    with pytest.raises(ScenarioError, match=r"shipped: .*cache"):
        find_scenario("no-such-scenario")
    cpus = tmp_path / "cpus.yaml"
    cpus.write_text("name: c\nls:\n  cpus: 3-1\nschedule:\n  episodes:\n"
                    "    - {antagonist: cpu, duration: 10s}\n")
    with pytest.raises(ScenarioError, match=rf"{cpus}:3:.*cpus.*not a CPU range: '3-1'"):
        load_scenario(cpus)
    twice = CliRunner().invoke(app, ["lab", "cache", "cache", "--out", str(tmp_path / "o")])
    assert twice.exit_code == 2 and "given more than once" in twice.output
    # `--report-only` run where --out holds the ways' results: ./cache is a directory there
    (tmp_path / "cache").mkdir()
    monkeypatch.chdir(tmp_path)
    assert find_scenario("cache").name == "cache.yaml"


def test_short_variant_keeps_the_antagonists() -> None:
    spec = shortened(load_scenario(find_scenario("io")), quiet=5, episode=7, episodes=1)
    episodes, total = timeline(spec)
    assert [(e.antagonist, e.start_s, e.end_s) for e in episodes] == [("io", 5, 12)]
    assert total == 17


# -- analysis on records whose answer is known ------------------------------------------------

def _result(way: str, actions: list[dict] | None = None) -> WayResult:
    start = 1_000_000_000_000
    t = np.arange(0, 30, 0.001)  # one request per ms for 30 s
    lat_ms = np.full(len(t), 0.1)
    lat_ms[(t >= 10) & (t < 20) & (np.arange(len(t)) % 20 == 0)] = 5.0  # 5% slow in the episode
    intended = start + (t * 1e9).astype(np.int64)
    done = intended + (lat_ms * 1e6).astype(np.int64)
    done[-40:] = -1  # never answered: 0.13%, so in the p999
    records = np.stack([intended, intended + 1000, done], axis=1)
    episode = EpisodeRun("cache", start + 10 * 10**9, start + 20 * 10**9,
                         0.0 if way == "baseline" else 5000.0, 0)
    # the delay to firing is the first incident that drives a policy (any rule routing to one),
    # not an alert-only rule's
    incidents = [{"rule": "LSLatencySLOBreach", "fired_ns": start + 11 * 10**9},
                 {"rule": "LSLatencyIOInterference", "policy": "ls-io",
                  "fired_ns": start + 12 * 10**9}]
    return WayResult("t", way, start, 30.0, [episode], incidents=incidents,
                     actions=actions or [], records=records)


def _action(t: float, kind: str, action: str = "apply", status: str = "done") -> dict:
    return {"time_ns": 1_000_000_000_000 + int(t * 1e9), "kind": kind, "action": action,
            "status": status, "reason": "", "detail": ""}


def test_delays_quiet_actions_and_percentiles_from_known_records() -> None:
    actions = [_action(12.0, "notify"), _action(12.5, "cpu_idle"), _action(24.0, "cpuset"),
               _action(26.0, "cpu_idle", action="undo"), _action(5.0, "notify")]
    stats = way_stats(_result("guarded", actions))
    [episode] = stats.episodes
    assert episode.fired_s == pytest.approx(2.0)
    assert episode.first_action_s == pytest.approx(2.5)  # cpu_idle; notify is not mitigating
    assert episode.first_action == "cpu_idle (done)"
    # 24.0 is within the grace after the episode; the undo is not an alarm; 5.0 is
    assert [(a["t"], a["kind"]) for a in stats.quiet_actions] == [(pytest.approx(5.0),
                                                                   "notify")]
    assert stats.unanswered == 40 and stats.p999_ms == float("inf")
    assert stats.episode_p99_ms == pytest.approx(5.0, rel=0.01)  # 5% slow in the episode
    assert stats.p50_ms == pytest.approx(0.1, rel=0.01)
    assert stats.be_ops_per_s == pytest.approx(500.0)
    starts, p99 = p99_timeline(_result("guarded"))
    assert len(starts) == 30 and p99[15] == pytest.approx(5.0, rel=0.01)
    assert p99[5] == pytest.approx(0.1, rel=0.01)


def test_an_episode_is_attributed_right_when_its_antagonist_is_the_first_suspect() -> None:
    """The first incident under a policy in the episode: its first suspect against the
    episode's antagonists; the innocents' throughput per second; the report's table."""
    from sloguard.lab.report import attributed, innocent_ratio

    result = _result("guarded")
    driving = result.incidents[1]
    driving["suspects"] = [{"cgroup": "/sloguard-lab/be-innocent-sleepy", "rank": 2},
                           {"cgroup": "/sloguard-lab/be", "rank": 1}]
    result.innocents = [{"name": "sleepy", "cgroup": "/sloguard-lab/be-innocent-sleepy",
                         "bogo_ops": 90.0, "seconds": 30.0}]
    stats = way_stats(result)
    [episode] = stats.episodes
    assert episode.suspect == "/sloguard-lab/be" and episode.attributed is True
    assert stats.innocent_ops_per_s == {"sleepy": 3.0}
    driving["suspects"] = [{"cgroup": "/sloguard-lab/be-innocent-sleepy", "rank": 1}]
    assert way_stats(result).episodes[0].attributed is False
    driving["suspects"] = []
    assert way_stats(result).episodes[0].attributed is False  # it fired and named nobody
    # fired in the quiet just before the episode (an innocent's blip over a noisy LS tail)
    # and still firing in it: its ranking is the episode's
    driving["fired_ns"] = result.start_ns + 9_500_000_000
    driving["suspects"] = [{"cgroup": "/sloguard-lab/be", "rank": 1}]
    assert way_stats(result).episodes[0].attributed is True
    driving["resolved_ns"] = result.start_ns + 9_900_000_000  # over before it began
    assert way_stats(result).episodes[0].attributed is None
    driving.update(fired_ns=result.start_ns + 12 * 10**9, resolved_ns=None, suspects=[])
    free = _result("unguarded")
    free.innocents = [{"name": "sleepy", "bogo_ops": 120.0, "seconds": 30.0}]
    spec = load_scenario(find_scenario("culprit"))
    report = build(spec, {"unguarded": free, "guarded": result})
    assert innocent_ratio(report, "guarded") == pytest.approx(0.75)
    assert attributed(report, "guarded") == (0, 1)


def test_a_lever_still_in_force_at_an_episode_start_mitigates_it_from_its_first_second() -> None:
    held = way_stats(_result("guarded", [_action(8.0, "cpuset")]))
    assert held.episodes[0].first_action_s == 0.0
    assert held.episodes[0].first_action == "cpuset (in force at the start)"
    assert held.episodes[0].carried  # the report's "needed a new action" leaves it out
    lifted = way_stats(_result("guarded", [_action(8.0, "cpuset"),
                                           _action(9.0, "cpuset", "undo", "undone"),
                                           _action(11.0, "cpu_idle")]))
    assert lifted.episodes[0].first_action_s == pytest.approx(1.0)
    assert not lifted.episodes[0].carried


def test_the_seconds_after_the_first_lever_are_measured_apart_from_the_onset() -> None:
    """Slow only until the first lever (10-12 s of a 10-20 s episode): the episode's p99 shows
    the onset, the p99 from the lever on matches the baseline over the same seconds."""
    guarded = _result("guarded", [_action(12.0, "cpu_idle")])
    lat_ms = np.full(len(guarded.records), 0.1)
    t = (guarded.records[:, 0] - guarded.start_ns) / 1e9
    lat_ms[(t >= 10) & (t < 12) & (np.arange(len(t)) % 10 == 0)] = 5.0  # 2% of the episode
    guarded.records[:, 2] = guarded.records[:, 0] + (lat_ms * 1e6).astype(np.int64)
    baseline = _result("baseline")
    baseline.records[:, 2] = baseline.records[:, 0] + 100_000  # 0.1 ms throughout
    report = build(load_scenario(find_scenario("cache")),
                   {"baseline": baseline, "guarded": guarded})
    assert mitigated_spans(report.stats["guarded"]) == [(pytest.approx(12.0), 20.0)]
    assert report.ratio("guarded", "episode_p99_ms", "baseline") == pytest.approx(50, rel=0.01)
    assert report.mitigated() == (pytest.approx(0.1), pytest.approx(0.1))
    assert report.mitigated_ratio() == pytest.approx(1.0)
    assert math.isnan(build(load_scenario(find_scenario("cache")),
                            {"baseline": baseline}).mitigated_ratio())


def test_standing_levers_count_0_s_but_the_ladders_delay_and_the_end_are_told_apart() -> None:
    """#23: a standing lever in force from the start counts as mitigation at 0 s, the ladder's
    own first action is reported beside it, and is no quiet-period action; after the episode
    (10-20 s), an action and a firing are reported, and how long the ladder's levers stayed."""
    standing = {**_action(1.0, "cpu_idle"), "policy": "standing:ls-interference", "rung": 0}
    ladder = [{**_action(t, kind, action), "policy": "ls-interference", "rung": rung}
              for t, kind, action, rung in ((12.5, "cpuset", "apply", 1),
                                            (21.0, "cpu_quota", "apply", 2),
                                            (24.0, "cpu_quota", "undo", 2),
                                            (26.0, "cpuset", "undo", 1))]
    result = _result("guarded", [standing, *ladder])
    result.incidents.append({"rule": "LSLatencyInterference", "policy": "ls-interference",
                             "fired_ns": result.start_ns + 22 * 10**9})
    stats = way_stats(result)
    [episode] = stats.episodes
    assert episode.first_action_s == 0.0 and episode.carried
    assert episode.ladder_action_s == pytest.approx(2.5)
    assert stats.quiet_actions == []
    assert episode.after_end == ["cpu_quota at +1.0 s", "fired at +2.0 s"]
    assert episode.lifted_s == pytest.approx(6.0)
    still = way_stats(_result("guarded", [standing, *ladder[:2]])).episodes[0]
    assert still.lifted_s is None and still.after_end == ["cpu_quota at +1.0 s"]
    plain = way_stats(_result("guarded", [ladder[0]])).episodes[0]
    assert (plain.first_action_s, plain.ladder_action_s) == (pytest.approx(2.5),) * 2


def test_proposals_count_for_the_shadow_way_and_the_baseline_has_no_be() -> None:
    stats = way_stats(_result("unguarded", [_action(13.0, "cpu_idle", status="proposed")]))
    assert stats.episodes[0].first_action == "cpu_idle (proposed)"
    assert way_stats(_result("baseline")).be_ops_per_s == 0.0


def _slower(result: WayResult, factor: float) -> WayResult:
    records = result.records.copy()
    answered = records[:, 2] >= 0
    records[answered, 2] = records[answered, 0] + (
        (records[answered, 2] - records[answered, 0]) * factor).astype(np.int64)
    result.records = records
    return result


def _with_be(result: WayResult, ops: float) -> WayResult:
    result.episodes = [EpisodeRun(e.antagonist, e.started_ns, e.ended_ns, ops, 0)
                       for e in result.episodes]
    return result


def _runs(folder: Path, spec, guarded: dict[int, tuple[float, float]]) -> None:
    """Runs kept as `--repeat` keeps them: run k's guarded way `factor` times slower than its
    baseline, with `ops` BE bogo-ops per episode (the unguarded way: 5000)."""
    for k, (factor, ops) in guarded.items():
        for way in spec.ways:
            result = _result(way)
            if way == "guarded":
                _with_be(_slower(result, factor), ops)
            result.save(folder / spec.name / f"run-{k}" / way)


def test_repeated_runs_are_judged_on_the_median_of_their_ratios(tmp_path: Path) -> None:
    """Three runs of a scenario: each run's ratio is against its own baseline and unguarded
    ways, the target is judged on their median, and the median run is the one shown."""
    spec = load_scenario(find_scenario("cache"))
    _runs(tmp_path, spec, {1: (3.0, 4000.0), 2: (1.5, 1000.0), 3: (1.0, 5000.0)})
    [scenario] = load_session([spec], tmp_path)
    assert scenario.ratios("guarded", "episode_p99_ms", "baseline") == pytest.approx(
        [3.0, 1.5, 1.0], rel=0.01)
    assert scenario.p99_ratio() == pytest.approx(1.5, rel=0.01)
    assert scenario.be_ratio() == pytest.approx(0.8)  # the median of 0.8, 0.2, 1.0
    assert scenario.median_run()[0] == 2
    out = CliRunner().invoke(app, ["lab", "cache", "--report-only", "--out", str(tmp_path)])
    assert out.exit_code == 0, out.output
    report = (tmp_path / "report.md").read_text()
    assert ("median of 3 runs: p99 1.50x (3.00x, 1.50x, 1.00x), BE 0.80x (0.80x, 0.20x, "
            "1.00x) | **no** |") in report  # 1.5 > 1.25
    assert "run 2's, the one the p99 target is judged on" in report
    assert "In that run BE kept less than 50%" in report  # run 2: BE at 20%
    assert "| 1 | 5.000 | 5.000 | 15.000 | 3.00x | 0.80x |" in report
    # one good run does not carry the target: the median of (0.9, 1.3, 1.4) misses it
    _runs(tmp_path, spec, {1: (0.9, 5000.0), 2: (1.3, 5000.0), 3: (1.4, 5000.0)})
    [scenario] = load_session([spec], tmp_path)
    assert scenario.p99_ratio() == pytest.approx(1.3, rel=0.01)


def test_an_even_count_is_judged_on_the_worse_middle_run_and_missing_ratios_do_not_count(
        tmp_path: Path) -> None:
    spec = load_scenario(find_scenario("cache"))
    _runs(tmp_path, spec, {1: (1.0, 2000.0), 2: (1.4, 4000.0)})
    [scenario] = load_session([spec], tmp_path)
    # not the mean of the two (1.2x, met; BE 60%): the worse of each, as one run measured it
    assert scenario.p99_ratio() == pytest.approx(1.4, rel=0.01)
    assert scenario.be_ratio() == pytest.approx(0.4)
    assert scenario.median_run()[0] == 2
    # a third run interrupted before its guarded way: no ratio, not counted, not shown
    _result("baseline").save(tmp_path / "cache" / "run-3" / "baseline")
    [scenario] = load_session([spec], tmp_path)
    assert len(scenario.runs) == 3 and scenario.counted() == 2
    assert scenario.p99_ratio() == pytest.approx(1.4, rel=0.01)
    assert scenario.median_run()[0] == 2
    # runs are named by their folder, not their position: run-2 gone, run-3 is still run 3
    shutil.rmtree(tmp_path / "cache" / "run-2")
    [scenario] = load_session([spec], tmp_path)
    assert scenario.numbers == [1, 3] and scenario.median_run()[0] == 1


def test_a_new_session_replaces_a_scenarios_earlier_results(tmp_path: Path) -> None:
    """`--repeat 3` after `--repeat 5`, or a single run after a repeated one, must not report
    the old runs with the new; other things in --out stay."""
    spec = load_scenario(find_scenario("cache"))
    _runs(tmp_path, spec, {k: (1.0, 5000.0) for k in range(1, 6)})
    _result("baseline").save(tmp_path / "cache" / "baseline")
    (tmp_path / "cache" / "notes.txt").write_text("mine")
    clear_results(tmp_path / "cache")
    assert [p.name for p in (tmp_path / "cache").iterdir()] == ["notes.txt"]
    clear_results(tmp_path / "nothing-here")  # no folder: nothing to do


def test_repeats_go_round_the_scenarios_into_their_own_folders(tmp_path: Path,
                                                               monkeypatch) -> None:
    import sloguard.lab.session as session

    calls, placed = [], []

    def fake_way(spec, way, workdir, progress, kubeconfig=None, pods=None):
        calls.append((spec.name, workdir.relative_to(tmp_path).as_posix()))
        placed.append((spec.name, pods))
        progress(1.0, way)
        result = _result(way)
        result.save(workdir)
        return result

    monkeypatch.setattr(session, "preflight", lambda specs: None)
    monkeypatch.setattr(session, "run_way", fake_way)
    specs = [load_scenario(find_scenario(n)) for n in ("cache", "io")]
    seen = []
    scenarios = session.run_session(specs, tmp_path, lambda *a: seen.append(a), repeats=2)
    assert [c[1] for c in calls[:4]] == ["cache/run-1/baseline", "cache/run-1/unguarded",
                                         "cache/run-1/guarded", "io/run-1/baseline"]
    assert calls[6][1] == "cache/run-2/baseline" and len(calls) == 12
    assert [len(s.runs) for s in scenarios] == [2, 2]
    assert ("io", 2, 1.0, "guarded") in seen
    assert (tmp_path / "report.md").exists()
    assert session.session_seconds(specs, 2) == 2 * session.session_seconds(specs)
    assert [len(s.runs) for s in session.load_session(specs, tmp_path)] == [2, 2]
    assert {pods for _, pods in placed} == {None}  # no --kube: no pods

    # --kube: each scenario and its `-kube` twin, only the twin run as pods (checked first)
    class Placement:
        checked = 0

        def check(self) -> None:
            Placement.checked += 1

    placement = Placement()
    calls.clear()
    placed.clear()
    twins = session.with_pods(specs)
    assert [s.name for s in twins] == ["cache", "cache-kube", "io", "io-kube"]
    session.run_session(twins, tmp_path / "kube", lambda *a: None, pods=placement)
    assert Placement.checked == 1
    assert {(name, pods is placement) for name, pods in placed} == {
        ("cache", False), ("cache-kube", True), ("io", False), ("io-kube", True)}
    assert "cache-kube/guarded" in {c[1].removeprefix("kube/") for c in calls}


def test_bogo_ops_read_from_stress_ng_yaml(tmp_path: Path) -> None:
    path = tmp_path / "m.yaml"
    path.write_text("---\nmetrics:\n    - stressor: cpu\n      bogo-ops: 1995\n"
                    "    - stressor: cache\n      bogo-ops: 5\n")
    assert bogo_ops(path) == 2000.0
    assert bogo_ops(tmp_path / "missing.yaml") == 0.0


# -- real parts -------------------------------------------------------------------------------

@needs_lab
def test_spawned_process_is_in_the_cgroup_before_it_runs() -> None:
    cgroup = LabCgroup(f"sloguard-labtest-{os.getpid()}/x")
    try:
        proc = cgroup.spawn(["cat", "/proc/self/cgroup"], stdout=subprocess.PIPE, text=True)
        out, _ = proc.communicate(timeout=10)
        lines = [line for line in out.splitlines() if ":cpu:" in line or ":memory:" in line]
        assert lines and all(line.endswith(cgroup.rel) for line in lines), out
    finally:
        cgroup.remove()
    assert not any(path.exists() for path in cgroup.paths())


def test_the_client_keeps_off_the_ls_cores() -> None:
    """A remote client costs the server no CPU: the lab's client gets every CPU but the LS
    service's own, and no restriction where nothing would be left or LS has no own cores."""
    assert shared_cpus("0", {0, 1}) == {1}
    assert shared_cpus("0-1,4", {0, 1, 2, 3, 4}) == {2, 3}
    assert shared_cpus("0-1", {0, 1}) == set()  # nothing left: run anywhere
    assert shared_cpus("", {0, 1}) == set()  # LS on every CPU: nothing to keep off
    assert parse_cpulist(" 1-3,5 ") == [1, 2, 3, 5] and parse_cpulist("") == []


def test_the_relay_pins_its_own_threads_not_the_lab_process() -> None:
    """Pinning the lab process would pin every process it starts later (redis, the agent, the
    antagonists) to the client's CPUs."""
    cpu = max(os.sched_getaffinity(0))
    before = os.sched_getaffinity(0)
    read, write = os.pipe()
    with os.fdopen(read, "rb") as stdout:
        relay = Relay(stdout, None, {cpu})
        relay.start()
        deadline = time.monotonic() + 5
        while not (relay.pusher and relay.pusher.native_id) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert relay.pinned == f"CPUs {cpu}"
        assert os.sched_getaffinity(relay.native_id) == {cpu}
        assert relay.pusher and os.sched_getaffinity(relay.pusher.native_id) == {cpu}
        assert os.sched_getaffinity(0) == before
        os.write(write, np.array([[1, 2, 3]], dtype="<i8").tobytes())
        os.close(write)
        relay.join(timeout=10)
    assert relay.records().tolist() == [[1, 2, 3]]


@needs_lab
def test_load_generator_is_open_loop(tmp_path: Path) -> None:
    """A server stalled for 300 ms: requests due during the stall count the wait (measured from
    their intended time), and the client keeps to its schedule instead of waiting."""
    cgroup = LabCgroup(f"sloguard-labtest-{os.getpid()}/ls")
    redis, port = start_redis(cgroup, tmp_path)
    last_cpu = max(os.sched_getaffinity(0))
    try:
        start_ns = time.time_ns() + int(1.5e9)
        proc = subprocess.Popen(
            [sys.executable, "-m", "sloguard.lab.loadgen", "--port", str(port), "--rate", "2000",
             "--duration", "3", "--start-ns", str(start_ns), "--cpus", str(last_cpu)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        time.sleep((start_ns - time.time_ns()) / 1e9 + 0.5)
        assert os.sched_getaffinity(proc.pid) == {last_cpu}
        time.sleep(0.5)
        redis.send_signal(signal.SIGSTOP)
        stalled_ns = time.time_ns()
        time.sleep(0.3)
        redis.send_signal(signal.SIGCONT)
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err
        assert b"SCHED_FIFO" in err and f"on CPUs {last_cpu}".encode() in err
        records = np.frombuffer(out, dtype="<i8").reshape(-1, 3)
        assert 5000 < len(records) < 7000  # Poisson at 2000/s for 3 s
        assert (records[:, 2] >= 0).all()
        lat_ms = (records[:, 2] - records[:, 0]) / 1e6
        # due in the first 100 ms of the stall: waited at least the remaining ~200 ms
        due = (records[:, 0] >= stalled_ns + 20_000_000) & (records[:, 0] < stalled_ns + 100e6)
        assert due.sum() > 50
        assert lat_ms[due].min() > 150
        # sent on time although nothing came back: the send lag stays small
        lag_ms = (records[due, 1] - records[due, 0]) / 1e6
        assert np.percentile(lag_ms, 90) < 20
    finally:
        redis.kill()
        redis.wait()
        cgroup.remove()


@needs_lab
def test_short_lab_run_shows_the_guardrail_working(tmp_path: Path) -> None:
    """`sloguard lab cache --short`: three ways with the real agent. Asserts directions only
    (this machine is noisy): the antagonist hurts the LS tail, the guarded way acts during the
    episode with a lever and hurts it less, nothing is done in quiet periods, BE still works."""
    ways_run = ("baseline", "unguarded", "guarded")

    def run(out: Path) -> dict:
        result = CliRunner().invoke(app, ["lab", "cache", "--short", "--out", str(out)])
        assert result.exit_code == 0, result.output
        # no terminal here, so no live bar: a line as each way starts says how far it is
        assert [line.split(" ", 1)[1] for line in result.output.splitlines()
                if " lab: " in line] == [f"lab: cache: {w}" for w in ways_run], result.output
        report = (out / "report.md").read_text()
        assert (out / "lab-cache.png").stat().st_size > 10_000
        assert "## Scenario `cache`" in report
        return {w: way_stats(WayResult.load(out / "cache" / w))
                for w in ("baseline", "unguarded", "guarded")}

    def directions_hold(ways: dict) -> bool:
        base, unguarded, guarded = ways["baseline"], ways["unguarded"], ways["guarded"]
        return (unguarded.episode_p99_ms > 1.5 * base.episode_p99_ms
                and guarded.episode_p99_ms < unguarded.episode_p99_ms)

    # One short run per way is at the mercy of this shared 2-core machine: a stall of the
    # baseline's own episode (seen in CI: baseline p99 3.9 ms above the unguarded 3.4 ms) says
    # nothing about the guardrail. Such a run is measured once more. The directions must hold
    # in a run whose baseline was quiet; when every baseline was noisy they could not be
    # measured, which the test says in a warning (the summary of every run shows it) while
    # the rest is still asserted.
    attempts = []
    for out in (tmp_path / "lab", tmp_path / "lab-again"):
        ways = run(out)
        attempts.append(ways)
        if directions_hold(ways):
            break
        print(f"the directions did not hold in {out.name} (p50, p99 ms):",
              {w: (s.episode_p50_ms, s.episode_p99_ms) for w, s in ways.items()})
    # stalled(): the baseline's p99 over NOISY_BASELINE times its median (sloguard.lab.analysis;
    # on this VM for an hour at a time: 1.7-3.7 ms against 0.16-0.19 ms, no antagonist running)
    measurable = directions_hold(ways) or not all(stalled(a["baseline"]) for a in attempts)
    if not measurable:
        warnings.warn(UserWarning(
            "the lab's tail directions were not measurable here: every baseline stalled "
            "(baseline p99/p50 " + ", ".join(
                f"{a['baseline'].episode_p99_ms:.2f}/{a['baseline'].episode_p50_ms:.2f} ms"
                for a in attempts) + "); the rest of the run was checked"), stacklevel=1)
    base, unguarded, guarded = ways["baseline"], ways["unguarded"], ways["guarded"]
    shared = ",".join(map(str, sorted(set(range(os.cpu_count() or 1)) - {0}))) or None
    if shared:  # the client, the relay and the agent all kept off the LS core (CPU 0)
        note = WayResult.load(out / "cache" / "guarded").client
        assert f"on CPUs {shared}; relay on CPUs {shared}; agent on CPUs {shared}" in note
    print({w: (s.episode_p99_ms, s.be_ops_per_s, [e.first_action_s for e in s.episodes])
           for w, s in ways.items()})
    if measurable:
        assert unguarded.episode_p99_ms > 1.5 * base.episode_p99_ms
        assert guarded.episode_p99_ms < unguarded.episode_p99_ms
    # the shipped policy keeps SCHED_IDLE standing on BE (docs/lab.md, "Standing SCHED_IDLE"):
    # in force before the antagonist starts, so the episode is protected from its first second;
    # in the unguarded way (shadow mode) it is only proposed, and nothing at all is done
    [episode] = guarded.episodes
    assert episode.first_action_s == 0.0
    assert episode.first_action == "cpu_idle (in force at the start)", episode
    standing = [a for a in guarded.actions if str(a.get("policy")).startswith("standing:")]
    assert standing and standing[0]["status"] == "done"
    assert standing[0]["t"] < episode.start_s
    assert not [a for a in unguarded.actions if a["status"] == "done"], unguarded.actions
    assert any(a["status"] == "proposed" for a in unguarded.actions)
    assert not any(s.quiet_actions for s in ways.values())
    assert guarded.be_ops_per_s > 0.2 * unguarded.be_ops_per_s
    applied = [a for a in guarded.actions if a["action"] == "apply" and a["status"] == "done"]
    undone = [a for a in guarded.actions if a["action"] == "undo" and a["status"] == "done"]
    assert applied and not pids_in("sloguard-lab/be")  # and nothing left running
    print("applied", [(a["kind"], round(a["t"], 1)) for a in applied],
          "undone", [(a["kind"], round(a["t"], 1)) for a in undone])

    # benchmarks/leading_indicators.py reads this run's own recordings: every way's LS signals,
    # a threshold from the baseline's quiet periods, and the latency rule's firing per episode
    rows_file, plot_file = tmp_path / "leading.json", tmp_path / "leading.png"
    done = subprocess.run(
        [sys.executable, str(BENCH / "leading_indicators.py"), str(out), "--json",
         str(rows_file), "--plot", str(plot_file)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = json.loads(rows_file.read_text())
    psi = {r["way"]: r for r in rows if r["signal"] == "LS CPU PSI some"}
    assert set(psi) == set(ways_run), rows
    assert 0 < psi["baseline"]["threshold"] <= psi["baseline"]["quiet_max"]
    assert all(len(r["crossing_s"]) == len(r["firing_s"]) == 1 for r in psi.values())
    for way in ("unguarded", "guarded"):  # the latency rule's firing, read apart
        [fired] = psi[way]["firing_s"]
        [timing] = ways[way].episodes
        result = WayResult.load(out / "cache" / way)
        latency = min((f for i in result.incidents
                       if i.get("rule") == "LSLatencyInterference" and i.get("fired_ns")
                       if (f := (i["fired_ns"] - result.start_ns) / 1e9 - timing.start_s) >= 0),
                      default=None)
        # the analysis judges an episode on the first firing of any rule that drives a policy
        # (in CI an I/O-stall rule once fired 5.4 s before the latency rule): never later
        if fired is not None and latency is not None:
            assert fired == pytest.approx(latency, abs=0.01), (way, fired, latency)
            assert timing.fired_s is not None and timing.fired_s <= fired + 0.01, (way, timing)
    assert "| cache | unguarded | LS CPU PSI some" in done.stdout
    assert plot_file.stat().st_size > 10_000


@needs_lab
def test_a_short_culprit_run_names_the_antagonist_not_the_innocents(tmp_path: Path) -> None:
    """`culprit`'s first episode, shortened, in the unguarded way (the agent in shadow mode
    still ranks suspects): a cpu antagonist beside two innocent BE jobs in their own cgroups,
    the agent with its eBPF programs; the antagonist's cgroup is the first suspect, with the
    run-queue blame among its clues, and the innocents ran all along."""
    spec = shortened(load_scenario(find_scenario("culprit")), quiet=8, episode=20, episodes=1)
    spec = spec.model_copy(update={"ways": ["unguarded"]})
    result = run_way(spec, "unguarded", tmp_path / "unguarded", lambda fraction, way: None)
    stats = way_stats(result)
    [episode] = stats.episodes
    print("first suspect:", episode.suspect, [
        (s["cgroup"], s["score"], [c["scorer"] for c in s["clues"]])
        for i in result.incidents for s in i.get("suspects", [])][:6])
    assert episode.attributed is True, (episode, [i.get("suspects") for i in result.incidents])
    ranked = next(i for i in result.incidents if i.get("suspects") and i.get("policy"))
    first = min(ranked["suspects"], key=lambda s: s["rank"])
    assert first["cgroup"] == "/sloguard-lab/be" and first["resource"] == "cpu"
    assert "runqueue_blame" in {c["scorer"] for c in first["clues"]}  # eBPF really ran
    innocents = {s["cgroup"]: s["score"] for s in ranked["suspects"]
                 if "innocent" in s["cgroup"]}
    assert all(score < first["score"] / 2 for score in innocents.values()), ranked["suspects"]
    assert {i["name"] for i in result.innocents} == {"sleepy", "light"}
    assert all(i["bogo_ops"] > 0 for i in result.innocents), result.innocents
    assert not pids_in("sloguard-lab/be") and not pids_in("sloguard-lab/be-innocent-sleepy")


@needs_lab
def test_a_second_lab_is_refused_and_leaves_the_first_running(tmp_path: Path) -> None:
    """Labs share their cgroups: a second one (a test, the lever benchmark, another `sloguard
    lab`) would kill the first's processes in its teardown."""
    first = LabCgroup(LS_CGROUP)
    sleeper = first.spawn(["sleep", "30"])
    try:
        with pytest.raises(LabSetupError, match="another lab is running"):
            LabStage(LsSpec(), tmp_path)
        assert sleeper.poll() is None and pids_in(LS_CGROUP) == [sleeper.pid]
    finally:
        sleeper.kill()
        sleeper.wait()
        LabStage(LsSpec(), tmp_path).close()  # the lab cgroups gone again
    assert not any((root / "sloguard-lab").exists() for root in hierarchies())


@needs_lab
def test_the_lever_benchmark_holds_the_agents_own_levers(tmp_path: Path) -> None:
    """benchmarks/lab_levers.py applies the levers through the agent's lever classes (a change
    to a lever shows there): held, BE is SCHED_IDLE and off the LS core; a tiny run measures
    every cell and leaves no lab cgroup behind."""
    spec = importlib.util.spec_from_file_location("lab_levers", BENCH / "lab_levers.py")
    assert spec is not None and spec.loader is not None
    lab_levers = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(lab_levers)
    ls = LsSpec()
    with LabStage(ls, tmp_path / "hold") as stage:
        paths = stage.be_cgroup.paths()
        idle = [p / "cpu.idle" for p in paths if (p / "cpu.idle").exists()]
        cpusets = [p / "cpuset.cpus" for p in paths if (p / "cpuset.cpus").exists()
                   and (p / "tasks").exists()]
        if not idle:
            pytest.skip("no cpu.idle here (kernel < 5.15): the benchmark refuses to hold it")
        before = {f: f.read_text() for f in idle + cpusets}
        held = lab_levers.hold(["cpu_idle", "cpuset"], tmp_path / "hold")
        assert [type(step).__name__ for step, _, _ in held] == ["CpuIdle", "Cpuset"]
        assert all(f.read_text().strip() == "1" for f in idle)
        ls_cpus = set(parse_cpulist(ls.cpus))
        for f in cpusets:
            be = set(parse_cpulist(f.read_text()))
            assert be and not be & ls_cpus, f"{f}: {be}"
        lab_levers.release(held)
        assert {f: f.read_text() for f in idle + cpusets} == before
    out = tmp_path / "cells.json"
    done = subprocess.run(
        [sys.executable, str(BENCH / "lab_levers.py"), "--antagonists", "cpu", "--repeats", "1",
         "--cells", "base", "none", "cpu_idle+cpuset", "--quiet", "1", "--seconds", "3",
         "--json", str(out)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = {r["cell"]: r for r in map(json.loads, out.read_text().splitlines())}
    assert set(rows) == {"base", "none", "cpu_idle+cpuset"}
    assert all(r["p99_ms"] > 0 for r in rows.values())
    assert rows["base"]["be_ops_per_s"] == 0 and rows["none"]["be_ops_per_s"] > 0
    assert rows["cpu_idle+cpuset"]["be_ops_per_s"] > 0
    assert "cpu_idle+cpuset" in done.stdout and "[3/3]" in done.stderr
    assert not any((root / "sloguard-lab").exists() for root in hierarchies())


# -- Kubernetes: shadow mode without an API server, a registered Node with one ---------------

def test_without_an_api_server_the_lab_policy_shadows_only_the_kubernetes_steps(tmp_path):
    import yaml

    from sloguard.lab.agent import KUBE_STEPS, lab_policies

    def steps(kube: bool) -> dict[str, bool]:
        folder = lab_policies(tmp_path / str(kube), kube=kube)
        [policy] = yaml.safe_load((folder / "ls-interference.yaml").read_text())["policies"]
        return {s["step"]: bool(s.get("dry_run")) for s in policy["steps"]}

    shadowed, acting = steps(False), steps(True)
    assert all(shadowed[k] for k in KUBE_STEPS)
    assert not shadowed["suppress"] and not acting["cordon"]
    assert acting["evict"]  # the shipped policy's own per-step shadow mode is kept


@pytest.mark.kube
def test_the_lab_node_is_registered_like_a_colocation_node_and_removed(kube):
    from kubernetes import client

    from sloguard.lab.kube import LabNode

    api = client.CoreV1Api(kube.api_client())
    node = LabNode(kube.kubeconfig_path(), "sloguard-lab-test")
    try:
        stored = api.read_node("sloguard-lab-test")
        assert stored.metadata.labels["sloguard.io/lab"] == "true"
        assert stored.status.allocatable["kubernetes.io/batch-cpu"] == "2k"
        assert node.state() == {"unschedulable": False, "batch_cpu": "2k"}
    finally:
        node.remove()
    with pytest.raises(client.ApiException) as gone:
        api.read_node("sloguard-lab-test")
    assert gone.value.status == 404
    api.create_node({"metadata": {"name": "someone-elses"}})
    try:
        LabNode(kube.kubeconfig_path(), "someone-elses").remove()
        assert api.read_node("someone-elses").metadata.name == "someone-elses"  # left alone
    finally:
        api.delete_node("someone-elses")


def test_the_suspects_way_policy_targets_the_suspects_with_every_per_workload_lever(tmp_path):
    """guarded-suspects' copy of the shipped policies: each per-workload lever at
    `target: suspects` (widened as docs/attribution.md says), and the copy loads as the
    agent would load it, with the real steps."""
    import yaml

    from sloguard.actuators.config import default_policy_paths
    from sloguard.actuators.env import ActuatorEnv
    from sloguard.actuators.kinds import StepFactory
    from sloguard.actuators.ledger import Ledger
    from sloguard.actuators.policy import PolicySet
    from sloguard.lab.agent import lab_policies, per_workload_levers, way_targets

    levers_of_workloads = per_workload_levers()  # read from the step registry
    assert set(levers_of_workloads) == {"cpu_idle", "cpuset", "cpu_quota", "memory_limit",
                                        "resctrl"}

    def targets_of(policy: dict) -> dict[str, str | None]:
        return {lever["step"]: lever.get("target") for step in policy["steps"]
                for lever in [step, *step.get("levers", [])]
                if lever["step"] in levers_of_workloads}

    def lever_targets(folder: Path) -> dict[str, str | None]:
        [policy] = yaml.safe_load((folder / "ls-interference.yaml").read_text())["policies"]
        return targets_of(policy)

    folder = lab_policies(tmp_path / "p", kube=False, targets=way_targets("guarded-suspects"))
    assert lever_targets(folder) == dict.fromkeys(["cpu_idle", "cpuset", "resctrl"], "suspects")
    factory = StepFactory(ActuatorEnv("node-a", Ledger(tmp_path / "a.db")))
    policies = PolicySet([str(folder)], validate_step=factory.check)
    assert policies.reload().ok, policies.errors
    rungs = policies.get("ls-interference").rungs()
    widened = [r for r in rungs if r.widening]
    assert [r.widening for r in widened] == ["suspect", "suspect", "rest"] * 3  # and resctrl

    # guarded: the shipped targets, untouched
    shipped = yaml.safe_load((Path(default_policy_paths()[0]) / "ls-interference.yaml")
                             .read_text())["policies"][0]
    assert lever_targets(lab_policies(tmp_path / "q", kube=False)) == targets_of(shipped)
    # guarded-tier: every lever on the whole tier, whatever the shipped files say
    tier = lever_targets(lab_policies(tmp_path / "t", kube=False,
                                      targets=way_targets("guarded-tier")))
    assert tier and set(tier.values()) == {"tier"}, tier
    # guarded-mixed: SCHED_IDLE stays on the tier, the levers that take CPU go to suspects
    mixed = lever_targets(lab_policies(tmp_path / "m", kube=False,
                                       targets=way_targets("guarded-mixed")))
    assert mixed == {"cpu_idle": "tier", "cpuset": "suspects", "resctrl": "suspects"}, mixed


def test_a_baseline_whose_tail_the_machine_set_is_told_apart() -> None:
    """The criterion the report and the short lab run use (docs/lab.md, "A noisy machine"):
    figures of a quiet hour and of an hour of this VM's stalls, both measured here."""
    from sloguard.lab.analysis import WayStats

    def baseline(p50: float, p99: float) -> WayStats:
        return WayStats("baseline", 1, 0, p50, p99, p99, p50, p99, p99, 0.1, 0.0)

    assert not stalled(baseline(0.16, 0.45))  # a quiet hour, the eBPF programs on
    assert stalled(baseline(0.19, 3.68))  # the VM stalling, no antagonist running
