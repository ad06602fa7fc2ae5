"""The lab report: a markdown page with every figure and one plot per scenario.

The plot is what a reader wants to see first: the LS p99 of each second for the three ways on
one time axis, the antagonist periods shaded, the SLO target drawn, and the guarded agent's
actions marked where they happened (solid: applied, dotted: undone).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from sloguard.lab.analysis import (
    MITIGATING,
    NOISY_BASELINE,
    WayStats,
    mitigated_spans,
    p99_timeline,
    p99_within,
    stalled,
    way_stats,
)
from sloguard.lab.scenario import ScenarioSpec
from sloguard.lab.way import WayResult

# the issues' targets (docs/lab.md): #23's delay and LS p99 over the whole episode, onset
# included; the memory (vm) antagonist's looser ratio
TARGET_DELAY_S = 0.25
TARGET_P99_RATIO = 1.1
VM_P99_RATIO = 1.25
TARGET_LIFT_S = 20.0
TARGET_BE_RATIO = 0.5
HELD_ANTAGONISTS = ("cpu", "cache", "io", "vm")  # judged; the others reported only
COLORS = {"baseline": "#2b8a3e", "unguarded": "#c92a2a", "guarded": "#1864ab",
          "guarded-tier": "#0c8599", "guarded-suspects": "#e8590c", "guarded-mixed": "#7048e8",
          "guarded-standing": "#2b8a3e", "guarded-episodic": "#c2255c"}
GUARDED_WAYS = ("unguarded", "guarded", "guarded-tier", "guarded-suspects", "guarded-mixed",
                "guarded-standing", "guarded-episodic")
TARGET_INNOCENT_RATIO = 0.9  # attribution (#22): the innocent BE jobs keep this much


@dataclass
class ScenarioReport:
    spec: ScenarioSpec
    results: dict[str, WayResult]
    stats: dict[str, WayStats]

    def ratio(self, way: str, attr: str, reference: str) -> float:
        a = getattr(self.stats[way], attr) if way in self.stats else math.nan
        b = getattr(self.stats[reference], attr) if reference in self.stats else math.nan
        return a / b if b and not math.isnan(b) else math.nan

    def mitigated(self) -> tuple[float, float]:
        """(guarded p99, baseline p99) over the seconds the guarded way had a lever in force
        during the episodes: what the levers reach once on, apart from the onset seconds
        before the first one, which a reactive guardrail cannot avoid."""
        if "guarded" not in self.stats or "baseline" not in self.results:
            return math.nan, math.nan
        spans = mitigated_spans(self.stats["guarded"])
        if not spans:
            return math.nan, math.nan
        return (p99_within(self.results["guarded"], spans),
                p99_within(self.results["baseline"], spans))

    def mitigated_ratio(self) -> float:
        guarded, baseline = self.mitigated()
        return guarded / baseline if baseline and not math.isnan(baseline) else math.nan


def build(spec: ScenarioSpec, results: dict[str, WayResult]) -> ScenarioReport:
    return ScenarioReport(spec, results, {w: way_stats(r) for w, r in results.items()})


@dataclass
class ScenarioRuns:
    """A scenario run several times (`sloguard lab --repeat N`). One run decides nothing near
    a 1.25x target on a noisy machine (runs of the same way differed up to 2x here), so each
    run's ratios are taken within the run (its own baseline, measured minutes apart from its
    other ways) and the targets are judged on the median of those ratios. Of an even count
    the cautious middle one is taken (the worse of the two), so the verdict is always some
    run's own figure and never rests on averaging a good run with a bad one."""

    spec: ScenarioSpec
    runs: list[ScenarioReport]
    numbers: list[int] = field(default_factory=list)  # each run's k (its folder run-<k>)

    def __post_init__(self) -> None:
        if not self.numbers:
            self.numbers = list(range(1, len(self.runs) + 1))

    def ratios(self, way: str, attr: str, reference: str) -> list[float]:
        return [r.ratio(way, attr, reference) for r in self.runs]

    def median_ratio(self, way: str, attr: str, reference: str, higher_is_worse: bool) -> float:
        """The median of the runs that have the ratio; of an even count, the worse middle."""
        values = [v for v in self.ratios(way, attr, reference) if not math.isnan(v)]
        if not values:
            return math.nan
        return statistics.median_high(values) if higher_is_worse else \
            statistics.median_low(values)

    def p99_ratio(self) -> float:
        return self.median_ratio("guarded", "episode_p99_ms", "baseline", higher_is_worse=True)

    def be_ratio(self) -> float:
        return self.median_ratio("guarded", "be_ops_per_s", "unguarded", higher_is_worse=False)

    def counted(self) -> int:
        """Runs with a guarded/baseline p99 ratio (an interrupted run may have none)."""
        return sum(not math.isnan(v) for v in self.ratios("guarded", "episode_p99_ms",
                                                          "baseline"))

    def median_run(self) -> tuple[int, ScenarioReport]:
        """(its number, the run) whose guarded/baseline p99 ratio is the judged one: the run
        the detailed tables and the plot show (the first run when none has the ratio)."""
        judged = self.p99_ratio()
        for number, run, ratio in zip(self.numbers, self.runs,
                                      self.ratios("guarded", "episode_p99_ms", "baseline"),
                                      strict=True):
            if ratio == judged:
                return number, run
        return self.numbers[0], self.runs[0]


