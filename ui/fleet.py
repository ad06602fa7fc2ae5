"""The cluster front page's fleet summary: which nodes suffer now, incidents per node over
time, and the BE workloads most often named as culprits (GET /api/cluster/summary, and the
section above the incident list of `sloguard server`).

The store answers each part with one bounded aggregate (store/cluster_db.py); this module
only validates what is asked, and lays the per-node counts out as an inline SVG computed here,
so that the page needs no chart library and shows the same thing without JavaScript. Every
name in it comes from the cluster (a node's, a pod's) and reaches the page through Jinja2's
autoescaping, in the SVG's text and titles too.
"""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query

from sloguard.store.cluster_db import MAX_BUCKETS, MAX_TOP, FleetSummary, Timeline
from sloguard.ui.view import NodeView

SUMMARY_PATH = "/api/cluster/summary"
# The ranges the page offers, each with its bucket count (so a bucket is a round length).
PAGE_RANGES = {"1h": 12, "6h": 24, "24h": 24, "7d": 28, "30d": 30}
DEFAULT_RANGE = "24h"
DEFAULT_LIMIT = 10
_RANGE = re.compile(r"([1-9][0-9]{0,4})([mhd])")
_UNIT_S = {"m": 60, "h": 3600, "d": 86400}
MIN_RANGE_S = 5 * 60
MAX_RANGE_S = 90 * 86400  # beyond what a cluster server is expected to keep


def range_seconds(text: str) -> int | None:
    """`30m`, `24h`, `7d` ... in seconds; None when it is not one, or outside 5m..90d."""
    match = _RANGE.fullmatch(text)
    if match is None:
        return None
    seconds = int(match[1]) * _UNIT_S[match[2]]
    return seconds if MIN_RANGE_S <= seconds <= MAX_RANGE_S else None


