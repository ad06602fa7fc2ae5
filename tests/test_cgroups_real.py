"""The container collector against real cgroups on this machine: usage, quota throttling,
memory, per-cgroup PSI, pod path recognition and containers that vanish mid-read."""

from __future__ import annotations

import os
import time
import uuid

from sloguard.collectors.cgroups import CgroupCollector
from sloguard.collectors.config import CgroupCollectorConfig, CgroupDeclaration
from sloguard.core.samples import Sample


def _by(samples: list[Sample], measurement: str, cgroup: str, **tags: str) -> Sample:
    found = [
        s for s in samples
        if s.measurement == measurement and s.tags["cgroup"] == "/" + cgroup
        and all(s.tags.get(k) == v for k, v in tags.items())
    ]
    assert len(found) == 1, f"{measurement} for {cgroup}: {found}"
    return found[0]


def _collect_twice(collector: CgroupCollector, pause: float = 1.0) -> list[Sample]:
    collector.collect(time.time_ns())
    time.sleep(pause)
    return collector.collect(time.time_ns())


def test_usage_and_quota_throttling_are_seen(real_cgroups):
    hog = real_cgroups.create("be/hog")
    idle = real_cgroups.create("ls/idle")
    real_cgroups.write(hog, "cpu.cfs_period_us", "100000")
    real_cgroups.write(hog, "cpu.cfs_quota_us", "20000")  # 20% of one CPU
    real_cgroups.spawn(hog)
    real_cgroups.spawn(idle, "import time\nwhile True: time.sleep(0.05)")
    config = CgroupCollectorConfig(
        include=[real_cgroups.prefix],
        declare=[
            CgroupDeclaration(path=f"{real_cgroups.prefix}/be/*", **{"class": "BE"}),
            CgroupDeclaration(path=f"{real_cgroups.prefix}/ls/*", name="idler",
                              **{"class": "LS"}),
        ],
    )
    collector = CgroupCollector("node-a", config)
    samples = _collect_twice(collector)

    cpu = _by(samples, "container_cpu", hog)
    assert cpu.tags["class"] == "BE" and cpu.tags["node"] == "node-a"
    assert 0.12 < cpu.fields["usage_cores"] < 0.3, cpu.fields  # held at ~20% by the quota
    assert cpu.fields["limit_cores"] == 0.2
    assert cpu.fields["periods"] >= 5
    assert cpu.fields["throttled_periods"] >= 5
    assert cpu.fields["throttled_ratio"] > 0.5
    assert cpu.fields["throttled_seconds"] > 0.1

    quiet = _by(samples, "container_cpu", idle)
    assert quiet.tags["class"] == "LS" and quiet.tags["workload"] == "idler"
    assert quiet.fields["usage_cores"] < 0.1
    assert "limit_cores" not in quiet.fields
    assert quiet.fields.get("throttled_periods", 0) == 0

    memory = _by(samples, "container_memory", hog)
    # A busy loop allocates nothing after the move (v1 does not move earlier charges);
    # test_memory_limit_is_reported checks that allocated memory is seen.
    assert 0 <= memory.fields["working_set_bytes"] <= memory.fields["usage_bytes"]
    assert "limit_bytes" not in memory.fields

    if collector.layout.unified is not None:  # per-cgroup PSI through the v2 hierarchy
        pressure = _by(samples, "container_pressure", hog, resource="cpu")
        assert pressure.fields["some_rate"] > 10, pressure.fields  # throttled = stalled
        assert pressure.fields["some_total"] > 0

    workloads = collector.workloads("LS")
    assert {"cgroup": f"/{idle}", "level": "cgroup", "class": "LS",
            "workload": "idler"} in workloads
    assert all(w["class"] == "LS" for w in workloads)
    # what it declares it writes (the agent's fresh read counts a series missing from one of
    # these as gone) is what it writes
    assert {s.measurement for s in samples} <= set(collector.measurements)


def test_memory_limit_is_reported(real_cgroups):
    rel = real_cgroups.create("limited")
    real_cgroups.write(rel, "memory.limit_in_bytes" if real_cgroups.layout.mode != "v2"
                       else "memory.max", str(256 * 1024 * 1024))
    real_cgroups.spawn(rel, "import time\nx = bytearray(30_000_000)\ntime.sleep(60)")
    time.sleep(0.5)
    collector = CgroupCollector("n", CgroupCollectorConfig(include=[real_cgroups.prefix]))
    samples = _collect_twice(collector, 0.2)
    memory = _by(samples, "container_memory", rel)
    assert memory.fields["limit_bytes"] == 256 * 1024 * 1024
    assert memory.fields["usage_bytes"] > 30_000_000


