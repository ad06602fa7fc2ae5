"""One scrape of one target: fetch its exposition page, bounded in size and time, and read it.

The page is read off the event loop (in a small thread pool): a large page from one target must
not hold up the timers of the others.
"""

from __future__ import annotations

import asyncio
import re
from concurrent.futures import Executor
from http import HTTPStatus

from sloguard.collectors.app_targets import Target
from sloguard.collectors.exposition import ACCEPT, ExpositionError, Reading, ReadSpec, read
from sloguard.collectors.http_client import HttpError, Networks, request


class ScrapeError(Exception):
    """The target answered, but not with a page we can use (status, size, encoding)."""


def status_text(code: int) -> str:
    """`HTTP 503 Service Unavailable`: the standard phrase, never the one the server sent
    (a target's owner chooses that, and error messages quote nothing a target wrote)."""
    try:
        return f"HTTP {code} {HTTPStatus(code).phrase}"
    except ValueError:
        return f"HTTP {code}"


async def fetch(target: Target, max_bytes: int, allowed: Networks = ()) -> tuple[str, str]:
    """The page's text and content type; ScrapeError for a non-200 answer or an oversize page."""
    try:
        response = await request("GET", target.url, headers={"Accept": ACCEPT},
                                 max_bytes=max_bytes, verify=target.tls_verify,
                                 ca_file=target.ca_file, allowed=allowed)
    except HttpError as exc:
        raise ScrapeError(str(exc).replace("the limit", "max_response")) from None
    if response.status != 200:
        raise ScrapeError(status_text(response.status))
    encoding = response.charset()
    try:
        text = response.body.decode(encoding)
    except LookupError:
        raise ScrapeError(f"page declares an unknown charset {encoding[:40]!r}") from None
    except UnicodeDecodeError as exc:
        raise ScrapeError(f"page is not valid {encoding}: byte {exc.start} "
                          f"({exc.reason})") from None
    return text, response.headers.get("content-type", "")


def _read(text: str, content_type: str, spec: ReadSpec) -> Reading:
    try:
        return read(text, content_type, spec)
    except ExpositionError as exc:
        message = str(exc)
        if message.startswith("malformed exposition"):
            # The parsers quote the offending line: say where, not what the page said.
            raise ExpositionError(f"malformed exposition: {_where(text, message)}") from None
        raise


def _where(text: str, message: str) -> str:
    """The number of the line the parser's message quotes (it quotes a line or a part)."""
    fragments = [f for f in re.findall(r"'([^']{2,})'|\"([^\"]{2,})\"", message) for f in f if f]
    fragments = [f.strip() for f in fragments if f.strip()]
    for number, line in enumerate(text.splitlines(), 1):
        if line.strip() and any(f in line or line.strip() in f for f in fragments):
            return f"line {number} does not parse as Prometheus text or OpenMetrics"
    return "the page does not parse as Prometheus text or OpenMetrics"


async def scrape(target: Target, max_bytes: int, pool: Executor,
                 allowed: Networks = ()) -> Reading:
    """Fetch and read, all within the target's timeout (the caller enforces it)."""
    text, content_type = await fetch(target, max_bytes, allowed)
    assert target.read is not None
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(pool, _read, text, content_type, target.read)
