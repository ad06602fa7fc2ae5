"""The suppression levers on this machine's real cgroups (v1 controllers here): each one applied
beside a busy BE and an LS process, measured, and lifted with the original values back.

The run-queue measurements pin BE and LS to the same CPU, give their common parent a weight
that keeps the other programs on this shared 2-CPU machine from dominating the LS probe's wait,
alternate lever-off and lever-on windows, and compare medians with a wide margin (measured
ratios are in docs/actuators.md); a lever that does nothing fails them.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from conftest import need
from support.levers import (
    LS_PROBE,
    context,
    keep,
    last_cpu,
    make_env,
    median,
    paired_waits,
    status_field,
    workload,
)

from sloguard.actuators.cpu_idle import CpuIdle
from sloguard.actuators.cpu_quota import CpuQuota
from sloguard.actuators.cpuset import Cpuset
from sloguard.actuators.memory_limit import MemoryLimit
from sloguard.actuators.step import DONE, PROPOSED, SKIPPED

BE_UID = "0b6f8c4e-7d3a-4c59-9a3e-2f1d8a6b5c4d"
LS_UID = "5a1e0c2d-9b8f-4e7a-8c6d-3f2e1d0c9b8a"


def _dir(real_cgroups, controller: str, rel: str) -> Path:
    need(controller in real_cgroups.layout.v1, f"a v1 {controller} hierarchy (this host's)")
    return real_cgroups.layout.v1[controller] / rel


def _read(path: Path) -> str:
    return path.read_text().strip()


def _pinned_pair(real_cgroups) -> tuple[str, str]:
    """BE and LS as siblings on CPU 0 under a parent of raised weight (see the module doc)."""
    need("cpuset" in real_cgroups.layout.v1 and "cpu" in real_cgroups.layout.v1,
         "v1 cpu and cpuset hierarchies (this host's)")
    need(len(_read(real_cgroups.layout.v1["cpuset"] / "cpuset.effective_cpus")) > 1,
         "two CPUs")
    real_cgroups.use_cpuset()
    arena = real_cgroups.create("arena")
    real_cgroups.write(arena, "cpu.shares", "16384")
    be, ls = real_cgroups.create("arena/be"), real_cgroups.create("arena/ls")
    for rel in (be, ls):
        real_cgroups.write(rel, "cpuset.cpus", "0")
    return be, ls


def _measure(probe_pid: int, apply, undo) -> tuple[list[float], list[float]]:
    """Up to three rounds of paired windows; the first whose medians show the lever wins."""
    for _ in range(3):
        without, with_lever = paired_waits(probe_pid, apply, undo)
        if median(with_lever) < 0.5 * median(without):
            break
    return without, with_lever


def test_cpu_idle_lets_ls_run_first_and_undo_restores_idle_and_weight(real_cgroups, tmp_path):
    be, ls = _pinned_pair(real_cgroups)
    real_cgroups.write(be, "cpu.shares", "2048")  # cpu.idle resets it: undo must put it back
    hog = real_cgroups.spawn(be)
    probe = real_cgroups.spawn(ls, LS_PROBE)
    inventory = [workload(be, "BE"), workload(ls, "LS")]
    env = make_env(tmp_path)
    step = CpuIdle({}, env)
    cpu_be, cpu_ls = _dir(real_cgroups, "cpu", be), _dir(real_cgroups, "cpu", ls)

    result = step.apply(context(inventory))
    assert result.status == DONE, result.detail
    assert _read(cpu_be / "cpu.idle") == "1"
    assert _read(cpu_be / "cpu.shares") == "3"  # the kernel's idle weight
    assert _read(cpu_ls / "cpu.idle") == "0" and _read(cpu_ls / "cpu.shares") == "1024"
    [record] = result.undo["writes"]
    assert record["old"] == "0" and record["wrote"] == "1"
    assert record["also"] == {str(cpu_be / "cpu.shares"): "2048"}

    lifted = step.undo(context(inventory), result.undo)
    assert lifted.status == DONE, lifted.detail
    assert _read(cpu_be / "cpu.idle") == "0"
    assert _read(cpu_be / "cpu.shares") == "2048"  # not the 1024 the kernel puts back

    time.sleep(0.3)
    without, with_idle = _measure(
        probe.pid, lambda: step.apply(context(inventory)),
        lambda: step.undo(context(inventory), result.undo))
    print(f"\nLS run-queue wait per timeslice (us), BE busy on the same CPU: no lever "
          f"{[round(w) for w in without]}, cpu.idle {[round(w) for w in with_idle]}: medians "
          f"{median(without):.0f} -> {median(with_idle):.0f}")
    assert median(with_idle) < 0.5 * median(without)
    assert hog.poll() is None  # BE still runs: SCHED_IDLE slows, never stops it
    assert _read(cpu_be / "cpu.idle") == "0" and _read(cpu_be / "cpu.shares") == "2048"


def test_minimum_weight_mode_and_its_effect(real_cgroups, tmp_path):
    be, ls = _pinned_pair(real_cgroups)
    real_cgroups.spawn(be)
    probe = real_cgroups.spawn(ls, LS_PROBE)
    inventory = [workload(be, "BE"), workload(ls, "LS")]
    step = CpuIdle({"mode": "weight"}, make_env(tmp_path))
    cpu_be = _dir(real_cgroups, "cpu", be)
    result = step.apply(context(inventory))
    assert result.status == DONE, result.detail
    assert _read(cpu_be / "cpu.shares") == "2" and _read(cpu_be / "cpu.idle") == "0"
    assert step.undo(context(inventory), result.undo).status == DONE
    assert _read(cpu_be / "cpu.shares") == "1024"
    time.sleep(0.3)
    without, with_weight = paired_waits(
        probe.pid, lambda: step.apply(context(inventory)),
        lambda: step.undo(context(inventory), result.undo))
    print(f"\nLS run-queue wait per timeslice (us): no lever {median(without):.0f}, "
          f"cpu.shares=2 {median(with_weight):.0f}")
    assert _read(cpu_be / "cpu.shares") == "1024"


def test_cpuset_moves_be_off_the_ls_core_and_back(real_cgroups, tmp_path):
    be, ls = _pinned_pair(real_cgroups)
    hogs = [real_cgroups.spawn(be) for _ in range(2)]
    probe = real_cgroups.spawn(ls, LS_PROBE)
    inventory = [workload(be, "BE"), workload(ls, "LS")]
    step = Cpuset({"ls_cpus": [0]}, make_env(tmp_path))
    cpuset_be, cpuset_ls = _dir(real_cgroups, "cpuset", be), _dir(real_cgroups, "cpuset", ls)
    time.sleep(0.2)
    assert {status_field(h.pid, "Cpus_allowed_list") for h in hogs} == {"0"}

    result = step.apply(context(inventory))
    assert result.status == DONE, result.detail
    assert _read(cpuset_be / "cpuset.cpus") == "1"
    assert _read(cpuset_ls / "cpuset.cpus") == "0"  # LS is never written
    assert {status_field(h.pid, "Cpus_allowed_list") for h in hogs} == {"1"}
    seen = set()
    for _ in range(20):
        seen.update(last_cpu(h.pid) for h in hogs)
        time.sleep(0.02)
    assert seen == {1}  # BE never ran on the LS core again
    assert step.undo(context(inventory), result.undo).status == DONE
    assert _read(cpuset_be / "cpuset.cpus") == "0"
    assert {status_field(h.pid, "Cpus_allowed_list") for h in hogs} == {"0"}

    # The LS wait is measured and reported, not asserted: on this 2-CPU machine, the load
    # balancer moves other programs' tasks onto the core that BE left, and they delay the probe
    # as much as BE did in some windows (docs/actuators.md).
    without, separated = paired_waits(probe.pid, lambda: step.apply(context(inventory)),
                                      lambda: step.undo(context(inventory), result.undo))
    print(f"\nLS run-queue wait per timeslice (us): no lever {[round(w) for w in without]}, "
          f"cpuset {[round(w) for w in separated]}: medians {median(without):.0f} -> "
          f"{median(separated):.0f}")
    assert _read(cpuset_be / "cpuset.cpus") == "0"


def test_cpuset_v1_narrows_a_kubelet_pod_subtree_children_first(real_cgroups, tmp_path):
    need("cpuset" in real_cgroups.layout.v1, "a v1 cpuset hierarchy (this host's)")
    need(len(_read(real_cgroups.layout.v1["cpuset"] / "cpuset.effective_cpus")) > 1,
         "two CPUs")
    real_cgroups.use_cpuset()
    pod = real_cgroups.create(f"kubepods/besteffort/pod{BE_UID}")
    container = real_cgroups.create(f"kubepods/besteffort/pod{BE_UID}/{'ab' * 32}")
    ls_pod = real_cgroups.create(f"kubepods/burstable/pod{LS_UID}")
    hog = real_cgroups.spawn(container)
    real_cgroups.spawn(ls_pod, "import time\nwhile True: time.sleep(0.1)")
    inventory = [workload(pod, "BE", level="pod", qos="besteffort"),
                 workload(ls_pod, "LS", level="pod", qos="burstable")]
    step = Cpuset({}, make_env(tmp_path))  # default: reserve half the CPUs, rounded up
    cpuset = real_cgroups.layout.v1["cpuset"]
    before = {rel: _read(cpuset / rel / "cpuset.cpus") for rel in (pod, container, ls_pod)}
    qos = _read(cpuset / pod.rsplit("/", 1)[0] / "cpuset.cpus")

    result = step.apply(context(inventory))
    assert result.status == DONE, result.detail
    assert "LS cores 0" in result.detail
    assert _read(cpuset / container / "cpuset.cpus") == "1"
    assert _read(cpuset / pod / "cpuset.cpus") == "1"
    assert [w["cgroup"] for w in result.undo["writes"]] == [f"/{container}", f"/{pod}"]
    assert _read(cpuset / pod.rsplit("/", 1)[0] / "cpuset.cpus") == qos  # the parent stays
    assert _read(cpuset / ls_pod / "cpuset.cpus") == before[ls_pod]
    assert status_field(hog.pid, "Cpus_allowed_list") == "1"

    assert step.undo(context(inventory), result.undo).status == DONE  # parent first, then child
    assert {rel: _read(cpuset / rel / "cpuset.cpus") for rel in before} == before
    assert status_field(hog.pid, "Cpus_allowed_list") == before[container]


def test_cpu_quota_throttles_be_and_is_lifted(real_cgroups, tmp_path):
    be, ls = real_cgroups.create("be"), real_cgroups.create("ls")
    for _ in range(2):
        real_cgroups.spawn(be)
    real_cgroups.spawn(ls, "import time\nwhile True: time.sleep(0.01)")
    inventory = [workload(be, "BE"), workload(ls, "LS")]
    env = make_env(tmp_path)
    # 2 CPUs x 10% - what the rest uses is below the 0.2-core floor: the floor it is, so the
    # two busy loops exceed it however busy the other programs keep this machine
    params = {"threshold_percent": 10, "min_cores": 0.2, "sample": "300ms"}
    step = CpuQuota(params, env)
    cpu = _dir(real_cgroups, "cpu", be)
    original = (_read(cpu / "cpu.cfs_quota_us"), _read(cpu / "cpu.cfs_period_us"))
    assert original[0] == "-1"

    result = step.apply(context(inventory))
    assert result.status == DONE, result.detail
    print(f"\n{result.detail}")
    assert _read(cpu / "cpu.cfs_quota_us") == "20000", result.detail
    assert "2 cores x 10% - " in result.detail and "= 0.20 cores" in result.detail
    assert _read(_dir(real_cgroups, "cpu", ls) / "cpu.cfs_quota_us") == "-1"

    def throttled() -> int:
        stat = dict(line.split() for line in (cpu / "cpu.stat").read_text().splitlines())
        return int(stat["nr_throttled"])

    first = throttled()
    time.sleep(1.0)
    assert throttled() - first >= 5  # two busy loops on 20 ms per 100 ms period

    keep(env, "cpu_quota", params, result)  # the ladder's row; then `repeat` applies again
    again = step.apply(context(inventory))
    assert again.status == DONE, again.detail
    quota_record = [r for r in again.undo["writes"] if r["file"].endswith("cfs_quota_us")]
    assert quota_record[0]["old"] == "-1"  # the original, not the quota of the first apply

    lifted = step.undo(context(inventory), again.undo)
    assert lifted.status == DONE, lifted.detail
    assert (_read(cpu / "cpu.cfs_quota_us"), _read(cpu / "cpu.cfs_period_us")) == original
    first = throttled()
    time.sleep(0.5)
    assert throttled() == first


def test_cpu_quota_goes_on_the_besteffort_qos_cgroup(real_cgroups, tmp_path):
    pod = real_cgroups.create(f"kubepods/besteffort/pod{BE_UID}")
    container = real_cgroups.create(f"kubepods/besteffort/pod{BE_UID}/{'cd' * 32}")
    ls_pod = real_cgroups.create(f"kubepods/burstable/pod{LS_UID}")
    for _ in range(2):
        real_cgroups.spawn(container)
    inventory = [workload(pod, "BE", level="pod"), workload(ls_pod, "LS", level="pod")]
    step = CpuQuota({"min_cores": 0.3, "sample": "200ms", "threshold_percent": 40},
                    make_env(tmp_path))
    qos = _dir(real_cgroups, "cpu", pod.rsplit("/", 1)[0])
    result = step.apply(context(inventory))
    assert result.status == DONE, result.detail
    assert [r["cgroup"] for r in result.undo["writes"]] == ["/" + pod.rsplit("/", 1)[0]]
    assert int(_read(qos / "cpu.cfs_quota_us")) > 0
    assert _read(_dir(real_cgroups, "cpu", pod) / "cpu.cfs_quota_us") == "-1"
    assert _read(_dir(real_cgroups, "cpu", ls_pod) / "cpu.cfs_quota_us") == "-1"
    stat = (qos / "cpu.stat").read_text()
    time.sleep(0.8)
    assert (qos / "cpu.stat").read_text() != stat
    assert step.undo(context(inventory), result.undo).status == DONE
    assert _read(qos / "cpu.cfs_quota_us") == "-1"


def _allocating_be(real_cgroups, mib: int = 64):
    be = real_cgroups.create("be")
    real_cgroups.spawn(be, f"import time\nb = b'x' * ({mib} << 20)\nwhile True: time.sleep(1)")
    usage = _dir(real_cgroups, "memory", be) / "memory.usage_in_bytes"
    deadline = time.monotonic() + 10
    while int(_read(usage)) < (mib - 4) << 20 and time.monotonic() < deadline:
        time.sleep(0.05)
    return be


def test_memory_limit_sits_above_usage_and_is_restored(real_cgroups, tmp_path):
    be = _allocating_be(real_cgroups)
    ls = real_cgroups.create("ls")
    inventory = [workload(be, "BE"), workload(ls, "LS")]
    env, params = make_env(tmp_path), {"factor": 1.5, "min_bytes": "16MiB"}
    step = MemoryLimit(params, env)
    memory = _dir(real_cgroups, "memory", be)
    original = _read(memory / "memory.limit_in_bytes")

    result = step.apply(context(inventory))
    assert result.status == DONE, result.detail
    usage = int(_read(memory / "memory.usage_in_bytes"))
    limit = int(_read(memory / "memory.limit_in_bytes"))
    assert usage <= limit <= 2 * usage and limit < int(original)
    assert _read(_dir(real_cgroups, "memory", ls) / "memory.limit_in_bytes") == original
    time.sleep(0.5)
    assert real_cgroups.procs[0].poll() is None  # above usage: nothing was OOM-killed
    assert "oom_kill 0" in (memory / "memory.oom_control").read_text()

    keep(env, "memory_limit", params, result)  # the ladder's row; then a `repeat`
    repeat = step.apply(context(inventory))  # recomputed from usage now, the original kept
    assert repeat.status == DONE, repeat.detail
    assert repeat.undo["writes"][0]["old"] == original
    assert int(_read(memory / "memory.limit_in_bytes")) >= int(
        _read(memory / "memory.usage_in_bytes"))

    assert step.undo(context(inventory), repeat.undo).status == DONE
    assert _read(memory / "memory.limit_in_bytes") == original


def test_undo_leaves_a_value_someone_changed_since(real_cgroups, tmp_path):
    be = _allocating_be(real_cgroups, 32)
    inventory = [workload(be, "BE")]
    step = MemoryLimit({"factor": 2.0}, make_env(tmp_path))
    memory = _dir(real_cgroups, "memory", be)
    result = step.apply(context(inventory))
    assert result.status == DONE, result.detail
    theirs = str(int(_read(memory / "memory.limit_in_bytes")) + (8 << 20))
    (memory / "memory.limit_in_bytes").write_text(theirs)  # an operator raised it meanwhile
    lifted = step.undo(context(inventory), result.undo)
    assert lifted.status == DONE
    assert "someone changed it since" in lifted.detail
    assert _read(memory / "memory.limit_in_bytes") == theirs


def test_dry_run_writes_nothing_and_says_what_it_would_write(real_cgroups, tmp_path):
    real_cgroups.use_cpuset()
    be, ls = real_cgroups.create("be"), real_cgroups.create("ls")
    real_cgroups.spawn(be)
    inventory = [workload(be, "BE"), workload(ls, "LS")]
    env = make_env(tmp_path)
    files = [_dir(real_cgroups, "cpu", be) / name for name in
             ("cpu.idle", "cpu.shares", "cpu.cfs_quota_us", "cpu.cfs_period_us")]
    files += [_dir(real_cgroups, "memory", be) / "memory.limit_in_bytes",
              _dir(real_cgroups, "cpuset", be) / "cpuset.cpus"]
    before = {f: _read(f) for f in files}
    for step in (CpuIdle({}, env), Cpuset({}, env), CpuQuota({"sample": "100ms"}, env),
                 MemoryLimit({}, env)):
        result = step.apply(context(inventory, dry_run=True))
        assert result.status == PROPOSED, (step.kind, result.detail)
        assert "would write" in result.detail, result.detail
        undo = step.undo(context(inventory, dry_run=True), result.undo)
        assert undo.status in (PROPOSED, DONE), undo.detail
    assert {f: _read(f) for f in files} == before


def test_a_vanished_cgroup_is_skipped_not_a_failure(real_cgroups, tmp_path):
    be = real_cgroups.create("be")
    gone = f"{real_cgroups.prefix}/pod-that-exited"
    env = make_env(tmp_path)
    only_gone = CpuIdle({}, env).apply(context([workload(gone, "BE")]))
    assert only_gone.status == SKIPPED and "gone" in only_gone.detail
    for step in (CpuQuota({"sample": "50ms"}, env), MemoryLimit({}, env)):
        assert step.apply(context([workload(gone, "BE")])).status == SKIPPED
    both = CpuIdle({}, env).apply(context([workload(be, "BE"), workload(gone, "BE")]))
    assert both.status == DONE and "gone" in both.detail
    assert _read(_dir(real_cgroups, "cpu", be) / "cpu.idle") == "1"
    undo = CpuIdle({}, env).undo(context([]), both.undo)
    assert undo.status == DONE


def test_a_lever_reads_a_file_whole_and_a_vanished_one_as_none(real_cgroups, tmp_path):
    """read_value reads with os.read (a standing lever's full check reads every BE cgroup):
    past a page it must read on to the end, and a cgroup gone reads as None, not an error."""
    from sloguard.actuators.cgroupfs import read_value

    for size in (4095, 4096, 65536, 200_001):
        long = tmp_path / f"long-{size}"
        long.write_text("x" * size + "\n")
        assert read_value(long) == "x" * size
    be = real_cgroups.create("be")
    cpu = _dir(real_cgroups, "cpu", be)
    assert read_value(cpu / "cpu.shares") == (cpu / "cpu.shares").read_text().strip()
    assert read_value(cpu / "no-such-file") is None
    assert read_value(cpu.parent / "pod-that-exited" / "cpu.shares") is None
    # a list file the kernel gives a line at a time, each read ending short of a page (a JVM's
    # threads: resctrl moves them by `tasks`); one read gave 819 of 901 threads. 1,500 threads
    # list past a page whatever their ids: on a fresh machine 901 ids of 3 and 4 digits were
    # only 3,962 bytes (CI), and 1,500 are at least 900 x 4 + 600 x 5 = 6,600
    proc = real_cgroups.spawn(be, "import threading, time\n"
                                  "for _ in range(1500):\n"
                                  "    threading.Thread(target=time.sleep, args=(60,),"
                                  " daemon=True).start()\n"
                                  "print('ready', flush=True)\ntime.sleep(60)\n")
    deadline = time.monotonic() + 30
    while len((cpu / "tasks").read_text().split()) < 1501 and time.monotonic() < deadline:
        time.sleep(0.05)
    listed = (cpu / "tasks").read_text().split()
    assert len(listed) == 1501 and len((cpu / "tasks").read_text()) > 4096
    assert read_value(cpu / "tasks").split() == listed
    proc.kill()


def test_apply_twice_keeps_the_original_for_undo(real_cgroups, tmp_path):
    be = real_cgroups.create("be")
    inventory = [workload(be, "BE")]
    env = make_env(tmp_path)
    step = CpuIdle({"mode": "weight"}, env)
    cpu = _dir(real_cgroups, "cpu", be)
    first = step.apply(context(inventory))
    keep(env, "cpu_idle", {"mode": "weight"}, first)
    second = step.apply(context(inventory))
    assert second.status == DONE and second.undo["writes"][0]["old"] == "1024"
    assert "1024 -> 2" in second.detail
    assert _read(cpu / "cpu.shares") == "2"
    assert step.undo(context(inventory), second.undo).status == DONE
    assert _read(cpu / "cpu.shares") == "1024"


@pytest.mark.parametrize("mode", ["idle", "auto"])
def test_ls_workloads_are_never_written(real_cgroups, tmp_path, mode):
    parent = real_cgroups.create("ls-parent")
    nested = real_cgroups.create("ls-parent/be-inside")
    inventory = [workload(parent, "LS"), workload(nested, "BE")]
    result = CpuIdle({"mode": mode}, make_env(tmp_path)).apply(context(inventory))
    assert result.status == SKIPPED and "lies under the LS workload" in result.detail
    assert _read(_dir(real_cgroups, "cpu", nested) / "cpu.idle") == "0"
    assert _read(_dir(real_cgroups, "cpu", parent) / "cpu.idle") == "0"
