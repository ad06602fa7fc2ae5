"""The escalation ladder's decisions: when each rung is applied, held, retried and undone.

The steps here are small recording steps defined in this file (the ladder is what is under
test); the real steps are tested against a real API server and real cgroups elsewhere.
"""

from __future__ import annotations

import textwrap
from typing import Any, ClassVar

import pytest
import yaml

from sloguard.actuators.env import ActuatorEnv
from sloguard.actuators.kinds import StepFactory
from sloguard.actuators.ladder import Ladder
from sloguard.actuators.ledger import Ledger
from sloguard.actuators.policy import PolicyFileError, PolicySet, load_policy_file
from sloguard.actuators.step import DONE, FAILED, PROPOSED, SKIPPED, StepContext, StepResult
from sloguard.core.incidents import FIRING, Evidence, Incident
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
    fail_name: ClassVar[str] = "second"
    undo_fail_times: ClassVar[int] = 0

    def __init__(self, params: dict[str, Any], env: ActuatorEnv) -> None:
        if set(params) - {"name"}:
            raise ValueError("mark takes only `name`")
        self.name = params.get("name", self.kind)

    def available(self) -> str | None:
        return None

    def apply(self, ctx: StepContext) -> StepResult:
        if Mark.fail_times and self.name == Mark.fail_name:
            Mark.fail_times -= 1
            raise ConnectionError("API server unreachable")
        CALLS.append(("apply", self.name, ctx.dry_run))
        status = PROPOSED if ctx.dry_run else DONE
        return StepResult(status, f"node/{ctx.node}", f"{self.name} applied",
                          {"was": f"before-{self.name}"})

    def undo(self, ctx: StepContext, undo: dict[str, Any]) -> StepResult:
        assert undo == {"was": f"before-{self.name}"}  # what apply recorded comes back
        if Mark.undo_fail_times:
            Mark.undo_fail_times -= 1
            raise ConnectionError("API server unreachable")
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


class LeverGone(Mark):
    kind: ClassVar[str] = "lever_gone"

    def __init__(self, params: dict[str, Any], env: ActuatorEnv) -> None:
        self.name = "resctrl"

    def available(self) -> str | None:
        return "no resctrl filesystem"


class LeverBroken(Mark):
    kind: ClassVar[str] = "lever_broken"

    def __init__(self, params: dict[str, Any], env: ActuatorEnv) -> None:
        self.name = "broken"

    def apply(self, ctx: StepContext) -> StepResult:
        return StepResult(FAILED, f"node/{ctx.node}", "cpu.idle not writable here")


class Untidy(Mark):
    """A step that breaks the contract: its undo data is not JSON (a set)."""

    kind: ClassVar[str] = "untidy"

    def __init__(self, params: dict[str, Any], env: ActuatorEnv) -> None:
        self.name = "untidy"

    def apply(self, ctx: StepContext) -> StepResult:
        CALLS.append(("apply", self.name, ctx.dry_run))
        return StepResult(DONE, f"node/{ctx.node}", "applied", {"pids": {1, 2}})

    def undo(self, ctx: StepContext, undo: dict[str, Any]) -> StepResult:
        CALLS.append(("undo", self.name, ctx.dry_run))
        return StepResult(DONE, f"node/{ctx.node}", "restored")


KINDS = {"mark": f"{__name__}:Mark", "lever_a": f"{__name__}:LeverA",
         "lever_b": f"{__name__}:LeverB", "untidy": f"{__name__}:Untidy",
         "lever_gone": f"{__name__}:LeverGone", "lever_broken": f"{__name__}:LeverBroken"}


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
        assert self.policies.reload().ok, self.policies.errors
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
    Mark.fail_name = "second"
    Mark.undo_fail_times = 0


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


def test_a_recovering_incident_holds_the_climb_without_restarting_the_hold(tmp_path, caplog):
    """Firing through `recover_for` after the signal came back under the lever in force: no
    lever is stacked on it (the lever in force gets the credit), nothing is undone either, and
    a relapse takes the next rung at once since its `after` ran meanwhile."""
    import logging

    h = Harness(tmp_path)
    incident = h.incident(0)
    for second in (0, 10, 15):
        h.tick(second, [incident])
    assert CALLS[-1] == ("apply", "cpu_idle", False)
    incident.quiet_since_ns = T0 + 17 * S  # the LS signal recovered under cpu_idle
    with caplog.at_level(logging.INFO, logger="sloguard.actuators.ladder"):
        for second in (17, 20, 25, 30):
            h.tick(second, [incident])
    assert [c[1] for c in CALLS] == ["first", "second", "cpu_idle"]
    assert [r.kind for r in h.ledger.rungs()] == ["mark", "mark", "lever_a"]
    holds = [r for r in caplog.records if "holding before lever_b" in r.getMessage()]
    assert len(holds) == 1 and holds[0].levelno == logging.INFO  # once, not every tick
    assert "crossed for 3s" in holds[0].getMessage()
    incident.quiet_since_ns = None  # it relapses: lever_b's 5 s ran out long ago
    h.tick(31, [incident])
    assert CALLS[-1] == ("apply", "cpuset", False)
    h.tick(35, [incident])
    assert len(CALLS) == 4  # the next rung counts from cpuset's application (31 s), not 15 s
    h.tick(41, [incident])
    assert CALLS[-1] == ("apply", "last", False)


