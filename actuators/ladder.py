"""The escalation ladder: one rung more while interference persists, back down on recovery.

Per policy, the node climbs rung by rung: rung k+1 is applied when an incident under that
policy is still firing `after` seconds past rung k (the hold in which the previous lever had its
chance to help) and its condition crosses now. Rungs whose `after` is already over (`after: 0s`)
follow in the same tick, except that a suppress step's levers go on one per tick at most: each
lever that took effect gets its hold (one that changed nothing, or failed for good, does not
hold up the next). An incident whose condition has stopped crossing (`quiet_since_ns`:
recovering through its rule's `recover_for`, or in the hysteresis band) may be recovering under
the levers in force: while every incident under the policy is quiet, the ladder holds (nothing
applied, nothing undone, no `repeat`), so no lever is stacked needlessly and the lever in force
gets the credit when the episode ends. If the condition crosses again, the next rung follows at
once when its `after` (still counted from the previous rung) is over.

While any incident under the policy fires, nothing is undone. When none fires (the rule's own
hysteresis and `recover_for` have passed), the rungs are undone in reverse order, one every
`undo_hold`, so a returning interference finds most levers still in place.

Safety, in one place:
- dry-run (global `actuators.dry_run`, or per step) runs the same ladder in shadow mode: every
  rung is recorded as "proposed" and nothing on the node changes;
- stale evidence (no value within `stale_after`) never escalates past cordon;
- what is in force is persisted (actuators/ledger.py) before the next tick, so a restart
  neither applies a rung twice nor forgets to undo one;
- a failed step is recorded and retried with backoff; escalation goes on meanwhile (a dead API
  server must not keep the node from protecting its LS pods with local levers); retries, and
  rungs proposed in dry-run taken once dry-run is switched off, do not wait for a crossing:
  they finish what the ladder had already decided;
- the same lever held by two policies is lifted only when the last one lets go.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from sloguard.actuators.ledger import AuditEntry, Descent, Intent, Ledger, RungState
from sloguard.actuators.policy import Policy, PolicySet, Rung, StepSpec
from sloguard.actuators.standing import STANDING_HELD, StandingLevers, is_standing
from sloguard.actuators.step import (
    DONE,
    FAILED,
    PROPOSED,
    SKIPPED,
    UNDONE,
    StepContext,
    StepResult,
    backoff_ns,
)
from sloguard.core.incidents import FIRING, ActionRecord, Incident
from sloguard.core.suspects import suspects_of

log = logging.getLogger(__name__)

SAFE_WHEN_STALE = ("notify", "cordon")  # all that stale metrics may ever trigger
RUNNING = "running"  # a step on the API worker: its rung waits for the outcome
TARGETS_KEY = "_suspects"  # in a suspect rung's undo record: the cgroups it was narrowed to


class Ladder(StandingLevers):
    """The node's escalation state machine; the engine's IncidentActuator."""

    def __init__(
        self,
        node: str,
        policies: PolicySet,
        ledger: Ledger,
        make_step: Callable[[StepSpec], Any],
        save_incident: Callable[[Incident], None],
        load_incident: Callable[[str], Incident | None],
        inventory: Callable[[], list[dict[str, str]]] = lambda: [],
        dry_run: bool = True,
        open_incidents: Callable[[], list[Incident]] = lambda: [],
        background: bool = False,
        cause_present: Callable[[str], bool | None] = lambda policy: None,
        confirm: Callable[[str], bool] = lambda policy: True,
        on_audit: Callable[[AuditEntry], None] = lambda entry: None,
    ) -> None:
        self.node = node
        self.policies = policies
        self.ledger = ledger
        self.make_step = make_step
        self.save_incident = save_incident
        self.load_incident = load_incident
        self.inventory = inventory
        self.dry_run = dry_run
        self.open_incidents = open_incidents
        self.cause_present = cause_present  # Engine.cause_present: BE still busy?
        # Agent.confirm_interference: the policy's rules judged again on fresh BE samples
        # right before a lever goes on (the last ones may predate the antagonist's end)
        self.confirm = confirm
        # each audit entry once the ledger holds it (the agent counts outcomes for /metrics)
        self.on_audit = on_audit
        self._kept: set[str] = set()  # policies whose levers the cause keeps (logged once)
        self._standing_due: dict[tuple[str, int], int] = {}  # a standing undo's back-off
        # a standing lever's last full check: the BE inventory it saw, and when
        self._standing_checked: dict[tuple[str, int], tuple[Any, int]] = {}
        self.errors: dict[str, str] = {}  # policy name -> why it cannot run
        self._held: set[tuple[str, int]] = set()  # (policy, rung) held for stale evidence
        self._quiet: set[tuple[str, int]] = set()  # (policy, rung) held while recovering
        self._edited: set[tuple[str, int]] = set()  # (policy, rung) another step holds now
        self._pending: set[tuple[str, int]] = set()  # (policy, rung) whose outcome is unknown
        # timers: monotonic time anchored at the first tick to the wall time then; labels:
        # wall time, `_skew` ahead of the timers (what the wall clock was stepped since start)
        self._anchor: int | None = None
        self._skew = 0
        # persisted when the wall clock steps, so that a restart carries on the same timers
        self._saved_skew = ledger.timer_skew()
        # incident -> (its newest evidence's time label, when that showed up, on the timers)
        self._evidence: dict[str, tuple[int, int]] = {}
        # Steps that talk to the API server (`remote`) run on their own worker when
        # `background`: a slow or hanging apiserver must not stall collection and evaluation
        # (nor the local levers). Their outcome is settled on this thread, at the next tick.
        self._worker = ThreadPoolExecutor(1, "ladder-api") if background else None
        self._jobs: dict[tuple[str, int], tuple[Future, Callable[[Any, int, bool], Any]]] = {}
        # between episodes, persisted (Descent): a restart keeps a relapse back-off
        self._saved = ledger.descents()
        self._undo_due = {n: d.undo_due_ns for n, d in self._saved.items() if d.undo_due_ns}
        self._was_firing = {n for n, d in self._saved.items() if d.firing}
        # policy -> when its incidents last stopped firing; relapses in a row (_count_relapse)
        self._came_down = {n: d.came_down_ns for n, d in self._saved.items()
                           if d.came_down_ns is not None}
        self._relapses = {n: d.relapses for n, d in self._saved.items() if d.relapses}

    # -- the engine's hooks ------------------------------------------------------------------

    def on_firing(self, incident: Incident, now_ns: int) -> list[ActionRecord]:
        return []  # the ladder acts in `tick`, right after the evaluation that fired

    def on_resolved(self, incident: Incident, now_ns: int) -> list[ActionRecord]:
        return []  # undone in `tick` once no incident under the policy fires

    # -- one tick ------------------------------------------------------------------------------

    def tick(self, now_ns: int, firing: list[Incident], mono_ns: int | None = None) -> None:
        """One step of every policy. `now_ns` is wall time, a label (audit, incidents, what
        steps write); with `mono_ns`, every timer (holds, retries, repeats, undo holds, the
        relapse window) runs on the monotonic clock instead, carried in the ledger as wall
        time anchored at the first run's start (and the offset since, saved whenever the wall
        clock steps, so a restart carries on the same timers): a wall clock stepped an hour
        either way neither takes every rung at once nor holds the node cordoned for an hour."""
        if mono_ns is not None:
            if self._anchor is None:  # the timers go on where the last run's stood
                self._anchor = now_ns - mono_ns - self._saved_skew
            timer_ns = mono_ns + self._anchor
            self._skew, now_ns = now_ns - timer_ns, timer_ns
            if abs(self._skew - self._saved_skew) > 1_000_000_000:  # the wall clock stepped
                try:
                    self.ledger.put_timer_skew(self._skew)
                    self._saved_skew = self._skew
                except Exception as exc:  # tried again on the next tick
                    log.warning("cannot save the timer clock's offset: %s", exc)
        by_policy: dict[str, list[Incident]] = defaultdict(list)
        for incident in firing:
            if incident.policy:
                by_policy[incident.policy].append(incident)
        # an error ends with the incidents it was about (a new dict: the API reads this one)
        self.errors = {n: e for n, e in self.errors.items() if n in by_policy
                       or is_standing(n)}
        self._collect(now_ns)
        self._reconcile(firing, now_ns)
        self._stand(now_ns)  # before the climb: a rung starts from what stands
        self._evidence = {i: seen for i, seen in self._evidence.items()
                          if any(f.id == i for f in firing)}
        in_force: dict[str, list[RungState]] = defaultdict(list)
        for row in self.ledger.rungs():
            if not is_standing(row.policy):  # not an episode's: _stand keeps them
                in_force[row.policy].append(row)
        # a policy that fired on the last tick is visited too: its end is a transition even
        # when it never had a rung in force; so is one whose file is gone, to be forgotten
        gone = {n for n in self._saved if self.policies.get(n) is None}
        # an episode still open with nothing in force: the agent died between the last undo
        # and the episode's end; visited so that it ends (the next one would inherit its order)
        open_episodes = set(self.ledger.open_episodes())
        for name in sorted(set(by_policy) | set(in_force) | self._was_firing | gone
                           | open_episodes):
            rows = sorted(in_force.get(name, []), key=lambda r: r.rung)
            try:
                self._tick_policy(name, rows, by_policy.get(name, []), now_ns)
                if self.policies.get(name) is None and not rows and name not in by_policy:
                    self._forget(name)  # removed, and nothing of it left in force
                self._save_descent(name)
            except Exception as exc:  # one policy's trouble must not stop the others
                self.errors[name] = f"policy {name!r}: {exc.__class__.__name__}: {exc}"[:500]
                log.exception("policy %s: the escalation ladder failed", name)

    def _forget(self, name: str) -> None:
        self._was_firing.discard(name)
        for state in (self._came_down, self._relapses, self._undo_due):
            state.pop(name, None)

    def _save_descent(self, name: str) -> None:
        """Written on a change only: the state moves at transitions (firing starts or stops,
        a relapse, an undo), not on every tick."""
        descent = Descent(firing=name in self._was_firing,
                          came_down_ns=self._came_down.get(name),
                          relapses=self._relapses.get(name, 0),
                          undo_due_ns=self._undo_due.get(name, 0))
        if self._saved.get(name, Descent()) != descent:
            self.ledger.put_descent(name, descent)
            self._saved[name] = descent
        if descent == Descent():
            self._saved.pop(name, None)

    def _tick_policy(self, name: str, rows: list[RungState], firing: list[Incident],
                     now_ns: int) -> None:
        policy = self.policies.get(name)
        if firing:
            if policy is None:
                self.errors[name] = f"policy {name!r} is not loaded; nothing escalates"
                return
            self.errors.pop(name, None)
            if name not in self._was_firing:
                self._count_relapse(policy, now_ns)
            self._climb(policy, rows, firing, now_ns)
            self._was_firing.add(name)
        else:
            # Still firing in the store, but not evaluated (its rule file failed to load after
            # a restart, say): not a recovery. Hold every lever where it is, and do not count
            # the episode as over (no credit, no relapse when it is back). The store is asked
            # only when an end or an undo is at stake, not on every tick of a wait.
            at_stake = name in self._was_firing or (
                bool(rows) and now_ns >= self._undo_due.get(name, 0))
            if at_stake and self._unevaluated(name):
                return
            cause = self._cause(name, policy) if rows else None
            if name in self._was_firing:
                self._was_firing.discard(name)
                self._learn(name, rows)
                self._came_down[name] = now_ns
                if cause is None:
                    self._wait_before_undo(name, policy, rows, now_ns)
                else:  # lifted when the cause goes, not probed: no relapse back-off
                    self._relapses.pop(name, None)
                    self._came_down.pop(name, None)
            # the next episode logs its holds again
            self._held = {held for held in self._held if held[0] != name}
            self._quiet = {held for held in self._quiet if held[0] != name}
            self._edited = {held for held in self._edited if held[0] != name}
            self._descend(name, policy, rows, now_ns, cause)

    def _unevaluated(self, name: str) -> bool:
        return any(i.policy == name and i.state == FIRING and i.node == self.node
                   for i in self.open_incidents())

    def _count_relapse(self, policy: Policy, now_ns: int) -> None:
        """Interference back within `relapse_window` of the last recovery is a relapse: the
        lever was masking a BE that still runs, and undoing it let the interference back."""
        came_down = self._came_down.get(policy.name)
        if came_down is not None and now_ns - came_down <= policy.spec.relapse_window * 1e9:
            self._relapses[policy.name] = self._relapses.get(policy.name, 0) + 1
        else:
            self._relapses.pop(policy.name, None)

    def _wait_before_undo(self, name: str, policy: Policy | None, rows: list[RungState],
                          now_ns: int) -> None:
        """After a relapse, the next descent waits before lifting its first rung: undo_hold,
        doubled with each relapse in a row, at most max_undo_wait. A lever that keeps ending
        the interference is thus probed ever less often (like a crash-loop back-off), instead
        of once per recover_for while the BE that causes it runs on."""
        relapses = self._relapses.get(name, 0)
        if not relapses or not rows or policy is None:
            return
        wait = min(policy.spec.undo_hold * 2 ** (relapses - 1), policy.spec.max_undo_wait)
        self._undo_due[name] = now_ns + int(wait * 1e9)
        log.info("policy %s: interference came back %d time(s) in a row after the levers were "
                 "lifted; waiting %gs before lifting them again", name, relapses, wait)

    def _climb(self, policy: Policy, rows: list[RungState], firing: list[Incident],
               now_ns: int) -> None:
        order = self.ledger.episode(policy.name)
        if order is None:
            order = self.lever_order()
            self.ledger.start_episode(policy.name, order, now_ns)
        rungs = policy.rungs(order)
        driver = self._driver(firing)
        # Only a condition crossing now calls for more: a quiet one may be recovering under the
        # levers in force, and another lever stacked on them would be needless and get the
        # credit in `_learn`.
        crossing = [i for i in firing if i.quiet_since_ns is None]
        self._undo_due.pop(policy.name, None)
        fresh = self._fresh(firing, now_ns, policy)
        # A policy edited mid-episode may hold another step at a rung now: the lever in force
        # there keeps its own record (and is undone from it); it is not retried or repeated
        # as the new step, which would overwrite that record and lose its originals.
        same = {row.rung for row in rows if self._same_step(policy, rungs, row)}
        same -= {rung for name, rung in self._pending if name == policy.name}
        for row in rows:  # failed rungs whose backoff is over
            if row.status == FAILED and row.retry_ns and now_ns >= row.retry_ns and (
                    row.rung in same) and (
                    fresh or rungs[row.rung].spec.step in SAFE_WHEN_STALE):
                # a retry is an application: stale evidence holds it past cordon; the next
                # rung's `after` still runs from the first attempt
                self._apply(policy, rungs[row.rung], driver, now_ns, row.attempts + 1,
                            "retry after a failure", first_ns=row.applied_ns)
        for row in rows:  # shadow-mode rungs whose step has since been switched to act
            if row.status == PROPOSED and row.rung in same and not (
                    self.dry_run or rungs[row.rung].spec.dry_run) and (
                    fresh or rungs[row.rung].spec.step in SAFE_WHEN_STALE):
                self._apply(policy, rungs[row.rung], driver, now_ns, 1,
                            "dry-run was switched off while this rung was proposed: taking it",
                            first_ns=row.applied_ns)
        if rows:
            last = rows[-1]
            repeat = rungs[last.rung].spec.repeat if last.rung in same else None
            latest = max(last.applied_ns, last.last_ns)
            if repeat and last.status not in (FAILED, RUNNING) and fresh and crossing and (
                    now_ns >= latest + int(repeat * 1e9)):
                self._repeat(policy, rungs[last.rung], last, self._driver(crossing), now_ns,
                             f"interference persists {repeat:g}s after the last "
                             f"{last.kind}: repeating it")
        self._climb_rungs(policy, rungs, rows, firing, crossing, fresh, now_ns)

    def _same_step(self, policy: Policy, rungs: list[Rung], row: RungState) -> bool:
        if row.rung < len(rungs) and rungs[row.rung].spec.step == row.kind:
            return True
        if (policy.name, row.rung) not in self._edited:  # said once per episode
            self._edited.add((policy.name, row.rung))
            now = rungs[row.rung].spec.step if row.rung < len(rungs) else "no step"
            log.warning("policy %s: rung %d is %s now, but %s is in force there since the "
                        "policy was edited: it stays until the episode ends, then is undone "
                        "from its own record", policy.name, row.rung + 1, now, row.kind)
        return False

    def _climb_rungs(self, policy: Policy, rungs: list[Rung], rows: list[RungState],
                     firing: list[Incident], crossing: list[Incident], fresh: bool,
                     now_ns: int) -> None:
        """Apply every rung that is due now, not one per tick: with `after: 0s` the next rung
        must not wait for the agent's next tick (the first lever is wanted within seconds of
        firing). A suppress step's levers stay one per tick, since each lever needs its hold
        to show an effect before the next goes on top of it; a lever that changed nothing and
        will not (unavailable here, nothing to do, failed for good) has no effect to wait for,
        so the next lever follows at once."""
        k = rows[-1].rung + 1 if rows else 0
        base = rows[-1].applied_ns if rows else min(
            i.fired_ns or i.started_ns for i in firing) - self._skew  # a label, as a timer
        previous = f"{rows[-1].kind} did not end it" if rows else "first rung"
        lever_groups: set[int] = set()  # suppress steps that had a lever applied in this tick
        no_effect: int | None = None  # the suppress step whose last lever changed nothing
        while k < len(rungs):
            rung = rungs[k]
            waived = rung.lever_group is not None and rung.lever_group == no_effect
            if now_ns < base + int(rung.spec.after * 1e9) and not waived:
                return
            if rung.lever_group is not None and rung.lever_group in lever_groups:
                return
            if not crossing:  # held, not restarted: `after` still counts from `base`
                if (policy.name, k) not in self._quiet:
                    self._quiet.add((policy.name, k))
                    wall = now_ns + self._skew
                    quiet_s = (wall - max(i.quiet_since_ns or wall for i in firing)) / 1e9
                    log.info("policy %s: holding before %s: no incident under it has crossed "
                             "for %.0fs (recovering, or in its rule's hysteresis band)",
                             policy.name, rung.spec.step, quiet_s)
                return
            self._quiet.discard((policy.name, k))
            if rung.spec.step not in SAFE_WHEN_STALE and not fresh:
                if (policy.name, k) not in self._held:
                    self._held.add((policy.name, k))
                    log.warning("policy %s: holding before %s: no fresh evidence for %gs",
                                policy.name, rung.spec.step, policy.spec.stale_after)
                return
            self._held.discard((policy.name, k))
            if rows and rung.spec.step != "notify" and not self._confirmed(policy.name):
                return  # an escalation, and the interference ended since the last samples
            driver = self._driver(crossing)
            since = (now_ns + self._skew - (driver.fired_ns or driver.started_ns)) / 1e9
            reason = (f"{driver.rule} firing for {since:.0f}s; {previous}; rung "
                      f"{k + 1}/{len(rungs)} of policy {policy.name}")
            result = self._apply(policy, rung, driver, now_ns, 1, reason)
            no_effect = None
            previous = f"right after {rung.spec.step}"
            held = result.status == SKIPPED and STANDING_HELD in result.undo
            if rung.lever_group is not None and not held and (
                    result.status == SKIPPED or (result.status == FAILED and not result.retry)):
                no_effect = rung.lever_group
                previous = f"{rung.spec.step} {result.status}: no effect to wait for"
            elif rung.lever_group is not None:
                # in force (a standing lever too: the next one waits its hold, as if this
                # rung had just put it on), or failed and retried soon: the retry must not
                # land on top of the next lever in the middle of its hold
                lever_groups.add(rung.lever_group)
            base, k = now_ns, k + 1

    def _confirmed(self, name: str) -> bool:
        try:
            confirmed = bool(self.confirm(name))
        except Exception:  # the check's own trouble must not hold the levers back
            log.exception("policy %s: confirming the interference failed", name)
            return True
        if not confirmed:
            log.info("policy %s: not acting: on fresh samples the interference is over "
                     "(its cause gone, or LS back within its objective)", name)
        return confirmed

    @staticmethod
    def _driver(incidents: list[Incident]) -> Incident:
        """The incident a rung is taken for: the one firing longest."""
        return min(incidents, key=lambda i: i.fired_ns or i.started_ns)

    def _cause(self, name: str, policy: Policy | None) -> bool | None:
        """Whether the cause the policy's levers answer is still present (True), gone
        (False), or not known (None: the policy says not to ask, or no rule tells)."""
        if policy is None or not policy.spec.keep_while_cause:
            return None
        try:
            return self.cause_present(name)
        except Exception:  # the engine's trouble: the descent falls back to its holds
            log.exception("policy %s: cannot tell whether the cause is still present", name)
            return None

    def _descend(self, name: str, policy: Policy | None, rows: list[RungState],
                 now_ns: int, cause: bool | None = None) -> None:
        """Down one rung per `undo_hold`; or, where the driving rules name the cause (their
        `and:` conditions), nothing while it is still present (the lever is what keeps it
        down: lifting it lets the interference back) and everything at once when it is
        gone (nothing left to protect against, BE should have its resources back)."""
        if not rows:
            self._kept.discard(name)
            if self.ledger.episode(name) is not None:
                self.ledger.end_episode(name)
            return
        if cause:
            # the local levers that hold BE down stay; what reaches beyond the node (cordon,
            # capacity, eviction's record) comes down as before, one per undo_hold
            if self._local(rows[-1]):
                if name not in self._kept:
                    self._kept.add(name)
                    log.info("policy %s: the interference ended under its levers and its "
                             "cause (BE work) is still present: the levers on BE stay until "
                             "it is gone", name)
                return
            if now_ns >= self._undo_due.get(name, 0):
                self._descend_one(name, policy, rows, now_ns)
            return
        if self._kept:
            self._kept.discard(name)
        if cause is False:
            self._lift_all(name, policy, rows, now_ns)
            return
        if now_ns < self._undo_due.get(name, 0):
            return
        self._descend_one(name, policy, rows, now_ns)

    def _local(self, row: RungState) -> bool:
        """A rung whose lever acts on BE workloads on this node (per_workload): what keeps
        the cause of an interference down while it runs."""
        spec = StepSpec.model_validate(row.spec or {"step": row.kind})
        return row.status in (DONE, PROPOSED) and bool(
            getattr(self._step_or_none(spec), "per_workload", False))

    def _lift_all(self, name: str, policy: Policy | None, rows: list[RungState],
                  now_ns: int) -> None:
        """The cause is gone: every rung undone in this tick, last first (one on the API
        worker stops the walk until its outcome is in)."""
        rows = list(rows)
        while rows:
            if rows[-1].undo.get("_undo_attempts") and now_ns < self._undo_due.get(name, 0):
                return  # its undo failed: retried after its back-off, not on every tick
            rest = self._descend_one(name, policy, rows, now_ns)
            if rest is None:
                return
            rows = rest
        self._undo_due.pop(name, None)

    def _descend_one(self, name: str, policy: Policy | None, rows: list[RungState],
                     now_ns: int) -> list[RungState] | None:
        """Undo the last rung in force; what is left below it when that is done."""
        rows = list(rows)
        while rows and rows[-1].status in (FAILED, SKIPPED):
            # never changed anything: dropped at once, without costing a hold
            self.ledger.remove(rows[-1].policy, rows[-1].rung)
            rows.pop()
        if not rows:
            self.ledger.end_episode(name)
            return []
        row = rows[-1]
        if row.status == RUNNING:
            return None  # its step is still on the API worker: undone once its outcome is in
        done = self._undo(row, now_ns, f"no incident under policy {name} fires any more")
        if done is None:
            return None  # the undo is on the API worker; the descent goes on from its outcome
        self._after_undo(name, policy, rows[:-1], row, done, now_ns)
        return rows[:-1] if done else None

    def _after_undo(self, name: str, policy: Policy | None, below: list[RungState],
                    row: RungState, done: bool, now_ns: int) -> None:
        hold = policy.spec.undo_hold if policy is not None else 30.0
        if done and all(r.status in (FAILED, SKIPPED) for r in below):
            # all the way down (what is left never changed anything): the next episode starts
            # afresh, with the levers that worked here first
            for left in below:
                self.ledger.remove(left.policy, left.rung)
            self.ledger.end_episode(name)
        self._undo_due[name] = now_ns + (int(hold * 1e9) if done else backoff_ns(
            row.undo.get("_undo_attempts", 1)))

    # -- applying and undoing ------------------------------------------------------------------

    def _context(self, incident_id: str, dry_run: bool, now_ns: int, reason: str,
                 resource: str = "", intend: Callable[[dict[str, Any]], None] | None = None
                 ) -> StepContext:
        ctx = StepContext(self.node, now_ns + self._skew, dry_run, incident_id, reason,
                          self.inventory, resource)
        if intend is not None:
            ctx.intend = intend
        return ctx

    def _narrowing(self, policy: str, rung: Rung, incident: Incident
                   ) -> tuple[tuple[str, ...] | None, tuple[str, ...], str]:
        """A `target: suspects` rung's BE workloads: (only, exclude, why). A suspect rung
        takes the incident's suspect of its rank among those its sibling rungs do not hold
        already (the ranking may have changed since they were applied); the rest rung takes
        every BE workload they do not hold. Disjoint targets, so each rung's own record undoes
        exactly what it did, in any order."""
        if not rung.widening:
            return None, (), ""
        held: list[str] = []
        for row in self.ledger.rungs(policy):
            if row.rung in rung.siblings and row.status in (DONE, PROPOSED, RUNNING):
                held += [c for c in row.undo.get(TARGETS_KEY, []) if isinstance(c, str)]
        if rung.widening == "rest":
            return None, tuple(held), (
                f"the rest of the BE tier (the suspects {', '.join(held)} are held by the "
                "rungs before)" if held else "the whole BE tier (no suspect was acted on)")
        ranked = [s for s in suspects_of(incident) if s.cgroup not in held]
        if rung.suspect > len(ranked) + len(held) or not ranked:
            return (), (), (f"no suspect #{rung.suspect}: the incident has "
                            f"{len(ranked) + len(held)} (docs/attribution.md)")
        chosen = ranked[0]
        return (chosen.cgroup,), (), (f"suspect #{chosen.rank} {chosen.name} (score "
                                      f"{chosen.score:.2f}, {chosen.resource or 'resource ?'})")

    def _apply(self, policy: Policy, rung: Rung, incident: Incident, now_ns: int,
               attempts: int, reason: str, first_ns: int | None = None) -> StepResult:
        spec = rung.spec
        dry_run = self.dry_run or spec.dry_run
        name = policy.name

        def finish(outcome: tuple[StepResult, bool], at_ns: int, late: bool) -> StepResult:
            result, keep = outcome
            retry_ns = at_ns + backoff_ns(attempts) if result.status == FAILED and \
                result.retry else 0
            row = RungState(name, rung.index, spec.step, result.status, incident.id, dry_run,
                            result.undo, first_ns or now_ns, attempts, retry_ns, spec.record(),
                            result.target, at_ns)
            self._settle(row, incident, "apply", result, reason, at_ns, put=row,
                         keep_intent=keep)
            if result.status == FAILED:
                log.error("policy %s: %s failed: %s%s", name, spec.step, result.detail,
                          " (will retry)" if retry_ns else "")
            return result

        remote = self._remote(spec)
        if remote and (name, rung.index) not in self._jobs:
            # its rung stands as running meanwhile: the next rung's `after` counts from here,
            # and neither a retry nor an undo starts on top of it
            self.ledger.put(RungState(name, rung.index, spec.step, RUNNING, incident.id,
                                      dry_run, {}, first_ns or now_ns, attempts, 0,
                                      spec.record(), f"node/{self.node}", now_ns))
        return self._job((name, rung.index), remote, lambda: self._attempt(
            name, rung, incident, dry_run, now_ns, reason), finish, now_ns) or StepResult(
            RUNNING, f"node/{self.node}", f"{spec.step}: on the API worker")

    def _repeat(self, policy: Policy, rung: Rung, row: RungState, incident: Incident,
                now_ns: int, reason: str) -> None:
        """Apply a rung in force again (`repeat`). A repeat that succeeds gives the step's
        latest account of what is in force and how to undo it (reduce_capacity reduces again
        from a value rewritten since); one that fails or finds nothing to do changes nothing in
        the record: what the rung put in force is still there, and must still be undone."""
        spec = rung.spec
        dry_run = self.dry_run or spec.dry_run

        def finish(outcome: tuple[StepResult, bool], at_ns: int, late: bool) -> None:
            result, keep = outcome
            strength = {DONE: 2, PROPOSED: 1}
            if strength.get(result.status, 0) >= max(strength.get(row.status, 0), 1):
                row.status, row.undo, row.target = result.status, result.undo, result.target
                row.incident, row.dry_run, row.spec = incident.id, dry_run, spec.record()
            row.last_ns = at_ns
            self._settle(row, incident, "apply", result, reason, at_ns, put=row,
                         keep_intent=keep, dry_run=dry_run)
            if result.status == FAILED:
                log.error("policy %s: repeating %s failed: %s", policy.name, spec.step,
                          result.detail)

        self._job((policy.name, rung.index), self._remote(spec), lambda: self._attempt(
            policy.name, rung, incident, dry_run, now_ns, reason), finish, now_ns)

    # -- the API worker --------------------------------------------------------------------

    def _remote(self, spec: StepSpec) -> bool:
        if self._worker is None:
            return False
        return bool(getattr(self._step_or_none(spec), "remote", False))

    def _job(self, key: tuple[str, int], remote: bool, work: Callable[[], Any],
             finish: Callable[[Any, int, bool], Any], now_ns: int) -> Any:
        """`work` now and `finish` its outcome now; or, for a step that talks to the API
        server while there is a worker, `work` there and `finish` on this thread at the first
        tick that finds it done (None meanwhile; None too while the rung's previous job runs).
        Every ledger and incident write but the step's own intents stays on this thread."""
        if not remote:
            return finish(work(), now_ns, False)
        if key not in self._jobs:
            assert self._worker is not None
            self._jobs[key] = (self._worker.submit(work), finish)
        return None

    def _collect(self, now_ns: int) -> None:
        for key, (future, finish) in list(self._jobs.items()):
            if not future.done():
                continue
            del self._jobs[key]
            try:
                finish(future.result(), now_ns, True)
            except Exception as exc:
                self.errors[key[0]] = (f"policy {key[0]!r}: rung {key[1] + 1}: "
                                       f"{exc.__class__.__name__}: {exc}")[:500]
                log.exception("policy %s: settling rung %d failed", key[0], key[1] + 1)

    def close(self) -> None:
        """An API call under way finishes (bounded by its request timeout); its outcome,
        never settled, is reconciled from its intent by the next run."""
        if self._worker is not None:
            self._worker.shutdown(wait=True, cancel_futures=True)

    def _attempt(self, policy: str, rung: Rung, incident: Incident | None, dry_run: bool,
                 now_ns: int, reason: str) -> tuple[StepResult, bool]:
        """Run the step with write-ahead: each change it announces (`ctx.intend`) is in the
        ledger before it is made. A step that fails part-way, or whose intent could not be
        written, has what it changed undone here from that record: a ledger that cannot be
        written means the lever is not applied. True beside the result: the intent stays for
        `_reconcile` (a step that can tell later whether its change happened)."""
        spec = rung.spec
        if not is_standing(policy):
            holder = self._standing_holds(spec, dry_run)
            if holder:
                return self._standing_result(spec, holder), False
        announced: list[dict[str, Any]] = []
        incident_id = incident.id if incident is not None else ""  # none: a standing lever
        only, exclude, narrowed = self._narrowing(policy, rung, incident) \
            if incident is not None else (None, (), "")
        # a suspect rung's intent names its suspects too: a change it dies in is adopted with
        # them, so its sibling rungs still know whom it holds
        held = {TARGETS_KEY: list(only)} if only else {}

        def intend(undo: dict[str, Any]) -> None:
            self.ledger.intend(Intent(policy, rung.index, spec.step, incident_id, spec.record(),
                                      {**undo, **held}, now_ns))
            announced[:] = [undo]

        ctx = self._context(incident_id, dry_run, now_ns, reason,
                            incident.labels.get("resource", "") if incident else "", intend)
        ctx.only, ctx.exclude = only, exclude
        ctx.suspects = suspects_of(incident) if incident is not None else []
        if ctx.only == ():
            return StepResult(SKIPPED, f"node/{self.node}", narrowed), False
        result = self._run(spec, lambda step: step.apply(ctx))
        if narrowed:
            # the target names the narrowing: sibling rungs of one lever hold different
            # cgroups, and must not take each other for "the same lever held twice" on undo
            result.detail = f"{narrowed}: {result.detail}"
            result.target += f" [{', '.join(ctx.only)}]" if ctx.only else " [rest of the tier]"
            if ctx.only:
                result.undo[TARGETS_KEY] = list(ctx.only)
        # a step that announced a change and did not end in force (failed part-way, or
        # skipped after a first write: cpuset enabled in a parent, then the target gone) has
        # what it changed undone from its last intent
        if announced and result.status not in (DONE, PROPOSED):
            step = self._step_or_none(spec)
            if step is not None and hasattr(step, "recover"):
                if result.status != FAILED:
                    return result, False  # its outcome is known: nothing was evicted
                return result, True  # `_reconcile` finds out whether it happened
            undone = self._run(spec, lambda step: step.undo(
                self._context(incident_id, False, now_ns, "the step did not complete"),
                announced[0]))
            if undone.detail and "nothing was changed" not in undone.detail:
                result.detail += f"; what it had changed: {undone.status}: {undone.detail}"
            return result, undone.status == FAILED
        # an attempt that announced nothing has no intent to end (one still pending from an
        # earlier attempt is `_reconcile`'s)
        return result, not announced

    def _settle(self, row: RungState, incident: Incident | None, action: str,
                result: StepResult, reason: str, now_ns: int, put: RungState | None = None,
                remove: bool = False, keep_intent: bool = False,
                dry_run: bool | None = None) -> None:
        """The rung's record, its audit entry and the end of its intent, in one transaction.
        When the ledger cannot take it, a change just made is undone again (nothing may stay
        in force that the ledger does not know of) and the error goes up."""
        if dry_run is None:
            dry_run = row.dry_run or (action == "undo" and row.status == PROPOSED)
        entry = AuditEntry(now_ns + self._skew, self.node, row.incident, row.policy, row.rung,
                           row.kind,
                           action, dry_run, result.status, result.target, result.detail, reason)
        try:
            self.ledger.settle(put=put, remove=(row.policy, row.rung) if remove else None,
                               audit=entry,
                               intent_done=None if keep_intent else (row.policy, row.rung))
        except Exception:
            spec = StepSpec.model_validate(row.spec or {"step": row.kind})
            step = self._step_or_none(spec)
            if step is not None and hasattr(step, "recover"):
                # cannot be undone (an eviction): its intent stays, counts against the budget
                # and is looked up by `_reconcile` once the ledger takes writes again
                log.error("policy %s: %s could not be recorded in the ledger; its intent stays "
                          "for a later look-up", row.policy, row.kind)
            elif action == "apply" and result.status == DONE and not row.dry_run:
                undone = self._run(spec, lambda step: step.undo(
                    self._context(row.incident, False, now_ns,
                                  "the ledger could not record it"), result.undo))
                log.error("policy %s: %s could not be recorded in the ledger; undone: %s: %s",
                          row.policy, row.kind, undone.status, undone.detail)
                if undone.status != FAILED:
                    self._drop_intent(row.policy, row.rung)
            raise
        self.on_audit(entry)
        self._note(incident, row.kind, action, entry.dry_run, result, now_ns)

    def _drop_intent(self, policy: str, rung: int) -> None:
        try:
            self.ledger.drop_intent(policy, rung)
        except Exception as exc:  # left for `_reconcile`, which finds nothing to undo
            log.error("policy %s: rung %d: cannot clear its intent: %s", policy, rung + 1, exc)

    def _step_or_none(self, spec: StepSpec) -> Any:
        try:
            return self.make_step(spec)
        except Exception:
            return None

    def _undo(self, row: RungState, now_ns: int, reason: str) -> bool | None:
        """Undo one rung in force; False when it failed and stays for a retry, None while it
        is on the API worker (the descent then goes on from its outcome)."""
        spec = StepSpec.model_validate(row.spec or {"step": row.kind})
        if row.status in (FAILED, SKIPPED):
            self.ledger.remove(row.policy, row.rung)  # nothing was changed: nothing to undo
            return True
        params = (row.spec or {}).get("params", {})
        others = [r for r in self.ledger.rungs() if r.kind == row.kind and r.target ==
                  row.target and (r.spec or {}).get("params", {}) == params
                  and (r.policy, r.rung) != (row.policy, row.rung) and r.status == DONE]
        ctx = self._context(row.incident, row.dry_run or row.status == PROPOSED, now_ns, reason)
        recorded = {k: v for k, v in row.undo.items() if k not in ("_undo_attempts",
                                                                     TARGETS_KEY)}
        if not is_standing(row.policy) and recorded.get("writes"):
            # a file a standing lever holds stays as it is, whatever this rung's params or
            # target: the standing lever is undone from its own record when it goes
            held = self._standing_files(row.kind)
            recorded["writes"] = [w for w in recorded["writes"] if w.get("file") not in held]

        def work() -> StepResult:
            if row.status == DONE and others:
                return StepResult(SKIPPED, row.target,
                                  f"kept: rung {others[0].rung + 1} of policy "
                                  f"{others[0].policy} still holds {row.kind}")
            return self._run(spec, lambda step: step.undo(ctx, recorded))

        def finish(result: StepResult, at_ns: int, late: bool) -> bool:
            incident = self.load_incident(row.incident)
            if result.status == FAILED:
                row.undo["_undo_attempts"] = row.undo.get("_undo_attempts", 0) + 1
                self._settle(row, incident, "undo", result, reason, at_ns, put=row)
            else:
                self._settle(row, incident, "undo", result, reason, at_ns, remove=True)
            done = result.status != FAILED
            if late and row.policy not in self._was_firing:  # the descent goes on from here
                # everything the policy still has, not only what lies below: a rung taken
                # while this undo ran (interference back) keeps the episode open
                rest = [r for r in self.ledger.rungs(row.policy)]
                self._after_undo(row.policy, self.policies.get(row.policy), rest, row, done,
                                 at_ns)
            return done

        if row.status == DONE and others:
            return finish(work(), now_ns, False)
        return self._job((row.policy, row.rung), self._remote(spec), work, finish, now_ns)

    # -- after a crash ----------------------------------------------------------------------

    def _reconcile(self, firing: list[Incident], now_ns: int) -> None:
        """Intents left over: steps the agent died in (or could not record the outcome of).
        A step that can say whether its change happened (`recover`: evict) is asked, and what
        happened is recorded (an eviction counts against the budget); any other is adopted
        with the originals its intent recorded, as a rung in force, and applied again while
        its policy still fires (apply is idempotent: the lever is then really in force) or
        undone in the descent when it does not. Nothing changed in the crash is left behind
        unknown, and nothing is done twice."""
        rows = {(r.policy, r.rung): r for r in self.ledger.rungs()}
        for key, row in rows.items():
            if row.status == RUNNING and key not in self._jobs:
                # on the API worker of a run that ended: nothing known of it but its intent
                row.status, row.retry_ns = FAILED, now_ns
                self.ledger.put(row)
        intents = [i for i in self.ledger.intents() if (i.policy, i.rung) not in self._jobs]
        self._pending = set()
        if not intents:
            return
        for intent in intents:
            try:
                self._reconcile_one(intent, rows.get((intent.policy, intent.rung)), firing,
                                    now_ns)
            except Exception as exc:
                self.errors[intent.policy] = (f"policy {intent.policy!r}: reconciling "
                                              f"{intent.kind} after a crash: "
                                              f"{exc.__class__.__name__}: {exc}")[:500]
                log.exception("policy %s: reconciling an interrupted %s failed", intent.policy,
                              intent.kind)

    def _reconcile_one(self, intent: Intent, row: RungState | None, firing: list[Incident],
                       now_ns: int) -> None:
        spec = StepSpec.model_validate(intent.spec or {"step": intent.kind})
        step = self._step_or_none(spec)
        incident = self.load_incident(intent.incident)
        reason = "the agent stopped while this step was being applied"
        if step is not None and hasattr(step, "recover"):
            ctx = self._context(intent.incident, False, now_ns, reason)
            result = self._run(spec, lambda s: s.recover(ctx, intent.undo))
            if result.status == FAILED:
                self.errors[intent.policy] = f"policy {intent.policy!r}: {result.detail}"[:500]
                # asked again on the next tick; meanwhile its budget stays spent, and its rung
                # is neither retried nor repeated (that could evict a second pod)
                self._pending.add((intent.policy, intent.rung))
                return
            if result.status != DONE:
                entry = AuditEntry(now_ns + self._skew, self.node, intent.incident, intent.policy,
                                   intent.rung, intent.kind, "apply", False, SKIPPED,
                                   result.target, result.detail, reason)
                self.ledger.settle(audit=entry, intent_done=(intent.policy, intent.rung))
                self.on_audit(entry)
                self._note(incident, intent.kind, "apply", False, result, now_ns)
                return
            undo = result.undo
        else:
            undo = _merged(row.undo if row is not None and row.status == DONE else None,
                           intent.undo)
            result = StepResult(DONE, f"node/{self.node}",
                                "adopted from its intent after the agent stopped mid-apply "
                                "(the values from before are on record)", undo)
        adopted = RungState(intent.policy, intent.rung, intent.kind, DONE, intent.incident,
                            False, undo, row.applied_ns if row is not None else intent.started_ns,
                            row.attempts if row is not None else 1, 0, intent.spec,
                            result.target, now_ns)
        self._settle(adopted, incident, "apply", result, reason, now_ns, put=adopted)
        log.warning("policy %s: rung %d (%s): %s", intent.policy, intent.rung + 1, intent.kind,
                    result.detail)
        policy = self.policies.get(intent.policy)
        under = [i for i in firing if i.policy == intent.policy]
        if step is not None and not hasattr(step, "recover") and policy is not None and under:
            rungs = policy.rungs(self.ledger.episode(policy.name))
            if intent.rung < len(rungs) and rungs[intent.rung].spec.step == intent.kind:
                self._repeat(policy, rungs[intent.rung], adopted, self._driver(under), now_ns,
                             "applied again after the agent stopped mid-apply")

    def _run(self, spec: StepSpec, action: Callable[[Any], StepResult]) -> StepResult:
        target = f"node/{self.node}"
        try:
            step = self.make_step(spec)
        except Exception as exc:
            return StepResult(FAILED, target, f"cannot build the step: {exc}")
        missing = step.available()
        if missing:
            return StepResult(SKIPPED, target, f"unavailable: {missing}")
        try:
            return action(step)
        except Exception as exc:  # a step that raises is a failed step, retried
            return StepResult(FAILED, target, f"{exc.__class__.__name__}: {exc}", retry=True)

    def _note(self, incident: Incident | None, kind: str, action: str, dry_run: bool,
              result: StepResult, now_ns: int) -> None:
        """The action on its incident, where the UI and Slack show it (the audit entry is
        already in the ledger)."""
        if incident is None:
            return
        status = result.status
        if action == "undo" and status == DONE:
            status = UNDONE
        step = kind if action == "apply" else f"undo {kind}"
        incident.actions.append(ActionRecord(now_ns + self._skew, step, result.target, dry_run,
                                             status, result.detail))
        self.save_incident(incident)

    # -- what worked ---------------------------------------------------------------------------

    def _fresh(self, firing: list[Incident], now_ns: int, policy: Policy) -> bool:
        """Whether any incident has had new evidence within `stale_after`. Sample times are
        wall-clock labels: the age of the newest is read off them once, when it first shows
        up, and from then on counted on the timer clock, so a wall clock stepped back does not
        make old evidence look new for an hour."""
        limit = int(policy.spec.stale_after * 1e9)
        fresh = False
        for incident in firing:
            times = [e.time_ns for e in incident.evidence if e.value is not None]
            if not times:
                continue
            newest = max(times)
            seen = self._evidence.get(incident.id)
            if seen is None or seen[0] != newest:
                age = max(0, now_ns + self._skew - newest)
                seen = self._evidence[incident.id] = (newest, now_ns - age)
            fresh = fresh or now_ns - seen[1] <= limit
        return fresh

    def _learn(self, name: str, rows: list[RungState]) -> None:
        """The interference ended: the last lever applied (for real) worked, the ones before it
        in this episode did not. The next episode tries the levers that work here first."""
        policy = self.policies.get(name)
        if policy is None:
            return
        lever_rungs = {r.index for r in policy.rungs(self.ledger.episode(name))
                       if r.lever_group is not None}
        levers = [row for row in rows if row.rung in lever_rungs and row.status == DONE
                  and not row.dry_run]
        if not levers:
            return
        for row in levers[:-1]:
            self.ledger.lever_record(row.kind, worked=False)
        winner = levers[-1]
        self.ledger.lever_record(winner.kind, worked=True)
        incident = self.load_incident(winner.incident)
        if incident is not None:
            incident.annotations["lever_that_worked"] = winner.kind
            self.save_incident(incident)

    def lever_order(self) -> list[str]:
        """Levers by their success rate on this node (untried ones keep the written order)."""
        stats = self.ledger.lever_stats()

        def rate(kind: str) -> float:
            tried, worked = stats.get(kind, (0, 0))
            return worked / tried if tried else -1.0

        ranked = sorted((k for k in stats if stats[k][1] > 0), key=rate, reverse=True)
        return ranked


def _merged(recorded: dict[str, Any] | None, intent: dict[str, Any]) -> dict[str, Any]:
    """A rung in force (`recorded`) that a repeat was changing when the agent died. Per file,
    the intent's record (what the file holds now, or is about to) with the rung's original
    (the value from before sloguard, which undo restores); files only the rung wrote are kept
    as they are; other undo data is the intent's, built by the step from the state in force
    (lists, like cpuset's enabled controllers, are joined)."""
    if not recorded:
        return dict(intent)
    merged = {**recorded, **intent}
    for key, value in recorded.items():
        if key != "writes" and isinstance(value, list) and isinstance(intent.get(key), list):
            merged[key] = value + [v for v in intent[key] if v not in value]
    if "writes" in recorded or "writes" in intent:
        first = {w.get("file"): w for w in recorded.get("writes", [])}
        writes = []
        for write in intent.get("writes", []):
            earlier = first.pop(write.get("file"), None)
            if earlier is not None:
                write = {**write, "old": earlier["old"],
                         **({"also": earlier["also"]} if "also" in earlier else {})}
            writes.append(write)
        merged["writes"] = list(first.values()) + writes
    return merged