def test_kubernetes_pod_layouts_are_recognised(real_cgroups):
    uid_fs, uid_sd = str(uuid.uuid4()), str(uuid.uuid4())
    cid = uuid.uuid4().hex * 2
    fs_container = real_cgroups.create(f"kubepods/besteffort/pod{uid_fs}/{cid}")
    fs_guaranteed = real_cgroups.create(f"kubepods/pod{uid_sd}")
    sd_pod = "kubepods-burstable-pod" + uid_sd.replace("-", "_") + ".slice"
    sd_container = real_cgroups.create(
        f"kubepods.slice/kubepods-burstable.slice/{sd_pod}/cri-containerd-{cid}.scope"
    )
    # static pods: the kubelet's uid is the hex of an MD5, without dashes
    static_fs, static_sd = uuid.uuid4().hex, uuid.uuid4().hex
    real_cgroups.create(f"kubepods/burstable/pod{static_fs}")
    real_cgroups.create(f"kubepods.slice/kubepods-besteffort.slice/"
                        f"kubepods-besteffort-pod{static_sd}.slice")
    real_cgroups.spawn(fs_container, "import time\ntime.sleep(60)")
    real_cgroups.spawn(sd_container, "import time\ntime.sleep(60)")
    collector = CgroupCollector(
        "n", CgroupCollectorConfig(include=[f"{real_cgroups.prefix}/kubepods",
                                            f"{real_cgroups.prefix}/kubepods.slice"]),
    )
    samples = _collect_twice(collector, 0.2)

    be = _by(samples, "container_memory", fs_container).tags
    assert (be["level"], be["qos"], be["class"], be["pod_uid"], be["container_id"]) == (
        "container", "besteffort", "BE", uid_fs, cid)
    guaranteed = _by(samples, "container_memory", fs_guaranteed).tags
    assert (guaranteed["level"], guaranteed["qos"], guaranteed["class"]) == (
        "pod", "guaranteed", "LS")
    ls = _by(samples, "container_memory", sd_container).tags
    assert (ls["level"], ls["qos"], ls["class"], ls["pod_uid"], ls["container_id"]) == (
        "container", "burstable", "LS", uid_sd, cid)
    for rel, uid, qos_tier, cls in (
            (f"kubepods/burstable/pod{static_fs}", static_fs, "burstable", "LS"),
            (f"kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{static_sd}.slice",
             static_sd, "besteffort", "LS")):  # LS whatever its tier: no lever's target
        static = _by(samples, "container_memory", f"{real_cgroups.prefix}/{rel}").tags
        assert (static["level"], static["qos"], static["class"], static["pod_uid"]) == (
            "pod", qos_tier, cls, uid)
    qos = _by(samples, "container_memory", f"{real_cgroups.prefix}/kubepods/besteffort").tags
    assert (qos["level"], qos["class"]) == ("qos", "BE")
    # per-pod usage for the eviction ranking: the pod cgroup's own figures, by pod uid
    pod_cpu = _by(samples, "container_cpu", f"{real_cgroups.prefix}/kubepods/besteffort/"
                                            f"pod{uid_fs}").fields
    assert collector.usage(uid_fs, "cpu") == pod_cpu["usage_cores"]
    assert collector.usage(uid_fs, "memory") > 0
    assert collector.usage("no-such-pod", "cpu") is None


def test_cpu_rise_reads_the_parent_of_all_its_children_and_each_child_otherwise(real_cgroups):
    """The look before a full read costs a file a BE cgroup: where the selected cgroups are
    all the children of a tracked parent that runs nothing itself (the kubelet's besteffort
    QoS cgroup), it reads the parent's one counter, and a BE that starts shows there. Where an
    LS cgroup sits beside them, or a process in the parent itself, each is read: an LS that
    slows down as BE speeds up would hide BE's rise in the sum."""
    import subprocess

    from sloguard.core.selectors import parse_selector

    group = real_cgroups.create("be")
    members = [real_cgroups.create(f"be/pod{i}") for i in range(3)]
    for rel in members:
        real_cgroups.prioritise(rel)
    declare = [CgroupDeclaration(path=f"{real_cgroups.prefix}/be/ls*", **{"class": "LS"}),
               CgroupDeclaration(path=f"{real_cgroups.prefix}/be/*", **{"class": "BE"})]
    collector = CgroupCollector("node-a", CgroupCollectorConfig(include=[real_cgroups.prefix],
                                                                declare=declare))
    read, files = collector._files.read, []  # the directories whose CPU counter it read

    def counted(path: str) -> bytes | None:
        if os.path.basename(path) in ("cpuacct.usage", "cpu.stat"):
            files.append(os.path.dirname(path))
        return read(path)

    collector._files.read = counted
    be = [parse_selector('container_cpu{class="BE"}')]

    def look() -> float:
        files.clear()
        return collector.cpu_rise(be)

    _collect_twice(collector, 0.3)
    assert look() < 0.1
    assert [f.endswith(f"/{group}") for f in files] == [True]  # the parent's counter alone
    hog = real_cgroups.spawn(members[1])
    time.sleep(0.5)
    assert look() > 0.2  # one BE started: the parent's sum shows it
    hog.kill()
    hog.wait()
    real_cgroups.create("be/ls-beside")  # an LS among them: each BE is read again
    look()  # at once, before any discovery has tracked it
    assert sorted(f.rpartition("/")[2] for f in files) == ["pod0", "pod1", "pod2"]
    collector.discover()
    _collect_twice(collector, 0.3)
    look()
    assert sorted(f.rpartition("/")[2] for f in files) == ["pod0", "pod1", "pod2"]
    for root in real_cgroups.hierarchies():
        (root / real_cgroups.prefix / "be" / "ls-beside").rmdir()
    collector.discover()
    _collect_twice(collector, 0.3)
    look()
    assert len(files) == 1  # the parent alone again
    sleeper = subprocess.Popen(["sleep", "60"])  # a process in the parent itself
    try:
        real_cgroups.move(sleeper.pid, group)
        look()
        assert len(files) == 3
    finally:
        sleeper.kill()
        sleeper.wait()


