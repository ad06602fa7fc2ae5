"""POST /api/v1/ingest: where agents send their incidents and actions (the cluster server).

Who may post, and as which node:

- With `server.node_tokens_file` (ui/node_tokens.py) each node has a token of its own and the
  token names the node. The body's `node`, every incident's `node` and every audit entry's
  `node` must be that node, or the whole batch is refused with 403 naming the first field
  that differs (nothing of it is stored: a batch is one node's, all or nothing). A node cannot
  withdraw another's incidents either (the store removes only the sender's, ClusterDB.ingest)
  nor overwrite one by sending its id.
- With `server.node_auth: tokenreview` (ui/tokenreview.py) the agent's pod-bound
  service-account token names the node its pod runs on, as the apiserver says; the same
  checks follow.
- Without either, every agent presents the shared `server.ingest_token` and the server trusts the
  node the body names (incidents and entries must still name that node: 422). With the nodes'
  own tokens, the shared one is refused unless `server.allow_shared_token` is on (a migration).

Tokens are bearers, never logged or echoed; the shared one is compared in constant time and a
node's by its SHA-256 (ui/node_tokens.py says why that is as safe). They are not ui.token: an
agent's credential neither reads nor changes the UI, and the UI's token cannot write here.
Wrong tokens count against the client address as wrong UI tokens do (429 past the limit).
Bodies over `server.max_body` are refused (413) before they are read whole; a body that does
not validate is a 422 naming the field.

`withdrawn` lists the ids of incidents the node deleted (a pending incident that never fired):
the server removes each only if it is that node's.
"""

from __future__ import annotations

import hmac
import json
import logging
import time
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from sloguard.core.config import SecretUnavailable, read_secret
from sloguard.core.incidents import SEVERITIES, STATES, Incident
from sloguard.ui.auth import FailureLimiter, client_of
from sloguard.ui.tokenreview import ReviewUnavailable

log = logging.getLogger(__name__)

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
    withdrawn: list[Text] = Field(default_factory=list, max_length=MAX_ITEMS,
                                  description="ids of incidents the node deleted")
    actions: list[IngestAction] = Field(default_factory=list, max_length=MAX_ITEMS)

    @model_validator(mode="after")
    def _known_values(self) -> IngestBody:
        for n, incident in enumerate(self.incidents):
            if incident.state not in STATES:
                raise ValueError(f"incidents.{n}.state: must be one of {', '.join(STATES)}")
            if incident.severity not in SEVERITIES:
                raise ValueError(f"incidents.{n}.severity: must be one of "
                                 f"{', '.join(SEVERITIES)}")
        return self


def foreign_node(body: IngestBody, node: str) -> tuple[str, str] | None:
    """The first field of `body` that names a node other than `node`, and the node it names;
    None when everything in it is `node`'s."""
    if body.node != node:
        return "node", body.node
    for n, incident in enumerate(body.incidents):
        if incident.node != node:
            return f"incidents.{n}.node", incident.node
    for n, action in enumerate(body.actions):
        if action.node != node:
            return f"actions.{n}.node", action.node
    return None


SHARED = ""  # the sender presented the shared ingest token: its node is the body's


