"""One scrape of one target: fetch its exposition page, bounded in size and time, and read it.

The page is read off the event loop (in a small thread pool): a large page from one target must
not hold up the timers of the others.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import Executor

from sloguard.collectors.app_targets import Target
from sloguard.collectors.exposition import ACCEPT, Reading, read
from sloguard.collectors.http_client import HttpError, request


class ScrapeError(Exception):
    """The target answered, but not with a page we can use (status, size, encoding)."""


async def fetch(target: Target, max_bytes: int) -> tuple[str, str]:
    """The page's text and content type; ScrapeError for a non-200 answer or an oversize page."""
    try:
        response = await request("GET", target.url, headers={"Accept": ACCEPT},
                                 max_bytes=max_bytes, verify=target.tls_verify,
                                 ca_file=target.ca_file)
    except HttpError as exc:
        raise ScrapeError(str(exc).replace("the limit", "max_response")) from None
    if response.status != 200:
        raise ScrapeError(f"HTTP {response.status} {response.reason}".strip())
    encoding = response.charset()
    try:
        text = response.body.decode(encoding)
    except (UnicodeDecodeError, LookupError) as exc:
        raise ScrapeError(f"page is not valid {encoding}: {exc}") from None
    return text, response.headers.get("content-type", "")


async def scrape(target: Target, max_bytes: int, pool: Executor) -> Reading:
    """Fetch and read, all within the target's timeout (the caller enforces it)."""
    text, content_type = await fetch(target, max_bytes)
    assert target.read is not None
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(pool, read, text, content_type, target.read)
