"""FORMAT TESTS: the levers' cgroup v2 writes against a tree in the documented v2 formats
(Documentation/admin-guide/cgroup-v2.rst), because this host mounts the cpu, cpuset and memory
controllers as v1 (test_levers_real.py runs them on the real v1 hierarchy). These check which
files are written, with what syntax, and what undo puts back; they say nothing about what the
kernel does with the values. Also: parameter validation, and the cpulist and budget maths."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.cgroup_trees import v1_tree, v2_tree
from support.levers import context, keep, make_env, workload

from sloguard.actuators.cpu_idle import CpuIdle
from sloguard.actuators.cpu_quota import CpuQuota
from sloguard.actuators.cpuset import Cpuset
from sloguard.actuators.kinds import BUILTIN_STEPS, StepFactory
from sloguard.actuators.ledger import Ledger
from sloguard.actuators.memory_limit import MemoryLimit
from sloguard.actuators.policy import StepSpec
from sloguard.actuators.step import DONE, FAILED, PROPOSED, SKIPPED
from sloguard.core.cpulist import format_cpulist, parse_cpulist

UID = "0b6f8c4e_7d3a_4c59_9a3e_2f1d8a6b5c4d"
BE_QOS = "kubepods.slice/kubepods-besteffort.slice"
BE_POD = f"{BE_QOS}/kubepods-besteffort-pod{UID}.slice"
LS_POD = "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod5a1e0c2d_9b8f_4e7a_" \
         "8c6d_3f2e1d0c9b8a.slice"


def _read(path: Path) -> str:
    return path.read_text().strip()


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    return v2_tree(tmp_path / "cgroup", [BE_POD, LS_POD])


def _inventory() -> list[dict[str, str]]:
    return [workload(BE_POD, "BE", level="pod"), workload(LS_POD, "LS", level="pod")]


def test_cpu_idle_v2_on_the_besteffort_qos_cgroup(tree, tmp_path):
    step = CpuIdle({}, make_env(tmp_path, tree))
    result = step.apply(context(_inventory()))
    assert result.status == DONE, result.detail
    assert _read(tree / BE_QOS / "cpu.idle") == "1"  # where BE meets the LS pods
    assert _read(tree / BE_POD / "cpu.idle") == "0"
    assert _read(tree / LS_POD / "cpu.idle") == "0"
    [record] = result.undo["writes"]
    assert record["also"] == {str(tree / BE_QOS / "cpu.weight"): "100"}
    # as str(Path) gives it: the records of an agent from before string paths still match
    assert record["file"] == str(tree / BE_QOS / "cpu.idle")
    assert step.undo(context(_inventory()), result.undo).status == DONE
    assert _read(tree / BE_QOS / "cpu.idle") == "0"


def test_cpu_idle_v2_falls_back_to_the_minimum_weight_without_cpu_idle(tmp_path):
    tree = v2_tree(tmp_path / "cgroup", [BE_POD, LS_POD], {BE_QOS: {"cpu.idle": None}})
    step = CpuIdle({}, make_env(tmp_path, tree))
    result = step.apply(context(_inventory()))
    assert result.status == DONE, result.detail
    assert _read(tree / BE_QOS / "cpu.weight") == "1"
    assert "minimum weight instead" in result.detail
    assert step.undo(context(_inventory()), result.undo).status == DONE
    assert _read(tree / BE_QOS / "cpu.weight") == "100"
    only_idle = CpuIdle({"mode": "idle"}, make_env(tmp_path, tree)).apply(
        context(_inventory()))
    assert only_idle.status == FAILED and "cpu.idle absent" in only_idle.detail
    assert _read(tree / BE_QOS / "cpu.weight") == "100"


def test_cpu_idle_v2_without_the_cpu_controller_fails_and_writes_nothing(tmp_path):
    tree = v2_tree(tmp_path / "cgroup", [BE_POD], {
        BE_QOS: {"cpu.idle": None, "cpu.weight": None, "cpu.max": None}})
    result = CpuIdle({}, make_env(tmp_path, tree)).apply(
        context([workload(BE_POD, "BE", level="pod")]))
    assert result.status == FAILED and result.retry and result.undo == {}
    assert "cpu controller not enabled" in result.detail


def test_cpuset_v2_writes_the_be_cgroup_and_restores_inherit(tree, tmp_path):
    step = Cpuset({"ls_cpus": "0-1"}, make_env(tmp_path, tree))
    result = step.apply(context(_inventory()))
    assert result.status == DONE, result.detail
    assert _read(tree / BE_POD / "cpuset.cpus") == "2-3"
    assert _read(tree / LS_POD / "cpuset.cpus") == ""
    assert result.undo["enabled"] == []
    assert step.undo(context(_inventory()), result.undo).status == DONE
    assert _read(tree / BE_POD / "cpuset.cpus") == ""  # empty: inherit the parent's again


class KernelLikeCpuset(Cpuset):
    """What the kernel does on a cgroup.subtree_control write, replayed on the format tree:
    the controller is listed for the parent's children and their cpuset files appear."""

    def _subtree_control(self, path: Path, change: str) -> None:
        enabled = set(_read(path).split())
        enabled.add("cpuset") if change == "+cpuset" else enabled.discard("cpuset")
        path.write_text(" ".join(sorted(enabled)) + "\n")
        for child in (p for p in path.parent.iterdir() if p.is_dir()):
            listed = set(_read(child / "cgroup.controllers").split())
            listed.add("cpuset") if change == "+cpuset" else listed.discard("cpuset")
            (child / "cgroup.controllers").write_text(" ".join(sorted(listed)) + "\n")
            if change == "+cpuset":
                (child / "cpuset.cpus").write_text("\n")
            else:
                (child / "cpuset.cpus").unlink()


