"""The escalation ladder's decisions: when each rung is applied, held, retried and undone.

The steps here are small recording steps defined in this file (the ladder is what is under
test); the real steps are tested against a real API server and real cgroups elsewhere.
"""

from __future__ import annotations

import textwrap
from typing import Any, ClassVar

import pytest

from sloguard.actuators.env import ActuatorEnv
from sloguard.actuators.kinds import StepFactory
from sloguard.actuators.ladder import Ladder
from sloguard.actuators.ledger import Ledger
from sloguard.actuators.policy import PolicyFileError, PolicySet, load_policy_file
from sloguard.actuators.step import DONE, FAILED, PROPOSED, StepContext, StepResult
from sloguard.incidents import FIRING, Evidence, Incident
from sloguard.store.incidents_db import IncidentStore

S = 1_000_000_000
T0 = 1_800_000_000 * S

POLICY = """\
policies:
  - name: guard
    undo_hold: 10s
    stale_after: 5s
    steps:
      - step: mark
        params: {name: first}
      - step: mark
        after: 10s
        params: {name: second}
      - step: suppress
        after: 5s
        levers:
          - step: lever_a
          - step: lever_b
      - step: mark
        after: 10s
        repeat: 20s
        params: {name: last}
"""

CALLS: list[tuple[str, str, bool]] = []


class Mark:
    kind: ClassVar[str] = "mark"
    fail_times: ClassVar[int] = 0

    def __init__(self, params: dict[str, Any], env: ActuatorEnv) -> None:
        if set(params) - {"name"}:
            raise ValueError("mark takes only `name`")
        self.name = params.get("name", self.kind)

    def available(self) -> str | None:
        return None

    def apply(self, ctx: StepContext) -> StepResult:
        if Mark.fail_times and self.name == "second":
            Mark.fail_times -= 1
            raise ConnectionError("API server unreachable")
        CALLS.append(("apply", self.name, ctx.dry_run))
        status = PROPOSED if ctx.dry_run else DONE
        return StepResult(status, f"node/{ctx.node}", f"{self.name} applied",
                          {"was": f"before-{self.name}"})

    def undo(self, ctx: StepContext, undo: dict[str, Any]) -> StepResult:
        assert undo == {"was": f"before-{self.name}"}  # what apply recorded comes back
        CALLS.append(("undo", self.name, ctx.dry_run))
        return StepResult(PROPOSED if ctx.dry_run else DONE, f"node/{ctx.node}", "restored")


class LeverA(Mark):
    kind: ClassVar[str] = "lever_a"

    def __init__(self, params: dict[str, Any], env: ActuatorEnv) -> None:
        self.name = "cpu_idle"


class LeverB(Mark):
    kind: ClassVar[str] = "lever_b"

    def __init__(self, params: dict[str, Any], env: ActuatorEnv) -> None:
        self.name = "cpuset"


KINDS = {"mark": f"{__name__}:Mark", "lever_a": f"{__name__}:LeverA",
         "lever_b": f"{__name__}:LeverB"}


class Harness:
    def __init__(self, tmp_path, policy: str = POLICY, dry_run: bool = False) -> None:
        (tmp_path / "policies").mkdir(exist_ok=True)
        (tmp_path / "policies" / "p.yaml").write_text(policy)
        self.tmp, self.dry_run = tmp_path, dry_run
        self.made: list[Incident] = []
        self.incidents = IncidentStore(tmp_path / "incidents.db")
        self.open()

    def open(self) -> None:
        self.ledger = Ledger(self.tmp / "actuators.db")
        env = ActuatorEnv("node-a", self.ledger)
        factory = StepFactory(env, KINDS)
        self.policies = PolicySet([str(self.tmp / "policies")], validate_step=factory.check)
        assert self.policies.reload(), self.policies.errors
        self.ladder = Ladder("node-a", self.policies, self.ledger, factory.make,
                             self.incidents.save, self.incidents.get, dry_run=self.dry_run,
                             open_incidents=self.incidents.open_incidents)

    def incident(self, second: int, policy: str = "guard") -> Incident:
        incident = Incident("inc-1", "f", "LSSlow", "ls", "critical", "node-a", FIRING,
                            {"pod": "web"}, T0 + second * S, T0 + second * S,
                            fired_ns=T0 + second * S, policy=policy)
        self.incidents.save(incident)
        self.made.append(incident)
        return incident

    def tick(self, second: int, firing: list[Incident], fresh: bool = True,
             unevaluated: bool = False) -> None:
        """One ladder tick; incidents not in `firing` have resolved (unless `unevaluated`:
        still open in the store, but their rule is not being evaluated)."""
        now = T0 + second * S
        for incident in self.made:
            if incident not in firing and incident.state == FIRING and not unevaluated:
                incident.state = "resolved"
                self.incidents.save(incident)
        for incident in firing:
            if fresh:
                incident.add_evidence(Evidence(now, 30.0, 10.0, "crossed"))
        self.ladder.tick(now, firing)


@pytest.fixture(autouse=True)
def _clean():
    CALLS.clear()
    Mark.fail_times = 0


