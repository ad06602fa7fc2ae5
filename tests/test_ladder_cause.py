"""The end of an episode (docs/actuators.md): levers kept while the cause their rule names is
still present (the lever works: lifting it lets the interference back), every one lifted in the
same tick once the cause is gone, and the old one-per-undo_hold descent where nothing tells."""

from __future__ import annotations

import pytest
from test_ladder import (  # noqa: F401 - _clean: the fixture
    CALLS,
    POLICY,
    Harness,
    LeverA,
    LeverB,
    Mark,
    _clean,
)

UNDONE_ALL = [("undo", n, False) for n in ("last", "cpuset", "cpu_idle", "second", "first")]


@pytest.fixture(autouse=True)
def _local_levers(monkeypatch):
    """The suppress step's two levers act on BE workloads (per_workload), as cpu_idle and
    cpuset do; the marks around them stand for cordon and the other steps beyond the node."""
    monkeypatch.setattr(LeverA, "per_workload", True, raising=False)
    monkeypatch.setattr(LeverB, "per_workload", True, raising=False)


def _climbed(tmp_path, policy: str = POLICY) -> tuple[Harness, dict[str, bool | None]]:
    """Every rung in force at 30 s; `cause["now"]` is what the engine says of the cause."""
    h = Harness(tmp_path, policy)
    cause: dict[str, bool | None] = {"now": True}
    h.ladder.cause_present = lambda name: cause["now"] if name == "guard" else None
    incident = h.incident(0)
    for second in (0, 10, 15, 20, 30):
        h.tick(second, [incident])
    assert [c[1] for c in CALLS] == ["first", "second", "cpu_idle", "cpuset", "last"]
    CALLS.clear()
    return h, cause


def test_levers_stay_while_the_cause_is_present_and_all_go_when_it_is_gone(tmp_path):
    h, cause = _climbed(tmp_path)
    for second in range(31, 700, 7):  # LS recovered under the levers, BE still runs
        h.tick(second, [])
    # what reaches beyond the node comes down as before; the levers on BE stay (no relapse
    # probe either)
    assert CALLS == [("undo", "last", False)]
    cause["now"] = False  # BE stopped
    h.tick(701, [])
    assert CALLS == UNDONE_ALL  # the rest in one tick, in reverse
    assert h.ledger.rungs() == [] and h.ledger.episode("guard") is None


def test_a_cause_gone_at_the_recovery_lifts_everything_at_once_and_no_relapse_backs_off(
        tmp_path):
    h, cause = _climbed(tmp_path)
    cause["now"] = False
    h.tick(31, [])
    assert CALLS == UNDONE_ALL
    CALLS.clear()
    cause["now"] = True  # a new antagonist 5 s later: within relapse_window, not a relapse
    again = h.incident(36)
    h.tick(36, [again])
    cause["now"] = False
    h.tick(37, [])
    assert CALLS == [("apply", "first", False), ("undo", "first", False)]


def test_a_failed_undo_is_retried_after_its_back_off_not_on_every_tick(tmp_path):
    h, cause = _climbed(tmp_path)
    cause["now"] = False
    Mark.undo_fail_times = 1
    h.tick(31, [])
    assert CALLS == []  # the last rung's undo failed: the walk stops there
    h.tick(32, [])
    h.tick(35, [])
    assert CALLS == []
    h.tick(36, [])  # 5 s later
    assert CALLS == UNDONE_ALL


def test_without_a_cause_or_with_keep_while_cause_false_one_rung_per_undo_hold(tmp_path):
    h, _ = _climbed(tmp_path, POLICY.replace("    undo_hold: 10s",
                                                 "    undo_hold: 10s\n"
                                                 "    keep_while_cause: false"))
    for second in (31, 35, 41):
        h.tick(second, [])
    assert [c[1] for c in CALLS] == ["last", "cpuset"]
    (tmp_path / "b").mkdir()
    CALLS.clear()
    h2, cause2 = _climbed(tmp_path / "b")
    cause2["now"] = None  # no rule names the cause
    for second in (31, 35, 41):
        h2.tick(second, [])
    assert [c[1] for c in CALLS] == ["last", "cpuset"]


def test_an_escalation_waits_for_the_interference_confirmed_on_fresh_samples(tmp_path):
    """Agent.confirm_interference: BE's last sample may predate the antagonist's end; the next
    lever goes on only when the rules judged on fresh samples still say so (the first rung,
    at firing, is not held back)."""
    h = Harness(tmp_path)
    confirmed = {"now": False}
    asked: list[str] = []

    def confirm(name: str) -> bool:
        asked.append(name)
        return confirmed["now"]

    h.ladder.confirm = confirm
    incident = h.incident(0)
    h.tick(0, [incident])
    assert [c[1] for c in CALLS] == ["first"] and asked == []
    h.tick(10, [incident])  # the second rung is due: on fresh samples it is over
    assert [c[1] for c in CALLS] == ["first"] and asked == ["guard"]
    confirmed["now"] = True
    h.tick(11, [incident])
    assert [c[1] for c in CALLS] == ["first", "second"]
