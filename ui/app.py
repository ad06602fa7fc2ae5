"""The agent's HTTP face: health, metrics, the incidents API and a first incidents page.

Binds loopback by default (see `listen` in the config). Every string that reaches HTML comes
from the cluster or a rule file and is escaped by Jinja2's autoescaping.
"""

from __future__ import annotations

from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

from fastapi import FastAPI, HTTPException, Query, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response
from fastapi.templating import Jinja2Templates
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from sloguard import __version__
from sloguard.incidents import SEVERITIES, STATES

TEMPLATES = Jinja2Templates(directory=str(Path(__file__).parent / "templates"))


def _when(ns: int | None) -> str:
    if not ns:
        return ""
    return datetime.fromtimestamp(ns / 1e9, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


TEMPLATES.env.filters["when"] = _when


def create_app(agent: Any, manage_lifecycle: bool = True) -> FastAPI:
    """The app for one agent; with `manage_lifecycle` the app starts and stops the agent."""

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
    app_latency = getattr(agent, "app_latency", None)
    if app_latency is not None and agent.settings.app_latency.receive.enabled:
        from sloguard.ui.receive import receive_router

        app.include_router(receive_router(app_latency, agent.settings.app_latency.receive,
                                          agent.node))

    @app.get("/healthz", tags=["health"])
    def healthz() -> Response:
        ok = agent.alive()
        return JSONResponse({"ok": ok, "ticks": agent.ticks}, status_code=200 if ok else 503)

    @app.get("/readyz", tags=["health"])
    def readyz() -> Response:
        components = [c.as_dict() for c in agent.components()]
        ready = agent.ready()
        return JSONResponse(
            {"ready": ready, "node": agent.node, "components": components},
            status_code=200 if ready else 503,
        )

    @app.get("/metrics", tags=["health"])
    def metrics() -> Response:
        return Response(generate_latest(agent.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/api/incidents", tags=["incidents"])
    def list_incidents(
        state: Annotated[str | None, Query(description=f"one of {', '.join(STATES)}")] = None,
        severity: Annotated[
            str | None, Query(description=f"one of {', '.join(SEVERITIES)}")
        ] = None,
        rule: str | None = None,
        node: str | None = None,
        since: Annotated[
            datetime | None, Query(description="started at or after (ISO 8601)")
        ] = None,
        until: Annotated[datetime | None, Query(description="started before (ISO 8601)")] = None,
        limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    ) -> dict[str, Any]:
        if state is not None and state not in STATES:
            raise HTTPException(422, f"state must be one of {', '.join(STATES)}")
        if severity is not None and severity not in SEVERITIES:
            raise HTTPException(422, f"severity must be one of {', '.join(SEVERITIES)}")
        found = agent.incidents.query(
            state=state, severity=severity, rule=rule, node=node,
            since_ns=_ns(since), until_ns=_ns(until), limit=limit,
        )
        return {"incidents": [i.to_dict() for i in found]}

    @app.get("/api/incidents/{incident_id}", tags=["incidents"])
    def get_incident(incident_id: str) -> dict[str, Any]:
        incident = agent.incidents.get(incident_id)
        if incident is None:
            raise HTTPException(404, "no such incident")
        return incident.to_dict()

    @app.get("/api/rules", tags=["rules"])
    def rules() -> dict[str, Any]:
        rules = []
        for r in agent.rules.rules:
            status = agent.engine.status.get(r.key)
            rules.append({
                "key": r.key, "source": r.source, "spec": r.spec.model_dump(by_alias=True),
                "last_eval_ns": status.last_eval_ns if status else None,
                "error": status.error if status else "",
            })
        return {
            "rules": rules,
            "file_errors": agent.rules.errors,
        }

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    def index(request: Request, state: str | None = None) -> Response:
        if state not in STATES:
            state = None
        found = agent.incidents.query(state=state, limit=200)
        return TEMPLATES.TemplateResponse(
            request, "index.html",
            {"incidents": found, "node": agent.node, "state": state, "states": STATES,
             "components": agent.components(), "version": __version__,
             "targets": app_latency.target_status() if app_latency is not None else []},
        )

    return app


def _ns(moment: datetime | None) -> int | None:
    if moment is None:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1e9)