def test_a_quiet_episode_credits_the_lever_in_force_when_it_went_quiet(tmp_path):
    h = Harness(tmp_path)
    incident = h.incident(0)
    for second in (0, 10, 15):
        h.tick(second, [incident])
    incident.quiet_since_ns = T0 + 16 * S
    for second in (16, 20, 25):  # lever_b would have been due at 20 s
        h.tick(second, [incident])
    for second in (26, 36, 46, 56):
        h.tick(second, [])
    assert h.ledger.lever_stats() == {"lever_a": (1, 1)}
    assert h.incidents.get("inc-1").annotations["lever_that_worked"] == "lever_a"


def test_one_crossing_incident_is_enough_to_climb_and_takes_the_rung(tmp_path):
    h = Harness(tmp_path)
    quiet = h.incident(0)
    h.tick(0, [quiet])
    quiet.quiet_since_ns = T0 + 2 * S
    crossing = Incident("inc-2", "g", "LSSlow", "ls", "critical", "node-a", FIRING,
                        {"pod": "api"}, T0 + 5 * S, T0 + 5 * S, fired_ns=T0 + 5 * S,
                        policy="guard")
    h.incidents.save(crossing)
    h.made.append(crossing)
    h.tick(10, [quiet, crossing])
    assert CALLS[-1] == ("apply", "second", False)
    [_, second] = h.ledger.rungs()
    assert second.incident == "inc-2"  # the rung was taken for the incident that called for it


def test_repeat_waits_for_a_crossing_but_retries_and_dry_run_switched_off_do_not(tmp_path):
    """Retries and rungs proposed in shadow mode finish what was decided while it crossed; a
    repeat is more of the same lever, which a recovering signal does not call for."""
    h = Harness(tmp_path, REPEATING)
    incident = h.incident(0)
    h.tick(0, [incident])
    incident.quiet_since_ns = T0 + 1 * S
    h.tick(5, [incident])
    h.tick(9, [incident])
    assert CALLS == [("apply", "first", False)]  # no repeat while recovering
    incident.quiet_since_ns = None
    h.tick(10, [incident])
    assert CALLS[-1] == ("apply", "first", False) and len(CALLS) == 2

    (tmp_path / "retry").mkdir()
    h = Harness(tmp_path / "retry")
    CALLS.clear()
    Mark.fail_times = 1
    incident = h.incident(0)
    h.tick(0, [incident])
    h.tick(10, [incident])  # "second" fails; retried from 15 s
    incident.quiet_since_ns = T0 + 11 * S
    h.tick(15, [incident])
    assert CALLS[-1] == ("apply", "second", False)  # retried although quiet
    assert ("apply", "cpu_idle", False) not in CALLS  # but not climbed

    (tmp_path / "shadow").mkdir()
    h = Harness(tmp_path / "shadow", dry_run=True)
    CALLS.clear()
    incident = h.incident(0)
    h.tick(0, [incident])
    h.tick(10, [incident])
    incident.quiet_since_ns = T0 + 11 * S
    h.dry_run = False
    h.open()
    h.tick(16, [incident])
    assert CALLS[2:] == [("apply", "first", False), ("apply", "second", False)]


FAST = """\
policies:
  - name: guard
    undo_hold: 10s
    stale_after: 5s
    steps:
      - step: mark
        params: {name: first}
      - step: mark
        params: {name: second}
      - step: suppress
        levers:
          - step: lever_a
          - step: lever_b
      - step: mark
        params: {name: last}
"""


def test_rungs_due_at_once_are_applied_in_the_same_tick_but_levers_one_per_tick(tmp_path):
    h = Harness(tmp_path, FAST)
    incident = h.incident(0)
    h.tick(0, [incident])  # every `after` is 0: the first lever with the firing, not 3 ticks on
    assert [c[1] for c in CALLS] == ["first", "second", "cpu_idle"]
    h.tick(1, [incident])  # the next lever waits for the next tick; the rung after it does not
    assert [c[1] for c in CALLS] == ["first", "second", "cpu_idle", "cpuset", "last"]
    reasons = [e.reason for e in h.ledger.audit_log() if e.action == "apply"]
    assert sum("right after mark" in r for r in reasons) == 2  # second and cpu_idle
    assert sum("did not end it" in r for r in reasons) == 1  # cpuset


