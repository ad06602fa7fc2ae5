"""Active probes, as the Prometheus blackbox exporter makes them: is the service answering, and
how fast, seen from the node.

A scrape says how fast the service thinks it is; a probe measures what a client gets, including
a listen queue that overflows or an accept loop starved of CPU, which no histogram inside the
service records. A probe that times out counts as a failure with the time it waited.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import ssl
import time
from dataclasses import dataclass

from sloguard.collectors.app_targets import Target
from sloguard.collectors.http_client import HttpError, Networks, connect, request


@dataclass(frozen=True, slots=True)
class ProbeResult:
    success: bool
    seconds: float
    status_code: int | None = None
    error: str = ""


def describe(exc: BaseException) -> str:
    """A probe or scrape failure in the words an SRE would search for."""
    if isinstance(exc, HttpError):
        return str(exc)
    text = str(exc) or exc.__class__.__name__
    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(cause, ConnectionRefusedError) or (
                isinstance(cause, OSError) and cause.errno == errno.ECONNREFUSED):
            return "connection refused"
        if isinstance(cause, ssl.SSLCertVerificationError):
            return f"TLS certificate not trusted: {cause.verify_message or cause}"
        cause = cause.__cause__ or cause.__context__
    if "Connection refused" in text or "ECONNREFUSED" in text:
        return "connection refused"
    if "CERTIFICATE_VERIFY_FAILED" in text:
        return f"TLS certificate not trusted: {text[:200]}"
    return f"{exc.__class__.__name__}: {text}"[:300]


async def probe_http(target: Target, max_bytes: int = 1024**2,
                     allowed: Networks = ()) -> ProbeResult:
    """One request on a new connection; success when the status is expected (default 200-399)
    within the timeout. The latency runs until the whole answer is read."""
    started = time.perf_counter()
    try:
        async with asyncio.timeout(target.timeout):
            response = await request(target.method, target.url, max_bytes=max_bytes,
                                     verify=target.tls_verify, ca_file=target.ca_file,
                                     allowed=allowed)
    except TimeoutError:
        return ProbeResult(False, time.perf_counter() - started,
                           error=f"timed out after {target.timeout:g}s")
    except (HttpError, OSError, ssl.SSLError) as exc:
        return ProbeResult(False, time.perf_counter() - started, error=describe(exc))
    seconds = time.perf_counter() - started
    code = response.status
    expected = code in target.expect_status if target.expect_status else 200 <= code < 400
    return ProbeResult(expected, seconds, code, "" if expected else f"unexpected status {code}")


async def probe_tcp(target: Target, allowed: Networks = ()) -> ProbeResult:
    """A TCP connect (and close): success when the handshake completes within the timeout."""
    host, _, port = target.url.rpartition(":")
    started = time.perf_counter()
    try:
        async with asyncio.timeout(target.timeout):
            _, writer = await connect(host, int(port), allowed)
    except TimeoutError:
        return ProbeResult(False, time.perf_counter() - started,
                           error=f"timed out after {target.timeout:g}s")
    except (HttpError, OSError) as exc:
        return ProbeResult(False, time.perf_counter() - started, error=describe(exc))
    seconds = time.perf_counter() - started
    writer.close()
    with contextlib.suppress(TimeoutError, OSError):
        await asyncio.wait_for(writer.wait_closed(), 1.0)
    return ProbeResult(True, seconds)
