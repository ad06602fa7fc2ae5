"""The two ways a batch of line protocol reaches InfluxDB, and how the agent chooses one.

- InfluxDB 1.8+, 2.x and 3.x have the v2 write API (token, org, bucket): written with the
  official `influxdb-client`, synchronously, so that every failure comes back to the caller.
  Its batching write API only logs a failed batch (the error callback) while `write()` returns
  normally; points would be lost without a trace, so sloguard does its own batching, retries
  and spooling around synchronous calls.
- InfluxDB 1.x before 1.8 only has `POST /write?db=&rp=` (user and password): written with a
  plain urllib3 pool.

`auto` asks the server: `GET /ping` answers with an `X-Influxdb-Version` header on every
version. Both transports send the same gzip-compressed line protocol and report the outcome in
one shape (`SendResult`), so batching, backoff and the spool do not care which path is used.
"""

from __future__ import annotations

import base64
import email.utils
import gzip
import re
import time
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import urlencode, urlsplit, urlunsplit

import urllib3

V1 = "v1"
V2 = "v2"
PATH_NAMES = {V1: "1.x /write (urllib3)", V2: "v2 /api/v2/write (influxdb-client)"}


@dataclass(frozen=True, slots=True)
class Credentials:
    """What the config gave; secrets stay out of repr so that no log line can show them."""

    url: str
    token: str | None = None
    org: str | None = None
    bucket: str | None = None
    database: str | None = None
    retention_policy: str | None = None
    username: str | None = None
    password: str | None = None

    def __repr__(self) -> str:
        return f"Credentials(url={redact_url(self.url)!r}, database={self.database!r}, " \
               f"bucket={self.bucket!r})"

    @property
    def db(self) -> str:
        """The database name for 1.x /write and /query (2.x and 3.x map it to a bucket)."""
        return self.database or self.bucket or ""

    @property
    def v2_bucket(self) -> str:
        """The bucket; on 1.8 a database is written as `database/retention_policy`."""
        if self.bucket:
            return self.bucket
        return f"{self.database}/{self.retention_policy}" if self.retention_policy \
            else str(self.database)

    @property
    def v2_token(self) -> str:
        if self.token:
            return self.token
        if self.username:
            return f"{self.username}:{self.password or ''}"  # InfluxDB 1.8's v2 API
        return ""

    def auth_headers(self) -> dict[str, str]:
        if self.username:
            pair = f"{self.username}:{self.password or ''}".encode()
            return {"Authorization": "Basic " + base64.b64encode(pair).decode()}
        if self.token:
            return {"Authorization": f"Token {self.token}"}
        return {}