def plot(report: ScenarioReport, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(11, 4.2), dpi=110)
    any_result = next(iter(report.results.values()))
    for episode in any_result.episodes:
        start = (episode.started_ns - any_result.start_ns) / 1e9
        end = (episode.ended_ns - any_result.start_ns) / 1e9
        ax.axvspan(start, end, color="#fab005", alpha=0.18, lw=0)
        ax.text(start + 0.5, 0.98, f"BE: {episode.antagonist}", transform=ax.get_xaxis_transform(),
                va="top", fontsize=8, color="#995c00")
    for way, result in report.results.items():
        t, p99 = p99_timeline(result)
        ax.plot(t, p99, color=COLORS.get(way, "black"), lw=1.2, label=way, drawstyle="steps-post")
    ax.axhline(report.spec.ls.slo.latency_ms, color="black", ls="--", lw=0.8,
               label=f"SLO target ({report.spec.ls.slo.latency_ms:g} ms)")
    guarded = report.stats.get("guarded")
    if guarded is not None:
        shown = set()
        for action in guarded.actions:
            if action["status"] not in ("done", "proposed") or action["kind"] == "notify":
                continue
            mitigating = action["kind"] in MITIGATING
            label = f"{action['action']}: {action['kind']}"
            ax.axvline(action["t"], color="#5f3dc4" if mitigating else "#868e96",
                       ls="-" if action["action"] == "apply" else ":", lw=1.0,
                       label=None if label in shown else label)
            shown.add(label)
            ax.text(action["t"], 0.02, f" {action['kind']}", rotation=90, fontsize=7,
                    transform=ax.get_xaxis_transform(), va="bottom",
                    color="#5f3dc4" if mitigating else "#868e96")
    ax.set_yscale("log")
    ax.set_xlabel("seconds since the start of the way")
    ax.set_ylabel("LS p99 per second (ms, log)")
    ax.set_title(f"scenario {report.spec.name}: LS (redis) p99 per second; "
                 f"actions of the guarded way marked")
    ax.legend(fontsize=7, loc="upper right", ncol=2)
    ax.grid(True, which="both", alpha=0.25)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def _ms(value: float) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if math.isinf(value):
        return "lost"
    return f"{value:.3f}"


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _x(value: float) -> str:
    return "-" if value is None or math.isnan(value) else f"{value:.2f}x"


