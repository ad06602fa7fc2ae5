"""The agent's HTTP face: health, metrics, the incidents API and a first incidents page.

Binds loopback by default (see `listen` in the config). Every string that reaches HTML comes
from the cluster or a rule file and is escaped by Jinja2's autoescaping.
"""

from __future__ import annotations

import dataclasses
import time
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import quote

from fastapi import FastAPI, Form, HTTPException, Query, Request
from fastapi.responses import (
    HTMLResponse,
    JSONResponse,
    PlainTextResponse,
    RedirectResponse,
    Response,
)
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, Field

from sloguard import __version__
from sloguard.core.incidents import SEVERITIES, STATES
from sloguard.core.units import format_duration
from sloguard.ui.auth import SESSION_COOKIE, Auth, ReadGate, client_of
from sloguard.ui.pages import add_pages
from sloguard.ui.view import NodeView

TEMPLATES = Jinja2Templates(directory=str(Path(__file__).parent / "templates"))
STATIC = Path(__file__).parent / "static"
CHART_MARGIN_NS = 300 * 10**9  # the series is shown from 5 min before the incident to 5 after
CHART_MAX_POINTS = 20_000
NOT_FOUND: dict[int | str, dict[str, Any]] = {404: {"description": "no such incident"}}
CHANGE_ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"description": "no or wrong bearer token"},
    403: {"description": "changes are disabled on this agent (no ui.token configured)"}}
OPEN_PATHS = frozenset({"/healthz", "/readyz", "/login", "/logout"})


class ChangeBody(BaseModel):
    author: str = Field(min_length=1, max_length=100, description="who, for the record")
    comment: str = Field("", max_length=2000)


def _change(view: NodeView, incident_id: str, what: str, author: str,
            comment: str) -> dict[str, Any]:
    try:
        incident = view.change_incident(incident_id, what, author, comment)
    except KeyError:
        raise HTTPException(404, "no such incident") from None
    except ValueError as exc:
        raise HTTPException(409, str(exc)) from None
    return incident.to_dict()


def _local(target: str) -> str:
    """Only same-site paths as redirect targets (no open redirect through ?next=)."""
    return target if target.startswith("/") and not target.startswith("//") else "/"


