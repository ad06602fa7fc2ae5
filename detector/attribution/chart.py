"""The suspects' signals against the LS signal over an incident: what the incident page plots
beside the suspects table, so an SRE sees the antagonist's CPU (or I/O, or reclaim) rise when
the LS latency did, instead of taking the score on trust."""

from __future__ import annotations

from typing import Any

import numpy as np

from sloguard.core.suspects import suspects_of
from sloguard.detector.attribution.attributor import ls_signal
from sloguard.detector.attribution.case import STEP_NS, Case, Reader

CHARTED = 3  # the first suspects, each in its own colour
# the signal shown for a suspect, by the resource its strongest clue points at
SHOWN = {"cpu": ("container_cpu", "usage_cores", {}, "CPU cores"),
         "cache": ("container_cpu", "usage_cores", {}, "CPU cores"),
         "io": ("ebpf_block_io", "count", {}, "block I/Os"),
         "memory": ("container_pressure", "some_rate", {"resource": "memory"},
                    "memory pressure %")}
MAX_POINTS = 2000


def suspects_chart(read: Reader, incident: Any, now_ns: int, lookback_s: float) -> dict[str, Any]:
    """Aligned columns for uPlot: x (seconds), the LS signal, one column per charted suspect."""
    suspects = suspects_of(incident)[:CHARTED]
    start = incident.started_ns - int(lookback_s * 1e9)
    start -= start % STEP_NS
    end = max(incident.resolved_ns + 60 * STEP_NS if incident.resolved_ns else now_ns,
              start + STEP_NS)
    candidates = [{**s.workload, "cgroup": s.cgroup} for s in suspects]
    case = Case(incident.id, incident.labels.get("resource", ""),
                list(incident.affected), candidates, incident.started_ns, start, end, read)
    out: dict[str, Any] = {"x": [], "ls": [], "ls_label": incident.signal.get("field", ""),
                           "suspects": [], "onset": incident.started_ns / 1e9, "error": ""}
    if not suspects:
        out["error"] = "no suspects were ranked for this incident"
        return out
    try:
        ls = ls_signal(case, incident)
        columns = []
        for suspect in suspects:
            measurement, field, extra, unit = SHOWN.get(suspect.resource, SHOWN["cpu"])
            values = case.per_workload(measurement, field, **extra).get(
                suspect.cgroup, np.full(len(case.grid), np.nan))
            columns.append((suspect, unit, values))
    except Exception as exc:  # the page still shows the table
        out["error"] = f"cannot read the signals: {exc}"
        return out
    stride = max(1, -(-len(case.grid) // MAX_POINTS))
    keep = slice(None, None, stride)
    out["x"] = (case.grid[keep] / 1e9).tolist()
    out["ls"] = _column(ls[keep])
    out["suspects"] = [{"rank": s.rank, "name": s.name, "resource": s.resource, "unit": unit,
                        "values": _column(values[keep])} for s, unit, values in columns]
    return out


def _column(values: np.ndarray) -> list[float | None]:
    return [None if v != v else round(float(v), 6) for v in values]
