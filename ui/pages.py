"""The server-rendered pages: incidents (filtered, live through htmx), rules, the action audit
log and the node. Read-only; the JSON API in ui/app.py carries the same data.

Every string shown comes from the cluster or a rule file and is escaped by Jinja2's
autoescaping; nothing is marked safe.
"""

from __future__ import annotations

import time
from typing import Any
from urllib.parse import urlencode

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, Response

from sloguard import __version__
from sloguard.core.incidents import SEVERITIES, STATES
from sloguard.ui.view import NodeView

WINDOWS = {"": None, "1h": 3600, "6h": 6 * 3600, "24h": 86400, "7d": 7 * 86400}


def add_pages(app: FastAPI, agent: NodeView, templates: Any) -> None:
    def render(request: Request, name: str, page: str, **context: Any) -> Response:
        return templates.TemplateResponse(request, name, {
            "node": agent.node, "version": __version__, "page": page, **context})

    def incidents_context(request: Request) -> dict[str, Any]:
        q = request.query_params
        f = {
            "state": q.get("state") if q.get("state") in STATES else None,
            "severity": q.get("severity") if q.get("severity") in SEVERITIES else None,
            "rule": (q.get("rule") or "").strip() or None,
            "node": (q.get("node") or "").strip() or None,
            "within": q.get("within") if q.get("within") in WINDOWS else "",
        }
        seconds = WINDOWS[f["within"]]
        since = time.time_ns() - seconds * 10**9 if seconds else None
        found = agent.incidents.query(state=f["state"], severity=f["severity"], rule=f["rule"],
                                      node=f["node"], since_ns=since, limit=200)
        query = urlencode({k: v for k, v in f.items() if v})
        return {"incidents": found, "f": f, "query": query, "states": STATES,
                "severities": SEVERITIES, "windows": list(WINDOWS)}

    def fleet_context(request: Request) -> dict[str, Any]:
        if not agent.cluster:
            return {}
        from sloguard.ui.fleet import page_context

        return page_context(agent, request.query_params.get("range"))

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    def index(request: Request) -> Response:
        return render(request, "index.html", "incidents", **incidents_context(request),
                      **fleet_context(request))

    @app.get("/fragments/fleet", response_class=HTMLResponse, include_in_schema=False)
    def fleet_fragment(request: Request) -> Response:
        context = fleet_context(request)
        if not context:
            return HTMLResponse("", status_code=404)
        return render(request, "fleet.html", "incidents", **context)

    @app.get("/fragments/incidents", response_class=HTMLResponse, include_in_schema=False)
    def incidents_fragment(request: Request) -> Response:
        return render(request, "incidents_table.html", "incidents",
                      **incidents_context(request))

    @app.get("/rules", response_class=HTMLResponse, include_in_schema=False)
    def rules_page(request: Request) -> Response:
        loaded, file_errors = agent.rules_view()
        rules = [{"key": r.key, "source": r.source, "spec": r.spec, "status": status}
                 for r, status in loaded]
        return render(request, "rules.html", "rules", rules=rules, file_errors=file_errors)

    @app.get("/actions", response_class=HTMLResponse, include_in_schema=False)
    def actions_page(request: Request) -> Response:
        return render(request, "actions.html", "actions",
                      audit=agent.ledger.audit_log(limit=500),
                      in_force=agent.ledger.rungs(),
                      dry_run=agent.settings.actuators.dry_run)

    @app.get("/node", response_class=HTMLResponse, include_in_schema=False)
    def node_page(request: Request) -> Response:
        workloads = agent.workloads()
        workloads.sort(key=lambda w: (w.get("class", ""), w.get("pod") or w.get("workload", "")))
        now = latest_signals(agent.store, time.time_ns()) if agent.store is not None else {}
        for w in workloads:
            w.update({f"now_{k}": v for k, v in now.get(w.get("cgroup", ""), {}).items()})
        return render(request, "node.html", "node", components=agent.components(),
                      workloads=workloads, costs=agent.guard_costs(),
                      targets=agent.app_targets())


# what the node page shows for each workload now: (measurement, field, extra tag) -> column
NOW_SIGNALS = (
    ("container_cpu", "usage_cores", None, "cpu"),
    ("container_cpu", "throttled_ratio", None, "throttled"),
    ("container_memory", "working_set_bytes", None, "memory"),
    ("container_pressure", "some_rate", ("resource", "cpu"), "cpu_psi"),
    ("container_pressure", "some_rate", ("resource", "memory"), "memory_psi"),
)


def latest_signals(store: Any, now_ns: int, window_s: int = 15) -> dict[str, dict[str, float]]:
    """cgroup -> the latest value of each NOW_SIGNALS column within the last seconds: what an
    SRE looks at first on a node page (is LS starved, is BE busy). Best effort: a store that
    cannot be read shows no values, not an error page."""
    from sloguard.store import WindowQuery

    out: dict[str, dict[str, float]] = {}
    for measurement in {m for m, _, _, _ in NOW_SIGNALS}:
        try:
            samples = store.read_samples(WindowQuery(measurement, now_ns - window_s * 10**9,
                                                     now_ns + 1))
        except Exception:
            continue
        for sample in sorted(samples, key=lambda s: s.time_ns):
            cgroup = sample.tags.get("cgroup")
            if not cgroup:
                continue
            for m, field, tag, column in NOW_SIGNALS:
                if m != measurement or field not in sample.fields:
                    continue
                if tag is not None and sample.tags.get(tag[0]) != tag[1]:
                    continue
                out.setdefault(cgroup, {})[column] = sample.fields[field]
    return out
