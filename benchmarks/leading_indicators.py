"""Could a leading indicator take the first rung before the LS latency objective is crossed?
Read from a `sloguard lab` run's own recordings (each way's sample store and way.json), so it
judges the signals the agent really collected, at the cadence it really collected them.

Issue #23 asked whether the LS cgroup's own run-queue wait or CPU PSI rises before its latency
objective is crossed, and whether a rule on them would act earlier without false actions in
quiet periods. Per signal, the threshold is the one quiet periods cross 1% of the time: the
99th percentile of that signal over every baseline way (no BE at all). Then, per way:
- quiet: the signal's median, p99 and maximum outside the episodes (1 s before each start to
  3 s after each end left out), and how many quiet samples per minute cross the threshold
  (each is a false action for a rule without `for`);
- episode: its median and 10th percentile from 1 s after each start to the end;
- delay: the first sample over the threshold after each start, against the first firing of
  the latency rule (LSLatencyInterference) after it; a leading indicator would have to come
  first, and to stay under the threshold in quiet periods.

    .venv/bin/python benchmarks/leading_indicators.py LAB_DIR [--plot leading-indicators.png]

LAB_DIR is what `sloguard lab ... --out LAB_DIR` wrote: `<scenario>/<way>/` or, with
`--repeat`, `<scenario>/run-N/<way>/`.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from sloguard.core.selectors import Matcher
from sloguard.lab.way import WayResult
from sloguard.store import WindowQuery
from sloguard.store.embedded import EmbeddedStore

LATENCY_RULE = "LSLatencyInterference"
QUIET_BEFORE_S, QUIET_AFTER_S = 1.0, 3.0  # around each episode, neither quiet nor episode
SETTLE_S = 1.0  # an episode's first second is its onset: not part of its level
LOOK_S = 10.0  # how long after a start a first crossing (or firing) is looked for


@dataclass(frozen=True)
class Signal:
    name: str
    measurement: str
    field: str
    matchers: tuple[Matcher, ...]
    unit: str


SIGNALS = (
    Signal("LS CPU PSI some", "container_pressure", "some_rate",
           (Matcher("class", "=", "LS"), Matcher("resource", "=", "cpu"),
            Matcher("level", "=", "cgroup")), "%"),
    Signal("LS run-queue wait per timeslice (schedstat)", "container_runqueue",
           "wait_per_timeslice_us", (Matcher("class", "=", "LS"),
                                     Matcher("level", "=", "cgroup")), "us"),
    Signal("LS run-queue p99 (eBPF)", "ebpf_runqueue", "p99_us",
           (Matcher("class", "=", "LS"), Matcher("level", "=", "cgroup")), "us"),
)


@dataclass
class Way:
    scenario: str
    run: str
    way: str
    result: WayResult
    # per signal: times (s since the way's start) and values
    series: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)

    @property
    def spans(self) -> list[tuple[float, float]]:
        t0 = self.result.start_ns
        return [((e.started_ns - t0) / 1e9, (e.ended_ns - t0) / 1e9)
                for e in self.result.episodes]

    def firings(self) -> list[float]:
        t0 = self.result.start_ns
        return sorted((i["fired_ns"] - t0) / 1e9 for i in self.result.incidents
                      if i.get("rule") == LATENCY_RULE and i.get("fired_ns"))


def load_way(directory: Path, scenario: str, run: str) -> Way:
    result = WayResult.load(directory)
    way = Way(scenario, run, result.way, result)
    store = EmbeddedStore(directory / "data" / "samples.db", retention_s=1e9, max_size=1 << 40)
    try:
        start = result.start_ns - int(60e9)
        end = result.start_ns + int((result.seconds + 60) * 1e9)
        for signal in SIGNALS:
            times: list[int] = []
            values: list[float] = []
            for _, ts, vs in store.read_series(WindowQuery(
                    signal.measurement, start, end, fields=(signal.field,),
                    matchers=signal.matchers)):
                times += ts
                values += vs
            if times:
                order = np.argsort(times)
                way.series[signal.name] = (
                    (np.asarray(times)[order] - result.start_ns) / 1e9,
                    np.asarray(values)[order])
    finally:
        store.close()
    return way


def find_ways(lab: Path) -> list[Way]:
    ways = []
    for way_json in sorted(lab.glob("*/*/way.json")) + sorted(lab.glob("*/run-*/*/way.json")):
        directory = way_json.parent
        if directory.parent.name.startswith("run-"):
            scenario, run = directory.parent.parent.name, directory.parent.name
        else:
            scenario, run = directory.parent.name, "run-1"
        ways.append(load_way(directory, scenario, run))
    return ways


def masks(way: Way, times: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(quiet, in episode) for each sample time."""
    quiet = (times >= 0) & (times <= way.result.seconds)
    episode = np.zeros(len(times), bool)
    for start, end in way.spans:
        quiet &= ~((times >= start - QUIET_BEFORE_S) & (times < end + QUIET_AFTER_S))
        episode |= (times >= start + SETTLE_S) & (times < end)
    return quiet, episode


def first_after(times: list[float] | np.ndarray, start: float) -> float | None:
    later = [t - start for t in times if start <= t < start + LOOK_S]
    return min(later) if later else None


@dataclass
class Row:
    scenario: str
    way: str
    signal: str
    threshold: float
    quiet_median: float
    quiet_p99: float
    quiet_max: float
    false_per_min: float
    episode_median: float
    episode_p10: float
    crossing_s: list[float | None]
    firing_s: list[float | None]
    quiet_values: np.ndarray  # what the plot shows: the analysis's own samples
    episode_values: np.ndarray