def test_cpuset_v2_enables_the_controller_in_the_parent_and_disables_it_on_undo(tmp_path):
    tree = v2_tree(tmp_path / "cgroup", [BE_POD, LS_POD], {
        BE_QOS: {"cgroup.subtree_control": "cpu memory"},
        BE_POD: {"cgroup.controllers": "cpu memory", "cpuset.cpus": None}})
    step = KernelLikeCpuset({"ls_cpus": [0]}, make_env(tmp_path, tree))
    proposed = step.apply(context(_inventory(), dry_run=True))
    assert proposed.status == PROPOSED
    assert "would enable cpuset" in proposed.detail and "cpuset.cpus = 1-3" in proposed.detail
    assert _read(tree / BE_QOS / "cgroup.subtree_control") == "cpu memory"
    result = step.apply(context(_inventory()))
    assert result.status == DONE, result.detail
    assert _read(tree / BE_QOS / "cgroup.subtree_control") == "cpu cpuset memory"
    assert _read(tree / BE_POD / "cpuset.cpus") == "1-3"
    assert step.undo(context(_inventory()), result.undo).status == DONE
    assert _read(tree / BE_QOS / "cgroup.subtree_control") == "cpu memory"


def test_cpuset_v2_does_not_enable_the_controller_in_a_parent_holding_ls(tmp_path):
    tree = v2_tree(tmp_path / "cgroup", ["lab/be", "lab/ls"], {
        "lab/be": {"cgroup.controllers": "cpu memory", "cpuset.cpus": None}})
    inventory = [workload("lab/be", "BE"), workload("lab/ls", "LS")]
    before = _read(tree / "lab" / "cgroup.subtree_control")
    result = KernelLikeCpuset({"reserve": 1}, make_env(tmp_path, tree)).apply(
        context(inventory))
    assert result.status == SKIPPED and "holds the LS workload /lab/ls" in result.detail
    assert _read(tree / "lab" / "cgroup.subtree_control") == before


def test_cpu_quota_v2_cpu_max_on_the_qos_cgroup(tree, tmp_path):
    params = {"capacity_cores": 4, "threshold_percent": 50, "sample": "20ms"}
    env = make_env(tmp_path, tree)
    step = CpuQuota(params, env)
    result = step.apply(context(_inventory()))
    assert result.status == DONE, result.detail
    # the tree's counters do not move: nothing but BE used CPU; 4 x 50% = 2 cores
    assert _read(tree / BE_QOS / "cpu.max") == "200000 100000"
    assert _read(tree / BE_POD / "cpu.max") == "max 100000"
    assert _read(tree / LS_POD / "cpu.max") == "max 100000"
    keep(env, "cpu_quota", params, result)
    again = CpuQuota(params, env).apply(context(_inventory()))
    assert again.undo["writes"][0]["old"] == "max 100000"
    assert step.undo(context(_inventory()), again.undo).status == DONE
    assert _read(tree / BE_QOS / "cpu.max") == "max 100000"


