"""POST /api/v1/ingest: where agents send their incidents and actions (the cluster server).

Authenticated by `server.ingest_token` (bearer, compared in constant time, never logged),
which is not ui.token: an agent's credential neither reads nor changes the UI, and the UI's
token cannot write here. Bodies over `server.max_body` are refused (413) before they are read
whole; a body that does not validate is a 422 naming the field.
"""

from __future__ import annotations

import hmac
import json
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from sloguard.core.config import SecretUnavailable, read_secret
from sloguard.core.incidents import SEVERITIES, STATES, Incident
from sloguard.ui.auth import FailureLimiter, client_of

INGEST_PATH = "/api/v1/ingest"
MAX_ITEMS = 1000
Text = Annotated[str, Field(max_length=10_000)]
Name = Annotated[str, Field(min_length=1, max_length=253)]


class IngestAction(BaseModel):
    model_config = ConfigDict(extra="ignore")
    id: int = Field(ge=1, description="the entry's id on its node")
    time_ns: int
    node: Name
    incident: Text
    policy: Text
    rung: int
    kind: Name
    action: Name
    dry_run: bool
    status: Name
    target: Text
    detail: Text
    reason: Text


class IngestBody(BaseModel):
    model_config = ConfigDict(extra="ignore")
    node: Name
    sent_ns: int = 0
    backlog: dict[str, int] = Field(default_factory=dict)
    incidents: list[Incident] = Field(default_factory=list, max_length=MAX_ITEMS)
    actions: list[IngestAction] = Field(default_factory=list, max_length=MAX_ITEMS)

    @model_validator(mode="after")
    def _of_this_node(self) -> IngestBody:
        for n, incident in enumerate(self.incidents):
            if incident.node != self.node:
                raise ValueError(f"incidents.{n}.node: {incident.node!r} is not the sender "
                                 f"{self.node!r}")
            if incident.state not in STATES:
                raise ValueError(f"incidents.{n}.state: must be one of {', '.join(STATES)}")
            if incident.severity not in SEVERITIES:
                raise ValueError(f"incidents.{n}.severity: must be one of "
                                 f"{', '.join(SEVERITIES)}")
        for n, action in enumerate(self.actions):
            if action.node != self.node:
                raise ValueError(f"actions.{n}.node: {action.node!r} is not the sender "
                                 f"{self.node!r}")
        return self


def ingest_router(server: Any) -> APIRouter:
    router = APIRouter(tags=["cluster"])
    cfg = server.settings.server
    # Wrong ingest tokens count against the client as wrong UI tokens do (ui/auth.py).
    limiter = FailureLimiter(server.settings.ui.auth_failures_per_minute)

    def check_token(request: Request) -> None:
        try:
            token = read_secret(cfg, "ingest_token")
        except SecretUnavailable:
            token = None
        if not token:
            server.refused.labels("disabled").inc()
            raise HTTPException(403, "ingest is disabled: server.ingest_token is not set or "
                                     "cannot be read")
        client = client_of(request)
        wait = limiter.refuse(client, INGEST_PATH)
        if wait:
            server.refused.labels("rate_limited").inc()
            raise HTTPException(429, "too many failed authentications from this address: "
                                     f"retry in {wait:.0f}s",
                                headers={"Retry-After": str(int(wait + 0.999))})
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(
                given.strip().encode("utf-8", "surrogateescape"), token.encode()):
            server.refused.labels("unauthenticated").inc()
            limiter.failed(client, "wrong ingest token", INGEST_PATH)
            raise HTTPException(401, "send Authorization: Bearer <server.ingest_token>",
                                headers={"WWW-Authenticate": "Bearer"})

    @router.post(INGEST_PATH, openapi_extra={"requestBody": {"required": True, "content": {
        "application/json": {"schema": IngestBody.model_json_schema(
            ref_template="#/components/schemas/{model}")}}}}, responses={
        401: {"description": "no or wrong ingest token"},
        413: {"description": "body over server.max_body"},
        422: {"description": "the body does not validate (detail names the field)"}})
    async def ingest(request: Request) -> Response:
        """Take a node's changed incidents and new audit entries (idempotent: a batch sent
        twice is stored once)."""
        check_token(request)
        limit = cfg.max_body
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            server.refused.labels("too_large").inc()
            raise HTTPException(413, f"body of {declared} bytes exceeds server.max_body "
                                     f"({limit} bytes)")
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                server.refused.labels("too_large").inc()
                raise HTTPException(413, f"body exceeds server.max_body ({limit} bytes)")
            chunks.append(chunk)
        try:
            body = IngestBody.model_validate_json(b"".join(chunks))
        except ValidationError as exc:
            server.refused.labels("invalid").inc()
            detail = json.loads(exc.json(include_url=False, include_input=False))
            for item in detail:
                item["field"] = ".".join(str(p) for p in item.get("loc", ()))
            return JSONResponse({"detail": detail}, status_code=422)
        stored = await run_in_threadpool(
            server.ingest, body.node, body.incidents,
            [a.model_dump() for a in body.actions], body.sent_ns, body.backlog)
        return JSONResponse({"node": body.node, **stored})

    return router