def analyse(ways: list[Way]) -> list[Row]:
    rows = []
    for scenario in sorted({w.scenario for w in ways}):
        mine = [w for w in ways if w.scenario == scenario]
        for signal in SIGNALS:
            quiet_base = [w.series[signal.name][1][masks(w, w.series[signal.name][0])[0]]
                          for w in mine if w.way == "baseline" and signal.name in w.series]
            if not quiet_base or not sum(len(q) for q in quiet_base):
                continue  # not collected on this node (eBPF off, say)
            threshold = float(np.percentile(np.concatenate(quiet_base), 99))
            for kind in ("baseline", "unguarded", "guarded"):
                quiet_v, episode_v, quiet_s = [], [], 0.0
                crossings: list[float | None] = []
                firings: list[float | None] = []
                for w in (w for w in mine if w.way == kind and signal.name in w.series):
                    times, values = w.series[signal.name]
                    quiet, episode = masks(w, times)
                    quiet_v.append(values[quiet])
                    episode_v.append(values[episode])
                    quiet_s += quiet_seconds(w)
                    over = times[values > threshold]
                    fired = w.firings()
                    for start, _ in w.spans:
                        crossings.append(first_after(over, start))
                        firings.append(first_after(fired, start))
                if not quiet_v:
                    continue
                q, e = np.concatenate(quiet_v), np.concatenate(episode_v)
                rows.append(Row(
                    scenario, kind, signal.name, threshold,
                    float(np.median(q)), float(np.percentile(q, 99)), float(q.max()),
                    float((q > threshold).sum() / max(quiet_s / 60, 1e-9)),
                    float(np.median(e)) if len(e) else float("nan"),
                    float(np.percentile(e, 10)) if len(e) else float("nan"),
                    crossings, firings, q, e))
    return rows


def quiet_seconds(way: Way) -> float:
    busy = sum(min(end + QUIET_AFTER_S, way.result.seconds) - max(start - QUIET_BEFORE_S, 0)
               for start, end in way.spans)
    return max(way.result.seconds - busy, 0.0)


def _median(values: list[float | None]) -> str:
    known = [v for v in values if v is not None]
    if not known:
        return "-"
    return f"{np.median(known):.2f} s ({len(known)}/{len(values)})"


def lead(row: Row) -> str:
    """The latency rule's firing minus the signal's first crossing, per episode where both
    came: positive when the signal led."""
    paired = [f - c for c, f in zip(row.crossing_s, row.firing_s, strict=True)
              if c is not None and f is not None]
    if not paired:
        return "-"
    return f"{np.median(paired):+.2f} s ({sum(p > 0.05 for p in paired)}/{len(paired)} led)"


def table(rows: list[Row]) -> str:
    unit = {s.name: s.unit for s in SIGNALS}
    lines = ["| scenario | way | signal (threshold) | quiet median / p99 / max | quiet samples "
             "over, per min | episode median / p10 | first over, after start | latency rule "
             "fired, after start | signal's lead (median) |", "|" + "---|" * 9]
    for r in rows:
        u = unit[r.signal]
        lines.append(
            f"| {r.scenario} | {r.way} | {r.signal} ({r.threshold:.1f} {u}) | "
            f"{r.quiet_median:.1f} / {r.quiet_p99:.1f} / {r.quiet_max:.1f} | "
            f"{r.false_per_min:.2f} | {r.episode_median:.1f} / {r.episode_p10:.1f} | "
            f"{_median(r.crossing_s) if r.way != 'baseline' else '-'} | "
            f"{_median(r.firing_s) if r.way != 'baseline' else '-'} | "
            f"{lead(r) if r.way != 'baseline' else '-'} |")
    return "\n".join(lines)


def plot(rows: list[Row], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    signals = [s for s in SIGNALS if any(r.signal == s.name for r in rows)]
    scenarios = sorted({r.scenario for r in rows})
    fig, axes = plt.subplots(len(signals), len(scenarios), squeeze=False,
                             figsize=(5 * len(scenarios), 3.2 * len(signals)))
    for i, signal in enumerate(signals):
        for j, scenario in enumerate(scenarios):
            ax = axes[i][j]
            data, labels = [], []
            for r in rows:
                if r.scenario == scenario and r.signal == signal.name:
                    data += [r.quiet_values, r.episode_values]
                    labels += [f"{r.way}\nquiet", f"{r.way}\nepisode"]
            ax.boxplot(data, whis=(1, 99), showfliers=True, flierprops={"markersize": 2})
            ax.set_xticks(range(1, len(labels) + 1), labels, fontsize=7)
            threshold = next(r.threshold for r in rows
                             if r.signal == signal.name and r.scenario == scenario)
            ax.axhline(threshold, color="tab:red", lw=0.8, ls="--",
                       label="baseline quiet p99")
            ax.set_title(f"{scenario}: {signal.name}", fontsize=9)
            ax.set_ylabel(signal.unit)
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("lab", type=Path, help="a `sloguard lab --out` directory")
    parser.add_argument("--plot", type=Path, help="write box plots of each signal here")
    parser.add_argument("--json", type=Path, help="write the rows here")
    args = parser.parse_args(argv)
    ways = find_ways(args.lab)
    if not ways:
        print(f"{args.lab}: no way.json under <scenario>/[run-N/]<way>/", file=sys.stderr)
        return 2
    print(f"{len(ways)} ways from {args.lab}", file=sys.stderr)
    rows = analyse(ways)
    print(table(rows))
    if args.json:
        args.json.write_text(json.dumps(
            [{k: v for k, v in r.__dict__.items() if not k.endswith("_values")} for r in rows],
            indent=1))
    if args.plot:
        plot(rows, args.plot)
        print(f"plot: {args.plot}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