def test_a_chain_of_rungs_stops_where_a_hold_applies(tmp_path):
    h = Harness(tmp_path, FAST.replace("      - step: suppress\n",
                                       "      - step: suppress\n        after: 2s\n"))
    incident = h.incident(0)
    h.tick(0, [incident])
    assert [c[1] for c in CALLS] == ["first", "second"]  # the suppress step waits its 2 s
    (tmp_path / "quiet").mkdir()
    h = Harness(tmp_path / "quiet", FAST)
    CALLS.clear()
    incident = h.incident(0)
    incident.quiet_since_ns = T0
    h.tick(0, [incident])
    assert CALLS == []  # fired on an evaluation that did not cross: nothing yet


HOLDING = POLICY.replace("      - step: suppress\n        after: 5s\n",
                         "      - step: suppress\n        after: 5s\n        hold: 2s\n")


def test_a_suppress_step_waits_after_before_its_first_lever_and_hold_between_levers(tmp_path):
    from sloguard.actuators.policy import Policy, PolicySpec

    h = Harness(tmp_path, HOLDING)
    incident = h.incident(0)
    for second in (0, 10, 14):
        h.tick(second, [incident])
    assert [c[1] for c in CALLS] == ["first", "second"]
    h.tick(15, [incident])  # the step's `after`: 5 s after "second"
    h.tick(16, [incident])
    assert CALLS[-1] == ("apply", "cpu_idle", False)
    h.tick(17, [incident])  # `hold`: 2 s after cpu_idle
    assert CALLS[-1] == ("apply", "cpuset", False)

    def afters(levers: str, order: list[str] | None = None, hold: str = "hold: 2s") -> list:
        spec = PolicySpec.model_validate(yaml.safe_load(textwrap.dedent(f"""\
            name: p
            steps:
              - step: mark
              - step: suppress
                after: 5s
                {hold}
                levers: {levers}
        """)))
        return [(r.spec.step, r.spec.after) for r in Policy(spec, "x").rungs(order)[1:]]

    three = "[{step: lever_a}, {step: lever_b}, {step: lever_c}]"
    assert afters(three) == [("lever_a", 5), ("lever_b", 2), ("lever_c", 2)]
    assert afters(three, hold="") == [("lever_a", 5), ("lever_b", 5), ("lever_c", 5)]
    # a lever's own `after` wins, 0 included (`lever.after or ...` once took 0 for unset)
    own = "[{step: lever_a, after: 0s}, {step: lever_b, after: 0s}, {step: lever_c, after: 9s}]"
    assert afters(own) == [("lever_a", 0), ("lever_b", 0), ("lever_c", 9)]
    # the first lever is the first tried here: after a learned reordering too
    assert afters(three, ["lever_c"]) == [("lever_c", 5), ("lever_a", 2), ("lever_b", 2)]
    # `order: written`: what the node learnt does not reorder them
    assert afters(three, ["lever_c"], hold="hold: 2s\n" + " " * 16 + "order: written") == [
        ("lever_a", 5), ("lever_b", 2), ("lever_c", 2)]


NO_EFFECT = """\
policies:
  - name: guard
    steps:
      - step: suppress
        after: 0s
        hold: 10s
        levers:
          - step: lever_gone
          - step: lever_a
          - step: lever_b
"""


@pytest.mark.parametrize("lever", ["lever_gone", "lever_broken"])
def test_a_lever_that_changed_nothing_does_not_cost_the_next_one_its_hold(tmp_path, lever):
    """A lever missing on this node, or one that failed for good, has no effect to wait for:
    the next lever comes in the same tick, not a hold later."""
    h = Harness(tmp_path, NO_EFFECT.replace("lever_gone", lever))
    incident = h.incident(0)
    h.tick(0, [incident])
    steps = [(a.step, a.status) for a in h.incidents.get("inc-1").actions]
    assert steps == [(lever, SKIPPED if lever == "lever_gone" else FAILED), ("lever_a", DONE)]
    [taken] = [e for e in h.ledger.audit_log() if e.kind == "lever_a"]
    assert f"{lever} {steps[0][1]}: no effect to wait for" in taken.reason
    h.tick(9, [incident])
    assert CALLS == [("apply", "cpu_idle", False)]
    h.tick(10, [incident])  # a lever that did something: its hold was kept
    assert CALLS[-1] == ("apply", "cpuset", False)


