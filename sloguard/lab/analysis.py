"""What a way's records say: latency percentiles, the p99 over time, and the guardrail's timing
against the ground truth (the antagonists' actual start and end times).

Definitions the report uses:
- a request's latency is `reply - intended send time`; a request never answered counts as
  slower than every answered one (it is in the tail, not dropped);
- in-episode figures take the requests due while an antagonist ran (in the baseline way: while
  it would have run), so a way is compared with the baseline over the same periods;
- a mitigating action is a rung that changes what BE may use on the node (the levers, resctrl,
  evict), applied for real (guarded) or proposed (shadow mode: what the unguarded way's agent
  would have done); notify, cordon and reduce_capacity change nothing for the BE already here;
- an action in a quiet period is any rung applied or proposed further than `GRACE_S` from every
  episode: a false alarm (undoing after an episode is the guardrail going back, not an alarm).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sloguard.lab.way import WayResult

MITIGATING = frozenset({"cpu_idle", "cpuset", "cpu_quota", "memory_limit", "resctrl", "evict"})
ACTED = frozenset({"done", "proposed"})
GRACE_S = 10.0  # after an episode ends, rungs still belong to it (the rule's recovery hold)
# A baseline whose in-episode p99 is over this many times its median stalled by itself: no
# antagonist ran, so the machine set its tail (docs/lab.md, "A noisy machine": 1.3-3x in a
# quiet hour here, 7-20x in an hour of the VM's stalls).
NOISY_BASELINE = 5.0


def latencies_ms(records: np.ndarray) -> np.ndarray:
    """Per request, ms; unanswered requests as +inf."""
    lat = (records[:, 2] - records[:, 0]) / 1e6
    return np.where(records[:, 2] < 0, np.inf, lat)


def percentile(values: np.ndarray, q: float) -> float:
    if len(values) == 0:
        return math.nan
    return float(np.percentile(values, q, method="higher"))


@dataclass
class EpisodeTiming:
    antagonist: str
    start_s: float
    end_s: float
    fired_s: float | None  # delay from the antagonist's start to the incident firing
    first_action_s: float | None  # ... to the first mitigating action (taken or proposed)
    first_action: str = ""
    p99_ms: float = math.nan  # LS p99 while this episode ran
    carried: bool = False  # a lever still in force from before counted as its first action
    # the same delay without the standing levers (in force at all times, docs/actuators.md):
    # to the ladder's first mitigating action, or 0 when one was carried over from before
    ladder_action_s: float | None = None
    # the end of the episode (#23): what the guard did after the antagonist had stopped (lever
    # applications and firings before the next episode), and how long its levers stayed on
    # after the end (None: still in force when the next episode or the way began)
    after_end: list[str] = field(default_factory=list)
    lifted_s: float | None = 0.0
    # attribution: the first suspect of the first incident under a policy that fired in the
    # episode (its last ranking), and whether it is one of the episode's antagonists
    suspect: str = ""
    attributed: bool | None = None


@dataclass
class WayStats:
    way: str
    requests: int
    unanswered: int
    p50_ms: float
    p99_ms: float
    p999_ms: float
    episode_p50_ms: float
    episode_p99_ms: float
    episode_p999_ms: float
    send_lag_p99_ms: float
    be_ops_per_s: float
    episodes: list[EpisodeTiming] = field(default_factory=list)
    innocent_ops_per_s: dict[str, float] = field(default_factory=dict)  # by innocent name
    quiet_actions: list[dict[str, Any]] = field(default_factory=list)
    actions: list[dict[str, Any]] = field(default_factory=list)  # with `t` (s from start)


def stalled(baseline: WayStats) -> bool:
    """The machine, not an antagonist, set this baseline's tail: its ratios to other ways say
    more about the machine than about the guardrail."""
    return baseline.episode_p99_ms > NOISY_BASELINE * baseline.episode_p50_ms


def in_episodes(t_s: np.ndarray, spans: list[tuple[float, float]]) -> np.ndarray:
    mask = np.zeros(len(t_s), dtype=bool)
    for start, end in spans:
        mask |= (t_s >= start) & (t_s < end)
    return mask


def way_stats(result: WayResult) -> WayStats:
    records = result.records
    lat = latencies_ms(records)
    t_s = (records[:, 0] - result.start_ns) / 1e9
    spans = [((e.started_ns - result.start_ns) / 1e9, (e.ended_ns - result.start_ns) / 1e9)
             for e in result.episodes]
    inside = lat[in_episodes(t_s, spans)]
    answered = records[:, 2] >= 0
    lag = (records[:, 1] - records[:, 0]) / 1e6
    seconds = sum(e.seconds for e in result.episodes)
    ops = sum(e.bogo_ops for e in result.episodes)
    actions = sorted(({**a, "t": (a["time_ns"] - result.start_ns) / 1e9}
                      for a in result.actions), key=lambda a: a["time_ns"])
    stats = WayStats(
        way=result.way, requests=len(records), unanswered=int((~answered).sum()),
        p50_ms=percentile(lat, 50), p99_ms=percentile(lat, 99), p999_ms=percentile(lat, 99.9),
        episode_p50_ms=percentile(inside, 50), episode_p99_ms=percentile(inside, 99),
        episode_p999_ms=percentile(inside, 99.9),
        send_lag_p99_ms=percentile(lag, 99),
        be_ops_per_s=ops / seconds if seconds > 0 and result.way != "baseline" else 0.0,
        actions=actions)
    stats.innocent_ops_per_s = {i["name"]: i["bogo_ops"] / i["seconds"]
                                for i in result.innocents if i.get("seconds")}
    driving = sorted((i for i in result.incidents if i.get("fired_ns") and i.get("policy")),
                     key=lambda i: i["fired_ns"])  # the rules that move levers
    fired = [(i["fired_ns"] - result.start_ns) / 1e9 for i in driving]
    applied = [a for a in actions if a["action"] == "apply" and a["status"] in ACTED]
    episodic = [a for a in actions if not _standing(a)]
    nexts = [s for s, _ in spans[1:]] + [(records[-1, 0] - result.start_ns) / 1e9
                                         if len(records) else math.inf]
    for k, (episode, (start, end), after) in enumerate(
            zip(result.episodes, spans, nexts, strict=True)):
        window = (start, end + GRACE_S)
        fire = next((f for f in fired if window[0] <= f < window[1]), None)
        held = in_force(actions, start)
        act = next((a for a in applied if a["kind"] in MITIGATING
                    and window[0] <= a["t"] < window[1]), None)
        if held:  # still in force from the episode before: mitigated from its first second
            delay, what = 0.0, f"{held[0]} (in force at the start)"
        elif act is not None:
            delay, what = act["t"] - start, f"{act['kind']} ({act['status']})"
        else:
            delay, what = None, ""
        ladder_act = next((a for a in applied if a["kind"] in MITIGATING and not _standing(a)
                           and window[0] <= a["t"] < window[1]), None)
        ladder_delay = 0.0 if in_force(episodic, start) else (
            None if ladder_act is None else ladder_act["t"] - start)
        timing = EpisodeTiming(
            episode.antagonist, start, end, None if fire is None else fire - start, delay, what,
            percentile(lat[(t_s >= start) & (t_s < end)], 99), carried=bool(held),
            ladder_action_s=ladder_delay)
        culprits = set(antagonists_of(episode))
        since = spans[k - 1][1] + GRACE_S if k else -math.inf
        ranked = ranking_incident(zip(fired, driving, strict=True), since, window,
                                  episode.started_ns)
        if culprits and ranked is not None:
            first = min(ranked["suspects"], key=lambda s: s.get("rank", 99))
            timing.suspect = first.get("cgroup", "")
            timing.attributed = timing.suspect in culprits
        elif culprits and result.way != "baseline" and fire is not None:
            timing.attributed = False  # it fired, and named nobody
        timing.after_end = [f"{a['kind']} at +{a['t'] - end:.1f} s" for a in applied
                            if not _standing(a) and end < a["t"] < after] + [
            f"fired at +{f - end:.1f} s" for f in fired if end < f < after]
        timing.lifted_s = lifted_after(episodic, end, after)
        stats.episodes.append(timing)
    stats.quiet_actions = [a for a in applied if not _standing(a) and not any(
        start <= a["t"] < end + GRACE_S for start, end in spans)]
    return stats


def ranking_incident(fired: Iterable[tuple[float, dict[str, Any]]], since: float,
                     window: tuple[float, float], started_ns: int) -> dict[str, Any] | None:
    """The policy incident whose suspects an episode is judged on: the first that fired in
    its window; else the first that fired after `since` (the earlier episode's window) and was
    still firing at its start. Such an early one is real: an innocent BE job's blip over a
    noisy LS tail fired it 0.5 s early in CI, and its ranking is refreshed while it fires."""
    early = None
    for at, incident in fired:
        if not incident.get("suspects") or not since <= at < window[1]:
            continue
        if at >= window[0]:
            return incident
        if early is None and (incident.get("resolved_ns") or math.inf) > started_ns:
            early = incident
    return early


def lifted_after(actions: list[dict[str, Any]], end: float, until: float) -> float | None:
    """Seconds from `end` until no mitigating rung was in force any more; None when one
    still was at `until`."""
    if not in_force(actions, end + 1e-6):
        return 0.0
    for t in sorted({a["t"] for a in actions if end < a["t"] < until}):
        if not in_force(actions, t + 1e-6):
            return t - end
    return None


def _standing(action: dict[str, Any]) -> bool:
    """A standing lever's entry (actuators/standing.py): in force at all times by design, not
    an action the guard took on evidence."""
    return str(action.get("policy", "")).startswith("standing:")


def antagonists_of(episode: Any) -> list[str]:
    """The cgroups (as the agent tags them) of an episode's antagonists."""
    from sloguard.lab.agent import BE_CGROUP
    from sloguard.lab.scenario import antagonist_cgroups

    return ["/" + rel for rel in antagonist_cgroups(episode.antagonist.split("+"),
                                                    BE_CGROUP).values()]


def in_force(actions: list[dict[str, Any]], at_s: float) -> list[str]:
    """Mitigating rungs applied (or proposed) before `at_s` and not undone by then."""
    held: dict[tuple[Any, Any], str] = {}
    for a in actions:
        if a["t"] >= at_s or a["kind"] not in MITIGATING or (a["status"] not in (
                *ACTED, "undone") and not (a["action"] == "undo" and a["status"] == "skipped")):
            continue
        key = (a.get("policy"), a.get("rung"), a["kind"])
        if a["action"] == "apply":
            held[key] = a["kind"]
        else:  # undone, or skipped: the rung let go, another holder keeps the lever
            held.pop(key, None)
    return list(held.values())


def p99_timeline(result: WayResult, bin_s: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """LS p99 per `bin_s` of intended send time: (bin starts in s, p99 in ms)."""
    records = result.records
    if len(records) == 0:
        return np.zeros(0), np.zeros(0)
    lat = latencies_ms(records)
    t_s = (records[:, 0] - result.start_ns) / 1e9
    bins = np.floor(t_s / bin_s).astype(int)
    order = np.argsort(bins, kind="stable")
    bins, lat = bins[order], lat[order]
    edges = np.flatnonzero(np.diff(bins)) + 1
    starts = bins[np.r_[0, edges]] * bin_s
    p99 = np.array([percentile(chunk, 99) for chunk in np.split(lat, edges)])
    return starts, p99


def mitigated_spans(stats: WayStats) -> list[tuple[float, float]]:
    """Each episode from its first mitigating action (its start when a lever was carried over)
    to its end, in seconds from the way's start; episodes never mitigated are left out."""
    return [(e.start_s + e.first_action_s, e.end_s) for e in stats.episodes
            if e.first_action_s is not None and e.start_s + e.first_action_s < e.end_s]


def p99_within(result: WayResult, spans: list[tuple[float, float]]) -> float:
    """LS p99 of the requests due within `spans` (seconds from the way's start). Ways share
    the schedule's offsets, so another way's spans select the same seconds of this one."""
    t_s = (result.records[:, 0] - result.start_ns) / 1e9
    return percentile(latencies_ms(result.records)[in_episodes(t_s, spans)], 99)