def test_cpu_quota_splits_the_budget_over_workloads_and_respects_a_tighter_quota(tmp_path):
    tree = v2_tree(tmp_path / "cgroup", ["lab/be/a", "lab/be/b", "lab/ls"],
                   {"lab/be/b": {"cpu.max": "20000 100000"}})
    inventory = [workload("lab/be/a", "BE"), workload("lab/be/b", "BE"),
                 workload("lab/ls", "LS")]
    result = CpuQuota({"capacity_cores": 2, "threshold_percent": 100, "sample": "20ms"},
                      make_env(tmp_path, tree)).apply(context(inventory))
    assert result.status == DONE, result.detail
    assert _read(tree / "lab/be/a" / "cpu.max") == "100000 100000"  # 2 cores / 2 cgroups
    assert _read(tree / "lab/be/b" / "cpu.max") == "20000 100000"  # already tighter: theirs
    assert "already limited to 0.20 cores" in result.detail


def test_memory_high_v2_above_usage_and_back_to_max(tree, tmp_path):
    step = MemoryLimit({}, make_env(tmp_path, tree))
    result = step.apply(context(_inventory()))
    assert result.status == DONE, result.detail
    assert int(_read(tree / BE_POD / "memory.high")) == 120 << 20  # 100 MiB used x 1.2
    assert _read(tree / BE_POD / "memory.max") == "max"  # never the OOM-killing limit
    assert _read(tree / LS_POD / "memory.high") == "max"
    assert step.undo(context(_inventory()), result.undo).status == DONE
    assert _read(tree / BE_POD / "memory.high") == "max"


def test_memory_floor_and_an_existing_lower_limit(tmp_path):
    tree = v2_tree(tmp_path / "cgroup", ["lab/small", "lab/capped"], {
        "lab/small": {"memory.current": str(1 << 20)},
        "lab/capped": {"memory.high": str(50 << 20)}})
    inventory = [workload("lab/small", "BE"), workload("lab/capped", "BE")]
    result = MemoryLimit({"min_bytes": "64MiB"}, make_env(tmp_path, tree)).apply(
        context(inventory))
    assert int(_read(tree / "lab/small" / "memory.high")) == 64 << 20
    assert _read(tree / "lab/capped" / "memory.high") == str(50 << 20)
    assert "already" in result.detail


def test_v1_soft_limit_option(tmp_path):
    tree = v1_tree(tmp_path / "cgroup", ["lab/be"])
    result = MemoryLimit({"v1": "soft"}, make_env(tmp_path, tree)).apply(
        context([workload("lab/be", "BE")]))
    assert result.status == DONE, result.detail
    memory = tree / "memory" / "lab/be"
    assert int(_read(memory / "memory.soft_limit_in_bytes")) == 120 << 20
    assert _read(memory / "memory.limit_in_bytes") == "9223372036854771712"


def test_cpulists():
    assert parse_cpulist("0-3,8,10-11\n") == [0, 1, 2, 3, 8, 10, 11]
    assert format_cpulist([11, 0, 1, 2, 3, 8, 10]) == "0-3,8,10-11"
    assert format_cpulist([]) == "" and parse_cpulist("") == []
    with pytest.raises(ValueError, match="not a CPU range: '3-1'"):
        parse_cpulist("3-1")
    with pytest.raises(ValueError, match="not a CPU list entry: 'a'"):
        parse_cpulist("0,a")


def test_reserve_never_leaves_be_without_a_cpu(tmp_path):
    step = Cpuset({"reserve": 8}, make_env(tmp_path))
    assert step.split([0, 1, 2, 3]) == ([0, 1, 2], "")
    assert Cpuset({}, make_env(tmp_path)).split([0, 1, 2]) == ([0, 1], "")
    assert "nothing to separate" in step.split([0])[1]
    assert "BE would have none" in Cpuset({"ls_cpus": [0, 1]}, make_env(tmp_path)).split(
        [0, 1])[1]