def test_a_lever_that_failed_and_will_be_retried_keeps_its_hold(tmp_path):
    """The retry must not land on the next lever in the middle of that lever's hold."""
    h = Harness(tmp_path, NO_EFFECT)
    Mark.fail_name, Mark.fail_times = "cpu_idle", 1
    incident = h.incident(0)
    h.tick(0, [incident])
    steps = [(a.step, a.status) for a in h.incidents.get("inc-1").actions]
    assert steps == [("lever_gone", SKIPPED), ("lever_a", FAILED)] and CALLS == []
    h.tick(5, [incident])  # retried on its backoff
    h.tick(9, [incident])
    assert CALLS == [("apply", "cpu_idle", False)]
    h.tick(10, [incident])
    assert CALLS[-1] == ("apply", "cpuset", False)


def test_a_restart_with_the_rule_unevaluated_is_not_a_recovery_nor_then_a_relapse(tmp_path):
    """After a restart whose rule file fails to load, the incident is open in the store but
    not evaluated: no lever is credited, and its evaluation coming back is no relapse."""
    h = Harness(tmp_path)
    incident = h.incident(0)
    for second in (0, 10, 15):
        h.tick(second, [incident])
    h.open()
    for second in (16, 30, 60):
        h.tick(second, [], unevaluated=True)
    assert h.ledger.lever_stats() == {} and CALLS[-1] == ("apply", "cpu_idle", False)
    h.tick(61, [incident])  # evaluated again (and climbing), then recovered: no back-off
    assert CALLS[-1] == ("apply", "cpuset", False)
    CALLS.clear()
    h.tick(62, [])
    assert CALLS == [("undo", "cpuset", False)]


def test_an_episode_ends_with_its_last_lever_lifted_and_the_next_tries_the_winner_first(
        tmp_path):
    """Only a rung that never changed anything (a notify with no notifier, say) left in
    force: the episode is over, and interference back before another undo_hold starts a new
    one with the lever that worked in front (it once resumed the old order)."""
    h = Harness(tmp_path, """\
policies:
  - name: guard
    undo_hold: 10s
    steps:
      - step: lever_gone
      - step: suppress
        hold: 5s
        levers:
          - step: lever_a
          - step: lever_b
""")
    incident = h.incident(0)
    for second in (0, 5):
        h.tick(second, [incident])
    assert [c[1] for c in CALLS] == ["cpu_idle", "cpuset"]
    for second in (6, 16):  # recovered: cpuset, then cpu_idle lifted
        h.tick(second, [])
    assert h.ledger.rungs() == [] and h.ledger.episode("guard") is None
    CALLS.clear()
    h.tick(18, [h.incident(18)])
    assert CALLS == [("apply", "cpuset", False)]


def test_order_written_keeps_the_written_lever_first_after_another_lever_worked(tmp_path):
    """A node where the second lever once ended an episode tries it first next time, unless
    the policy says `order: written` (the shipped policy: the cheap lever stays first)."""
    text = """\
policies:
  - name: guard
    undo_hold: 5s
    steps:
      - step: suppress
        hold: 5s
        ORDER
        levers:
          - step: lever_a
          - step: lever_b
"""
    firsts = {}
    for order in ("", "order: written"):
        folder = tmp_path / (order.replace(": ", "-") or "learned")
        folder.mkdir()
        h = Harness(folder, text.replace("ORDER", order))
        incident = h.incident(0)
        for second in (0, 5):
            h.tick(second, [incident])
        for second in (6, 11):  # recovered: lever_b (cpuset) credited, both lifted
            h.tick(second, [])
        assert h.ledger.lever_stats()["lever_b"] == (1, 1)
        CALLS.clear()
        h.tick(30, [h.incident(30)])
        firsts["written" if order else "learned"] = CALLS[0][1]
    assert firsts == {"learned": "cpuset", "written": "cpu_idle"}


def test_hold_is_only_for_a_suppress_step(tmp_path):
    path = tmp_path / "bad.yaml"
    for where, at in (
            ("- step: mark\n  hold: 2s\n", "4:9: policies.0.steps.0: only a suppress step has "
                                            "`hold` (the time each of its levers is given); "
                                            "mark waits only its `after`"),
            ("- step: suppress\n  levers:\n    - step: lever_a\n      hold: 2s\n",
             "6:13: policies.0.steps.0.levers.0: only a suppress step has `hold`"),
            ("- step: mark\n  order: written\n", "4:9: policies.0.steps.0: only a suppress "
                                                   "step has `order`"),
            ("- step: suppress\n  order: newest\n  levers:\n    - step: lever_a\n",
             "5:9: policies.0.steps.0.order: Input should be 'learned' or 'written'")):
        path.write_text("policies:\n  - name: a\n    steps:\n" + textwrap.indent(where, " " * 6))
        with pytest.raises(PolicyFileError) as caught:
            load_policy_file(path)
        assert f"{path}:{at}" in str(caught.value), str(caught.value)


