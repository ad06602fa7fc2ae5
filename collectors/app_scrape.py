"""One scrape of one target: fetch its exposition page, bounded in size and time, and read it.

The page is read off the event loop (in a small thread pool): a large page from one target must
not hold up the timers of the others.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import Executor

import httpx

from sloguard.collectors.app_targets import Target
from sloguard.collectors.exposition import ACCEPT, Reading, read


class ScrapeError(Exception):
    """The target answered, but not with a page we can use (status, size)."""


async def fetch(client: httpx.AsyncClient, target: Target, max_bytes: int) -> tuple[str, str]:
    """The page's text and content type; ScrapeError for a non-200 answer or an oversize page."""
    async with client.stream("GET", target.url, headers={"Accept": ACCEPT}) as response:
        if response.status_code != 200:
            raise ScrapeError(f"HTTP {response.status_code} {response.reason_phrase}".strip())
        declared = response.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > max_bytes:
            raise ScrapeError(f"page of {int(declared)} bytes exceeds max_response "
                              f"({max_bytes} bytes)")
        chunks, size = [], 0
        async for chunk in response.aiter_bytes():
            size += len(chunk)
            if size > max_bytes:
                raise ScrapeError(f"page exceeds max_response ({max_bytes} bytes)")
            chunks.append(chunk)
        content_type = response.headers.get("content-type", "")
        encoding = response.charset_encoding or "utf-8"
    try:
        text = b"".join(chunks).decode(encoding)
    except (UnicodeDecodeError, LookupError) as exc:
        raise ScrapeError(f"page is not valid {encoding}: {exc}") from None
    return text, content_type


async def scrape(client: httpx.AsyncClient, target: Target, max_bytes: int,
                 pool: Executor) -> Reading:
    """Fetch and read, all within the target's timeout (the caller enforces it)."""
    text, content_type = await fetch(client, target, max_bytes)
    assert target.read is not None
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(pool, read, text, content_type, target.read)