def markdown(scenarios: list[ScenarioRuns], out: Path, header: str) -> str:
    lines = [header, ""]
    guarded_episodes = [e for g in scenarios for r in g.runs if "guarded" in r.stats
                        for e in r.stats["guarded"].episodes]
    delays = [e.first_action_s for e in guarded_episodes if e.first_action_s is not None]
    missed = sum(1 for e in guarded_episodes if e.first_action_s is None)
    quiet = [(g.spec.name, k, w, a) for g in scenarios for k, r in zip(g.numbers, g.runs,
                                                                       strict=True)
             for w, s in r.stats.items() for a in s.quiet_actions]
    repeated = any(len(g.runs) > 1 for g in scenarios)
    lines += ["## Targets", ""]
    if repeated:
        lines += ["A scenario that ran several times is judged on the median of its runs' "
                  "ratios, each taken within its run (against that run's own baseline or "
                  "unguarded way; every run's in brackets; of an even count, the worse middle "
                  "one). The delay target takes the median over every guarded episode of every "
                  "run, and any action in a quiet period of any run misses that target.", ""]
    lines += ["| target | result | met |", "|---|---|---|"]
    median = statistics.median(delays) if delays else None
    fresh = [e.first_action_s for e in guarded_episodes
             if e.first_action_s is not None and not e.carried]
    fresh_median = statistics.median(fresh) if fresh else None
    ladder = [e.ladder_action_s for e in guarded_episodes if e.ladder_action_s is not None]
    ladder_median = statistics.median(ladder) if ladder else None
    standing = any(e.ladder_action_s != e.first_action_s for e in guarded_episodes)
    lines.append(f"| median delay to the first mitigating action <= {TARGET_DELAY_S:g} s "
                 f"(guarded) | {_s(median)} s over {len(delays)} episodes"
                 f"{f', {missed} with none' if missed else ''} (a lever still in force at the "
                 f"start counts 0 s); {_s(fresh_median)} s over the {len(fresh)} episodes that "
                 f"needed a new action"
                 + (f"; without the standing levers (the ladder's first action) "
                    f"{_s(ladder_median)} s over {len(ladder)}" if standing else "")
                 + " | "
                 f"{_yes(median is not None and median <= TARGET_DELAY_S and not missed)} |")
    lines.append(f"| no action in quiet periods (every way) | {len(quiet)} | "
                 f"{_yes(not quiet)} |")
    late = [x for e in guarded_episodes for x in e.after_end]
    lines.append(f"| no action or firing after the antagonist stopped (guarded) | "
                 f"{len(late)}{': ' + ', '.join(late[:6]) if late else ''} | "
                 f"{_yes(not late)} |")
    lifted = [e.lifted_s for e in guarded_episodes]
    known = [x for x in lifted if x is not None]
    lines.append(f"| levers lifted within {TARGET_LIFT_S:g} s of the antagonist's end "
                 f"(guarded) | longest {_s(max(known) if known else None)} s"
                 f"{f', {lifted.count(None)} still on at the next start' if None in lifted else ''}"
                 f" | {_yes(bool(lifted) and None not in lifted and max(known) <= TARGET_LIFT_S)}"
                 " |")
    for g in scenarios:
        p99, be = g.p99_ratio(), g.be_ratio()
        kind = "+".join(g.spec.schedule.episodes[0].kinds)
        held = kind in HELD_ANTAGONISTS and not g.spec.culprits
        ratio = VM_P99_RATIO if kind == "vm" else TARGET_P99_RATIO
        met = p99 <= ratio and be >= TARGET_BE_RATIO
        result = f"p99 {_x(p99)}, BE {_x(be)}"
        if len(g.runs) > 1:
            result = (f"median of {g.counted()} runs: p99 {_x(p99)} ("
                      f"{_each(g.ratios('guarded', 'episode_p99_ms', 'baseline'))}), BE "
                      f"{_x(be)} ({_each(g.ratios('guarded', 'be_ops_per_s', 'unguarded'))})")
        lines.append(f"| {g.spec.name}: LS p99 guarded <= {ratio:g}x baseline and BE "
                     f">= {TARGET_BE_RATIO:.0%} of unguarded{'' if held else ' (reported only)'}"
                     f" | {result} | {_yes(met) if held else 'n/a'} |")
    lines.append("")
    lines += ["Once a lever is on (information, not a target): the guarded way's LS p99 from each "
              "episode's first mitigating action to its end, against the baseline's p99 over "
              "the same seconds. The seconds before the first lever are the onset a reactive "
              "guardrail cannot avoid; at 5000 requests/s one such second is 3% of a 30 s "
              "episode's requests, three times the 1% a p99 leaves.", "",
              "| scenario | guarded vs baseline, from the first lever on |", "|---|---|"]
    for g in scenarios:
        each = [r.mitigated_ratio() for r in g.runs]
        finite = [v for v in each if not math.isnan(v)]
        judged = statistics.median_high(finite) if finite else math.nan
        lines.append(f"| {g.spec.name} | {_x(judged)}"
                     f"{f' ({_each(each)})' if len(each) > 1 else ''} |")
    lines.append("")
    for g in scenarios:
        lines += _scenario(g, out)
    if quiet:
        lines += ["## Actions in quiet periods", "", "| scenario | run | way | t (s) | step | "
                  "status |", "|---|---|---|---|---|---|"]
        lines += [f"| {name} | {k} | {way} | {a['t']:.1f} | {a['kind']} | {a['status']} |"
                  for name, k, way, a in quiet]
        lines.append("")
    return "\n".join(lines) + "\n"