def test_rungs_in_force_are_recorded_without_hold(tmp_path):
    """An agent rolled back to a version without `hold` must still be able to undo them."""
    h = Harness(tmp_path, HOLDING)
    incident = h.incident(0)
    for second in (0, 10, 15):
        h.tick(second, [incident])
    assert all("hold" not in row.spec for row in h.ledger.rungs())
    assert [r.kind for r in h.ledger.rungs()] == ["mark", "mark", "lever_a"]


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


def test_rungs_proposed_in_shadow_mode_are_taken_once_dry_run_is_switched_off(tmp_path):
    h = Harness(tmp_path, dry_run=True)
    incident = h.incident(0)
    h.tick(0, [incident])
    h.tick(10, [incident])
    assert CALLS == [("apply", "first", True), ("apply", "second", True)]
    h.dry_run = False
    h.open()  # the operator turned dry-run off and restarted the agent mid-episode
    h.tick(11, [incident])
    assert CALLS[2:] == [("apply", "first", False), ("apply", "second", False)]
    assert {r.status for r in h.ledger.rungs()} == {DONE}
    h.tick(12, [incident])
    assert len(CALLS) == 4  # taken once, not on every tick
    h.tick(15, [incident])  # and the climb goes on from there, for real
    assert CALLS[-1] == ("apply", "cpu_idle", False)


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
    assert not h.policies.reload().ok
    assert h.policies.get("guard") is not None  # still armed
    assert "steps" in next(iter(h.policies.errors.values()))


def test_an_unknown_policy_is_reported_not_guessed(tmp_path):
    h = Harness(tmp_path)
    incident = h.incident(0, policy="missing")
    h.tick(0, [incident])
    assert CALLS == [] and "not loaded" in h.ladder.errors["missing"]


def test_policies_check_cli(tmp_path, sloguard_bin):
    import subprocess

    from sloguard.settings import load_settings

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


REPEATING = """\
policies:
  - name: guard
    undo_hold: 10s
    stale_after: 5s
    steps:
      - step: mark
        params: {name: first}
        repeat: 5s
      - step: mark
        after: 12s
        params: {name: second}
"""


def test_a_repeating_rung_does_not_hold_back_the_next_one(tmp_path):
    """`after` runs from the rung's first application: re-notifying every 5 s must not keep
    the 12 s hold before the next rung from ever ending."""
    h = Harness(tmp_path, REPEATING)
    incident = h.incident(0)
    for second in (0, 5, 10, 12):
        h.tick(second, [incident])
    assert [c[1] for c in CALLS] == ["first", "first", "first", "second"]


def test_a_failed_repeat_leaves_the_rung_in_force_and_it_is_still_undone(tmp_path):
    """A repeat that fails (or finds nothing to do) must not replace the rung's record: the
    first application is still in force, and must be undone with what it recorded."""
    h = Harness(tmp_path, REPEATING)
    Mark.fail_name = "first"
    incident = h.incident(0)
    h.tick(0, [incident])
    Mark.fail_times = 1
    h.tick(5, [incident])  # the repeat fails
    [row] = h.ledger.rungs()
    assert row.status == DONE and row.undo == {"was": "before-first"}
    h.tick(6, [])  # recovered
    assert CALLS[-1] == ("undo", "first", False)
    assert h.ledger.rungs() == []


def test_a_failed_rung_is_retried_only_on_fresh_evidence_and_keeps_its_clock(tmp_path):
    """Retrying a failed step is applying it: past cordon, stale evidence holds it like any
    other escalation. And the next rung's `after` runs from the first attempt, however many
    retries there were."""
    h = Harness(tmp_path, POLICY.replace("      - step: suppress\n        after: 5s",
                                         "      - step: suppress\n        after: 8s"))
    Mark.fail_times = 1
    incident = h.incident(0)
    h.tick(0, [incident])
    h.tick(10, [incident])  # "second" fails; retried from 15 s
    h.tick(16, [incident], fresh=False)  # no value for 6 s (stale_after: 5 s)
    assert ("apply", "second", False) not in CALLS
    h.tick(17, [incident])
    assert CALLS[-1] == ("apply", "second", False)
    h.tick(18, [incident])  # 8 s after the first attempt at "second"
    assert CALLS[-1] == ("apply", "cpu_idle", False)


