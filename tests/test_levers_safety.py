"""Property: no lever ever writes under, at or above an LS workload's cgroup, whatever the
inventory; and apply then undo leaves every cgroup file as it was.

Random inventories mix LS and BE workloads at random paths (kubelet-like ones included, BE
nested in LS and LS nested in BE), on a v1 or a v2 tree in the documented file formats (these
are files, not a kernel; test_levers_real.py covers the real hierarchy), with the resctrl rung
on a resctrl tree. Two broken contexts are tried too: one whose be_workloads() also returns the
LS workloads, one that even relabels them BE; the levers must refuse those by themselves
(class re-check, and the LS set taken from the whole inventory).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.cgroup_trees import snapshot, v1_tree, v2_tree
from support.levers import make_env
from support.resctrl_tree import KernelLikeResctrl, resctrl_tree

from sloguard.actuators.cpu_idle import CpuIdle
from sloguard.actuators.cpu_quota import CpuQuota
from sloguard.actuators.cpuset import Cpuset
from sloguard.actuators.memory_limit import MemoryLimit
from sloguard.actuators.step import BE, StepContext

SEGMENTS = ["kubepods", "besteffort", "burstable", "kubepods.slice", "kubepods-besteffort.slice",
            "pod0b6f8c4e-7d3a-4c59-9a3e-2f1d8a6b5c4d", "lab", "a", "b", "c"]
CLASSES = ["BE", "BE", "LS", "LSR"]  # anything but BE is protected

paths = st.lists(st.sampled_from(SEGMENTS), min_size=1, max_size=4).map("/".join)
inventories = st.dictionaries(paths, st.sampled_from(CLASSES), min_size=1, max_size=6)


class BrokenContext(StepContext):
    """A context with a bug in it: be_workloads() leaks LS workloads (optionally as BE)."""

    relabel: bool = False

    def be_workloads(self) -> list[dict[str, str]]:
        leaked = [dict(w) for w in self.inventory()]
        if self.relabel:
            for w in leaked:
                w["class"] = BE
        return leaked


def _steps(env) -> list:
    return [
        CpuIdle({}, env), CpuIdle({"mode": "weight", "scope": "parent"}, env),
        Cpuset({"reserve": 1}, env), Cpuset({"ls_cpus": [0, 1]}, env),
        CpuQuota({"sample": "10ms", "capacity_cores": 4}, env),
        CpuQuota({"sample": "10ms", "capacity_cores": 4, "scope": "parent"}, env),
        MemoryLimit({}, env), KernelLikeResctrl({}, env),
    ]


def _cgroup_of(file: Path, root: Path, v1: bool) -> tuple[str, ...]:
    parts = file.parent.relative_to(root).parts
    return parts[1:] if v1 else parts


def _related(a: tuple[str, ...], b: tuple[str, ...]) -> bool:
    n = min(len(a), len(b))
    return a[:n] == b[:n]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(inventory=inventories, v1=st.booleans(), broken=st.sampled_from(["", "leak", "relabel"]))
def test_no_lever_writes_an_ls_cgroup(inventory, v1, broken):
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        threads, tid = {}, 100
        for path in inventory:
            threads[path] = [tid, tid + 1]
            tid += 2
        rels = list(inventory)
        root = (v1_tree(tmp_path / "cgroup", rels, threads) if v1
                else v2_tree(tmp_path / "cgroup", rels, threads=threads))
        resctrl = resctrl_tree(tmp_path / "resctrl")
        env = make_env(tmp_path, root, resctrl)
        workloads = [{"cgroup": "/" + p, "class": c, "level": "cgroup"}
                     for p, c in inventory.items()]
        protected = [tuple(p.split("/")) for p, c in inventory.items() if c != BE]
        ls_threads = {t for p, c in inventory.items() if c != BE for t in threads[p]}

        def ctx() -> StepContext:
            cls = BrokenContext if broken else StepContext
            made = cls("node-a", 0, False, "inc-1", "property", lambda: workloads)
            if broken == "relabel":
                made.relabel = True
            return made

        before = snapshot(root)
        for step in _steps(env):
            result = step.apply(ctx())
            assert result.status != "failed" or not result.undo.get("writes"), result.detail
            after = snapshot(root)
            for name in set(before) | set(after):
                if before.get(name, "").split() == after.get(name, "").split():
                    continue
                cgroup = _cgroup_of(Path(name), root, v1)
                bad = [p for p in protected if _related(cgroup, p)]
                assert not bad, f"{step.kind} wrote {name}, related to LS {bad}: {result.detail}"
            group_tasks = resctrl / "sloguard-be" / "tasks"
            if group_tasks.exists():
                assert not set(map(int, group_tasks.read_text().split())) & ls_threads
            undone = step.undo(ctx(), result.undo)
            assert undone.status != "failed", undone.detail
            restored = snapshot(root)
            assert {k: v.split() for k, v in restored.items()} == {
                k: v.split() for k, v in before.items()}, f"{step.kind} undo: {undone.detail}"


def test_the_class_is_checked_even_when_the_inventory_does_not_know_the_workload(tmp_path):
    """The second line of defence on its own: an LS workload handed over as a target, and no
    inventory entry that would make it protected."""
    root = v2_tree(tmp_path / "cgroup", ["lab/x"], threads={"lab/x": [7]})
    env = make_env(tmp_path, root, resctrl_tree(tmp_path / "resctrl"))

    class Leaky(StepContext):
        def be_workloads(self) -> list[dict[str, str]]:
            return [{"cgroup": "/lab/x", "class": "LS", "level": "cgroup"}]

    before = snapshot(root)
    for step in _steps(env):
        result = step.apply(Leaky("node-a", 0, False, "inc-1", "leak", list))
        assert result.status == "skipped" and "is not BE" in result.detail, result.detail
    assert snapshot(root) == before
    assert not (tmp_path / "resctrl" / "sloguard-be").exists()
