"""The eBPF collector on this machine's real kernel: programs compiled with BCC, attached to
real tracepoints, fed by real processes in real cgroups. Nothing here is simulated: a wrong
attribution, a lost event or a broken map read fails these tests.

Other work runs on this 2-core machine at the same time, so the assertions compare cgroups
measured in the same seconds (ratios with margins), never absolute latencies.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import need
from support.ebpf import (
    HOG,
    dominate_cpu,
    hogs_beside_a_sleeper,
    kernel_collectors,
    need_bcc,
    of,
    run,
    while_hogs_run,
)

from sloguard.collectors.ebpf_programs import tracefs_root, tracepoint_exists

# latency and throughput are measured here: these run last, never beside the background
# Kubernetes build of `make test` (conftest.run_phase)
pytestmark = pytest.mark.timing
SLEEPER = "import time\nwhile True: time.sleep(0.005)"


def _median(samples, field):
    values = [s.fields[field] for s in samples]
    assert values, "no samples"
    return statistics.median(values)


@pytest.mark.parametrize("key", ["cgroup", "pid"])
def test_runqueue_latency_of_a_loaded_cgroup_is_10x_an_idle_ones(real_cgroups, key):
    """CPU hogs (four per CPU) in one cgroup, a periodic sleeper in another: the hogs wait
    behind each other for milliseconds, the sleeper is run soon after it wakes. Attribution by
    cgroup v2 id and by process id must both see it.

    Four per CPU, not two: with other work waking up on this machine, a hog preempted by a
    short-lived task is often run again at once, and with two hogs per CPU those short waits
    made its median ~0.2 ms (ratio ~30x); with four, it waits behind other hogs (median ~2 ms,
    ~300x the sleeper's)."""
    need_bcc()
    busy, idle = real_cgroups.create("be/busy"), real_cgroups.create("ls/idle")
    dominate_cpu(real_cgroups, busy, idle)
    cgroups, kernel = kernel_collectors(
        [{"path": busy, "class": "BE", "name": "busy"},
         {"path": idle, "class": "LS", "name": "idle"}], key=key, block_io=False, reclaim=False)
    kernel.start()
    try:
        assert kernel.status().details["signals"]["runqueue"] == "attached", kernel.status()
        assert kernel.status().details["attribution"] == key
        ticks = hogs_beside_a_sleeper(real_cgroups, busy, 4 * os.cpu_count(), idle, SLEEPER,
                                      cgroups, kernel, 6)
    finally:
        kernel.close()
    loaded = of(ticks, "ebpf_runqueue", workload="busy")
    quiet = of(ticks, "ebpf_runqueue", workload="idle")
    assert len(loaded) >= 4 and len(quiet) >= 4
    # The container collector's tags, reused: class and cgroup come with every sample.
    assert loaded[0].tags["class"] == "BE" and loaded[0].tags["cgroup"] == f"/{busy}"
    assert quiet[0].tags["class"] == "LS" and quiet[0].tags["level"] == "cgroup"
    busy_p50, idle_p50 = _median(loaded, "p50_us"), _median(quiet, "p50_us")
    print(f"run-queue p50: loaded {busy_p50:.1f} us, idle {idle_p50:.1f} us")
    assert busy_p50 >= 10 * idle_p50, (busy_p50, idle_p50)
    # The sleeper wakes every ~5 ms: ~200 waits a second, all attributed to it.
    assert _median(quiet, "count") >= 50
    for sample in loaded + quiet:
        assert sample.fields["p50_us"] <= sample.fields["p99_us"]
    node = of(ticks, "ebpf_runqueue", level="node")
    assert len(node) == len(ticks)
    assert sum(s.fields["count"] for s in node) >= sum(s.fields["count"] for s in loaded + quiet)


# An innocent BE job: awake 1 ms in every 50 (2% of a CPU), as a sleepy batch step is.
NAPPER = ("import time\nwhile True:\n    t = time.perf_counter()\n"
          "    while time.perf_counter() - t < 0.001: pass\n    time.sleep(0.05)")


@pytest.mark.parametrize("key", ["cgroup", "pid"])
def test_runqueue_blame_names_the_cgroup_an_ls_task_waited_behind(real_cgroups, key):
    """An LS sleeper shares one CPU with a BE antagonist (CPU hogs) and an innocent BE job
    that is mostly asleep: the LS task's run-queue wait is charged to the antagonist, hardly
    to the innocent, never to the LS cgroup itself; BE victims are not written (their waits are
    nobody's SLO). What detector/attribution/'s runqueue_blame scorer reads."""
    need_bcc()
    victim = real_cgroups.create("ls/victim")
    antagonist, innocent = real_cgroups.create("be/antagonist"), real_cgroups.create("be/innocent")
    dominate_cpu(real_cgroups, victim, antagonist, innocent)
    pin = f"import os\nos.sched_setaffinity(0, {{{max(os.sched_getaffinity(0))}}})\n"
    cgroups, kernel = kernel_collectors(
        [{"path": antagonist, "class": "BE", "name": "antagonist"},
         {"path": innocent, "class": "BE", "name": "innocent"},
         {"path": victim, "class": "LS", "name": "victim"}],
        key=key, block_io=False, reclaim=False)
    kernel.start()
    try:
        with while_hogs_run(real_cgroups):
            for _ in range(2):  # one CPU for all three: the LS task waits behind whoever runs
                real_cgroups.spawn(antagonist, pin + HOG)
            real_cgroups.spawn(innocent, pin + NAPPER)
            real_cgroups.spawn(victim, pin + SLEEPER)
            time.sleep(0.5)
            ticks = run(cgroups, kernel, 5)
    finally:
        kernel.close()
    blamed = of(ticks, "ebpf_runqueue_blame", workload="victim")
    by_culprit: dict[str, float] = {}
    for sample in blamed:
        by_culprit[sample.tags["culprit"]] = (by_culprit.get(sample.tags["culprit"], 0.0)
                                              + sample.fields["wait_us"])
        assert sample.fields["count"] >= 1 and sample.tags["class"] == "LS"
    print(f"LS wait blamed (us over 5 s): {by_culprit}")
    hog, nap = by_culprit.get(f"/{antagonist}", 0.0), by_culprit.get(f"/{innocent}", 0.0)
    assert hog > 0.5 * sum(by_culprit.values()), by_culprit
    assert hog >= 10 * nap, by_culprit
    assert f"/{victim}" not in by_culprit
    hog_sample = next(s for s in blamed if s.tags["culprit"] == f"/{antagonist}")
    assert hog_sample.tags["culprit_class"] == "BE"
    assert hog_sample.tags["culprit_workload"] == "antagonist"
    assert not of(ticks, "ebpf_runqueue_blame", workload="antagonist")
    assert not of(ticks, "ebpf_runqueue_blame", workload="innocent")


def test_runqueue_pod_level_merges_its_containers(real_cgroups):
    """Tasks live in container cgroups; the pod-level series must hold all of them."""
    need_bcc()
    uid = "0d3c8a6e-8f5b-4d0e-9a51-3c0f3f2a1b7c"
    pod = f"kubepods/besteffort/pod{uid}"
    one = real_cgroups.create(f"{pod}/{'a' * 64}")
    two = real_cgroups.create(f"{pod}/{'b' * 64}")
    cgroups, kernel = kernel_collectors([], block_io=False, reclaim=False)
    cgroups.config.include = [f"{real_cgroups.prefix}/kubepods"]
    kernel.start()
    try:
        real_cgroups.spawn(one, HOG)
        real_cgroups.spawn(two, SLEEPER)
        real_cgroups.spawn(two, HOG)
        ticks = run(cgroups, kernel, 3)
    finally:
        kernel.close()
    pod_samples = of(ticks, "ebpf_runqueue", level="pod", pod_uid=uid)
    containers = of(ticks, "ebpf_runqueue", level="container", pod_uid=uid)
    assert pod_samples and {s.tags["container_id"] for s in containers} == {"a" * 64, "b" * 64}
    assert pod_samples[0].tags["class"] == "BE" and pod_samples[0].tags["qos"] == "besteffort"
    # Each tick, the pod's count is the sum of its containers' counts.
    for tick in ticks:
        pod_count = sum(s.fields["count"] for s in tick if s.tags.get("level") == "pod"
                        and s.tags.get("pod_uid") == uid)
        container_count = sum(s.fields["count"] for s in tick if s.measurement == "ebpf_runqueue"
                              and s.tags.get("level") == "container"
                              and s.tags.get("pod_uid") == uid)
        assert pod_count == container_count


def _disk_of(path: Path) -> str:
    """The whole disk under a file (block tracepoints report the disk, not the partition)."""
    dev = os.stat(path).st_dev
    sys_dir = Path(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}").resolve()
    if (sys_dir / "partition").exists():
        sys_dir = sys_dir.parent
    return sys_dir.name


def test_direct_io_is_attributed_to_the_cgroup_that_issued_it(real_cgroups, tmp_path):
    need_bcc()
    target = tmp_path / "direct.bin"
    need(os.path.exists(f"/sys/dev/block/{os.major(os.stat(tmp_path).st_dev)}:"
                        f"{os.minor(os.stat(tmp_path).st_dev)}"),
         f"{tmp_path} is not on a block device (O_DIRECT I/O needs one)")
    writer, bystander = real_cgroups.create("io/writer"), real_cgroups.create("io/bystander")
    cgroups, kernel = kernel_collectors(
        [{"path": writer, "class": "BE", "name": "writer"},
         {"path": bystander, "class": "LS", "name": "bystander"}], runqueue=False, reclaim=False)
    kernel.start()
    try:
        assert kernel.status().details["signals"]["block_io"] == "attached", kernel.status()
        real_cgroups.spawn(bystander, "import time\nwhile True: time.sleep(0.01)")
        cgroups.collect(time.time_ns())
        kernel.collect(time.time_ns())
        dd = real_cgroups.spawn(writer, (
            "import os\n"
            f"os.execvp('dd', ['dd', 'if=/dev/zero', 'of={target}', 'bs=64k', 'count=300',"
            " 'oflag=direct', 'status=none'])\n"))
        assert dd.wait(timeout=60) == 0
        time.sleep(0.2)  # completions of the last requests
        cgroups.collect(time.time_ns())
        samples = kernel.collect(time.time_ns())
    finally:
        kernel.close()
    disk = _disk_of(target)
    writes = [s for s in samples if s.measurement == "ebpf_block_io"
              and s.tags.get("workload") == "writer" and s.tags["op"] == "write"]
    assert len(writes) == 1, samples
    print(f"direct writes attributed: {writes[0].fields['count']}")
    assert writes[0].tags["device"] == disk
    # 300 direct writes of 64 KiB: 300 requests (more if the device splits them). Once in a
    # full-suite run beside other I/O-heavy work, one was missing (299): a bio merged into a
    # neighbour's request, or an LRU eviction of its start entry, both of which the design
    # accepts; 95% is required.
    assert writes[0].fields["count"] >= 285, writes[0].fields
    assert writes[0].fields["p50_us"] > 0
    assert not [s for s in samples if s.measurement == "ebpf_block_io"
                and s.tags.get("workload") == "bystander" and s.tags["op"] == "write"]
    node = [s for s in samples if s.measurement == "ebpf_block_io"
            and s.tags.get("level") == "node" and s.tags["device"] == disk
            and s.tags["op"] == "write"]
    assert node and node[0].fields["count"] >= writes[0].fields["count"]


class _TraceInstance:
    """A private tracefs instance counting one event: independent evidence of whether the
    kernel emitted it, to tell "the kernel did not stall" from "our program missed it"."""

    def __init__(self, category: str, event: str) -> None:
        self.path = Path(tracefs_root()) / "instances" / f"sloguard-test-{os.getpid()}"
        self.path.mkdir()
        self.enable = self.path / "events" / category / event / "enable"
        self.enable.write_text("1")

    def count(self) -> int:
        return sum(1 for line in (self.path / "trace").read_text().splitlines()
                   if line and not line.startswith("#"))

    def remove(self) -> None:
        self.enable.write_text("0")
        self.path.rmdir()


def test_memory_pressure_under_a_limit_shows_reclaim_stalls(real_cgroups, tmp_path):
    """Writing a file 8x larger than the cgroup's memory limit makes the kernel reclaim the
    cgroup's page cache in the writer's context (memcg reclaim) on almost every charge."""
    need_bcc()
    for event in ("mm_vmscan_memcg_reclaim_begin", "mm_vmscan_memcg_reclaim_end"):
        if not tracepoint_exists("vmscan", event):
            pytest.skip(f"this kernel has no vmscan:{event} tracepoint: it cannot report "
                        "memcg reclaim stalls")
    tight = real_cgroups.create("mem/tight")
    layout = real_cgroups.layout
    if "memory" in layout.v1:
        real_cgroups.write(tight, "memory.limit_in_bytes", str(48 << 20))
        limit_hits = layout.v1["memory"] / tight / "memory.failcnt"
    elif layout.unified is not None and (layout.unified / tight / "memory.max").exists():
        real_cgroups.write(tight, "memory.max", str(48 << 20))
        limit_hits = layout.unified / tight / "memory.events"
    else:
        need(False, "no memory controller to put a limit on")
    cgroups, kernel = kernel_collectors([{"path": tight, "class": "LS", "name": "tight"}],
                                        runqueue=False, block_io=False)
    trace = _TraceInstance("vmscan", "mm_vmscan_memcg_reclaim_begin")
    kernel.start()
    try:
        assert kernel.status().details["signals"]["reclaim"] == "attached", kernel.status()
        cgroups.collect(time.time_ns())
        kernel.collect(time.time_ns())
        writer = real_cgroups.spawn(tight, (
            f"f = open({str(tmp_path / 'big.bin')!r}, 'wb')\n"
            "for _ in range(400):\n    f.write(b'x' * (1 << 20))\nf.close()\n"))
        assert writer.wait(timeout=120) == 0
        cgroups.collect(time.time_ns())
        samples = kernel.collect(time.time_ns())
        emitted = trace.count()
    finally:
        kernel.close()
        trace.remove()
    hits = limit_hits.read_text().strip().replace("\n", ", ")
    stalls = [s for s in samples if s.measurement == "ebpf_reclaim"
              and s.tags.get("workload") == "tight" and s.tags["kind"] == "memcg"]
    if emitted == 0:
        pytest.skip(f"the kernel emitted no memcg reclaim event while a 400 MiB file was "
                    f"written under a 48 MiB limit (limit hits: {hits}); nothing to attribute")
    assert stalls, f"the kernel emitted {emitted} memcg reclaim events, we attributed none"
    node = [s for s in samples if s.measurement == "ebpf_reclaim"
            and s.tags.get("level") == "node" and s.tags["kind"] == "memcg"]
    ours, machine = stalls[0].fields["count"], node[0].fields["count"]
    print(f"memcg reclaim: tracefs saw {emitted}, node total {machine}, the cgroup {ours}; "
          f"limit hits {hits}")
    # The machine-wide count matches what tracefs saw in the same window (both saw every
    # cgroup; the margin covers reclaims cut by the window's edges), and the cgroup that hit
    # its limit got most of it.
    assert 0.8 * emitted - 5 <= machine <= 1.2 * emitted + 5
    assert ours > 10 and ours >= 0.5 * machine and stalls[0].fields["p99_us"] > 0


def test_syscall_latency_when_enabled_skips_waiting_syscalls(real_cgroups):
    """Off by default; when on, a busy syscall loop is counted and a sleeper's sleeps are not
    (their length is the caller's choice, not a stall)."""
    need_bcc()
    caller, sleeper = real_cgroups.create("sys/caller"), real_cgroups.create("sys/sleeper")
    cgroups, kernel = kernel_collectors(
        [{"path": caller, "class": "LS", "name": "caller"},
         {"path": sleeper, "class": "LS", "name": "sleeper"}],
        runqueue=False, block_io=False, reclaim=False, syscall=True)
    kernel.start()
    try:
        assert kernel.status().details["signals"]["syscall"] == "attached", kernel.status()
        real_cgroups.spawn(caller, "import os\nwhile True: os.getppid()")
        real_cgroups.spawn(sleeper, "import time\nwhile True: time.sleep(0.02)")
        ticks = run(cgroups, kernel, 3)
    finally:
        kernel.close()
    calls = of(ticks, "ebpf_syscall", workload="caller")
    assert calls and _median(calls, "count") > 10_000
    assert _median(calls, "p50_us") < 1000
    sleeps = of(ticks, "ebpf_syscall", workload="sleeper")
    assert all(s.fields["p99_us"] < 10_000 for s in sleeps), sleeps  # no 20 ms sleeps


def test_cgroup_ids_are_the_v2_inode_numbers(real_cgroups):
    """The attribution rests on bpf_get_current_cgroup_id() == the v2 directory's inode."""
    need_bcc()
    layout = real_cgroups.layout
    need(layout.unified is not None, "no cgroup v2 hierarchy mounted")
    from bcc import BPF

    rel = real_cgroups.create("ids/one")
    program = BPF(text=b"""
BPF_HASH(seen, u32, u64);
TRACEPOINT_PROBE(syscalls, sys_enter_getppid) {
    u32 tgid = bpf_get_current_pid_tgid() >> 32;
    u64 id = bpf_get_current_cgroup_id();
    seen.update(&tgid, &id);
    return 0;
}""")
    try:
        proc = real_cgroups.spawn(rel, "import os, time\nos.getppid()\ntime.sleep(30)")
        deadline = time.monotonic() + 10
        seen = {}
        while proc.pid not in seen and time.monotonic() < deadline:
            time.sleep(0.1)
            seen = {k.value: v.value for k, v in program[b"seen"].items()}
    finally:
        program.cleanup()
    assert seen.get(proc.pid) == os.stat(layout.unified / rel).st_ino


def test_setup_script_is_idempotent_and_quick():
    """`make test` and `make run` run scripts/bcc-setup.sh every time: a second run must find
    everything in place and only re-check it."""
    need_bcc()
    root = Path(__file__).resolve().parent.parent
    started = time.monotonic()
    done = subprocess.run(["bash", str(root / "scripts" / "bcc-setup.sh"),
                           str(Path(sys.executable).parent.parent)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "apt-get install" not in done.stderr and "built the stand-in" not in done.stderr
    assert "ok: compiled and attached a tracepoint program" in done.stderr
    assert time.monotonic() - started < 30


@pytest.mark.parametrize("batch", [True, False])
def test_drain_reads_the_whole_map_in_chunks_and_empties_it(batch):
    """The interval read: every entry once, across many batch calls, and nothing left behind
    (both with the batch syscall and the per-key path of kernels without it)."""
    need_bcc()
    from bcc import BPF

    from sloguard.collectors.bpf_maps import MapDrainer

    program = BPF(text=b"""
struct k { u64 id; u64 slot; };
BPF_F_TABLE("hash", struct k, u64, h, 8192, BPF_F_NO_PREALLOC);
""")
    try:
        table = program[b"h"]
        for i in range(3000):
            table[table.Key(i, i % 7)] = table.Leaf(i * 3)
        drainer = MapDrainer(table.map_fd, "=QQ", chunk=64)
        drainer.batch = batch
        got = drainer.drain()
        assert sorted(got) == [((i, i % 7), (i * 3,)) for i in range(3000)]
        assert len(table.items()) == 0
        assert drainer.drain() == []
    finally:
        program.cleanup()