def test_an_undo_retried_after_a_failure_gets_what_apply_recorded(tmp_path):
    h = Harness(tmp_path)
    incident = h.incident(0)
    h.tick(0, [incident])
    Mark.undo_fail_times = 1
    h.tick(1, [])  # the undo fails: retried after a backoff
    assert [r.kind for r in h.ledger.rungs()] == ["mark"]
    h.tick(7, [])
    assert CALLS[-1] == ("undo", "first", False)  # Mark.undo checks the data it is given
    assert h.ledger.rungs() == []


def test_the_error_of_an_unknown_policy_ends_with_its_incidents(tmp_path):
    h = Harness(tmp_path)
    incident = h.incident(0, policy="missing")
    h.tick(0, [incident])
    assert "not loaded" in h.ladder.errors["missing"]
    h.tick(1, [])
    assert h.ladder.errors == {}


def test_a_ledger_from_before_last_ns_opens_and_keeps_its_rungs(tmp_path):
    import sqlite3

    path = tmp_path / "actuators.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE rungs (policy TEXT NOT NULL, rung INTEGER NOT NULL, kind TEXT "
                     "NOT NULL, status TEXT NOT NULL, incident TEXT NOT NULL, dry_run INTEGER "
                     "NOT NULL, undo TEXT NOT NULL, applied_ns INTEGER NOT NULL, attempts "
                     "INTEGER NOT NULL DEFAULT 1, retry_ns INTEGER NOT NULL DEFAULT 0, spec TEXT "
                     "NOT NULL, target TEXT NOT NULL, PRIMARY KEY (policy, rung))")
        conn.execute("INSERT INTO rungs VALUES ('guard', 0, 'mark', 'done', 'inc-1', 0, "
                     "'{\"was\": \"before-first\"}', 5, 1, 0, '{\"step\": \"mark\"}', 'node/a')")
    [row] = Ledger(path).rungs()
    assert (row.kind, row.applied_ns, row.last_ns, row.undo) == (
        "mark", 5, 0, {"was": "before-first"})


def test_policies_can_be_read_from_other_threads_while_files_change(tmp_path):
    """The API (/api/policies, /readyz) reads the policies on uvicorn's threads while the
    agent's loop reloads them: a policy file added or removed meanwhile must not fail those
    reads with 'dictionary changed size during iteration'."""
    import os
    import sys
    import threading

    directory = tmp_path / "policies"
    directory.mkdir()
    for i in range(20):
        (directory / f"p{i}.yaml").write_text(
            f"policies:\n  - name: g{i}\n    steps:\n      - step: mark\n")
    factory = StepFactory(ActuatorEnv("n", Ledger(tmp_path / "l.db")), KINDS)
    policies = PolicySet([str(directory)], validate_step=factory.check)
    assert policies.reload().ok
    stop = threading.Event()

    def churn() -> None:
        n = 0
        while not stop.is_set():
            n += 1
            extra, broken = directory / "x.yaml", directory / "y.yaml"
            if n % 2:
                extra.write_text(f"policies:\n  - name: x{n}\n    steps:\n      - step: mark\n")
                broken.write_text("policies:\n  - name: y\n    steps:\n      - step: nope\n")
                os.utime(extra, (n, n))
                os.utime(broken, (n, n))
            else:
                extra.unlink()
                broken.unlink()
            policies.reload()

    failures = []
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads switch as often as they can: races show up
    writer = threading.Thread(target=churn)
    writer.start()
    try:
        for _ in range(20_000):
            try:
                assert policies.get("g3") is not None and "g19" in policies.names
                {**policies.errors}  # noqa: B018 - what /readyz does
            except RuntimeError as exc:
                failures.append(exc)
    finally:
        stop.set()
        writer.join()
        sys.setswitchinterval(switch)
    assert failures == []


def test_removing_a_broken_policy_file_clears_its_error(tmp_path):
    h = Harness(tmp_path)
    broken = tmp_path / "policies" / "broken.yaml"
    broken.write_text("policies: [ {name: other} ]\n")
    assert not h.policies.reload().ok and str(broken) in h.policies.errors
    broken.unlink()
    assert h.policies.reload().ok, h.policies.errors  # nothing is wrong any more
    assert h.policies.errors == {} and h.policies.get("guard") is not None


