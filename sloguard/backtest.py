"""Replays stored history through rules: what would have fired, when, and what would have run.

The same engine, detectors and dry-run actuator as the agent, on a private incident store, fed
the store's samples in time order and evaluated at a fixed step, so a rule can be tried on last
week's data before it is trusted with a node.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sloguard.actuators.dryrun import DryRunActuator
from sloguard.core.incidents import Incident
from sloguard.core.samples import Sample
from sloguard.detector.engine import Engine
from sloguard.detector.recent import RecentWindows
from sloguard.detector.registry import DetectorRegistry
from sloguard.detector.rules import RuleSet
from sloguard.store import WindowQuery
from sloguard.store.incidents_db import IncidentStore


@dataclass
class BacktestResult:
    incidents: list[Incident]
    evaluations: int
    samples: int
    rule_errors: dict[str, str] = field(default_factory=dict)
    # rule key -> the samples of its own signal, for plots
    history: dict[str, list[Sample]] = field(default_factory=dict)


def backtest(
    store: Any,
    rules: RuleSet,
    registry: DetectorRegistry,
    start_ns: int,
    end_ns: int,
    step_s: float = 1.0,
    node: str = "backtest",
    timeout_s: float = 5.0,
    progress: Callable[[float], None] | None = None,
) -> BacktestResult:
    with tempfile.TemporaryDirectory(prefix="sloguard-backtest-") as tmp:
        incidents = IncidentStore(Path(tmp) / "incidents.db")
        windows = RecentWindows()
        engine = Engine(windows, incidents, rules, node, DryRunActuator(node),
                        registry=registry, timeout_s=timeout_s)
        try:
            engine.sync_windows(None, start_ns)
            history: dict[str, list[Sample]] = {}
            feed: list[Sample] = []
            seen: set[tuple] = set()  # rules sharing a signal must not see its samples twice
            for rule in rules.rules:
                for index, spec in enumerate(rule.spec.signals):
                    samples = store.read_samples(WindowQuery(
                        spec.selector.measurement, start_ns - int(spec.window * 1e9), end_ns + 1,
                        fields=(spec.field,), matchers=spec.selector.matchers))
                    for sample in samples:
                        key = (sample.measurement, tuple(sorted(sample.tags.items())),
                               sample.time_ns, spec.field)
                        if key not in seen:
                            seen.add(key)
                            feed.append(sample)
                    if index == 0:
                        history[rule.key] = samples
            feed.sort(key=lambda s: s.time_ns)
            step_ns, now, fed, evaluations = int(step_s * 1e9), start_ns, 0, 0
            while now <= end_ns:
                upto = fed
                while upto < len(feed) and feed[upto].time_ns <= now:
                    upto += 1
                windows.add(feed[fed:upto])
                fed = upto
                engine.evaluate(now)
                evaluations += 1
                if progress is not None and evaluations % 600 == 0:
                    progress((now - start_ns) / max(end_ns - start_ns, 1))
                now += step_ns
            errors = {key: status.error for key, status in engine.status.items() if status.error}
            found = sorted(incidents.query(limit=100_000), key=lambda i: i.started_ns)
        finally:  # a failed read or rule must not leave the detector thread and the
            engine.close()  # database behind in the caller (a test process runs many)
            incidents.close()
    return BacktestResult(found, evaluations, len(feed), errors, history)


def plot(result: BacktestResult, path: Path, max_series: int = 6) -> None:
    """The series behind each incident with its firing period shaded and the bound drawn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.dates as mdates
    import matplotlib.pyplot as plt

    shown = result.incidents[:max_series]
    rows = max(len(shown), 1)
    fig, axes = plt.subplots(rows, 1, figsize=(11, 2.6 * rows), squeeze=False)
    if not shown:
        axes[0][0].text(0.5, 0.5, "nothing would have fired", ha="center", va="center")
        axes[0][0].set_axis_off()
    for ax, incident in zip((a[0] for a in axes), shown, strict=False):
        key = f"{incident.group}/{incident.rule}"
        points = [s for s in result.history.get(key, [])
                  if all(s.tags.get(k) == v for k, v in incident.series.items())]
        field_name = next(iter(points[0].fields)) if points else ""
        times = [mdates.date2num(_utc(s.time_ns)) for s in points]
        ax.plot(times, [s.fields[field_name] for s in points], lw=1, color="#1f5fa8")
        end = incident.resolved_ns or (points[-1].time_ns if points else incident.started_ns)
        ax.axvspan(mdates.date2num(_utc(incident.started_ns)),
                   mdates.date2num(_utc(incident.fired_ns or incident.started_ns)),
                   color="#f2c14e", alpha=0.35, label="pending")
        if incident.fired_ns:
            ax.axvspan(mdates.date2num(_utc(incident.fired_ns)), mdates.date2num(_utc(end)),
                       color="#d9534f", alpha=0.25, label="firing")
        bound = incident.evidence[0].threshold if incident.evidence else None
        if bound is not None:
            ax.axhline(bound, color="#d9534f", ls="--", lw=1, label=f"bound {bound:.3g}")
        series = ", ".join(f"{k}={v}" for k, v in incident.series.items() if k != "node")
        ax.set_title(f"{key} [{incident.severity}] {series}", fontsize=9, loc="left")
        ax.set_ylabel(field_name, fontsize=8)
        ax.xaxis.set_major_formatter(mdates.DateFormatter("%H:%M:%S"))
        ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _utc(ns: int) -> Any:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(ns / 1e9, UTC)
