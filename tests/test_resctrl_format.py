"""The resctrl rung.

This machine has no resctrl (no CONFIG_X86_CPU_RESCTRL, no RDT flags in the VM's CPU), so:
- on the real machine, the step must say so at run time and the ladder must skip it with that
  reason (the first tests);
- FORMAT TESTS (the rest) run it against a directory tree in the formats of
  Documentation/arch/x86/resctrl.rst (info/L3/cbm_mask, min_cbm_bits, num_closids, info/MB/
  min_bandwidth, bandwidth_gran, the right-aligned schemata lines, tasks). The tree is files, not
  a kernel: a small subclass replays what the kernel does on mkdir and rmdir of a group (its
  files appear and go); nothing here shows what the hardware does with the masks.
"""

from __future__ import annotations

import errno
from pathlib import Path

import pytest
from support.cgroup_trees import v1_tree
from support.levers import context, keep, make_env, workload
from support.resctrl_tree import KernelLikeResctrl, resctrl_tree

from sloguard.actuators.kinds import StepFactory
from sloguard.actuators.ladder import Ladder
from sloguard.actuators.policy import PolicySet
from sloguard.actuators.resctrl import Resctrl, be_mask, mb_value, parse_schemata
from sloguard.actuators.step import DONE, FAILED, PROPOSED, SKIPPED
from sloguard.core.incidents import FIRING, Evidence, Incident
from sloguard.store.incidents_db import IncidentStore

REAL_ROOT = Path("/sys/fs/resctrl")


def _cpu_flags() -> set[str]:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            return set(line.partition(":")[2].split())
    return set()


# -- the real machine ------------------------------------------------------------------------


def test_on_this_machine_the_step_says_why_it_cannot_run(tmp_path):
    step = Resctrl({}, make_env(tmp_path))  # the real /sys/fs/resctrl
    missing = step.available()
    if (REAL_ROOT / "info").is_dir():
        assert missing is None  # a node with resctrl mounted
        return
    assert missing is not None and missing.startswith(
        "resctrl is not mounted at /sys/fs/resctrl")
    if not _cpu_flags() & {"rdt_a", "cat_l3", "mba"}:
        assert "this CPU has no RDT/L3 CAT" in missing


def test_the_ladder_skips_it_with_that_reason_and_changes_nothing(tmp_path):
    if (REAL_ROOT / "info").is_dir():
        pytest.skip("resctrl is mounted here: there is no absence to report")
    (tmp_path / "policies").mkdir()
    (tmp_path / "policies" / "p.yaml").write_text(
        "policies:\n  - name: llc\n    steps:\n      - step: resctrl\n")
    env = make_env(tmp_path)
    factory = StepFactory(env)
    policies = PolicySet([str(tmp_path / "policies")], validate_step=factory.check)
    assert policies.reload().ok, policies.errors
    incidents = IncidentStore(tmp_path / "incidents.db")
    ladder = Ladder("node-a", policies, env.ledger, factory.make, incidents.save, incidents.get,
                    dry_run=False)
    now = 1_800_000_000 * 1_000_000_000
    incident = Incident("inc-1", "f", "LSCacheStall", "ls", "critical", "node-a", FIRING, {},
                        now, now, fired_ns=now, policy="llc")
    incident.add_evidence(Evidence(now, 30.0, 10.0, "crossed"))
    incidents.save(incident)
    ladder.tick(now, [incident])
    [row] = env.ledger.rungs()
    assert row.kind == "resctrl" and row.status == SKIPPED
    [entry] = env.ledger.audit_log()
    assert entry.status == SKIPPED
    assert "unavailable: resctrl is not mounted at /sys/fs/resctrl" in entry.detail
    assert not REAL_ROOT.exists() or not (REAL_ROOT / "sloguard-be").exists()


# -- format tests --------------------------------------------------------------------------