def test_a_policy_path_that_cannot_be_listed_does_not_stop_detection(tmp_path):
    """The agent reloads policies before rules on its loop: a policy path that cannot be
    listed (here a name too long for the file system) once raised out of every tick, before
    the engine evaluated anything."""
    from sloguard.agent import Agent
    from sloguard.settings import load_settings

    (tmp_path / "rules").mkdir()
    (tmp_path / "rules" / "r.yaml").write_text(
        "groups:\n  - name: ls\n    rules:\n      - alert: LSSlow\n        expr: lat\n"
        "        field: p99\n        params: {above: 10}\n")
    unlistable = tmp_path / ("x" * 300)
    config = tmp_path / "c.yaml"
    config.write_text(
        f"node_name: n\ndata_dir: {tmp_path / 'data'}\nrules:\n  paths: [{tmp_path / 'rules'}]\n"
        f"actuators:\n  policies: [{unlistable}]\n"
        "collectors:\n  node: {enabled: false}\n  cgroups: {enabled: false}\n")
    agent = Agent(load_settings(config).settings)
    try:
        agent.tick(T0)
        assert agent.engine.status["ls/LSSlow"].evaluations == 1
        assert "cannot list" in agent.policies.errors[str(unlistable)]
    finally:
        agent.store.close()
        agent.incidents.close()
        agent.ledger.close()


def test_a_step_with_untidy_undo_data_is_recorded_once_and_other_policies_go_on(tmp_path):
    """A step applied for real must be recorded as in force whatever it returns, or the
    next tick applies it again (and again); and one policy's trouble must not keep the
    ladder from the policies after it."""
    h = Harness(tmp_path, POLICY + "  - name: aaa\n    steps:\n      - step: untidy\n")
    first = h.incident(0, policy="aaa")
    second = Incident("inc-2", "g", "LSSlow", "ls", "critical", "node-a", FIRING, {"pod": "x"},
                      T0, T0, fired_ns=T0, policy="guard")
    h.incidents.save(second)
    h.made.append(second)
    for tick in range(3):
        h.tick(tick, [first, second])
    assert CALLS == [("apply", "untidy", False), ("apply", "first", False)]
    assert [(r.policy, r.kind) for r in h.ledger.rungs()] == [("aaa", "untidy"),
                                                             ("guard", "mark")]
    h.tick(3, [])
    assert ("undo", "untidy", False) in CALLS and ("undo", "first", False) in CALLS


def test_a_policy_whose_rung_cannot_be_undone_does_not_stop_the_others(tmp_path):
    """A rung recorded by another version of the agent (a step field this one does not know)
    cannot be undone here; the ladder reports it on its policy and goes on with the rest."""
    from sloguard.actuators.ledger import RungState

    h = Harness(tmp_path)
    h.ledger.put(RungState("aaa", 0, "mark", DONE, "inc-0", False, {"was": "before-x"}, T0,
                           spec={"step": "mark", "params": {"name": "x"}, "jitter": "5s"}))
    incident = h.incident(0)
    h.tick(0, [incident])
    assert CALLS == [("apply", "first", False)]
    assert "aaa" in h.ladder.errors and "jitter" in h.ladder.errors["aaa"]


def test_a_successful_repeat_records_what_the_step_now_says_is_in_force(tmp_path):
    """A step whose repeat acts again (reduce_capacity after its value was rewritten) returns
    the undo data that now holds; the rung is undone with that, not the first one."""
    h = Harness(tmp_path, REPEATING)
    incident = h.incident(0)
    h.tick(0, [incident])
    [row] = h.ledger.rungs()
    row.undo = {"was": "stale"}  # as if the first application had recorded something else
    h.ledger.put(row)
    h.tick(5, [incident])  # the repeat records {"was": "before-first"} again
    assert h.ledger.rungs()[0].undo == {"was": "before-first"}
    h.tick(6, [])
    assert CALLS[-1] == ("undo", "first", False)  # Mark.undo checks the data it is given


@pytest.mark.parametrize("restart", [False, True])
def test_relapses_after_undo_back_off_the_next_undo(tmp_path, restart):
    """A lever that ended the interference is lifted; the interference comes back (the BE it
    was holding down still runs): each relapse in a row doubles the wait before the next
    descent lifts anything, and a recovery that lasts past relapse_window starts afresh.
    An agent restarted while firing and again while waiting keeps the count and the wait."""
    h = Harness(tmp_path)
    incident = h.incident(0)
    for second in (0, 10, 15):
        h.tick(second, [incident])
    CALLS.clear()
    h.tick(20, [])  # recovered, no relapse yet: the lever is lifted at once
    assert CALLS == [("undo", "cpu_idle", False)]

    def relapse(at: int, recovered: int, climb: tuple[int, ...] = ()) -> int | None:
        """Fires at `at`, recovers at `recovered`; the second the lever is lifted at."""
        again = h.incident(at)
        for second in (at, *climb):
            h.tick(second, [again])
            if restart:  # not a relapse of its own
                h.open()
        assert CALLS[-1] == ("apply", "cpu_idle", False)  # the lever that worked
        for second in range(recovered, recovered + 60):
            before = len(CALLS)
            h.tick(second, [])
            if restart and second == recovered + 1:
                h.open()
            if ("undo", "cpu_idle", False) in CALLS[before:]:
                return second
        return None

    assert relapse(25, 30) == 40  # first relapse: undo_hold (10 s)
    assert relapse(42, 45) == 65  # second in a row: 20 s
    assert relapse(67, 70) == 110  # third: 40 s
    CALLS.clear()
    for second in range(125, 300, 5):  # the rest of the ladder comes down meanwhile
        h.tick(second, [])
    assert h.ledger.rungs() == []
    # recovered for longer than relapse_window: a new episode climbs from the bottom, and its
    # descent starts at once
    assert relapse(300, 320, climb=(310, 315)) == 320