def innocent_ratio(r: ScenarioReport, way: str) -> float:
    """The worst innocent BE job's throughput in `way` against the unguarded way's."""
    if way not in r.stats or "unguarded" not in r.stats:
        return math.nan
    mine, free = r.stats[way].innocent_ops_per_s, r.stats["unguarded"].innocent_ops_per_s
    ratios = [mine[name] / free[name] for name in free if free[name] and name in mine]
    return min(ratios) if ratios else math.nan


def attributed(r: ScenarioReport, way: str) -> tuple[int, int]:
    """(episodes whose first suspect was an antagonist, episodes that fired)."""
    judged = [e.attributed for e in r.stats[way].episodes if e.attributed is not None] \
        if way in r.stats else []
    return sum(judged), len(judged)


def _attribution(r: ScenarioReport) -> list[str]:
    """Who the agent named, and what each guarded way cost the innocent BE jobs."""
    lines = ["", "Attribution (docs/attribution.md): the first suspect of the first incident "
             "under a policy in each episode (its last ranking) against the episode's "
             "antagonists; the innocent BE jobs' throughput (the worst of them) and the "
             "antagonists' against the unguarded way. `guarded` runs the shipped policies, "
             "`guarded-tier` acts on the whole BE tier, `guarded-suspects` on the suspects "
             "first (`target: suspects`), `guarded-mixed` SCHED_IDLE on the tier and the other "
             "levers on the suspects first.", "",
             "| way | antagonist ranked first | in-episode p99 vs baseline | innocents vs "
             f"unguarded (target >= {TARGET_INNOCENT_RATIO:.0%}) | antagonists vs unguarded |",
             "|---|---|---|---|---|"]
    for way in GUARDED_WAYS:
        if way not in r.stats:
            continue
        good, total = attributed(r, way)
        share = f"{good}/{total}" + (f" ({good / total:.0%})" if total else "")
        free = way == "unguarded"
        innocents = "-" if free else _x(innocent_ratio(r, way))
        antagonists = "-" if free else _x(r.ratio(way, "be_ops_per_s", "unguarded"))
        lines.append(f"| {way} | {share} | {_x(r.ratio(way, 'episode_p99_ms', 'baseline'))} | "
                     f"{innocents} | {antagonists} |")
    named = [(way, n, e) for way in GUARDED_WAYS
             if way in r.stats for n, e in enumerate(r.stats[way].episodes, start=1)]
    lines += ["", "| way | episode | antagonist | first suspect |", "|---|---|---|---|"]
    lines += [f"| {way} | {n} | {e.antagonist} | {e.suspect or '(none)'}"
              f"{'' if e.attributed is None else (' (right)' if e.attributed else ' (wrong)')} |"
              for way, n, e in named]
    return lines


def _each(values: list[float]) -> str:
    return ", ".join(_x(v) for v in values)


def _yes(ok: bool) -> str:
    return "yes" if ok else "**no**"