def ingest_router(server: Any) -> APIRouter:
    router = APIRouter(tags=["cluster"])
    cfg = server.settings.server
    # Wrong ingest tokens count against the client as wrong UI tokens do (ui/auth.py).
    limiter = FailureLimiter(server.settings.ui.auth_failures_per_minute)

    tokens = server.node_tokens  # None: no node_tokens_file
    reviewer = server.tokenreview  # None: node_auth is not tokenreview
    shared_allowed = (tokens is None and reviewer is None) or cfg.allow_shared_token
    # a node whose token posts as another is logged at most once a minute per node (a
    # misconfigured agent retries with back-off, a hostile one as fast as it likes)
    warned: dict[str, float] = {}

    def shared_token() -> str | None:
        if not shared_allowed:
            return None
        try:
            return read_secret(cfg, "ingest_token")
        except SecretUnavailable:  # refused below, saying so; not logged on every request
            return None

    async def identify(request: Request) -> str:
        """The node the request's token belongs to, or SHARED for the shared ingest token;
        raises 401/403/429, or 503 when the apiserver cannot review a token."""
        shared = shared_token()
        if tokens is None and reviewer is None and not shared:
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
        given = given.strip()
        if scheme.lower() == "bearer" and given:
            if tokens is not None:
                tokens.refresh()
                node = tokens.node_of(given)
                if node is not None:
                    return node
            if shared and hmac.compare_digest(given.encode("utf-8", "surrogateescape"),
                                              shared.encode()):
                return SHARED
            if reviewer is not None:  # last: it may cost the apiserver two requests
                try:
                    node = await run_in_threadpool(reviewer.node_of, given)
                except ReviewUnavailable as exc:
                    server.refused.labels("review_unavailable").inc()
                    raise HTTPException(503, f"cannot check the token now: {exc}",
                                        headers={"Retry-After": "10"}) from None
                if node is not None:
                    return node
        server.refused.labels("unauthenticated").inc()
        limiter.failed(client, "wrong ingest token", INGEST_PATH)
        wanted = ("<this node's token from server.node_tokens_file>" if tokens is not None
                  else "<the agent's projected service-account token>" if reviewer is not None
                  else "<server.ingest_token>")
        raise HTTPException(401, f"send Authorization: Bearer {wanted}",
                            headers={"WWW-Authenticate": "Bearer"})

    def refuse_foreign(body: IngestBody, node: str, client: str) -> Response | None:
        """403 when a node's token sends what names another node; 422 when a batch sent with
        the shared token mixes nodes. None when the batch is the sender's."""
        foreign = foreign_node(body, node or body.node)
        if foreign is None:
            return None
        field, named = foreign
        if not node:  # the shared token: the body's node is trusted, the batch must agree
            server.refused.labels("invalid").inc()
            return JSONResponse({"detail": [{
                "type": "value_error", "loc": field.split("."), "field": field,
                "msg": f"{field}: {named[:253]!r} is not the sender {body.node!r}"}]},
                status_code=422)
        server.refused.labels("wrong_node").inc()
        now = time.monotonic()
        if now - warned.get(node, float("-inf")) >= 60:
            if len(warned) > 10_000:
                warned.clear()
            warned[node] = now
            log.warning("ingest refused: node %s's token sent a batch whose %s is %r, from "
                        "%s (logged once a minute per node)", node, field, named[:253], client)
        return JSONResponse({"detail": f"{field}: {named[:253]!r} is not {node!r}, the node this "
                                       "token belongs to: a node sends only its own incidents "
                                       "and audit entries; nothing of this batch was stored"},
                            status_code=403)

    @router.post(INGEST_PATH, openapi_extra={"requestBody": {"required": True, "content": {
        "application/json": {"schema": IngestBody.model_json_schema(
            ref_template="#/components/schemas/{model}")}}}}, responses={
        401: {"description": "no or wrong token"},
        403: {"description": "the batch names a node other than the token's (nothing stored)"},
        503: {"description": "the Kubernetes API cannot review the token now (retry)"},
        413: {"description": "body over server.max_body"},
        422: {"description": "the body does not validate (detail names the field)"}})
    async def ingest(request: Request) -> Response:
        """Take a node's changed incidents, withdrawals and new audit entries (idempotent: a
        batch sent twice is stored once)."""
        node = await identify(request)
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
        refused = refuse_foreign(body, node, client_of(request))
        if refused is not None:
            return refused
        stored = await run_in_threadpool(
            server.ingest, body.node, body.incidents,
            [a.model_dump() for a in body.actions], body.sent_ns, body.backlog,
            body.withdrawn)
        return JSONResponse({"node": body.node, **stored})

    return router
