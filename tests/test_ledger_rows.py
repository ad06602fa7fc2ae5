"""Ledger.rungs() hands out rows decoded on first read: each call's rows must still be its own.

The ladder changes a row it was given (its undo, its attempts) before the write that records
the change; when that write fails, nobody else may see the change. These tests fail if rows
(or their undo and spec) are shared between calls, cached past a write, or decoded differently
from what was put.
"""

from __future__ import annotations

import dataclasses

import pytest

from sloguard.actuators.ledger import Ledger, RungState
from sloguard.core import failpoints


def _row(**changes: object) -> RungState:
    row = RungState("standing:p", 0, "cpu_idle", "done", "", False,
                    {"writes": [{"file": "/sys/fs/cgroup/be/cpu.idle", "old": "0", "wrote": "1"}]},
                    10, spec={"step": "cpu_idle", "params": {"mode": "auto"}}, target="node/n",
                    last_ns=12)
    return dataclasses.replace(row, **changes)


def test_rows_read_back_as_put(tmp_path):
    ledger = Ledger(tmp_path / "ledger.db")
    ledger.put(_row())
    ledger.put(_row(policy="other", rung=2, spec=None, undo={}))
    rows = ledger.rungs()
    assert rows == [_row(policy="other", rung=2, spec={}, undo={}), _row()]
    assert dataclasses.asdict(rows[1]) == dataclasses.asdict(_row())
    assert ledger.rungs("standing:p") == [_row()]


def test_a_row_changed_by_a_caller_is_not_seen_by_the_next(tmp_path):
    ledger = Ledger(tmp_path / "ledger.db")
    ledger.put(_row())
    first = ledger.rungs()[0]
    first.undo["writes"].append({"file": "x", "old": "1", "wrote": "2"})
    first.undo["_undo_attempts"] = 3
    first.spec["params"]["mode"] = "weight"
    first.attempts = 9
    again = ledger.rungs()[0]
    assert again == _row()
    assert again.undo is not first.undo and again.spec is not first.spec
    # nor by a row of the same call decoded later, nor one never read before the change
    unread, other = ledger.rungs()[0], ledger.rungs()[0]
    other.undo.clear()
    assert unread.undo == _row().undo


def test_a_change_whose_write_fails_stays_with_its_caller(tmp_path, monkeypatch):
    ledger = Ledger(tmp_path / "ledger.db")
    ledger.put(_row())
    row = ledger.rungs()[0]
    row.undo["_undo_attempts"] = 2  # as the ladder marks an undo that failed, then records it

    def refuse(name: str) -> None:
        if name == "ledger.settle:before":
            raise OSError("disk full")

    monkeypatch.setattr(failpoints, "hit", refuse)
    with pytest.raises(OSError):
        ledger.put(row)
    assert ledger.rungs()[0].undo == _row().undo
    monkeypatch.undo()
    ledger.put(row)  # and once it is written, every later call sees it
    assert ledger.rungs()[0].undo["_undo_attempts"] == 2


def test_a_field_set_before_its_first_read_wins(tmp_path):
    ledger = Ledger(tmp_path / "ledger.db")
    ledger.put(_row())
    row = ledger.rungs()[0]
    row.undo = {"writes": []}  # assigned without reading the stored one first
    row.spec = None
    assert row.undo == {"writes": []} and row.spec is None
    assert vars(row)["undo"] == {"writes": []}