def test_climbs_one_rung_per_hold_and_descends_in_reverse(tmp_path):
    h = Harness(tmp_path)
    incident = h.incident(0)
    h.tick(0, [incident])
    assert CALLS == [("apply", "first", False)]  # `after: 0`: at once
    h.tick(9, [incident])
    assert len(CALLS) == 1  # the second rung waits its 10 s
    h.tick(10, [incident])
    h.tick(15, [incident])  # suppress: lever after lever, 5 s each
    h.tick(20, [incident])
    h.tick(29, [incident])
    assert [c[1] for c in CALLS] == ["first", "second", "cpu_idle", "cpuset"]
    h.tick(30, [incident])
    h.tick(49, [incident])
    h.tick(50, [incident])  # `repeat: 20s`: the last rung again while it persists
    assert [c[1] for c in CALLS][4:] == ["last", "last"]
    CALLS.clear()
    for second in (51, 60, 61, 71, 81, 91):  # recovered: one undo per undo_hold (10 s)
        h.tick(second, [])
    assert [("undo", n, False) for n in ("last", "cpuset", "cpu_idle", "second",
                                                  "first")] == CALLS
    assert h.ledger.rungs() == []
    stored = h.incidents.get("inc-1")
    steps = [(a.step, a.status) for a in stored.actions]
    assert steps[:3] == [("mark", DONE), ("mark", DONE), ("lever_a", DONE)]
    assert steps[-1] == ("undo mark", "undone")
    assert stored.annotations["lever_that_worked"] == "lever_b"  # the last lever before the end
    audit = h.ledger.audit_log()
    assert len(audit) == 11 and all(e.reason for e in audit)  # 6 applied, 5 undone
    assert "rung 2/5 of policy guard" in [e for e in audit if e.action == "apply"][-2].reason


def test_learnt_lever_order_is_tried_first_next_time(tmp_path):
    h = Harness(tmp_path)
    incident = h.incident(0)
    for second in (0, 10, 15, 20):
        h.tick(second, [incident])
    for second in (21, 31, 41, 51):
        h.tick(second, [])
    assert h.ledger.lever_stats() == {"lever_a": (1, 0), "lever_b": (1, 1)}
    CALLS.clear()
    again = h.incident(100)
    for second in (100, 110, 115):
        h.tick(second, [again])
    assert [c[1] for c in CALLS] == ["first", "second", "cpuset"]  # lever_b worked: first now


def test_a_new_firing_stops_the_descent_and_climbs_from_where_it_is(tmp_path):
    h = Harness(tmp_path)
    incident = h.incident(0)
    for second in (0, 10, 15):
        h.tick(second, [incident])
    h.tick(16, [])  # recovered: cpu_idle undone
    assert CALLS[-1] == ("undo", "cpu_idle", False)
    again = h.incident(20)
    h.tick(20, [again])  # interference is back: the lever just lifted goes back at once
    assert CALLS[-1] == ("apply", "cpu_idle", False)
    assert [r.kind for r in h.ledger.rungs()] == ["mark", "mark", "lever_a"]
    h.tick(24, [again])
    h.tick(25, [again])  # and the climb resumes from there
    assert CALLS[-1] == ("apply", "cpuset", False)


def test_stale_evidence_never_escalates_past_cordon(tmp_path):
    policy = POLICY.replace("params: {name: second}", "params: {name: second}\n"
                            "      - step: mark\n        after: 1s\n        params: {name: x}")
    h = Harness(tmp_path, policy.replace("step: mark\n        params: {name: first}",
                                         "step: mark\n        params: {name: first}"))
    incident = h.incident(0)
    h.tick(0, [incident])
    h.tick(10, [incident])
    h.tick(20, [incident], fresh=False)  # the signal went silent 10 s ago (stale_after 5 s)
    h.tick(30, [incident], fresh=False)
    assert [c[1] for c in CALLS] == ["first", "second"]  # held: rung "x" is not a safe one
    h.tick(31, [incident])  # fresh again
    assert [c[1] for c in CALLS] == ["first", "second", "x"]


def test_a_failed_step_is_recorded_retried_with_backoff_and_escalation_goes_on(tmp_path):
    h = Harness(tmp_path)
    Mark.fail_times = 2
    incident = h.incident(0)
    h.tick(0, [incident])
    h.tick(10, [incident])  # "second" fails: recorded, retried in 5 s
    [failed] = [r for r in h.ledger.rungs() if r.status == FAILED]
    assert failed.retry_ns == T0 + 15 * S
    stored = h.incidents.get("inc-1")
    assert stored.actions[-1].status == FAILED and "unreachable" in stored.actions[-1].detail
    h.tick(14, [incident])
    h.tick(15, [incident])  # retried (fails again: next backoff 10 s); cpu_idle is due too
    assert [c[1] for c in CALLS] == ["first", "cpu_idle"]
    h.tick(25, [incident])
    assert ("apply", "second", False) in CALLS
    assert all(r.status == DONE for r in h.ledger.rungs())