def _scenario(g: ScenarioRuns, out: Path) -> list[str]:
    number, r = g.median_run()
    png = plot(r, out / f"lab-{r.spec.name}.png")
    lines = [f"## Scenario `{r.spec.name}`", "", r.spec.description, ""]
    if len(g.runs) > 1:
        lines += ["| run | in-episode p99 ms: baseline | unguarded | guarded | guarded vs "
                  "baseline | BE guarded vs unguarded |", "|---|---|---|---|---|---|"]
        for k, run in zip(g.numbers, g.runs, strict=True):
            p99 = {w: run.stats[w].episode_p99_ms if w in run.stats else math.nan
                   for w in ("baseline", "unguarded", "guarded")}
            lines.append(f"| {k} | {_ms(p99['baseline'])} | {_ms(p99['unguarded'])} | "
                         f"{_ms(p99['guarded'])} | "
                         f"{_x(run.ratio('guarded', 'episode_p99_ms', 'baseline'))} | "
                         f"{_x(run.ratio('guarded', 'be_ops_per_s', 'unguarded'))} |")
        lines += ["", f"The plot and the tables below are run {number}'s, the one the p99 "
                  "target is judged on (the median guarded vs baseline p99)."]
        if r.ratio("guarded", "be_ops_per_s", "unguarded") < TARGET_BE_RATIO:
            lines.append(f"In that run BE kept less than {TARGET_BE_RATIO:.0%} of its unguarded "
                         "throughput, though the median of the runs may not.")
        lines.append("")
    lines += [f"![LS p99 over time, scenario {r.spec.name}]({png.name})", "",
              "| way | requests | unanswered | p50 ms | p99 ms | p999 ms | in-episode p99 ms | "
              "in-episode p99 vs baseline | client send lag p99 ms | BE ops/s (bogo-ops or runs) | "
              "BE vs unguarded |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for way, s in r.stats.items():
        lines.append(
            f"| {way} | {s.requests} | {s.unanswered} | {_ms(s.p50_ms)} | {_ms(s.p99_ms)} | "
            f"{_ms(s.p999_ms)} | {_ms(s.episode_p99_ms)} | "
            f"{_x(r.ratio(way, 'episode_p99_ms', 'baseline'))} | {_ms(s.send_lag_p99_ms)} | "
            f"{s.be_ops_per_s:.0f} | "
            f"{_x(r.ratio(way, 'be_ops_per_s', 'unguarded')) if way != 'baseline' else '-'} |")
    base = r.stats.get("baseline")
    if base is not None and stalled(base):
        lines += ["", f"**The baseline stalled**: its in-episode p99 ({_ms(base.episode_p99_ms)} "
                  f"ms) is over {NOISY_BASELINE:g}x its median ({_ms(base.episode_p50_ms)} ms) "
                  "with no antagonist running, so this run's ratios say more about the machine "
                  "than about the guardrail (docs/lab.md, \"A noisy machine\")."]
    lines += ["", "Per episode (seconds from the antagonist's start; unguarded: the agent in "
              "shadow mode, its proposals):", "",
              "| way | episode | antagonist | length s | p99 ms | to firing s | "
              "to first mitigating action s | action | levers lifted s after its end | "
              "after its end |", "|---|---|---|---|---|---|---|---|---|---|"]
    for way, s in r.stats.items():
        if way == "baseline":
            continue
        for i, e in enumerate(s.episodes, start=1):
            lines.append(f"| {way} | {i} | {e.antagonist} | {e.end_s - e.start_s:.1f} | "
                         f"{_ms(e.p99_ms)} | {_s(e.fired_s)} | {_s(e.first_action_s)} | "
                         f"{e.first_action or '-'} | "
                         f"{'still on' if e.lifted_s is None else _s(e.lifted_s)} | "
                         f"{', '.join(e.after_end) or '-'} |")
    if r.spec.culprits:
        lines += _attribution(r)
    guarded = r.stats.get("guarded")
    if guarded is not None and guarded.actions:
        lines += ["", "Every action of the guarded way:", "",
                  "| t (s) | step | action | status | reason |", "|---|---|---|---|---|"]
        for a in guarded.actions:
            reason = (a.get("reason") or a.get("detail") or "").replace("|", "/")[:140]
            lines.append(f"| {a['t']:.1f} | {a['kind']} | {a['action']} | {a['status']} | "
                         f"{reason} |")
    lines.append("")
    return lines
