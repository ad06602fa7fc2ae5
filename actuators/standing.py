"""Standing levers: a policy's levers kept in force at all times, not only during an episode.

Koordinator keeps BE at the lowest CPU priority (group identity, cpu.idle) all the time, and the
lab measured why one would: an episode's first second is unprotected when the first lever waits
for the rule that fires on LS latency, and SCHED_IDLE costs BE nothing measurable while LS is
idle (docs/lab.md, "Standing levers"). A policy's `standing:` levers are therefore reconciled on
every tick of the ladder, not when an incident fires:

- applied to every BE workload the collector knows, within the tick that discovers a new one
  (an apply is idempotent, and a reconcile that changes nothing writes nothing: no ledger row,
  no audit entry); with the same workloads as at its last check, it is checked again only every
  STANDING_CHECK (a value someone reset is put back within it): re-reading every BE cgroup's
  file on every tick was a sixth of the agent's tick (docs/performance.md, "Cost on a node",
  benchmarks/agent_overhead.py);
- recorded in the ledger like any rung (policy `standing:<name>`, write-ahead, so a crash
  leaves nothing unknown in force), shown in the UI, /api/policies and /readyz;
- undone when the configuration drops them (the policy removed, the lever removed or its
  params changed); a policy file that fails to load keeps its last good standing levers;
- the ladder starts from them: a rung of the same lever and params is skipped as already in
  force (it costs no hold, the next lever follows at once), and no descent or relapse probe
  ever lifts a standing lever (an undo of a same-kind rung keeps what a standing lever holds).
"""

from __future__ import annotations

import logging
from typing import Any

from sloguard.actuators.cgroupfs import params_key
from sloguard.actuators.ledger import RungState
from sloguard.actuators.policy import Rung, StepSpec
from sloguard.actuators.step import DONE, FAILED, PROPOSED, SKIPPED, StepResult, backoff_ns

log = logging.getLogger(__name__)

STANDING_HELD = "_standing"  # in a skipped rung's record: the standing lever holds it
STANDING_CHECK_NS = 5_000_000_000  # a full re-check of a standing lever with no new workload
STANDING = "standing:"  # the ledger's policy name for a policy's standing levers: a prefix no
#                         policy name can take (names are [A-Za-z0-9_.-])


def is_standing(ledger_policy: str) -> bool:
    return ledger_policy.startswith(STANDING)


def _error_key(key: tuple[str, int]) -> str:
    """Where a standing lever's trouble shows (the ladder's errors, /readyz): one per lever."""
    return f"{key[0]}#{key[1] + 1}"


def _key_of(error_key: str) -> tuple[str, int]:
    policy, _, number = error_key.rpartition("#")
    return policy, int(number) - 1 if number.isdigit() else -1