@pytest.mark.parametrize(("kind", "params", "message"), [
    ("cpu_idle", {"mode": "nice"}, "mode must be"),
    ("cpu_idle", {"scope": "node"}, "scope must be"),
    ("cpu_idle", {"level": 1}, "unknown cpu_idle parameter"),
    ("cpuset", {"ls_cpus": [0], "reserve": 1}, "not both"),
    ("cpuset", {"ls_cpus": "a-b"}, "ls_cpus must be"),
    ("cpuset", {"ls_cpus": []}, "ls_cpus is empty"),
    ("cpuset", {"reserve": 0}, "reserve must be"),
    ("cpu_quota", {"threshold_percent": 150}, "threshold_percent must be"),
    ("cpu_quota", {"min_cores": 0}, "min_cores must be"),
    ("cpu_quota", {"period_us": 10}, "period_us must be"),
    ("cpu_quota", {"sample": "1h"}, "sample must be"),
    ("memory_limit", {"factor": 0.5}, "never below current usage"),
    ("memory_limit", {"min_bytes": "lots"}, "not a size"),
    ("memory_limit", {"v1": "hard"}, "v1 must be"),
    ("resctrl", {"l3_percent": 0}, "l3_percent must be"),
    ("resctrl", {"group": "../x"}, "group must be"),
    ("resctrl", {"l3_percent": None, "mb_percent": None}, "nothing to restrict"),
])
def test_bad_params_reject_the_policy(tmp_path, kind, params, message):
    factory = StepFactory(make_env(tmp_path))
    with pytest.raises(ValueError, match=message):
        factory.check(StepSpec(step=kind, params=params))


def test_every_lever_is_registered(tmp_path):
    factory = StepFactory(make_env(tmp_path))
    for kind in ("cpu_idle", "cpuset", "cpu_quota", "memory_limit", "resctrl"):
        assert kind in BUILTIN_STEPS
        factory.check(StepSpec(step=kind))  # the defaults are valid
        assert factory.type_of(kind).kind == kind
    assert isinstance(make_env(tmp_path).ledger, Ledger)


def test_auto_scope_writes_be_pods_one_by_one_when_the_qos_cgroup_holds_an_ls_pod(tmp_path):
    labelled_ls = f"{BE_QOS}/kubepods-besteffort-pod5a1e0c2d_9b8f_4e7a_8c6d_3f2e1d0c9b8a.slice"
    tree = v2_tree(tmp_path / "cgroup", [BE_POD, labelled_ls])
    inventory = [workload(BE_POD, "BE", level="pod"), workload(labelled_ls, "LS", level="pod")]
    result = CpuIdle({}, make_env(tmp_path, tree)).apply(context(inventory))
    assert result.status == DONE, result.detail
    assert _read(tree / BE_QOS / "cpu.idle") == "0"
    assert _read(tree / BE_POD / "cpu.idle") == "1"
    assert _read(tree / labelled_ls / "cpu.idle") == "0"


def test_an_error_on_one_cgroup_keeps_what_was_done_for_the_others(tmp_path):
    tree = v1_tree(tmp_path / "cgroup", ["good/be", "bad/be"])
    (tree / "cpuset" / "bad" / "cpuset.cpus").write_text("garbage\n")
    inventory = [workload("good/be", "BE"), workload("bad/be", "BE")]
    step = Cpuset({"ls_cpus": [0]}, make_env(tmp_path, tree))
    result = step.apply(context(inventory))
    assert result.status == DONE, result.detail
    assert "/bad/be: ValueError" in result.detail
    assert [r["cgroup"] for r in result.undo["writes"]] == ["/good/be"]
    assert _read(tree / "cpuset" / "good/be" / "cpuset.cpus") == "1-3"
    assert step.undo(context(inventory), result.undo).status == DONE
    assert _read(tree / "cpuset" / "good/be" / "cpuset.cpus") == "0-3"


def test_a_controller_path_is_the_path_the_undo_records_of_pathlib_named(tree):
    """Changes.set keys its undo records by the file's path as a string, and an agent from
    before string paths wrote str(Path): the two must agree for every hierarchy, a root of
    "/" included (pathlib gives "/kubepods", a plain join "//kubepods": an earlier apply's
    record would not be found, and the lever's own value taken for the original)."""
    from sloguard.actuators.cgroupfs import Cgroups
    from sloguard.core.cgroup_layout import CgroupLayout

    cgroups = Cgroups(tree)
    for hierarchy in (Path("/"), tree, Path("/sys/fs/cgroup")):
        cgroups.layout = CgroupLayout("v2", {}, hierarchy)
        for parts in ((), ("kubepods.slice",), tuple(BE_POD.split("/"))):
            expected = str(hierarchy.joinpath(*parts))
            assert cgroups.controller_path("cpu", parts) == (expected, "v2"), (hierarchy, parts)
            assert cgroups.controller_dir("cpu", parts) == (Path(expected), "v2")
        cgroups.layout = CgroupLayout("v1", {"cpu": hierarchy / "cpu"}, None)
        assert cgroups.controller_path("cpu", ("a",)) == (str(hierarchy / "cpu" / "a"), "v1")
