"""Silences over HTTP: the JSON API the CLI uses, and a small page with a form (issue #9 makes
it part of the full UI).

Times are ISO 8601 (UTC when no zone is given); a silence is created for `duration` from its
start or until `ends_at`. Expiring is DELETE: the silence is kept, ended now, as Alertmanager
does, so who muted what stays visible.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import parse_qs

from fastapi import APIRouter, Depends, HTTPException, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.templating import Jinja2Templates
from pydantic import BaseModel, Field

from sloguard import __version__
from sloguard.actuators.alerting.silences import SILENCE_STATES
from sloguard.ui.auth import Auth

TEMPLATES = Jinja2Templates(directory=str(Path(__file__).parent / "templates"))
MAX_FORM_BYTES = 64 * 1024


class SilenceIn(BaseModel):
    matchers: list[str] = Field(min_length=1, max_length=50,
                                examples=[['alertname="LSCpuStall"', 'node="worker-7"']])
    created_by: str = Field(max_length=1000)
    comment: str = Field(max_length=1000)
    starts_at: datetime | None = Field(None, description="default: now")
    ends_at: datetime | None = Field(None, description="or `duration`")
    duration: str | None = Field(None, max_length=100,
                                 description="e.g. 2h, 30m (from starts_at)",
                                 examples=["2h"])


LATEST_NS = 2**63 - 1  # the stores keep nanoseconds in int64: until 2262-04-11


def _ns(moment: datetime, field: str = "ends_at") -> int:
    """Nanoseconds since the epoch; ValueError naming the field beyond what int64 holds (a
    silence "until year 9999" is refused with the reason, not a 500 from the store)."""
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    ns = int(moment.timestamp() * 1e9)
    if not 0 <= ns <= LATEST_NS:
        raise ValueError(f"{field}: {moment.isoformat()} is outside 1970-01-01 .. 2262-04-11, "
                         "the times this agent can store")
    return ns


def _when(ns: int | None) -> str:
    if not ns:
        return ""
    return datetime.fromtimestamp(ns / 1e9, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


TEMPLATES.env.filters["when"] = _when


def create_silence(store: Any, body: SilenceIn) -> Any:
    from sloguard.actuators.alerting.silences import SilenceError
    from sloguard.core.units import parse_duration

    now_ns = time.time_ns()
    try:
        starts = _ns(body.starts_at, "starts_at") if body.starts_at else now_ns
        if body.ends_at is not None and body.duration:
            raise SilenceError("give ends_at or duration, not both")
        if body.ends_at is not None:
            ends = _ns(body.ends_at)
        elif body.duration:
            seconds = parse_duration(body.duration)
            if not seconds * 1e9 <= LATEST_NS - starts:
                raise SilenceError(f"duration: {body.duration[:50]!r} ends after 2262-04-11, "
                                   "the latest time this agent can store")
            ends = starts + int(seconds * 1e9)
        else:
            raise SilenceError("give ends_at or duration (e.g. 2h)")
        return store.add(body.matchers, ends, body.created_by, body.comment, starts, now_ns)
    except (SilenceError, ValueError, OverflowError) as exc:
        raise HTTPException(422, str(exc)) from None


def silences_router(agent: Any, auth: Auth) -> APIRouter:
    router = APIRouter()

    @router.get("/api/silences", tags=["silences"])
    def list_silences(
        state: Annotated[Literal[SILENCE_STATES] | None,  # type: ignore[valid-type]
                         Query(description="default: all")] = None,
    ) -> dict[str, Any]:
        now_ns = time.time_ns()
        return {"silences": [s.as_dict(now_ns) for s in agent.silences.list(state, now_ns)]}

    @router.post("/api/silences", tags=["silences"], status_code=201,
                 dependencies=[Depends(auth.api_change)],
                 responses={401: {"description": "no or wrong bearer token"},
                            403: {"description": "changes are disabled (no ui.token)"}})
    def add_silence(body: SilenceIn) -> dict[str, Any]:
        """Create a silence (needs the UI token)."""
        return create_silence(agent.silences, body).as_dict()

    @router.get("/api/silences/{silence_id}", tags=["silences"],
                responses={404: {"description": "no such silence"}})
    def get_silence(silence_id: str) -> dict[str, Any]:
        silence = agent.silences.get(silence_id)
        if silence is None:
            raise HTTPException(404, "no such silence")
        return silence.as_dict()

    @router.delete("/api/silences/{silence_id}", tags=["silences"],
                   dependencies=[Depends(auth.api_change)],
                   responses={404: {"description": "no such silence"},
                              401: {"description": "no or wrong bearer token"},
                              403: {"description": "changes are disabled (no ui.token)"}})
    def expire_silence(silence_id: str) -> dict[str, Any]:
        """End a silence now (it is kept, expired)."""
        silence = agent.silences.expire(silence_id)
        if silence is None:
            raise HTTPException(404, "no such silence")
        return silence.as_dict()

    @router.get("/silences", response_class=HTMLResponse, include_in_schema=False)
    def page(request: Request, error: str = "") -> Response:
        now_ns = time.time_ns()
        return TEMPLATES.TemplateResponse(request, "silences.html", {
            "silences": agent.silences.list(None, now_ns), "now_ns": now_ns,
            "node": agent.node, "version": __version__, "page": "silences",
            "csrf": auth.csrf(auth.session(request)), "error": error[:500],
            "changes": auth._token() is not None})

    @router.post("/silences", include_in_schema=False)
    async def add_from_form(request: Request) -> Response:
        fields = await _form(request)
        auth.require_change(request, fields.get("csrf"))
        matchers = [line for line in fields.get("matchers", "").splitlines() if line.strip()]
        try:
            create_silence(agent.silences, SilenceIn(
                matchers=matchers or [""], created_by=fields.get("created_by", ""),
                comment=fields.get("comment", ""), duration=fields.get("duration") or "2h"))
        except (HTTPException, ValueError) as exc:
            shown = page(request, error=str(getattr(exc, "detail", exc)))
            shown.status_code = 422
            return shown
        return RedirectResponse("/silences", status_code=303)

    @router.post("/silences/{silence_id}/expire", include_in_schema=False)
    async def expire_from_form(request: Request, silence_id: str) -> Response:
        auth.require_change(request, (await _form(request)).get("csrf"))
        if agent.silences.expire(silence_id) is None:
            raise HTTPException(404, "no such silence")
        return RedirectResponse("/silences", status_code=303)

    return router


async def _form(request: Request) -> dict[str, str]:
    """An urlencoded form (python-multipart is not needed for these few fields)."""
    if "application/x-www-form-urlencoded" not in request.headers.get("content-type", ""):
        raise HTTPException(415, "expected a form (application/x-www-form-urlencoded)")
    body = await request.body()
    if len(body) > MAX_FORM_BYTES:
        raise HTTPException(413, "form too large")
    return {k: v[-1] for k, v in parse_qs(body.decode("utf-8", "replace")).items()}
