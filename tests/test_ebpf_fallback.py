"""Where eBPF cannot run, the collector says why and procfs keeps the run-queue signal alive.

Each way of failing is produced for real: the `bcc` module made unimportable, a kernel header
tree BCC really fails to compile against, a process really without privileges. The fallback
then reads real /proc/TID/schedstat counters of real processes in real cgroups.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
from conftest import need
from support.ebpf import HOG, dominate_cpu, hogs_beside_a_sleeper, kernel_collectors, need_bcc, of

# Wakes 20 times a second: each wake may still wait milliseconds behind the hogs, but its
# waiting adds up to a small share of each second, while the hogs wait most of theirs.
SLEEPER = "import time\nwhile True: time.sleep(0.05)"


def _loaded_and_idle(real_cgroups, **ebpf):
    busy, idle = real_cgroups.create("be/busy"), real_cgroups.create("ls/idle")
    dominate_cpu(real_cgroups, busy, idle)
    cgroups, kernel = kernel_collectors(
        [{"path": busy, "class": "BE", "name": "busy"},
         {"path": idle, "class": "LS", "name": "idle"}], **ebpf)
    return busy, idle, cgroups, kernel


def _check_fallback_signal(real_cgroups, busy, idle, cgroups, kernel):
    ticks = hogs_beside_a_sleeper(real_cgroups, busy, 2 * os.cpu_count(), idle, SLEEPER,
                                  cgroups, kernel, 4)
    assert not [s for tick in ticks for s in tick if s.measurement.startswith("ebpf_")]
    loaded = of(ticks, "container_runqueue", workload="busy")
    quiet = of(ticks, "container_runqueue", workload="idle")
    assert len(loaded) >= 3 and len(quiet) >= 3
    assert loaded[0].tags["class"] == "BE" and quiet[0].tags["class"] == "LS"
    busy_rate = sorted(s.fields["wait_rate"] for s in loaded)[len(loaded) // 2]
    idle_rate = sorted(s.fields["wait_rate"] for s in quiet)[len(quiet) // 2]
    # 2 hogs per CPU: on average about one per CPU is waiting, i.e. ~ncpu seconds per second.
    assert busy_rate > 0.3 * os.cpu_count(), busy_rate
    print(f"wait_rate busy {busy_rate:.3f} s/s, idle {idle_rate:.4f} s/s")
    assert busy_rate >= 10 * idle_rate, (busy_rate, idle_rate)
    assert all(s.fields["tasks"] == 2 * os.cpu_count() for s in loaded)
    # The mean wait per timeslice is no 10x discriminator: the sleeper's mean is dominated by
    # its rare long waits behind the hogs (eBPF sees its median at microseconds and its p99 at
    # milliseconds; schedstat only has the mean). It must agree with the other two fields.
    for s in loaded + quiet:
        f = s.fields
        if f["timeslices_per_s"]:
            assert f["wait_per_timeslice_us"] == pytest.approx(
                f["wait_rate"] * 1e6 / f["timeslices_per_s"])


def test_without_bcc_the_agent_says_so_and_falls_back_to_schedstat(real_cgroups, monkeypatch):
    monkeypatch.setitem(sys.modules, "bcc", None)  # `import bcc` now raises ImportError
    busy, idle, cgroups, kernel = _loaded_and_idle(real_cgroups)
    kernel.start()
    try:
        status = kernel.status()
        assert not status.ok
        assert status.reason.startswith("eBPF unavailable: BCC is not installed")
        assert "python3-bpfcc" in status.reason
        assert "fallback: run-queue wait from /proc/PID/schedstat" in status.reason
        assert status.details["fallback"]["collector"] == "schedstat"
        _check_fallback_signal(real_cgroups, busy, idle, cgroups, kernel)
    finally:
        kernel.close()


def test_failed_compilation_is_reported_with_the_compiler_error(real_cgroups, tmp_path):
    """An empty header tree: BCC runs, clang really fails, and the reason carries its error."""
    need_bcc()
    empty = tmp_path / "no-headers"
    empty.mkdir()
    busy, idle, cgroups, kernel = _loaded_and_idle(real_cgroups, kernel_source=str(empty))
    saved = os.environ.get("BCC_KERNEL_SOURCE")
    kernel.start()
    try:
        status = kernel.status()
        assert not status.ok and status.reason.startswith("eBPF unavailable: ")
        for family in ("runqueue", "block_io", "reclaim"):
            signal = status.details["signals"][family]
            assert signal.startswith("unavailable: Failed to compile BPF module"), signal
            assert f"BCC_KERNEL_SOURCE={empty}" in signal
            assert "error" in signal.lower() or "unable" in signal.lower(), signal
        assert status.details["signals"]["syscall"] == "off"
        _check_fallback_signal(real_cgroups, busy, idle, cgroups, kernel)
    finally:
        kernel.close()
        if saved is not None:
            os.environ["BCC_KERNEL_SOURCE"] = saved


def test_missing_header_tree_is_named(tmp_path):
    need_bcc()
    _, kernel = kernel_collectors([], kernel_source=str(tmp_path / "absent"))
    saved = os.environ.get("BCC_KERNEL_SOURCE")
    kernel.start()
    try:
        reason = kernel.status().reason
        assert reason.startswith(f"eBPF unavailable: no kernel headers for BCC: "
                                 f"{tmp_path / 'absent'} does not exist")
        assert "scripts/bcc-setup.sh" in reason
    finally:
        kernel.close()
        if saved is not None:
            os.environ["BCC_KERNEL_SOURCE"] = saved


UNPRIVILEGED = textwrap.dedent("""
    import json, sys, time
    sys.path.insert(0, sys.argv[1])
    from support.ebpf import kernel_collectors
    cgroups, kernel = kernel_collectors([{"path": sys.argv[2], "class": "LS", "name": "w"}])
    kernel.start()
    cgroups.collect(time.time_ns()); kernel.collect(time.time_ns())
    time.sleep(1)
    cgroups.collect(time.time_ns())
    samples = kernel.collect(time.time_ns())
    print(json.dumps({"status": kernel.status().as_dict(),
                      "samples": [[s.measurement, s.tags, s.fields] for s in samples]}))
    kernel.close()
