"""The `ui` and `server` sections: who may read and change through the web UI/API, and the
cluster server's ingest credential.
"""

from __future__ import annotations

import logging
import os
from typing import Annotated, Literal
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, field_validator, model_validator

from sloguard.core.config import (
    Duration,
    SecretUnavailable,
    Section,
    Size,
    read_secret,
    secret_sources,
)

log = logging.getLogger(__name__)


class UiConfig(Section):
    external_url: str | None = Field(
        None, description="the UI's address as Slack readers reach it (links in messages); "
                          "default http://<listen>")
    token: SecretStr | None = Field(
        None, description="bearer token for changes (and for reading when not on loopback); "
                          "prefer token_file (a mounted Secret) or token_env")
    token_file: str | None = None
    token_env: str | None = None
    session_hours: float = Field(12.0, gt=0, description="how long a browser login lasts")
    tls_cert_file: str | None = Field(
        None, description="PEM certificate (chain) to serve the UI/API over HTTPS; with "
                          "tls_key_file. Session cookies are then Secure")
    tls_key_file: str | None = Field(None, description="PEM private key of tls_cert_file")
    allowed_hosts: list[Annotated[str, Field(min_length=1, max_length=253)]] = Field(
        default_factory=list, max_length=100,
        description="Host header names accepted besides loopback ones (on loopback always "
                    "checked, against DNS rebinding; beyond loopback checked when set)")
    auth_failures_per_minute: int = Field(
        10, ge=1, le=10_000,
        description="wrong tokens a client address may send in a minute before its "
                    "credentials are refused (429) for the rest of the minute")

    @model_validator(mode="after")
    def _one_token(self) -> UiConfig:
        if len(secret_sources(self, "token")) > 1:
            raise ValueError("give only one of token, token_file, token_env")
        if bool(self.tls_cert_file) != bool(self.tls_key_file):
            raise ValueError("give tls_cert_file and tls_key_file together (or neither)")
        for name in ("tls_cert_file", "tls_key_file"):
            path = getattr(self, name)
            if path and not os.access(path, os.R_OK):
                raise ValueError(f"{name} {path} cannot be read")
        return self

    def resolved_token(self) -> str | None:
        """The token, read when asked (a rotated Secret is picked up); None when none is
        configured or it cannot be read (changes are then refused, with the reason logged)."""
        try:
            return read_secret(self, "token")
        except SecretUnavailable as exc:
            log.error("ui token unavailable: %s", exc)
            return None


class ServerConfig(Section):
    """`sloguard server`: the cluster view. Agents authenticate with a token of their own node
    (node_tokens_file), or, before that is set up, one ingest token all share; either is
    separate from ui.token so that an agent's credential cannot read or change the UI."""

    ingest_token: SecretStr | None = Field(
        None, description="bearer token every agent presents on POST /api/v1/ingest (any "
                          "agent may then post as any node): accepted while node_tokens_file "
                          "is unset, or with allow_shared_token")
    ingest_token_file: str | None = None
    ingest_token_env: str | None = None
    node_tokens_file: str | None = Field(
        None, description="a file (a mounted Secret) of `NODE TOKEN` or `NODE sha256:HEX` "
                          "lines: a node's token names it, and it may post only its own "
                          "incidents and audit entries; re-read when it changes")
    node_auth: Literal["tokens", "tokenreview"] = Field(
        "tokens", description="tokens: node_tokens_file (or the shared ingest_token); "
                              "tokenreview: also the agents' pod-bound service-account "
                              "tokens, checked with the Kubernetes TokenReview API, the node "
                              "being the one their pod runs on")
    tokenreview_audiences: list[Annotated[str, Field(min_length=1, max_length=253)]] = Field(
        default_factory=lambda: ["sloguard-server"], max_length=10,
        description="the audience the agents' projected tokens are issued for (so the server "
                    "cannot replay one against the apiserver); [] accepts the apiserver's own "
                    "audience, which lets it")
    tokenreview_service_accounts: list[Annotated[str, Field(
        pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?:[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")]] = Field(
        default_factory=lambda: ["sloguard:sloguard-agent"], min_length=1, max_length=20,
        description="NAMESPACE:NAME of the service accounts whose tokens are agents' (the "
                    "DaemonSet's)")
    tokenreview_cache: Duration = Field(
        30.0, le=600, description="how long a reviewed token's node is remembered (a token "
                                  "whose pod was deleted is accepted at most this long)")
    kubeconfig: str | None = Field(
        None, description="for tokenreview: the apiserver to ask; unset: the in-cluster "
                          "service account")
    allow_shared_token: bool = Field(
        False, description="with node_tokens_file, still accept ingest_token (trusting the "
                           "node the body names): while agents move to their own tokens")
    max_body: Size = Field(8 * 1024**2, ge=1024, description="largest ingest body accepted")
    stale_after: Duration = Field(
        60.0, gt=0, description="a node not heard from for this long is shown as not ok")
    database: str | None = Field(
        None, description="postgresql://USER@HOST[:PORT]/DBNAME: keep incidents, imported "
                          "audit entries and the nodes in PostgreSQL, which several replicas "
                          "may share; unset: SQLite files in data_dir (one replica)")
    database_password: SecretStr | None = None
    database_password_file: str | None = None
    database_password_env: str | None = None
    database_pool: int = Field(
        4, ge=1, le=100, description="PostgreSQL connections each replica may hold")

    @field_validator("database")
    @classmethod
    def _postgres_url(cls, value: str | None) -> str | None:
        """A URL without its password: the URL is logged and shown by `config show`, and a
        password belongs in a Secret (database_password_file) or the environment."""
        if value is None:
            return None
        parts = urlsplit(value)
        if parts.scheme not in ("postgresql", "postgres"):
            raise ValueError("must be a postgresql://USER@HOST[:PORT]/DBNAME URL")
        if parts.password is not None or "password=" in parts.query:
            raise ValueError("holds a password: give it as database_password_file or "
                             "database_password_env, never in the URL")
        return value

    @model_validator(mode="after")
    def _one_token(self) -> ServerConfig:
        for name in ("ingest_token", "database_password"):
            if len(secret_sources(self, name)) > 1:
                raise ValueError(f"give only one of {name}, {name}_file, {name}_env")
        own = bool(self.node_tokens_file) or self.node_auth == "tokenreview"
        if self.allow_shared_token and not (own and secret_sources(self, "ingest_token")):
            raise ValueError("server.allow_shared_token: needs ingest_token and the nodes' own "
                             "tokens (node_tokens_file or node_auth: tokenreview): it lets the "
                             "shared token in beside them")
        if secret_sources(self, "database_password") and not self.database:
            raise ValueError("database_password: set server.database too (the password is "
                             "PostgreSQL's; SQLite needs none)")
        return self

    def database_where(self) -> str:
        """The database for logs and errors: host, port and name, never a password."""
        if not self.database:
            return "SQLite in data_dir"
        parts = urlsplit(self.database)
        return f"PostgreSQL {parts.hostname or 'localhost'}:{parts.port or 5432}" \
               f"{parts.path or '/'}"