BE_POD = "kubepods/besteffort/pod0b6f8c4e-7d3a-4c59-9a3e-2f1d8a6b5c4d"
LS_POD = "kubepods/burstable/pod5a1e0c2d-9b8f-4e7a-8c6d-3f2e1d0c9b8a"


@pytest.fixture
def nodes(tmp_path: Path) -> tuple[Path, Path]:
    """(resctrl root, cgroup v1 root) with BE threads 101-103 and LS threads 201-202."""
    cgroups = v1_tree(tmp_path / "cgroup", [BE_POD, f"{BE_POD}/{'ab' * 32}", LS_POD],
                      {BE_POD: [101], f"{BE_POD}/{'ab' * 32}": [102, 103],
                       LS_POD: [201, 202]})
    return resctrl_tree(tmp_path / "resctrl"), cgroups


def _inventory() -> list[dict[str, str]]:
    return [workload(BE_POD, "BE", level="pod"), workload(LS_POD, "LS", level="pod")]


def _lines(path: Path) -> list[str]:
    return path.read_text().split()


def test_schemata_and_tasks_in_the_documented_formats_and_undo(nodes, tmp_path):
    root, cgroups = nodes
    step = KernelLikeResctrl({}, make_env(tmp_path, cgroups, root))
    assert step.available() is None
    result = step.apply(context(_inventory()))
    assert result.status == DONE, result.detail
    group = root / "sloguard-be"
    schemata = parse_schemata((group / "schemata").read_text())
    assert schemata["L3"] == {"0": "3f", "1": "3f"}  # 30% of 20 ways: the lowest 6
    assert schemata["MB"] == {"0": "50", "1": "50"}
    assert sorted(_lines(group / "tasks"), key=int) == ["101", "102", "103"]  # one per write
    assert "201" not in _lines(group / "tasks") and "202" not in _lines(group / "tasks")
    assert result.undo["created"] is True

    lifted = step.undo(context(_inventory()), result.undo)
    assert lifted.status == DONE, lifted.detail
    assert not group.exists()
    assert _lines(root / "tasks")[-3:] == ["101", "102", "103"]  # back to the root group


def test_cdp_min_cbm_bits_and_bandwidth_steps(tmp_path):
    root = resctrl_tree(tmp_path / "resctrl", cdp=True, cbm="7ff", min_bits="4")
    cgroups = v1_tree(tmp_path / "cgroup", [BE_POD], {BE_POD: [101]})
    step = KernelLikeResctrl({"l3_percent": 10, "mb_percent": 33},
                             make_env(tmp_path, cgroups, root))
    result = step.apply(context([workload(BE_POD, "BE")]))
    assert result.status == DONE, result.detail
    schemata = parse_schemata((root / "sloguard-be" / "schemata").read_text())
    assert schemata["L3CODE"] == schemata["L3DATA"] == {"0": "f", "1": "f"}  # 4 bits at least
    assert schemata["MB"] == {"0": "40", "1": "40"}  # 10 + N x 10, rounded up


def test_masks_and_steps():
    assert be_mask("fffff", 1, 30) == "3f"
    assert be_mask("ff0", 2, 10) == "30"  # contiguous, inside the valid mask
    assert be_mask("f", 1, 100) == "f"
    assert mb_value(5, 10, 10) == 10 and mb_value(55, 10, 10) == 60 and mb_value(100, 20, 1) == 100
    assert parse_schemata("    L3:0=fffff;1=ff\n    MB:0=100;1=  16\n") == {
        "L3": {"0": "fffff", "1": "ff"}, "MB": {"0": "100", "1": "16"}}


def test_mb_in_absolute_units_is_not_treated_as_a_percentage(tmp_path):
    root = resctrl_tree(tmp_path / "resctrl", mb="2048")  # AMD: 1/8 GB/s units
    cgroups = v1_tree(tmp_path / "cgroup", [BE_POD], {BE_POD: [101]})
    result = KernelLikeResctrl({}, make_env(tmp_path, cgroups, root)).apply(
        context([workload(BE_POD, "BE")]))
    assert result.status == DONE
    assert "MB is not in percent here" in result.detail
    assert parse_schemata((root / "sloguard-be" / "schemata").read_text())["MB"]["0"] == "100"