def _when(ns: int | None) -> str:
    if not ns:
        return ""
    return datetime.fromtimestamp(ns / 1e9, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


TEMPLATES.env.filters["when"] = _when
TEMPLATES.env.filters["duration"] = format_duration


def create_app(agent: NodeView, manage_lifecycle: bool = True) -> FastAPI:
    """The app for one agent (or the cluster server: ui/view.py is all it uses of either);
    with `manage_lifecycle` the app starts and stops it."""

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        if manage_lifecycle:
            agent.start()
        try:
            yield
        finally:
            if manage_lifecycle:
                agent.stop()

    app = FastAPI(title="sloguard", version=__version__, lifespan=lifespan)
    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    auth = Auth(agent.settings)
    app.state.auth = auth
    app_latency = agent.receiver()
    own_auth: frozenset[str] = frozenset()  # paths that check a token of their own
    if app_latency is not None and agent.settings.app_latency.receive.enabled:
        from sloguard.ui.receive import RECEIVE_PATHS, receive_router

        app.include_router(receive_router(app_latency, agent.settings.app_latency.receive,
                                          agent.node))
        own_auth = RECEIVE_PATHS
    ingest = agent.ingest_router()  # the cluster server's
    if ingest is not None:
        router, paths = ingest
        app.include_router(router)
        own_auth = own_auth | paths
    if agent.cluster:
        from sloguard.ui.fleet import fleet_router

        app.include_router(fleet_router(agent))

    app.add_middleware(ReadGate, auth=auth, open_paths=OPEN_PATHS, own_auth=own_auth)

    @app.get("/healthz", tags=["health"], responses={
        503: {"description": "the agent's loop has not ticked recently: restart it"}})
    def healthz() -> Response:
        problem = agent.liveness_problem()
        body = {"ok": not problem, "ticks": agent.ticks, "reason": problem}
        return JSONResponse(body, status_code=503 if problem else 200)

    @app.get("/readyz", tags=["health"], responses={
        503: {"description": "not ready: a component it needs does not work (see components)"}})
    def readyz(request: Request) -> Response:
        """Readiness. Off loopback, without the token, only each component's name and ok:
        reasons and details name targets, pods, channels and what servers answered."""
        ready = agent.ready()
        status = 200 if ready else 503
        if not auth.read_open and not auth.authenticated(request)[0]:
            return JSONResponse({"ready": ready, "components": [
                {"name": c.name, "ok": c.ok} for c in agent.components()],
                "detail": "reasons and details need Authorization: Bearer <ui.token>"},
                status_code=status)
        components = [c.as_dict() for c in agent.components()]
        return JSONResponse({"ready": ready, "node": agent.node, "components": components},
                            status_code=status)

    @app.get("/metrics", tags=["health"], response_class=PlainTextResponse, responses={
        200: {"content": {"text/plain": {}},
              "description": "Prometheus text exposition format"}})
    def metrics() -> Response:
        return Response(generate_latest(agent.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/api/incidents", tags=["incidents"])
    def list_incidents(
        state: Annotated[Literal[STATES] | None, Query()] = None,  # type: ignore[valid-type]
        severity: Annotated[
            Literal[SEVERITIES] | None, Query()] = None,  # type: ignore[valid-type]
        rule: str | None = None,
        node: str | None = None,
        since: Annotated[
            datetime | None, Query(description="started at or after (ISO 8601)")
        ] = None,
        until: Annotated[datetime | None, Query(description="started before (ISO 8601)")] = None,
        limit: Annotated[int, Query(ge=1, le=1000)] = 100,
        before: Annotated[str | None, Query(
            max_length=600, pattern=r"^-?[0-9]{1,19}:.+$",
            description="the `next` of the previous page: the next page, older")] = None,
    ) -> dict[str, Any]:
        """Newest first, a page of at most `limit`; `next` (when there may be more) is what
        `before` takes for the next page. Pages are keyed on the last incident's (started,
        id), so a page deep in a long list costs what the first does."""
        after_page = None
        if before is not None:
            started, _, last_id = before.partition(":")
            if not -2**63 <= int(started) < 2**63 or "\x00" in last_id:
                raise HTTPException(422, "before: not a `next` this API gave")
            after_page = (int(started), last_id)
        found = agent.incidents.query(
            state=state, severity=severity, rule=rule, node=node,
            since_ns=_ns(since), until_ns=_ns(until), limit=limit, before=after_page,
        )
        page: dict[str, Any] = {"incidents": [i.to_dict() for i in found]}
        if len(found) == limit:
            page["next"] = f"{found[-1].started_ns}:{found[-1].id}"
        return page

    @app.get("/api/incidents/{incident_id}", tags=["incidents"], responses=NOT_FOUND)
    def get_incident(incident_id: str) -> dict[str, Any]:
        incident = agent.incidents.get(incident_id)
        if incident is None:
            raise HTTPException(404, "no such incident")
        return incident.to_dict()

    @app.get("/api/rules", tags=["rules"])
    def rules() -> dict[str, Any]:
        rules = []
        loaded, file_errors = agent.rules_view()
        for r, status in loaded:
            rules.append({
                "key": r.key, "source": r.source, "spec": r.spec.model_dump(by_alias=True),
                "last_eval_ns": status.last_eval_ns if status else None,
                "error": status.error if status else "",
            })
        return {
            "rules": rules,
            "file_errors": file_errors,
        }

    @app.get("/api/incidents/{incident_id}/series", tags=["incidents"], responses=NOT_FOUND)
    def incident_series(incident_id: str) -> dict[str, Any]:
        """The series that triggered the incident, around it, with the thresholds it was judged
        against and the times of every action: what the incident page charts."""
        incident = agent.incidents.get(incident_id)
        if incident is None:
            raise HTTPException(404, "no such incident")
        return incident_chart(agent.store, incident, time.time_ns())

    @app.get("/api/incidents/{incident_id}/suspects/series", tags=["incidents"],
             responses=NOT_FOUND)
    def suspects_series(incident_id: str) -> dict[str, Any]:
        """The LS signal and the first suspects' own signals (CPU, block I/O or memory
        pressure, by the resource their evidence points at) on one-second columns, from
        `attribution.lookback` before the incident: what the incident page plots beside the
        suspects."""
        incident = agent.incidents.get(incident_id)
        if incident is None:
            raise HTTPException(404, "no such incident")
        if agent.store is None:
            return {"x": [], "ls": [], "suspects": [], "error": "the cluster server keeps no "
                    f"samples: the chart is on node {incident.node}'s agent"}
        from sloguard.detector.attribution.case import as_reader
        from sloguard.detector.attribution.chart import suspects_chart

        return suspects_chart(as_reader(agent.store), incident, time.time_ns(),
                              agent.settings.attribution.lookback)

    @app.post("/api/incidents/{incident_id}/ack", tags=["incidents"],
              responses={**NOT_FOUND, **CHANGE_ERRORS})
    def acknowledge(incident_id: str, body: ChangeBody, request: Request) -> dict[str, Any]:
        """Acknowledge an incident (someone is on it). Needs the bearer token."""
        auth.require_change(request)
        return _change(agent, incident_id, "ack", body.author, body.comment)

    @app.post("/api/incidents/{incident_id}/resolve", tags=["incidents"],
              responses={**NOT_FOUND, **CHANGE_ERRORS,
                         409: {"description": "already resolved"}})
    def resolve(incident_id: str, body: ChangeBody, request: Request) -> dict[str, Any]:
        """Resolve an incident by hand; if its condition still holds, the rule opens a new one
        after its `for`. Needs the bearer token."""
        auth.require_change(request)
        return _change(agent, incident_id, "resolve", body.author, body.comment)

    @app.post("/incidents/{incident_id}/{what}", include_in_schema=False)
    def change_from_the_browser(
        incident_id: str, what: str, request: Request,
        author: Annotated[str, Form(min_length=1, max_length=100)],
        csrf: Annotated[str, Form()] = "",
        comment: Annotated[str, Form(max_length=2000)] = "",
    ) -> Response:
        if what not in ("ack", "resolve"):
            raise HTTPException(404, "no such change")
        auth.require_change(request, csrf)
        _change(agent, incident_id, what, author, comment)
        return RedirectResponse(f"/incidents/{quote(incident_id)}", status_code=303)

    @app.get("/login", response_class=HTMLResponse, include_in_schema=False)
    def login_page(request: Request, next: str = "/", failed: bool = False) -> Response:
        return TEMPLATES.TemplateResponse(request, "login.html", {
            "node": agent.node, "version": __version__, "page": "", "next": _local(next),
            "failed": failed, "enabled": auth._token() is not None})

    @app.post("/login", include_in_schema=False)
    def login(request: Request, token: Annotated[str, Form(max_length=4096)],
              next: Annotated[str, Form(max_length=4096)] = "/") -> Response:
        wait = auth.limiter.refuse(client_of(request), "/login")
        if wait:
            raise HTTPException(429, f"too many failed logins from this address: retry in "
                                     f"{wait:.0f}s", headers={"Retry-After": str(int(wait + 1))})
        cookie = auth.login(token, request)
        if cookie is None:
            return RedirectResponse(f"/login?failed=true&next={quote(_local(next))}",
                                    status_code=303)
        response = RedirectResponse(_local(next), status_code=303)
        response.set_cookie(SESSION_COOKIE, cookie, httponly=True, samesite="strict",
                            secure=auth.secure_cookies,
                            max_age=int(agent.settings.ui.session_hours * 3600))
        return response

    @app.post("/logout", include_in_schema=False)
    def logout() -> Response:
        response = RedirectResponse("/", status_code=303)
        response.delete_cookie(SESSION_COOKIE, secure=auth.secure_cookies, httponly=True,
                               samesite="strict")
        return response

    @app.get("/api/actions", tags=["actions"])
    def actions(
        since: Annotated[datetime | None, Query(description="at or after (ISO 8601)")] = None,
        step: Annotated[str | None, Query(description="one step kind, e.g. cordon")] = None,
        incident: str | None = None,
        limit: Annotated[int, Query(ge=1, le=5000)] = 500,
    ) -> dict[str, Any]:
        """The audit log: every step applied or undone (or proposed, in dry-run), newest
        first, with its incident, target, outcome and the reason the ladder took it."""
        found = agent.ledger.audit_log(since_ns=_ns(since) or 0, kind=step, incident=incident,
                                       limit=limit)
        return {"actions": [vars(entry) for entry in found]}

    @app.get("/api/workloads", tags=["node"])
    def workloads(
        class_: Annotated[Literal["LS", "BE"] | None, Query(alias="class")] = None,
    ) -> dict[str, Any]:
        """The node's LS and BE workloads as the agent classes them now (the node page's
        list): each pod's (or declared cgroup's) class, QoS tier, namespace, pod and uid.
        What a lever may touch and what it protects follows this class."""
        found = [w for w in agent.workloads() if class_ is None or w.get("class") == class_]
        found.sort(key=lambda w: (w.get("class", ""), w.get("namespace", ""),
                                  w.get("pod") or w.get("workload", "")))
        return {"workloads": found}

    @app.get("/api/workloads/cost", tags=["node"])
    def guard_costs(
        workload: Annotated[str | None, Query(max_length=512)] = None,
    ) -> dict[str, Any]:
        """What guarding has cost each BE workload, the most held first: seconds under each
        lever kind, CPU got and wanted (got + run-queue wait) while held and while free, and
        their ratio (`satisfaction`, null without the eBPF run-queue program), evictions, and
        the incidents that ended with attribution naming it first. Kept across restarts."""
        found = agent.guard_costs()
        if workload is not None:
            found = [c for c in found if c["workload"] == workload]
        return {"workloads": found}

    @app.get("/api/policies", tags=["actions"])
    def policies() -> dict[str, Any]:
        """Loaded escalation policies, the rungs in force on this node, and what works here."""
        loaded, file_errors, errors = agent.policies_view()
        return {
            "dry_run": agent.settings.actuators.dry_run,
            "policies": [{"name": p.name, "source": p.source,
                          "spec": p.spec.model_dump(exclude_defaults=False)} for p in loaded],
            "file_errors": file_errors,
            "errors": errors,
            "in_force": [dataclasses.asdict(r) for r in agent.ledger.rungs()],
            "levers": {kind: {"tried": tried, "worked": worked}
                       for kind, (tried, worked) in agent.ledger.lever_stats().items()},
        }

    from sloguard.ui.silences import silences_router

    if agent.silences is not None:
        app.include_router(silences_router(agent, auth))
    else:  # the cluster server: silences mute each node's own alerting
        @app.get("/silences", response_class=HTMLResponse, include_in_schema=False)
        def no_silences(request: Request) -> Response:
            return TEMPLATES.TemplateResponse(request, "no_silences.html", {
                "node": agent.node, "version": __version__, "page": "silences"})

    @app.get("/incidents/{incident_id}", response_class=HTMLResponse, include_in_schema=False)
    def incident_page(request: Request, incident_id: str) -> Response:
        incident = agent.incidents.get(incident_id)
        if incident is None:
            raise HTTPException(404, "no such incident")
        audit = agent.ledger.audit_log(incident=incident_id, limit=200)
        timeline = sorted(
            [("evidence", e.time_ns, e) for e in incident.evidence]
            + [("action", a.time_ns, a) for a in incident.actions]
            + [("state", t, label) for t, label in (
                (incident.fired_ns, "fired"), (incident.resolved_ns, "resolved")) if t],
            key=lambda entry: entry[1])
        return TEMPLATES.TemplateResponse(request, "incident.html", {
            "i": incident, "node": agent.node, "version": __version__, "page": "incidents",
            "audit": list(reversed(audit)), "timeline": timeline,
            "changes": auth._token() is not None,
            "cluster": agent.cluster,
            "csrf": auth.csrf(auth.session(request)),
        })

    add_pages(app, agent, TEMPLATES)
    return app


def server_options(settings: Any) -> dict[str, Any]:
    """uvicorn's TLS options from `ui.tls_cert_file` and `ui.tls_key_file` (none without)."""
    ui = settings.ui
    if not ui.tls_cert_file:
        return {}
    return {"ssl_certfile": ui.tls_cert_file, "ssl_keyfile": ui.tls_key_file}


def incident_chart(store: Any, incident: Any, now_ns: int) -> dict[str, Any]:
    """Aligned columns for uPlot: x (seconds), the value, and the threshold in force (from the
    evidence, held until the next one), plus action and state-change markers."""
    from sloguard.core.selectors import Matcher
    from sloguard.store import WindowQuery

    signal = incident.signal
    if store is None:  # the cluster server keeps incidents and actions, not samples
        return {"x": [], "value": [], "threshold": [], "field": signal.get("field", ""),
                "expr": signal.get("expr", ""), "started": incident.started_ns / 1e9,
                "fired": incident.fired_ns / 1e9 if incident.fired_ns else None,
                "resolved": incident.resolved_ns / 1e9 if incident.resolved_ns else None,
                "actions": [], "error": f"the cluster server keeps no samples: the chart of "
                                        f"this series is on node {incident.node}'s agent"}
    start = incident.started_ns - CHART_MARGIN_NS
    end = (incident.resolved_ns or now_ns) + CHART_MARGIN_NS
    points: list[tuple[int, float]] = []
    error = ""
    if signal.get("measurement") and signal.get("field"):
        matchers = tuple(Matcher(k, "=", v) for k, v in incident.series.items())
        try:
            samples = store.read_samples(WindowQuery(
                signal["measurement"], start, end, fields=(signal["field"],),
                matchers=matchers))
        except Exception as exc:  # the page still shows the evidence
            error = f"cannot read the series: {exc}"
            samples = []
        for sample in samples:
            if sample.tags == incident.series or all(
                    sample.tags.get(k) == v for k, v in incident.series.items()):
                value = sample.fields.get(signal["field"])
                if isinstance(value, int | float) and not isinstance(value, bool):
                    points.append((sample.time_ns, float(value)))
    else:
        error = "this incident does not say which series it watched"
    points.sort()
    if len(points) > CHART_MAX_POINTS:
        stride = -(-len(points) // CHART_MAX_POINTS)
        points = points[::stride]
    evidence = sorted((e.time_ns, e.threshold) for e in incident.evidence)
    times = sorted({t for t, _ in points} | {t for t, _ in evidence})
    values = dict(points)
    thresholds, current, ei = [], None, 0
    for t in times:
        while ei < len(evidence) and evidence[ei][0] <= t:
            current = evidence[ei][1]
            ei += 1
        thresholds.append(current)
    marks = [{"t": a.time_ns / 1e9, "label": f"{a.step} {a.status}", "dry_run": a.dry_run}
             for a in incident.actions]
    return {
        "x": [t / 1e9 for t in times],
        "value": [values.get(t) for t in times],
        "threshold": thresholds,
        "field": signal.get("field", ""), "expr": signal.get("expr", ""),
        "started": incident.started_ns / 1e9,
        "fired": incident.fired_ns / 1e9 if incident.fired_ns else None,
        "resolved": incident.resolved_ns / 1e9 if incident.resolved_ns else None,
        "actions": marks, "error": error,
        "changes": sorted({e.change_ns / 1e9 for e in incident.evidence if e.change_ns}),
    }


def _ns(moment: datetime | None) -> int | None:
    if moment is None:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    # nanoseconds since the epoch fit int64 only until 2262: later (or far earlier) dates are
    # clamped, so "since year 3000" is simply an empty answer, not a failed query
    return max(-(2**63), min(int(moment.timestamp() * 1e9), 2**63 - 1))