def test_restart_continues_without_reapplying_and_still_undoes(tmp_path):
    h = Harness(tmp_path)
    incident = h.incident(0)
    h.tick(0, [incident])
    h.tick(10, [incident])
    h.open()  # the agent restarts: a new ladder on the same ledger
    h.tick(11, [incident])
    assert [c[1] for c in CALLS] == ["first", "second"]  # nothing applied twice
    h.tick(15, [incident])
    assert CALLS[-1] == ("apply", "cpu_idle", False)
    h.open()
    for second in (16, 26, 36):
        h.tick(second, [])
    assert [c for c in CALLS if c[0] == "undo"] == [
        ("undo", "cpu_idle", False), ("undo", "second", False), ("undo", "first", False)]


def test_an_incident_still_open_in_the_store_holds_the_levers(tmp_path):
    h = Harness(tmp_path)
    incident = h.incident(0)
    h.tick(0, [incident])
    h.tick(10, [incident])
    h.open()  # restart with its rule file broken: the engine evaluates nothing
    for second in (11, 21, 31):
        h.tick(second, [], unevaluated=True)
    assert [c[0] for c in CALLS] == ["apply", "apply"]  # firing in the store: nothing undone
    h.tick(41, [])  # it resolved
    assert CALLS[-1] == ("undo", "second", False)


def test_dry_run_records_proposals_and_touches_nothing(tmp_path):
    h = Harness(tmp_path, dry_run=True)
    incident = h.incident(0)
    for second in (0, 10, 15):
        h.tick(second, [incident])
    assert [("apply", n, True) for n in ("first", "second", "cpu_idle")] == CALLS
    for second in (16, 26, 36):
        h.tick(second, [])
    assert {c[2] for c in CALLS} == {True}
    stored = h.incidents.get("inc-1")
    assert {a.status for a in stored.actions} == {PROPOSED}
    assert h.ledger.lever_stats() == {}  # shadow mode teaches nothing about what works


def test_per_step_dry_run(tmp_path):
    h = Harness(tmp_path, POLICY.replace("params: {name: second}",
                                         "params: {name: second}\n        dry_run: true"))
    incident = h.incident(0)
    h.tick(0, [incident])
    h.tick(10, [incident])
    assert CALLS == [("apply", "first", False), ("apply", "second", True)]


def test_policy_files_report_every_problem_with_its_line(tmp_path):
    path = tmp_path / "bad.yaml"
    factory = StepFactory(ActuatorEnv("n", Ledger(tmp_path / "l.db")), KINDS)
    path.write_text(textwrap.dedent("""\
        policies:
          - name: a
            steps:
              - step: mark
                params: {colour: red}
              - step: nonsense
              - step: suppress
                after: soon
    """))
    with pytest.raises(PolicyFileError) as caught:
        load_policy_file(path, factory.check)
    assert f"{path}:8:" in str(caught.value) and "not a duration" in str(caught.value)
    path.write_text(textwrap.dedent("""\
        policies:
          - name: a
            steps:
              - step: mark
                params: {colour: red}
              - step: nonsense
    """))
    with pytest.raises(PolicyFileError) as caught:
        load_policy_file(path, factory.check)
    lines = str(caught.value).splitlines()
    assert lines[0].startswith(f"{path}:5:") and "mark takes only" in lines[0]
    assert lines[1].startswith(f"{path}:6:") and "unknown step 'nonsense'" in lines[1]


def test_a_broken_policy_file_keeps_the_previous_policies(tmp_path):
    import os

    h = Harness(tmp_path)
    (tmp_path / "policies" / "p.yaml").write_text("policies: [ {name: guard} ]\n")
    os.utime(tmp_path / "policies" / "p.yaml", (1, 1))
    assert not h.policies.reload()
    assert h.policies.get("guard") is not None  # still armed
    assert "steps" in next(iter(h.policies.errors.values()))


def test_an_unknown_policy_is_reported_not_guessed(tmp_path):
    h = Harness(tmp_path)
    incident = h.incident(0, policy="missing")
    h.tick(0, [incident])
    assert CALLS == [] and "not loaded" in h.ladder.errors["missing"]


def test_policies_check_cli(tmp_path, sloguard_bin):
    import subprocess

    from sloguard.config import load_settings

    shipped = load_settings().settings.actuators.policies
    ok = subprocess.run([sloguard_bin, "policies", "check", *shipped], capture_output=True,
                        text=True)
    assert ok.returncode == 0 and "ls-interference" in ok.stdout, ok.stderr
    bad = tmp_path / "bad.yaml"
    bad.write_text("policies:\n  - name: x\n    steps:\n      - step: cordon\n"
                   "        params: {taint: Bogus}\n      - step: evictt\n")
    result = subprocess.run([sloguard_bin, "policies", "check", str(bad)], capture_output=True,
                            text=True)
    assert result.returncode == 1
    assert f"{bad}:5:9: policies.0.steps.0.params: taint must be one of" in result.stderr
    assert f"{bad}:6:9: policies.0.steps.1.step: unknown step 'evictt'" in result.stderr