def test_container_that_exits_mid_read_is_skipped_and_counted(real_cgroups):
    keep = real_cgroups.create("keep")
    gone = real_cgroups.create("gone")
    proc = real_cgroups.spawn(gone, "import time\ntime.sleep(60)")
    collector = CgroupCollector("n", CgroupCollectorConfig(include=[real_cgroups.prefix],
                                                           rediscover=3600))
    collector.collect(time.time_ns())
    assert collector.status().details["cgroups"] == 3
    proc.kill()
    proc.wait()
    time.sleep(0.2)
    for root in real_cgroups.hierarchies():
        (root / gone).rmdir()
    samples = collector.collect(time.time_ns())  # discovery is stale: the cgroup vanished
    assert collector.vanished_total == 1
    assert collector.status().ok
    assert {s.tags["cgroup"] for s in samples} == {f"/{real_cgroups.prefix}", f"/{keep}"}


def test_cpu_rise_looks_at_the_selected_cgroups_only_and_changes_no_rate(real_cgroups):
    """cpu_rise (evaluation on arrival's look before a full read): a BE that starts after the
    last collection shows as a rise in cores, also one discovered after the first looks; a
    busy LS cgroup the selector does not select, and a BE busy since before that collection
    (no rise), do not; a pressure selector selects by its resource's tags; and the next
    collection's rate still covers the whole interval."""
    from sloguard.core.selectors import parse_selector

    steady = real_cgroups.create("be/steady")
    ls = real_cgroups.create("ls/busy")
    for rel in (steady, ls):  # their core even on a loaded machine: the bars need steady rates
        real_cgroups.prioritise(rel)
    real_cgroups.limit(steady, 0.3)  # with one more busy loop, room for the test itself
    real_cgroups.spawn(steady)
    config = CgroupCollectorConfig(
        include=[real_cgroups.prefix],
        declare=[CgroupDeclaration(path=f"{real_cgroups.prefix}/be/*", **{"class": "BE"}),
                 CgroupDeclaration(path=f"{real_cgroups.prefix}/ls/*", **{"class": "LS"})])
    collector = CgroupCollector("node-a", config)
    be = [parse_selector('container_cpu{class="BE"}')]
    _collect_twice(collector, 0.5)
    busy = real_cgroups.spawn(ls)  # LS busy: not selected
    time.sleep(0.4)
    assert collector.cpu_rise(be) < 0.1  # the steady BE was busy before as well
    assert collector.cpu_rise([parse_selector('container_cpu{class="LS"}')]) > 0.3
    busy.kill()
    busy.wait()
    late = real_cgroups.create("be/late")  # a BE that appears after those looks
    real_cgroups.prioritise(late)
    collector.discover()  # what its looks select is matched again
    collector.collect(time.time_ns())
    time.sleep(0.4)
    real_cgroups.spawn(late)
    time.sleep(0.4)
    assert collector.cpu_rise(be) > 0.2
    if collector.layout.unified is not None:
        io = parse_selector('container_pressure{class="BE", resource="io"}')
        assert collector.cpu_rise([io]) > 0.2
        assert collector.cpu_rise([parse_selector(
            'container_pressure{class="BE", resource="disk"}')]) == 0.0
    assert collector.cpu_rise([parse_selector('node_cpu{class="BE"}')]) == 0.0  # not its own
    samples = collector.collect(time.time_ns())
    # the late BE's rate is over the 0.8 s since the last collection, half of it idle, as
    # without the looks (a look that moved the counters on would give its busy half alone)
    assert 0.2 < _by(samples, "container_cpu", late).fields["usage_cores"] < 0.75
