"""The `store` and `incidents` sections: where samples and incidents are kept, and how long.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, SecretStr, ValidationInfo, field_validator

from sloguard.core.config import Duration, Section, Size


class StoreConfig(Section):
    kind: Literal["embedded", "influxdb"] = "embedded"
    retention: Duration = Field(6 * 3600, description="drop samples older than this (embedded)")
    max_size: Size = Field(
        1024**3, description="drop the oldest samples above this size (embedded)")
    buffer_samples: int = Field(
        200_000, ge=1000, description="samples kept in memory while the store cannot be written"
    )
    # kind: influxdb. The server's version (/ping) picks the write path unless `api` says.
    url: str | None = Field(
        None, validate_default=True, description="InfluxDB base URL, e.g. http://influx:8086")
    api: Literal["auto", "v1", "v2"] = Field(
        "auto", description="auto: v2 write API on 1.8+, 2.x, 3.x; 1.x /write before 1.8")
    token: SecretStr | None = Field(None, description="v2 API token")
    org: str | None = Field(None, description="v2 API organisation")
    bucket: str | None = Field(None, description="v2 API bucket")
    database: str | None = Field(
        None, validate_default=True,
        description="1.x database; also the database /query reads (default: the bucket)")
    retention_policy: str | None = Field(None, description="1.x retention policy")
    username: str | None = Field(None, description="1.x user")
    password: SecretStr | None = Field(None, description="1.x password")
    batch_size: int = Field(5000, ge=1, le=1_000_000, description="points per write request")
    flush_interval: Duration = Field(1.0, gt=0, description="longest a point waits for a batch")
    timeout: Duration = Field(10.0, gt=0, description="HTTP timeout of one request")
    gzip: bool | Literal["auto"] = Field(
        "auto", description="compress write requests; auto: unless the server is on loopback")
    verify_tls: bool = True
    max_backoff: Duration = Field(30.0, gt=0, description="longest wait between retries")
    spool_max_size: Size = Field(
        256 * 1024**2, ge=1024, description="bound of the on-disk spool (data_dir/influx-spool)")
    spool_full: Literal["drop_oldest", "drop_newest"] = Field(
        "drop_oldest", description="which batches go when the spool is full (counted, logged)")
    max_series: int = Field(
        20_000, ge=1, description="distinct series written per hour; new ones beyond are refused")

    @field_validator("url")
    @classmethod
    def _url(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is None:
            if info.data.get("kind") == "influxdb":
                raise ValueError("required with kind: influxdb (e.g. http://127.0.0.1:8086)")
            return value
        from urllib.parse import urlsplit

        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("must be an http:// or https:// URL")
        if parts.password:
            raise ValueError("put the password in store.password (or the token in store.token),"
                             " not in the URL")
        return value

    @field_validator("database")
    @classmethod
    def _database(cls, value: str | None, info: ValidationInfo) -> str | None:
        if info.data.get("kind") == "influxdb" and not value and not info.data.get("bucket"):
            raise ValueError("set database (InfluxDB 1.x) or bucket (v2 API): where samples go")
        return value


class IncidentsConfig(Section):
    retention: Duration = Field(
        30 * 86400, gt=0,
        description="resolved incidents resolved longer ago than this are deleted (open "
                    "ones are kept however old)")

