"""What the eBPF tests need from this machine, and a way to run collectors side by side."""

from __future__ import annotations

import gc
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from conftest import need

from sloguard.collectors.cgroups import CgroupCollector
from sloguard.collectors.config import CollectorsConfig, EbpfCollectorConfig
from sloguard.collectors.ebpf import kernel_source
from sloguard.collectors.kernel_latency import KernelLatencyCollector
from sloguard.core.samples import Sample

HOG = "while True: pass"  # a process that keeps one CPU busy


def need_bcc() -> None:
    """Root, Debian's BCC importable from this interpreter, and something to compile against
    (scripts/bcc-setup.sh provides the last two; `make test` runs it)."""
    need(os.geteuid() == 0, "loading eBPF programs needs root")
    try:
        import bcc  # noqa: F401
    except ImportError as exc:
        need(False, f"BCC is not importable ({exc}); run scripts/bcc-setup.sh")
    source = kernel_source(EbpfCollectorConfig())
    build = f"/lib/modules/{os.uname().release}/build"
    need(source is not None or os.path.isdir(build),
         "no kernel headers for BCC; run scripts/bcc-setup.sh")
    if source is not None:  # for tests that compile programs of their own
        os.environ.setdefault("BCC_KERNEL_SOURCE", source)


def dominate_cpu(real_cgroups: Any, *rels: str) -> None:
    """Give the test's cgroups, and every cgroup between them and the root, the maximum CPU
    weight: other work on this shared machine (load averages of 5-8 were seen) then barely
    competes with them, so what a test compares is what its own cgroups do to each other.
    (A weight only counts against siblings, hence the whole chain.)"""
    chain: dict[str, None] = {}
    for rel in rels:
        parts = rel.split("/")
        for depth in range(1, len(parts) + 1):
            chain["/".join(parts[:depth])] = None
    for path in chain:
        try:
            real_cgroups.write(path, "cpu.shares", "262144")
        except FileNotFoundError:
            real_cgroups.write(path, "cpu.weight", "10000")


@contextmanager
def while_hogs_run(real_cgroups: Any) -> Iterator[None]:
    """Around a test's CPU hogs and its measurement: no garbage collection, and the hogs (and
    the test's other processes) killed as soon as it ends. dominate_cpu gives them a weight
    that starves this process, and a collection of pytest's heap then ran at a fraction of a
    percent of a CPU: a CI simulation timed out at 1200 s after the measurement was done."""
    gc.disable()
    try:
        yield
    finally:
        real_cgroups.stop()
        gc.enable()


def hogs_beside_a_sleeper(real_cgroups: Any, busy: str, hogs: int, idle: str, sleeper: str,
                          cgroups: CgroupCollector, kernel: KernelLatencyCollector,
                          seconds: float) -> list[list[Sample]]:
    """`hogs` CPU hogs in `busy` and one `sleeper` in `idle`, the collectors ticked over them
    for `seconds` (run), the processes ended with it (while_hogs_run).

    The hogs are capped at half a CPU less than this process may use (RealCgroups.limit). At
    dominate_cpu's weight, uncapped, they left this process (whose threads tick the
    collectors) a fraction of a percent of a CPU: the 6 s of ticks of
    test_ebpf_real's 10x test took 13 s alone and 134-165 s late in a CI simulation, when
    threads left over from earlier tests share that fraction. Throttled hogs wait on their run
    queue all the more, and the sleeper's weight is untouched, so what the tests compare keeps
    its direction."""
    real_cgroups.limit(busy, len(os.sched_getaffinity(0)) - 0.5)
    with while_hogs_run(real_cgroups):
        for _ in range(hogs):
            real_cgroups.spawn(busy, HOG)
        real_cgroups.spawn(idle, sleeper)
        time.sleep(0.5)
        return run(cgroups, kernel, seconds)


def kernel_collectors(declare: list[dict[str, str]], **ebpf: Any
                      ) -> tuple[CgroupCollector, KernelLatencyCollector]:
    """The container collector over declared cgroups and the kernel-latency collector on it,
    as the agent builds them; the caller must `start()` and `close()` the latter."""
    config = CollectorsConfig.model_validate({
        "cgroups": {"include": [], "rediscover": 1, "declare": declare},
        "ebpf": ebpf,
    })
    cgroups = CgroupCollector("test-node", config.cgroups)
    return cgroups, KernelLatencyCollector("test-node", config, cgroups)


def run(cgroups: CgroupCollector, kernel: KernelLatencyCollector, seconds: float,
        interval: float = 1.0) -> list[list[Sample]]:
    """Tick both collectors like the agent's loop does; the kernel collector's samples per tick
    (the first tick, which only primes counters, is dropped). A fixed number of ticks
    (seconds / interval), not a deadline: on a machine the test's own CPU hogs saturate, a
    collection can take a good part of a second, and a deadline would yield fewer ticks."""
    ticks = []
    cgroups.collect(time.time_ns())
    kernel.collect(time.time_ns())
    for _ in range(max(1, round(seconds / interval))):
        time.sleep(interval)
        cgroups.collect(time.time_ns())
        ticks.append(kernel.collect(time.time_ns()))
    return ticks


def of(ticks: list[list[Sample]], measurement: str, **tags: str) -> list[Sample]:
    return [s for tick in ticks for s in tick if s.measurement == measurement
            and all(s.tags.get(k) == v for k, v in tags.items())]
