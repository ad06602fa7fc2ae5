"""What the embedded store's writes cost a node: disk bytes written and CPU per tick.

Each measurement's table is indexed by (series, time), so one tick (a row for every series)
dirties as many index pages as there are series; SQLite writes each dirty page whole to the
WAL, and again at the checkpoint. Since the fold (store/embedded.py), a tick appends to an
unindexed twin table and the rows are moved into the index every `fold_every_s`. This
benchmark writes ticks shaped like the 100-cgroup agent's (per cgroup: container_cpu,
container_memory, three container_pressure and container_runqueue samples; a few node
samples) at each `fold_every_s`, the reference being 0 (every write into the index, as before
the fold), and prints per tick the bytes the process wrote to disk (/proc/self/io
write_bytes: WAL, checkpoints) and its CPU, with the ratio to the reference measured in the
same run; then the time to read one series' last hour and all series' last minute.

    .venv/bin/python benchmarks/store_write.py [--cgroups 100] [--ticks 1800]
        [--fold 0 5 30 60] [--retention MINUTES]

With `--retention M`, the default fold (30 s) is measured once more on a store already full to an
M-minute retention, with `maintain` (the agent's retention pass) every 60 s as the agent runs
it: at steady state each minute deletes a minute of rows from every table and its index, which
a run on a fresh store never does (it holds nothing old enough). The table then gives each
store's write and retention CPU per tick and the steady store's ratio to the fresh one, both
measured in the same run.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

from sloguard.core.samples import Sample
from sloguard.core.selectors import Matcher
from sloguard.store import MAINTAIN_EVERY_S, WindowQuery
from sloguard.store.embedded import FOLD_EVERY_S, EmbeddedStore

S = 10**9
T0 = 1_800_000_000 * S
SHAPES = (  # measurement, extra tags, fields (as the cgroup collector writes them)
    ("container_cpu", {}, ("usage_cores", "user_cores", "system_cores", "throttled_ratio",
                           "throttled_s", "periods", "nr_throttled", "limit_cores")),
    ("container_memory", {}, ("usage_bytes", "working_set_bytes", "rss_bytes", "cache_bytes",
                              "limit_bytes", "pgfault_rate", "pgmajfault_rate", "oom_kills")),
    *(("container_pressure", {"resource": r}, ("some_rate", "full_rate", "some_avg10",
                                                "full_avg10", "some_total", "full_total"))
      for r in ("cpu", "memory", "io")),
    ("container_runqueue", {}, ("wait_per_timeslice_us", "wait_rate", "timeslices_rate",
                                "tasks")),
)


def tick(cgroups: int, t: int) -> list[Sample]:
    out = []
    for c in range(cgroups):
        tags = {"node": "bench", "cgroup": f"/kubepods/pod{c:04d}", "level": "cgroup",
                "class": "LS" if c % 10 == 0 else "BE"}
        for measurement, extra, fields in SHAPES:
            out.append(Sample(measurement, {**tags, **extra},
                              {f: float((t // S + c + k) % 97) for k, f in enumerate(fields)},
                              t))
    for measurement in ("node_cpu", "node_memory", "node_load", "node_pressure"):
        out.append(Sample(measurement, {"node": "bench"},
                          {f"f{k}": float(t // S % 13 + k) for k in range(6)}, t))
    return out


def written_bytes() -> int:
    with open("/proc/self/io") as handle:
        return next(int(line.split()[1]) for line in handle if line.startswith("write_bytes"))


def measure(fold: float, cgroups: int, ticks: int, work: Path,
            retention_s: float = 0.0) -> dict[str, float]:
    """With `retention_s`, the store is first filled to it (`maintain` every MAINTAIN_EVERY_S of the
    sample clock, as the agent calls it), and the ticks measured are those of a full store."""
    label = f"fold {fold:g}" + (f", full to {retention_s / 60:g} min" if retention_s else "")
    path = work / label.replace(" ", "-").replace(",", "") / "samples.db"
    clock = [T0]
    # The fold is due by the sample clock, as in a 1 s agent.
    store = EmbeddedStore(path, retention_s=retention_s or 7 * 86400, max_size=1 << 40,
                          fold_every_s=fold, clock=lambda: clock[0] / S)
    # the index has some depth before it is measured; a full store is measured once full
    warm = int(retention_s) if retention_s else min(ticks // 3, 600)
    spent = {"maintain": 0.0}

    def write(n: int) -> None:
        for _ in range(n):
            clock[0] += S
            store.write(tick(cgroups, clock[0]))
            if retention_s and clock[0] // S % int(MAINTAIN_EVERY_S) == 0:
                start = time.process_time()
                store.maintain(clock[0])
                spent["maintain"] += time.process_time() - start

    for done in range(0, warm, 600):
        write(min(600, warm - done))
        print(f"  {label}: filling, {min(done + 600, warm)}/{warm} ticks", file=sys.stderr,
              flush=True)
    spent["maintain"] = 0.0
    disk0, cpu0 = written_bytes(), time.process_time()
    done = 0
    while done < ticks:
        step = min(300, ticks - done)
        write(step)
        done += step
        print(f"  {label}: {done}/{ticks} ticks", file=sys.stderr, flush=True)
    disk, cpu = written_bytes() - disk0, time.process_time() - cpu0
    now = clock[0] + 1
    one = WindowQuery("container_cpu", now - 3600 * S, now, fields=("usage_cores",),
                      matchers=(Matcher("cgroup", "=", "/kubepods/pod0007"),))
    every = WindowQuery("container_cpu", now - 60 * S, now, fields=("usage_cores",))
    reads = {}
    for name, query in (("one", one), ("all", every)):
        start = time.perf_counter()
        for _ in range(5):
            store.read_series(query)
        reads[name] = (time.perf_counter() - start) / 5 * 1000
    size = sum(p.stat().st_size for p in path.parent.iterdir())
    store.close()
    return {"kb_per_tick": disk / ticks / 1024, "cpu_ms_per_tick": cpu / ticks * 1000,
            "maintain_ms_per_tick": spent["maintain"] / ticks * 1000,
            "read_one_hour_ms": reads["one"], "read_all_minute_ms": reads["all"],
            "samples_per_tick": len(tick(cgroups, T0)), "mb": size / 1e6}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cgroups", type=int, default=100)
    parser.add_argument("--ticks", type=int, default=1800)
    parser.add_argument("--fold", type=float, nargs="+", default=[0, 5, 30, 60])
    parser.add_argument("--retention", type=float, default=0.0, metavar="MINUTES",
                        help="also measure the default fold on a store full to this retention")
    args = parser.parse_args()
    if args.retention < 0 or (args.retention and args.retention * 60 < MAINTAIN_EVERY_S):
        parser.error(f"--retention must be 0 or at least {MAINTAIN_EVERY_S / 60:g} minute")
    folds = sorted(set(args.fold) | {0.0})
    work = Path(tempfile.mkdtemp(prefix="sloguard-store-write-"))
    try:
        results = {fold: measure(fold, args.cgroups, args.ticks, work) for fold in folds}
        if args.retention:  # the same store twice: fresh, then full (fresh again after it)
            steady = [measure(FOLD_EVERY_S, args.cgroups, args.ticks, work,
                              args.retention * 60)]
            fresh = [results.get(FOLD_EVERY_S) or measure(FOLD_EVERY_S, args.cgroups,
                                                          args.ticks, work)]
            fresh.append(measure(FOLD_EVERY_S, args.cgroups, args.ticks, work / "again"))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    ref = results[0.0]
    print(f"\nembedded store, {args.cgroups} cgroups ({ref['samples_per_tick']:.0f} samples a "
          f"tick), {args.ticks} ticks measured\n")
    print("| fold_every_s | disk KB per tick | vs 0 | CPU ms per tick | vs 0 | read one series, "
          "1 h (ms) | read all series, 1 min (ms) |")
    print("|---|---|---|---|---|---|---|")
    for fold, r in results.items():
        print(f"| {fold:g}{' (index at once)' if not fold else ''} | {r['kb_per_tick']:.0f} | "
              f"{r['kb_per_tick'] / ref['kb_per_tick']:.2f}x | {r['cpu_ms_per_tick']:.2f} | "
              f"{r['cpu_ms_per_tick'] / ref['cpu_ms_per_tick']:.2f}x | "
              f"{r['read_one_hour_ms']:.1f} | {r['read_all_minute_ms']:.1f} |")
    if args.retention:
        cost = [r["cpu_ms_per_tick"] for r in fresh]
        base = sum(cost) / len(cost)
        print(f"\nfold {FOLD_EVERY_S:g} s, fresh (before and after) and full to a "
              f"{args.retention:g}-minute retention with `maintain` every {MAINTAIN_EVERY_S:g} s\n")
        print("| store | CPU ms per tick (writes and retention) | of which retention | "
              "vs fresh | disk KB per tick | MB on disk | read one series, 1 h (ms) |")
        print("|---|---|---|---|---|---|---|")
        for name, r in (("fresh", fresh[0]), ("full", steady[0]), ("fresh again", fresh[1])):
            print(f"| {name} | {r['cpu_ms_per_tick']:.2f} | {r['maintain_ms_per_tick']:.2f} | "
                  f"{r['cpu_ms_per_tick'] / base:.2f}x | {r['kb_per_tick']:.0f} | "
                  f"{r['mb']:.0f} | {r['read_one_hour_ms']:.1f} |")


if __name__ == "__main__":
    main()