def test_apply_again_moves_new_threads_only_and_keeps_what_undo_needs(nodes, tmp_path):
    root, cgroups = nodes
    env = make_env(tmp_path, cgroups, root)
    step = KernelLikeResctrl({}, env)
    first = step.apply(context(_inventory()))
    keep(env, "resctrl", {}, first)
    (cgroups / "cpu" / BE_POD / "tasks").write_text("101\n104\n")  # a new thread
    again = step.apply(context(_inventory()))
    assert again.status == DONE, again.detail
    assert "1 BE threads" in again.detail and "3 already there" in again.detail
    assert again.undo["created"] is True
    assert sorted(m["tid"] for m in again.undo["moved"]) == [101, 102, 103, 104]
    assert step.undo(context(_inventory()), again.undo).status == DONE
    assert not (root / "sloguard-be").exists()


def test_a_group_that_existed_is_adopted_restored_and_kept(nodes, tmp_path):
    root, cgroups = nodes
    step = KernelLikeResctrl({}, make_env(tmp_path, cgroups, root))
    step._mkdir(root / "sloguard-be")  # made by someone before the first apply
    (root / "sloguard-be" / "schemata").write_text("L3:0=ff;1=ff\nMB:0=70;1=70\n")
    result = step.apply(context(_inventory()))
    assert result.status == DONE and "adopted" in result.detail
    assert step.undo(context(_inventory()), result.undo).status == DONE
    assert (root / "sloguard-be").is_dir()
    restored = parse_schemata((root / "sloguard-be" / "schemata").read_text())
    assert restored["L3"] == {"0": "ff", "1": "ff"} and restored["MB"] == {"0": "70", "1": "70"}


def test_a_schemata_changed_since_is_left_alone(nodes, tmp_path):
    root, cgroups = nodes
    step = KernelLikeResctrl({}, make_env(tmp_path, cgroups, root))
    result = step.apply(context(_inventory()))
    with open(root / "sloguard-be" / "schemata", "a") as handle:
        handle.write("L3:0=ffff\n")
    lifted = step.undo(context(_inventory()), result.undo)
    assert lifted.status == DONE and "left as it is" in lifted.detail
    assert (root / "sloguard-be").is_dir()


def test_no_free_closid_fails_without_pretending(nodes, tmp_path):
    root, cgroups = nodes
    step = KernelLikeResctrl({}, make_env(tmp_path, cgroups, root))
    step.fail_mkdir = errno.ENOSPC
    result = step.apply(context(_inventory()))
    assert result.status == FAILED and "no free CLOSID" in result.detail
    assert not (root / "sloguard-be").exists()


def test_dry_run_creates_nothing(nodes, tmp_path):
    root, cgroups = nodes
    step = KernelLikeResctrl({}, make_env(tmp_path, cgroups, root))
    result = step.apply(context(_inventory(), dry_run=True))
    assert result.status == PROPOSED
    assert "would create" in result.detail and "L3:0=3f;1=3f" in result.detail
    assert "move 3 BE threads" in result.detail
    assert not (root / "sloguard-be").exists()


def test_a_tree_without_cat_or_mba_is_reported_as_such(tmp_path):
    root = tmp_path / "resctrl"
    (root / "info" / "L3_MON").mkdir(parents=True)  # monitoring only
    (root / "schemata").write_text("")
    (root / "tasks").write_text("")
    missing = Resctrl({}, make_env(tmp_path, resctrl_root=root)).available()
    assert missing is not None and "no RDT/L3 CAT" in missing
    no_mba = resctrl_tree(tmp_path / "other", mb=None)
    assert Resctrl({"l3_percent": None}, make_env(tmp_path, resctrl_root=no_mba)).available() \
        == "this CPU has no MBA: resctrl has no info/MB"