def redact_url(url: str) -> str:
    """The URL without any user:password@ part, for logs and /readyz."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    host = parts.netloc.rsplit("@", 1)[1]
    return urlunsplit((parts.scheme, f"***@{host}", parts.path, parts.query, parts.fragment))


@dataclass(frozen=True, slots=True)
class SendResult:
    ok: bool
    retryable: bool = False
    status: int | None = None
    message: str = ""
    retry_after: float | None = None
    too_large: bool = False
    dropped_points: int | None = None  # a 1.x partial write says how many it refused


class Batch:
    """Line protocol for one request; compressed (for the wire or the spool) only when needed."""

    __slots__ = ("_gz", "_raw", "points", "spooled")

    def __init__(self, points: int, raw: bytes | None = None, gz: bytes | None = None,
                 spooled: Any = None) -> None:
        self.points = points
        self._raw, self._gz = raw, gz
        self.spooled = spooled  # the SpooledBatch it was read from, if any

    def raw(self) -> bytes:
        if self._raw is None:
            self._raw = gzip.decompress(self._gz or b"")
        return self._raw

    def gz(self) -> bytes:
        if self._gz is None:
            self._gz = gzip.compress(self.raw(), compresslevel=1)
        return self._gz


class Transport(Protocol):
    path: str

    def send(self, batch: Batch) -> SendResult: ...

    def close(self) -> None: ...


def http_pool(verify_tls: bool) -> urllib3.PoolManager:
    return urllib3.PoolManager(
        num_pools=2, maxsize=2, retries=False,
        cert_reqs="CERT_REQUIRED" if verify_tls else "CERT_NONE")


def timeout_of(seconds: float) -> urllib3.Timeout:
    return urllib3.Timeout(connect=min(5.0, seconds), read=seconds)


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds to wait from a Retry-After header (delta-seconds or an HTTP date)."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        moment = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if moment is None:
        return None
    return max(0.0, moment.timestamp() - (now if now is not None else time.time()))


_DROPPED = re.compile(r"dropped=(\d+)")


def classify(status: int, message: str, retry_after: str | None) -> SendResult:
    """What to do with a batch the server answered `status` to.

    5xx and 429: the server is struggling; retry later. 401, 403 and 404 (database or bucket
    not found): a configuration problem an operator can fix without the data being lost, so the
    batch is kept too. 413: split the batch. Other 4xx: the server refuses these points for
    good (unparsable line, field type conflict, outside the retention); retrying cannot help.
    """
    wait = parse_retry_after(retry_after)
    if 200 <= status < 300:
        return SendResult(True, status=status)
    if status == 413:
        return SendResult(False, status=status, message=message, too_large=True)
    if status >= 500 or status in (401, 403, 404, 408, 429):
        return SendResult(False, retryable=True, status=status, message=message,
                          retry_after=wait)
    dropped = _DROPPED.search(message)
    return SendResult(False, status=status, message=message,
                      dropped_points=int(dropped.group(1)) if dropped else None)


def _message(status: int, headers: Any, body: bytes | str | None) -> str:
    text = ""
    if headers is not None:
        text = headers.get("X-Influxdb-Error") or headers.get("X-Platform-Error-Code") or ""
    if not text and body:
        text = body.decode("utf-8", "replace") if isinstance(body, bytes) else str(body)
    return f"HTTP {status}: {text.strip()[:500]}"


class V1Transport:
    """POST /write?db=&rp=&precision=ns with user/password (or a token), gzip-compressed."""

    path = V1

    def __init__(self, creds: Credentials, timeout_s: float, use_gzip: bool,
                 verify_tls: bool) -> None:
        params = {"db": creds.db, "precision": "ns"}
        if creds.retention_policy:
            params["rp"] = creds.retention_policy
        self._url = creds.url.rstrip("/") + "/write?" + urlencode(params)
        self._headers = {"Content-Type": "text/plain; charset=utf-8", **creds.auth_headers()}
        if use_gzip:
            self._headers["Content-Encoding"] = "gzip"
        self._gzip = use_gzip
        self._timeout = timeout_of(timeout_s)
        self._http = http_pool(verify_tls)

    def send(self, batch: Batch) -> SendResult:
        body = batch.gz() if self._gzip else batch.raw()
        try:
            response = self._http.request("POST", self._url, body=body, headers=self._headers,
                                          timeout=self._timeout, preload_content=True)
        except urllib3.exceptions.HTTPError as exc:
            return SendResult(False, retryable=True, message=f"cannot reach the server: {exc}")
        return classify(response.status, _message(response.status, response.headers,
                                                  response.data),
                        response.headers.get("Retry-After"))

    def close(self) -> None:
        self._http.clear()


class V2Transport:
    """The official influxdb-client's synchronous write API (no background batching)."""

    path = V2

    def __init__(self, creds: Credentials, timeout_s: float, use_gzip: bool,
                 verify_tls: bool) -> None:
        from influxdb_client import InfluxDBClient
        from influxdb_client.client.write_api import SYNCHRONOUS

        self._bucket = creds.v2_bucket
        self._org = creds.org or ("-" if not creds.bucket else None)
        self._client = InfluxDBClient(
            url=creds.url, token=creds.v2_token, org=self._org, timeout=int(timeout_s * 1000),
            enable_gzip=use_gzip, verify_ssl=verify_tls, retries=False)
        self._write = self._client.write_api(write_options=SYNCHRONOUS)

    def send(self, batch: Batch) -> SendResult:
        from influxdb_client.rest import ApiException

        try:
            self._write.write(bucket=self._bucket, org=self._org, record=batch.raw(),
                              write_precision="ns")
        except ApiException as exc:
            status = int(exc.status or 0)
            headers = exc.headers or {}
            return classify(status, _message(status, headers, exc.body),
                            headers.get("Retry-After"))
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            return SendResult(False, retryable=True, message=f"cannot reach the server: {exc}")
        return SendResult(True, status=204)

    def close(self) -> None:
        self._client.close()


def server_version(creds: Credentials, timeout_s: float, verify_tls: bool) -> str:
    """The version the server reports on /ping; raises urllib3 errors when it cannot be had."""
    http = http_pool(verify_tls)
    try:
        response = http.request("GET", creds.url.rstrip("/") + "/ping",
                                headers=creds.auth_headers(), timeout=timeout_of(timeout_s))
    finally:
        http.clear()
    version = response.headers.get("X-Influxdb-Version")
    if version:
        return version
    if response.status >= 500:
        raise urllib3.exceptions.HTTPError(f"/ping answered HTTP {response.status}")
    return ""


def path_for_version(version: str) -> str:
    """v2 for 1.8 and later (the v2 write API exists from 1.8 on), v1 before, and v1 when the
    server does not say (a /write endpoint is what other line-protocol servers accept)."""
    found = re.match(r"v?(\d+)\.(\d+)", version.strip())
    if not found:
        return V1
    major, minor = int(found.group(1)), int(found.group(2))
    return V2 if (major, minor) >= (1, 8) else V1


def make_transport(path: str, creds: Credentials, timeout_s: float, use_gzip: bool,
                   verify_tls: bool) -> Transport:
    cls = V2Transport if path == V2 else V1Transport
    return cls(creds, timeout_s, use_gzip, verify_tls)
