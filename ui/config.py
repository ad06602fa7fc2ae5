"""The `ui` and `server` sections: who may read and change through the web UI/API, and the
cluster server's ingest credential.
"""

from __future__ import annotations

import logging
import os
from typing import Annotated

from pydantic import Field, SecretStr, model_validator

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
    """`sloguard server`: the cluster view. Agents authenticate with the ingest token, which is
    separate from ui.token so that an agent's credential cannot read or change the UI."""

    ingest_token: SecretStr | None = Field(
        None, description="bearer token agents present on POST /api/v1/ingest")
    ingest_token_file: str | None = None
    ingest_token_env: str | None = None
    max_body: Size = Field(8 * 1024**2, ge=1024, description="largest ingest body accepted")
    stale_after: Duration = Field(
        60.0, gt=0, description="a node not heard from for this long is shown as not ok")

    @model_validator(mode="after")
    def _one_token(self) -> ServerConfig:
        if len(secret_sources(self, "ingest_token")) > 1:
            raise ValueError("give only one of ingest_token, ingest_token_file, "
                             "ingest_token_env")
        return self