class StandingLevers:
    """A mixin of the Ladder (actuators/ladder.py): it shares its write-ahead apply, its
    settling in the ledger and its undo, which keeps what two holders hold."""

    def _stand(self: Any, now_ns: int) -> None:
        wanted: dict[tuple[str, int], tuple[str, StepSpec]] = {}
        for policy in self.policies.active:
            for i, spec in enumerate(policy.spec.standing):
                wanted[(STANDING + policy.name, i)] = (policy.name, spec)
        rows = {(r.policy, r.rung): r for r in self.ledger.rungs() if is_standing(r.policy)}
        for key, row in rows.items():
            if key in self._jobs:
                continue
            want = wanted.get(key)
            if want is None or (row.spec or {}) != want[1].record():
                wanted.pop(key, None)  # applied anew once the old one is off
                if now_ns < self._standing_due.get(key, 0):
                    continue  # its undo failed: tried again after its back-off
                why = (f"the standing {row.kind} of policy {row.policy[len(STANDING):]} is "
                       + ("no longer configured" if want is None else "configured anew"))
                try:
                    done = self._undo(row, now_ns, why)
                except Exception as exc:
                    done = False
                    log.exception("%s: undo failed", why)
                    self.errors[_error_key(key)] = f"{why}: undo failed: {exc}"[:500]
                if done is False:
                    attempts = int(row.undo.get("_undo_attempts", 1))
                    self._standing_due[key] = now_ns + backoff_ns(attempts)
                    self.errors.setdefault(_error_key(key), f"{why}: its undo failed; "
                                                            "tried again after a back-off")
                else:
                    self._standing_due.pop(key, None)
                    self.errors.pop(_error_key(key), None)
        for key in [k for k in self.errors if is_standing(k)]:
            if (k := _key_of(key)) not in wanted and k not in rows:
                del self.errors[key]  # gone with its lever
        for key, (name, spec) in wanted.items():
            try:
                self._stand_one(key, name, spec, rows.get(key), now_ns)
            except Exception as exc:  # one lever's trouble must not stop the ladder
                self.errors[_error_key(key)] = (f"standing {spec.step} of policy {name!r}: "
                                                f"{exc.__class__.__name__}: {exc}")[:500]
                log.exception("policy %s: the standing %s failed", name, spec.step)

    def _stand_one(self: Any, key: tuple[str, int], name: str, spec: StepSpec,
                   row: RungState | None, now_ns: int) -> None:
        """Apply it, again, every tick: what a re-apply finds already in force it leaves and
        records nothing of; only a change (a new BE workload, a value someone reset, a first
        apply, a failure) reaches the ledger and the audit."""
        dry_run = self.dry_run or spec.dry_run
        if row is not None and row.retry_ns and now_ns < row.retry_ns:
            return  # failed: tried again after its back-off
        if row is not None and row.status == DONE and not row.dry_run and dry_run:
            # dry-run switched on while it is in force: like a ladder rung, it stays as it is
            # (a dry re-apply would record it as proposed and lose what undo needs)
            return
        seen = self._workloads_seen()
        # SKIPPED too: a node with no BE workload yet had its lever applied on every tick
        # (the cgroup layout parsed twice each time, 1.1 of the idle agent's 6.3 ms a tick in
        # benchmarks/agent_tick.py --cgroups 0); a BE workload that appears changes `seen`
        if seen is not None and row is not None and row.status in (DONE, PROPOSED, SKIPPED) and \
                row.dry_run == dry_run and not row.retry_ns and \
                (checked := self._standing_checked.get(key)) is not None and \
                checked[0] == seen and 0 <= now_ns - checked[1] < STANDING_CHECK_NS:
            return  # the same BE workloads as at its last check, a few seconds ago
        reason = f"standing lever of policy {name}: kept in force on every BE workload"
        self._standing_checked[key] = (seen, now_ns)
        result, keep = self._attempt(key[0], Rung(key[1], spec), None, dry_run, now_ns, reason)
        if result.status == FAILED or "not done:" in result.detail:
            self.errors[_error_key(key)] = (f"standing {spec.step} of policy {name!r}: "
                                            f"{result.detail}")[:500]
        else:
            self.errors.pop(_error_key(key), None)
        if row is not None and keep and result.status == row.status and \
                result.undo == row.undo and row.dry_run == dry_run:
            return  # nothing announced (`keep`: no intent of its own to end), as it was
        attempts = (row.attempts + 1) if row is not None and result.status == FAILED else 1
        if result.status == FAILED and row is not None and row.status in (DONE, PROPOSED):
            # what the lever holds stays on record (and is undone from it); retried later
            row.attempts, row.retry_ns, row.last_ns = attempts, now_ns + backoff_ns(attempts), \
                now_ns
            self._settle(row, None, "apply", result, reason, now_ns, put=row, keep_intent=keep)
            return
        retry_ns = now_ns + backoff_ns(attempts) if result.status == FAILED else 0
        new = RungState(key[0], key[1], spec.step, result.status, "", dry_run, result.undo,
                        row.applied_ns if row is not None and row.status == result.status
                        else now_ns, attempts, retry_ns, spec.record(), result.target, now_ns)
        if row is not None and result.status == row.status and row.dry_run == dry_run:
            reason = f"{reason} (reconciled: what it holds changed)"
        self._settle(new, None, "apply", result, reason, now_ns, put=new, keep_intent=keep)
        if result.status == SKIPPED and (row is None or row.status != SKIPPED):
            log.info("policy %s: standing %s: %s", name, spec.step, result.detail)

    def _workloads_seen(self: Any) -> frozenset[tuple[tuple[str, str], ...]] | None:
        """What a standing lever's reach depends on: every workload's tags (a BE one that
        appears, an LS pod that lands in a BE cgroup; discovery's tags, stable between ticks).
        None when the inventory cannot be read: the lever is then checked in full."""
        try:  # tags in the collector's order: another order is a full check, never a miss
            return frozenset(tuple(w.items()) for w in self.inventory())
        except Exception:
            log.debug("the inventory could not be read for the standing levers", exc_info=True)
            return None

    def release_standing(self: Any, now_ns: int) -> None:
        """The agent is stopping: its standing levers go with it, so that a node whose agent
        was removed is not left with BE at the lowest priority and nobody to keep or lift it
        (a crash leaves them on record instead: the next run adopts them). A rolling update
        leaves BE without them for the seconds between the two agents."""
        for row in self.ledger.rungs():
            if not is_standing(row.policy) or row.status not in (DONE, PROPOSED):
                continue
            try:
                self._undo(row, now_ns, "the agent is stopping: its standing levers go with it")
            except Exception:
                log.exception("%s: cannot lift its standing %s at stop", row.policy, row.kind)

    def _standing_files(self: Any, kind: str) -> set[str]:
        """The files standing levers of this kind hold now (in force, for real)."""
        return {str(w.get("file")) for row in self.ledger.rungs()
                if is_standing(row.policy) and row.kind == kind and row.status == DONE
                and not row.dry_run for w in row.undo.get("writes", [])}

    def _standing_holds(self: Any, spec: StepSpec, dry_run: bool) -> str:
        """The standing lever that already holds what a ladder rung of `spec` would do: the
        same kind and params, in force (or proposed, for a rung in dry-run)."""
        key = params_key(spec.params)
        for row in self.ledger.rungs():
            if not is_standing(row.policy) or row.kind != spec.step:
                continue
            if params_key((row.spec or {}).get("params", {})) != key:
                continue
            if row.status == DONE or (row.status == PROPOSED and dry_run):
                return row.policy[len(STANDING):]
        return ""

    def _standing_result(self: Any, spec: StepSpec, holder: str) -> StepResult:
        """Skipped, but in force: the next lever waits its hold from here, as if this rung had
        just put the lever on (it is the episode's first chance to show whether it is enough;
        measured: without the hold the ladder went straight to cpuset at firing and BE kept
        39% instead of 68%, docs/lab.md)."""
        return StepResult(SKIPPED, f"node/{self.node}",
                          f"{spec.step}: already in force as a standing lever of policy "
                          f"{holder}: nothing to add; its hold runs from here",
                          {STANDING_HELD: holder})