def test_an_episode_without_a_rung_still_ends_and_a_removed_policy_is_forgotten(tmp_path):
    """A policy whose incident fired but stayed quiet (no rung ever applied) is still seen to
    stop firing; once its file is gone, nothing of it stays in the ledger."""
    h = Harness(tmp_path)
    incident = h.incident(0)
    incident.quiet_since_ns = T0  # recovering from its first tick on: the ladder holds
    h.tick(0, [incident])
    assert CALLS == [] and h.ledger.descents()["guard"].firing
    h.tick(1, [])
    assert not h.ledger.descents()["guard"].firing
    (tmp_path / "policies" / "p.yaml").unlink()
    h.policies.reload()
    h.tick(2, [])
    assert h.ledger.descents() == {}


def test_every_shipped_rule_names_a_shipped_policy_and_each_cause_gets_its_own_levers():
    """LSLatencyInterference and LSCpuStall drive SCHED_IDLE then cpuset, in that order on every
    node; an I/O-bound BE (LSLatencyIOInterference) SCHED_IDLE only; memory stalls drive
    memory_limit; neither gets cpu_quota (the lab: it did not protect
    the LS tail) nor the other's lever (stacked, they made the cache tail worse)."""
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent / "rules"
    policies = {p.name: p for f in sorted((root / "policies").glob("*.yaml"))
                for p in load_policy_file(f)}
    named = {r["alert"]: r.get("policy") for f in root.glob("*.yaml")
             for g in yaml.safe_load(f.read_text())["groups"] for r in g["rules"]}
    assert {name for name in named.values() if name} <= set(policies)
    assert named["LSLatencyInterference"] == named["LSCpuStall"] == "ls-interference"
    assert named["LSMemoryStall"] == "ls-memory"
    assert named["LSLatencyIOInterference"] == "ls-io"

    def levers(name: str, learnt: list[str]) -> list[str]:
        """Each lever once, in the order of its first rung (a `target: suspects` lever is
        several rungs: the suspects, then the rest)."""
        kinds = {"cpu_idle", "cpuset", "cpu_quota", "memory_limit", "resctrl"}
        return list(dict.fromkeys(r.spec.step for r in policies[name].rungs(learnt)
                                  if r.spec.step in kinds))

    # resctrl stays a rung of its own after cordon and capacity
    assert levers("ls-interference", []) == ["cpu_idle", "cpuset", "resctrl"]
    # cpuset on the suspects first, SCHED_IDLE on the tier (docs/attribution.md, "Measured")
    widening = {r.spec.step: r.widening for r in policies["ls-interference"].rungs([])}
    assert widening["cpuset"] == "rest" and widening["cpu_idle"] == ""
    assert levers("ls-interference", ["cpuset"]) == ["cpu_idle", "cpuset", "resctrl"]
    assert levers("ls-memory", ["cpuset"]) == ["memory_limit"]
    # an I/O-bound BE: SCHED_IDLE, never cpuset (the lab: it made the io tail worse)
    assert levers("ls-io", ["cpuset"]) == ["cpu_idle"]


def test_each_audit_entry_is_handed_on_once_the_ledger_holds_it(tmp_path):
    """What the agent counts for /metrics (sloguard_actions_total, the SloguardActionsFailing
    alert): every outcome the audit records, failures included, and nothing it does not."""
    h = Harness(tmp_path)
    handed: list[Any] = []
    h.ladder.on_audit = handed.append
    Mark.fail_times = 2
    incident = h.incident(0)
    for second in (0, 10, 15, 25):
        h.tick(second, [incident])
    audit = h.ledger.audit_log()
    assert sorted((e.kind, e.action, e.status, e.time_ns) for e in handed) == sorted(
        (e.kind, e.action, e.status, e.time_ns) for e in audit)
    assert [e.status for e in handed].count(FAILED) == 2
