"""cgroup v2 files in their documented formats (Documentation/admin-guide/cgroup-v2.rst).

This machine mounts v1 controllers, so cpu.max/memory.* of v2 cannot be exercised on its real
hierarchy (test_cgroups_real.py covers v1 and the real v2 PSI files); here a tree in the exact v2
format checks the v2 reading path that production nodes use, including a pod that exits.
"""

from __future__ import annotations

import time

from sloguard.collectors.cgroups import CgroupCollector, parse_psi
from sloguard.collectors.config import CgroupCollectorConfig
from sloguard.core.cgroup_layout import detect_layout, layout_from_root

POD = (
    "kubepods.slice/kubepods-besteffort.slice/"
    "kubepods-besteffort-pod0b6f8c4e_7d3a_4c59_9a3e_2f1d8a6b5c4d.slice"
)
CONTAINER = POD + "/cri-containerd-" + "ab" * 32 + ".scope"


def _write_cgroup(root, rel, usage_usec, throttled, max_="50000 100000", mem="max"):
    d = root / rel
    d.mkdir(parents=True, exist_ok=True)
    (d / "cpu.stat").write_text(
        f"usage_usec {usage_usec}\nuser_usec {usage_usec // 2}\nsystem_usec {usage_usec // 2}\n"
        f"nr_periods {throttled * 2}\nnr_throttled {throttled}\n"
        f"throttled_usec {throttled * 1000}\nnr_bursts 0\nburst_usec 0\n"
    )
    (d / "cpu.max").write_text(f"{max_}\n")
    (d / "memory.current").write_text("104857600\n")
    (d / "memory.max").write_text(f"{mem}\n")
    (d / "memory.stat").write_text(
        "anon 52428800\nfile 41943040\nkernel 1048576\nactive_file 20971520\n"
        "inactive_file 31457280\n"
    )
    (d / "cpu.pressure").write_text(
        f"some avg10=12.50 avg60=3.10 avg300=0.80 total={usage_usec // 4}\n"
        f"full avg10=1.00 avg60=0.20 avg300=0.05 total={usage_usec // 40}\n"
    )
    (d / "memory.pressure").write_text(
        "some avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"
        "full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"
    )