def summary_for(view: NodeView, seconds: int, buckets: int, limit: int,
                now_ns: int | None = None) -> FleetSummary | None:
    """The summary of the last `seconds`, its buckets aligned on multiples of their width
    since the epoch (an hour's on the hour, a day's at midnight UTC): the last bucket holds
    now, and the same buckets come back on every refresh instead of sliding by the second."""
    now = now_ns if now_ns is not None else time.time_ns()
    width = -(-seconds * 10**9 // buckets)
    until = -(-(now + 1) // width) * width
    return view.fleet_summary(until - buckets * width, until, buckets, limit)


def fleet_router(view: NodeView) -> APIRouter:
    """GET /api/cluster/summary, mounted on the cluster server only (an agent has one node:
    its own incident list is the whole story). Behind the same authentication as the rest
    of /api/ (ui/auth.py's ReadGate)."""
    router = APIRouter()

    @router.get(SUMMARY_PATH, tags=["cluster"])
    def cluster_summary(
        range_: Annotated[str, Query(
            alias="range", max_length=8,
            description="how far back: a number and m, h or d, 5m to 90d")] = DEFAULT_RANGE,
        buckets: Annotated[int, Query(ge=1, le=MAX_BUCKETS,
                                      description="time buckets of the per-node counts")] = 24,
        limit: Annotated[int, Query(ge=1, le=MAX_TOP,
                                    description="at most this many nodes and workloads "
                                                "in each list")] = DEFAULT_LIMIT,
    ) -> dict[str, Any]:
        """The fleet at a glance over the last `range`: the nodes with firing incidents now
        (count, worst severity, firing since), incidents started per node in each of
        `buckets` buckets (the top `limit` nodes, the others summed), and the BE workloads
        the incidents' suspects name most often first (then anywhere), with how many
        incidents and nodes. Each list says how many there are in all (`total`)."""
        seconds = range_seconds(range_)
        if seconds is None:
            raise HTTPException(422, [{
                "type": "value_error", "loc": ["query", "range"], "input": range_,
                "msg": "range: a number and m, h or d (30m, 24h, 7d), from 5m to 90d"}])
        summary = summary_for(view, seconds, buckets, limit)
        if summary is None:  # not reached: mounted on the cluster server only
            raise HTTPException(404, "the fleet summary is on the cluster server")
        return {"range": range_, **summary.to_dict()}

    return router


# -- the per-node chart ----------------------------------------------------------------------

WIDTH = 960
LABEL_W = 190
TOTAL_W = 60
ROW_H = 22
BAR_H = 17
AXIS_H = 24
LABEL_CHARS = 26


def _short(name: str) -> str:
    return name if len(name) <= LABEL_CHARS else name[:LABEL_CHARS - 1] + "\u2026"


def _clock(ns: int, span_ns: int) -> str:
    moment = datetime.fromtimestamp(ns / 1e9, UTC)
    return moment.strftime("%H:%M" if span_ns <= 86400 * 10**9 else "%m-%d %H:%M")


def timeline_chart(timeline: Timeline) -> dict[str, Any]:
    """The SVG's geometry: one row per node (and one for the others), a bar per bucket whose
    height is its count against the largest bucket of the chart, each with a title (node,
    bucket, count) for hover and screen readers; and a few time ticks along the bottom."""
    rows = [(n.node, n.counts, n.total) for n in timeline.nodes]
    if timeline.other_nodes:
        rows.append((f"{timeline.other_nodes} other nodes", timeline.other.counts,
                     timeline.other.total))
    peak = max((c for _, counts, _ in rows for c in counts), default=0)
    plot_w = WIDTH - LABEL_W - TOTAL_W
    step = plot_w / max(1, timeline.buckets)
    span = timeline.bucket_ns * timeline.buckets
    laid = []
    for k, (name, counts, total) in enumerate(rows):
        top = k * ROW_H
        bars = []
        for b, count in enumerate(counts):
            if not count:
                continue
            height = max(1.5, BAR_H * count / peak)
            start = timeline.since_ns + b * timeline.bucket_ns
            bars.append({"x": round(LABEL_W + b * step, 1), "w": round(max(1.0, step - 1), 1),
                         "y": round(top + BAR_H - height + 2, 1), "h": round(height, 1),
                         "title": f"{name}, {_clock(start, span)}\u2013"
                                  f"{_clock(start + timeline.bucket_ns, span)} UTC: "
                                  f"{count} incident{'s' if count != 1 else ''}"})
        laid.append({"label": _short(name), "name": name, "y": top + BAR_H - 2,
                     "base": top + BAR_H + 2, "total": total, "bars": bars,
                     "other": k >= len(timeline.nodes)})
    plot_h = len(rows) * ROW_H
    ticks = []
    for k in range(0, timeline.buckets + 1, max(1, timeline.buckets // 6)):
        ticks.append({"x": round(LABEL_W + k * step, 1),
                      "label": _clock(timeline.since_ns + k * timeline.bucket_ns, span)})
    return {"width": WIDTH, "height": plot_h + AXIS_H, "plot_h": plot_h, "rows": laid,
            "ticks": ticks, "peak": peak, "label_w": LABEL_W, "total_x": WIDTH - 4,
            "columns": [_clock(timeline.since_ns + b * timeline.bucket_ns, span)
                        for b in range(timeline.buckets)]}


def page_context(view: NodeView, chosen: str | None) -> dict[str, Any]:
    """What index.html's fleet section needs: the summary over the chosen range (one of
    PAGE_RANGES; anything else is the default, as the page's other filters treat bad
    input), and its chart."""
    name = chosen if chosen in PAGE_RANGES else DEFAULT_RANGE
    seconds = range_seconds(name)
    assert seconds is not None
    summary = summary_for(view, seconds, PAGE_RANGES[name], DEFAULT_LIMIT)
    if summary is None:
        return {}
    return {"fleet": summary, "fleet_range": name, "fleet_ranges": list(PAGE_RANGES),
            "fleet_chart": timeline_chart(summary.timeline)}