""")


def test_an_unprivileged_agent_is_told_why_and_still_gets_the_procfs_signal(real_cgroups):
    """A real process without root or capabilities (setpriv to nobody)."""
    rel = real_cgroups.create("w")
    real_cgroups.spawn(rel, HOG)
    real_cgroups.spawn(rel, HOG)
    real_cgroups.spawn(rel, HOG)
    tests_dir = os.path.dirname(os.path.abspath(__file__))
    done = subprocess.run(
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=-all",
         sys.executable, "-c", UNPRIVILEGED, tests_dir, rel],
        capture_output=True, text=True, timeout=120, env={**os.environ, "CI": "false"})
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    status = result["status"]
    assert not status["ok"]
    assert status["reason"].startswith(
        "eBPF unavailable: needs root or CAP_BPF and CAP_PERFMON (running as uid 65534")
    fallback = [s for s in result["samples"] if s[0] == "container_runqueue"]
    assert fallback and fallback[0][1]["workload"] == "w" and fallback[0][2]["tasks"] == 3
    assert fallback[0][2]["wait_rate"] > 0


def test_disabled_in_config_is_not_a_fault_and_the_fallback_runs():
    _, kernel = kernel_collectors([], enabled=False)
    kernel.start()
    try:
        status = kernel.status()
        assert status.ok and status.reason.startswith("eBPF disabled by collectors.ebpf.enabled")
        assert kernel.fallback is not None
    finally:
        kernel.close()


def test_fallback_can_be_turned_off():
    _, kernel = kernel_collectors([], enabled=False, fallback=False)
    kernel.start()
    try:
        assert kernel.fallback is None
    finally:
        kernel.close()


@pytest.mark.parametrize("text, parsed", [
    (b"123456 789 42\n", (789, 42)),
    (b"1 2\n", None),
    (b"a b c\n", None),
])
def test_schedstat_lines(text, parsed):
    from sloguard.collectors.schedstat import parse_schedstat

    assert parse_schedstat(text) == parsed


def test_privileges_are_read_from_capabilities(tmp_path, monkeypatch):
    from sloguard.collectors import ebpf

    need(True, "")
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    status = tmp_path / "status"
    for caps, allowed in ((0, False), (1 << 21, True), ((1 << 38) | (1 << 39), True),
                          (1 << 39, False)):
        status.write_text(f"Name:\tx\nCapEff:\t{caps:016x}\n")
        assert (ebpf.privilege_problem(str(status)) is None) == allowed, hex(caps)


def test_programs_load_into_an_agent_holding_over_1024_descriptors():
    """select(2) cannot watch a descriptor above 1,023: the loader's socket must be waited on
    another way, or an agent with many connections open never gets its programs (seen in the
    suite: "filedescriptor out of range in select()" once the test process held ~1,100)."""
    import resource

    from sloguard.collectors import ebpf_loader
    from sloguard.collectors.config import EbpfCollectorConfig
    from sloguard.collectors.ebpf import kernel_source

    need_bcc()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 1200:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(4096, hard), hard))
    held = []
    try:
        while not held or held[-1] < 1100:
            held.append(os.open(os.devnull, os.O_RDONLY))
        loaded, failed = ebpf_loader.load(["runqueue"], False,
                                          kernel_source(EbpfCollectorConfig()))
        assert failed == {} and list(loaded) == ["runqueue"]
        for family in loaded.values():
            assert family.map_fd > 1100  # received above the limit select(2) has
            family.close()
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_families_that_cannot_attach_are_exported_as_0_for_the_alert(tmp_path):
    """sloguard_ebpf_attached: 0 for each family asked for and not feeding the agent (whatever
    kept it from loading), nothing while eBPF is off or not started (nothing expected yet)."""
    from prometheus_client import CollectorRegistry, generate_latest

    from sloguard.collectors.base import CollectorContext
    from sloguard.collectors.kernel_latency import KernelLatencyCollector
    from sloguard.settings import Settings

    settings = Settings.model_validate({"collectors": {
        "cgroups": {"include": []},
        "ebpf": {"kernel_source": str(tmp_path / "absent"), "syscall": False}}})
    registry = CollectorRegistry()
    kernel = KernelLatencyCollector.create(
        CollectorContext("test-node", settings, metrics=registry, built={}))
    assert kernel is not None
    assert "sloguard_ebpf_attached{" not in generate_latest(registry).decode()  # not started
    saved = os.environ.get("BCC_KERNEL_SOURCE")
    kernel.start()
    try:
        exported = generate_latest(registry).decode()
        for family in ("runqueue", "block_io", "reclaim"):
            assert f'sloguard_ebpf_attached{{family="{family}"}} 0.0' in exported, exported
        assert 'family="syscall"' not in exported  # not asked for
    finally:
        kernel.close()
        if saved is not None:
            os.environ["BCC_KERNEL_SOURCE"] = saved
    _, off = kernel_collectors([], enabled=False)
    off.start()
    assert off.ebpf.attachment() == {}
    off.close()