def test_v2_tree_is_read_with_rates_limits_and_psi(tmp_path):
    (tmp_path / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    _write_cgroup(tmp_path, "kubepods.slice", 9_000_000, 0, "max 100000")
    _write_cgroup(tmp_path, POD.rsplit("/", 1)[0], 9_000_000, 0, "max 100000")
    _write_cgroup(tmp_path, CONTAINER, 1_000_000, 10, mem="536870912")
    _write_cgroup(tmp_path, POD, 1_000_000, 10)
    collector = CgroupCollector(
        "node-b", CgroupCollectorConfig(root=str(tmp_path), include=["kubepods.slice"],
                                        memory_stat_every=0)
    )
    assert collector.layout.mode == "v2"
    collector.collect(time.time_ns())
    time.sleep(0.5)
    _write_cgroup(tmp_path, CONTAINER, 1_250_000, 30, mem="536870912")  # +0.25 s CPU
    samples = collector.collect(time.time_ns())
    cid = "/" + CONTAINER
    cpu = next(s for s in samples if s.measurement == "container_cpu" and s.tags["cgroup"] == cid)
    assert cpu.tags["level"] == "container" and cpu.tags["class"] == "BE"
    assert cpu.tags["pod_uid"] == "0b6f8c4e-7d3a-4c59-9a3e-2f1d8a6b5c4d"
    assert 0.3 < cpu.fields["usage_cores"] < 0.55  # 0.25 s over ~0.5 s
    assert cpu.fields["throttled_periods"] == 20
    assert cpu.fields["periods"] == 40
    assert cpu.fields["throttled_ratio"] == 0.5
    assert abs(cpu.fields["throttled_seconds"] - 0.02) < 1e-9
    assert cpu.fields["limit_cores"] == 0.5
    memory = next(s for s in samples
                  if s.measurement == "container_memory" and s.tags["cgroup"] == cid)
    assert memory.fields["usage_bytes"] == 104857600
    assert memory.fields["working_set_bytes"] == 104857600 - 31457280
    assert memory.fields["rss_bytes"] == 52428800
    assert memory.fields["limit_bytes"] == 536870912
    psi = next(s for s in samples if s.measurement == "container_pressure"
               and s.tags["cgroup"] == cid and s.tags["resource"] == "cpu")
    assert psi.fields["some_avg10"] == 12.5 and psi.fields["full_avg10"] == 1.0
    assert psi.fields["some_rate"] > 0
    root = next(s for s in samples if s.measurement == "container_cpu"
                and s.tags["cgroup"] == "/kubepods.slice")
    assert "limit_cores" not in root.fields  # "max" means no limit
    assert root.tags["level"] == "root"


def test_v2_container_removed_between_reads(tmp_path):
    (tmp_path / "cgroup.controllers").write_text("cpu memory\n")
    parts = CONTAINER.split("/")
    for depth in range(1, len(parts) + 1):  # every v2 cgroup has these files
        _write_cgroup(tmp_path, "/".join(parts[:depth]), 1, 0)
    collector = CgroupCollector(
        "n", CgroupCollectorConfig(root=str(tmp_path), include=["kubepods.slice"],
                                   rediscover=3600)
    )
    collector.collect(time.time_ns())
    for name in ("cpu.stat", "memory.current"):
        (tmp_path / CONTAINER / name).unlink()
    samples = collector.collect(time.time_ns())
    assert collector.vanished_total == 1
    assert all(s.tags["cgroup"] != "/" + CONTAINER for s in samples)


def test_mountinfo_layouts(tmp_path):
    hybrid = tmp_path / "hybrid"
    hybrid.write_text(
        "25 24 0:22 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro,mode=755\n"
        "26 25 0:23 / /sys/fs/cgroup/unified rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"
        "28 25 0:25 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid - cgroup cgroup rw,cpu,cpuacct\n"
        "29 25 0:26 / /sys/fs/cgroup/memory rw,nosuid - cgroup cgroup rw,memory\n"
    )
    layout = detect_layout(str(hybrid))
    assert layout.mode == "hybrid"
    assert str(layout.v1["cpu"]) == str(layout.v1["cpuacct"]) == "/sys/fs/cgroup/cpu,cpuacct"
    assert str(layout.unified) == "/sys/fs/cgroup/unified"
    pure = tmp_path / "pure"
    pure.write_text("30 24 0:27 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n")
    layout = detect_layout(str(pure))
    assert layout.mode == "v2" and str(layout.primary) == "/sys/fs/cgroup"
    (tmp_path / "v1" / "memory").mkdir(parents=True)
    assert layout_from_root(tmp_path / "v1").mode == "v1"


def test_v2_cgroup_without_memory_controller_is_still_collected(tmp_path):
    (tmp_path / "cgroup.controllers").write_text("cpu\n")
    lab = tmp_path / "lab"
    lab.mkdir()
    (lab / "cpu.stat").write_text("usage_usec 1000\nuser_usec 500\nsystem_usec 500\n")
    (lab / "cpu.pressure").write_text(
        "some avg10=1.00 avg60=0.00 avg300=0.00 total=10\n"
        "full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n")
    collector = CgroupCollector("n", CgroupCollectorConfig(root=str(tmp_path), include=["lab"]))
    for _ in range(3):
        samples = collector.collect(time.time_ns())
        time.sleep(0.05)
    assert collector.vanished_total == 0
    assert {s.measurement for s in samples} == {"container_cpu", "container_pressure"}


def test_psi_files_parse_the_same_whichever_way_they_take():
    """The kernel's shape goes through one regex pass, anything else through the general
    parser: both must give the same fields (a missing `full` line, no final newline, a field
    a later kernel might add)."""
    two = (b"some avg10=1.25 avg60=0.12 avg300=0.05 total=123456\n"
           b"full avg10=0.50 avg60=0.00 avg300=0.00 total=6543\n")
    want = {"some_avg10": 1.25, "some_avg60": 0.12, "some_total": 123456,
            "full_avg10": 0.5, "full_avg60": 0.0, "full_total": 6543}
    assert parse_psi(two) == want
    assert parse_psi(two.rstrip(b"\n")) == want  # the general way
    assert parse_psi(two.replace(b" total=6543", b" total=6543 extra=7")) == want
    assert parse_psi(two.split(b"\n")[0] + b"\n") == {
        k: v for k, v in want.items() if k.startswith("some")}
    assert parse_psi(b"") == {}


def test_a_counter_that_went_back_gives_no_rate_and_psi_rates_are_exact(tmp_path):
    """A recreated cgroup at the same path restarts its counters: a negative increase is no
    rate, not a huge or negative one; a PSI rate is the stalled share of the elapsed time."""
    (tmp_path / "cgroup.controllers").write_text("cpu memory\n")
    _write_cgroup(tmp_path, "kubepods.slice", 1, 0, "max 100000")
    _write_cgroup(tmp_path, POD, 4_000_000, 50)
    collector = CgroupCollector(
        "n", CgroupCollectorConfig(root=str(tmp_path), include=["kubepods.slice"]))
    collector.collect(time.time_ns())
    item = collector._tracked[POD]
    _write_cgroup(tmp_path, POD, 1_000_000, 10)  # every counter lower than before
    item.prev_mono -= 10**9  # as if the previous read was a second ago
    samples = collector.collect(time.time_ns())
    cpu = next(s for s in samples
               if s.measurement == "container_cpu" and s.tags["cgroup"] == "/" + POD)
    assert "usage_cores" not in cpu.fields and "throttled_periods" not in cpu.fields
    assert "throttled_seconds" not in cpu.fields
    assert cpu.fields["usage_seconds_total"] == 1.0
    psi = next(s for s in samples if s.measurement == "container_pressure"
               and s.tags["cgroup"] == "/" + POD and s.tags["resource"] == "cpu")
    assert "some_rate" not in psi.fields
    _write_cgroup(tmp_path, POD, 1_400_000, 10)  # cpu.pressure some total +100,000 us
    item.prev_mono -= 10**9
    samples = collector.collect(time.time_ns())
    psi = next(s for s in samples if s.measurement == "container_pressure"
               and s.tags["cgroup"] == "/" + POD and s.tags["resource"] == "cpu")
    # 0.1 s stalled over ~1 s (plus the few ms the test took): ~10%
    assert 9.0 < psi.fields["some_rate"] <= 10.0, psi.fields
    assert psi.tags == {**cpu.tags, "resource": "cpu"}
    memory = next(s for s in samples if s.measurement == "container_pressure"
                  and s.tags["cgroup"] == "/" + POD and s.tags["resource"] == "memory")
    assert memory.fields["some_rate"] == 0.0 and memory.tags["resource"] == "memory"


def test_rediscovery_keeps_counters_and_reads_what_can_change_in_place(tmp_path):
    """A cgroup already tracked is not tracked anew at each discovery; its limits (a resize, a
    lever) and its tags (pod metadata arriving late) are read again, and a cgroup first seen
    without all its files gets them once they appear."""
    from sloguard.core.pods import PodMeta

    (tmp_path / "cgroup.controllers").write_text("cpu memory\n")
    _write_cgroup(tmp_path, "kubepods.slice", 1, 0, "max 100000")
    _write_cgroup(tmp_path, POD, 1_000_000, 10)
    bare = tmp_path / "kubepods.slice" / "bare"
    bare.mkdir()
    (bare / "cpu.stat").write_text("usage_usec 5\n")
    pods: dict[str, PodMeta] = {}
    collector = CgroupCollector(
        "n", CgroupCollectorConfig(root=str(tmp_path), include=["kubepods.slice"],
                                   rediscover=3600), pod_lookup=pods.get)
    collector.collect(time.time_ns())
    item = collector._tracked[POD]
    uid = "0b6f8c4e-7d3a-4c59-9a3e-2f1d8a6b5c4d"
    pods[uid] = PodMeta("batch-1", "jobs", uid, qos_class="BestEffort")
    _write_cgroup(tmp_path, POD, 1_500_000, 10, max_="200000 100000", mem="1073741824")
    (bare / "memory.current").write_text("4096\n")
    (bare / "memory.stat").write_text("inactive_file 0\n")
    collector.discover()
    assert collector._tracked[POD] is item  # kept, with its counters
    samples = collector.collect(time.time_ns())
    cpu = next(s for s in samples
               if s.measurement == "container_cpu" and s.tags["cgroup"] == "/" + POD)
    assert cpu.fields["limit_cores"] == 2.0 and "usage_cores" in cpu.fields
    assert cpu.tags["pod"] == "batch-1" and cpu.tags["namespace"] == "jobs"
    psi = next(s for s in samples
               if s.measurement == "container_pressure" and s.tags["cgroup"] == "/" + POD)
    assert psi.tags["pod"] == "batch-1"
    memory = next(s for s in samples
                  if s.measurement == "container_memory" and s.tags["cgroup"] == "/" + POD)
    assert memory.fields["limit_bytes"] == 1073741824
    assert any(s.measurement == "container_memory" and s.tags["cgroup"] == "/kubepods.slice/bare"
               and s.fields["usage_bytes"] == 4096 for s in samples)


def test_memory_stat_is_read_every_memory_stat_every_and_usage_every_tick(tmp_path):
    """memory.stat (the kernel sums it over the subtree) is read every memory_stat_every; the
    working set in between is the fresh usage less the last inactive file cache."""
    (tmp_path / "cgroup.controllers").write_text("cpu memory\n")
    _write_cgroup(tmp_path, "kubepods.slice", 1, 0, "max 100000")
    _write_cgroup(tmp_path, POD, 1_000_000, 10)  # usage 100 MiB, inactive_file 30 MiB
    collector = CgroupCollector(
        "n", CgroupCollectorConfig(root=str(tmp_path), include=["kubepods.slice"],
                                   memory_stat_every=5))

    def memory():
        return next(s for s in collector.collect(time.time_ns())
                    if s.measurement == "container_memory" and s.tags["cgroup"] == "/" + POD)

    first = memory()
    assert first.fields["rss_bytes"] == 52428800
    assert first.fields["working_set_bytes"] == 104857600 - 31457280
    item = collector._tracked[POD]
    assert 0 < item.mem_stat_due - time.monotonic_ns() <= 5 * 10**9  # its own phase
    (tmp_path / POD / "memory.current").write_text("209715200\n")
    (tmp_path / POD / "memory.stat").write_text("anon 1\nfile 2\ninactive_file 104857600\n")
    between = memory()
    assert between.fields["usage_bytes"] == 209715200  # fresh
    assert between.fields["working_set_bytes"] == 209715200 - 31457280  # the last inactive
    assert "rss_bytes" not in between.fields
    item.mem_stat_due = time.monotonic_ns()  # due
    due = memory()
    assert due.fields["working_set_bytes"] == 209715200 - 104857600
    assert due.fields["rss_bytes"] == 1 and due.fields["cache_bytes"] == 2
    assert item.mem_stat_due - time.monotonic_ns() > 4 * 10**9  # a whole interval on


def test_a_file_that_reads_the_same_is_not_parsed_again_and_its_parse_stays_clean(tmp_path):
    """The collector keeps the parse of each file's last bytes (_OpenFiles.parsed): a file
    that reads the same gives the same parse, a changed one is parsed again, and the rates the
    collector adds to a PSI sample never end up in the kept parse (the next tick would carry
    them)."""
    (tmp_path / "cgroup.controllers").write_text("cpu memory\n")
    _write_cgroup(tmp_path, "kubepods.slice", 1, 0, "max 100000")
    _write_cgroup(tmp_path, POD, 1_000_000, 10)
    collector = CgroupCollector(
        "n", CgroupCollectorConfig(root=str(tmp_path), include=["kubepods.slice"]))
    files, item = collector._files, None

    def pressure(samples, resource):
        return next(s for s in samples if s.measurement == "container_pressure"
                    and s.tags["cgroup"] == "/" + POD and s.tags["resource"] == resource)

    collector.collect(time.time_ns())
    item = collector._tracked[POD]
    kept = {res: files._parsed[path][1] for res, path in item.psi.items()}
    item.prev_mono -= 10**9
    samples = collector.collect(time.time_ns())
    for res, path in item.psi.items():
        assert files._parsed[path][1] is kept[res]  # the same bytes: not parsed again
        assert "some_rate" not in kept[res] and "full_rate" not in kept[res]
    assert pressure(samples, "memory").fields["some_rate"] == 0.0
    assert pressure(samples, "cpu").fields["some_rate"] == 0.0  # the same total: no stall
    _write_cgroup(tmp_path, POD, 1_400_000, 10)  # cpu.pressure some total +100,000 us
    item.prev_mono -= 10**9
    samples = collector.collect(time.time_ns())
    cpu = pressure(samples, "cpu").fields
    assert cpu["some_total"] == 350_000 and 9.0 < cpu["some_rate"] <= 10.0, cpu
    assert files._parsed[item.psi["cpu"]][1] is not kept["cpu"]
    assert files._parsed[item.psi["memory"]][1] is kept["memory"]
    usage = next(s for s in samples if s.measurement == "container_cpu"
                 and s.tags["cgroup"] == "/" + POD).fields
    assert usage["usage_seconds_total"] == 1.4  # cpu.stat changed too: read afresh
    collector.close()
    assert not files._parsed
