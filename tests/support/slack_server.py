"""A local HTTP server that implements the parts of Slack's documented contract sloguard uses.

- Incoming webhooks (POST /services/T/B/X): `200 ok`; `400 invalid_payload` (not JSON),
  `400 no_text` (no text, blocks or attachments), `400 invalid_blocks`, `400
  invalid_attachments`, `404 no_service` (unknown or revoked URL), `410 channel_is_archived`.
  A message may be legacy attachments only (what Alertmanager's slack_configs posts: each
  attachment's title, text, fallback, color and fields).
- Web API (POST/GET /api/METHOD, bearer token): chat.postMessage (channel by ID or #name, text
  or blocks, thread_ts, reply_broadcast, metadata), chat.update, conversations.history and
  conversations.replies (oldest, limit, cursor, include_all_metadata), auth.test; errors as
  Slack sends them: HTTP 200 with {"ok": false, "error": ...}; 429 with Retry-After.
- Faults, programmable per endpoint: a status (500, 503, 429 with Retry-After), a delay before
  the response (after the request was processed, as a slow Slack that did post), a hold (the
  request is processed and the response waits until released: a client killed meanwhile saw
  no answer although the message exists).

Every request is recorded with the time it arrived, so tests assert what Slack saw and when.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

BLOCK_TYPES = {"section", "header", "divider", "context", "actions", "image", "rich_text",
               "input", "file", "video", "markdown"}


@dataclass
class Fault:
    endpoint: str  # "chat.postMessage", "webhook", ...
    status: int = 500
    retry_after: float | None = None
    error: str = ""
    count: int = 1
    delay: float = 0.0  # respond normally, but only after this long (the message is posted)
    hold: bool = False  # process, then keep the response until `release()`


@dataclass
class Message:
    channel: str
    ts: str
    text: str
    blocks: list[dict[str, Any]] | None
    thread_ts: str | None = None
    reply_broadcast: bool = False
    metadata: dict[str, Any] | None = None
    updates: list[dict[str, Any]] = field(default_factory=list)  # every chat.update, in order


@dataclass
class Request:
    endpoint: str
    params: dict[str, Any]
    at: float  # time.monotonic() on arrival
    status: int = 0


class SlackServer:
    def __init__(self, token: str = "xoxb-test-token") -> None:
        self.token = token
        self.channels: dict[str, str] = {}  # id -> name
        self.archived: set[str] = set()
        self.webhooks: dict[str, str] = {}  # path -> channel id
        self.messages: list[Message] = []
        self.webhook_messages: list[dict[str, Any]] = []
        self.requests: list[Request] = []
        self.faults: list[Fault] = []
        self.lock = threading.Lock()
        self.released = threading.Event()
        self.held = threading.Event()  # set once a held request has been processed
        self._seq = 0
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                server._handle(self)

            def do_POST(self) -> None:
                server._handle(self)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    # -- setup -------------------------------------------------------------------------------

    def __enter__(self) -> SlackServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.released.set()
        self.httpd.shutdown()
        self.httpd.server_close()

    def add_channel(self, channel_id: str, name: str) -> str:
        self.channels[channel_id] = name
        return channel_id

    def add_webhook(self, channel_id: str, path: str = "/services/T000/B000/XXXXSECRETXXXX") -> str:
        self.webhooks[path] = channel_id
        return self.url + path

    @property
    def api_url(self) -> str:
        return self.url + "/api/"

    def fault(self, endpoint: str, **kwargs: Any) -> Fault:
        fault = Fault(endpoint, **kwargs)
        with self.lock:
            self.faults.append(fault)
        return fault

    def release(self) -> None:
        self.released.set()

    # -- what Slack saw ----------------------------------------------------------------------

    def top_level(self, channel: str | None = None) -> list[Message]:
        return [m for m in self.messages if not m.thread_ts and (channel is None or
                                                                  m.channel == channel)]

    def replies(self, ts: str) -> list[Message]:
        return [m for m in self.messages if m.thread_ts == ts]

    def calls(self, endpoint: str) -> list[Request]:
        return [r for r in self.requests if r.endpoint == endpoint]

    def wait_for(self, check: Any, timeout: float = 20.0, what: str = "") -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            result = check()
            if result:
                return result
            time.sleep(0.05)
        raise AssertionError(f"timed out waiting for {what or check}; requests: "
                             f"{[(r.endpoint, r.status) for r in self.requests]}")

    # -- the contract ------------------------------------------------------------------------

    def _handle(self, handler: BaseHTTPRequestHandler) -> None:
        parts = urlsplit(handler.path)
        length = int(handler.headers.get("Content-Length") or 0)
        raw = handler.rfile.read(length) if length else b""
        endpoint = parts.path[len("/api/"):] if parts.path.startswith("/api/") else "webhook"
        params: dict[str, Any] = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        content_type = handler.headers.get("Content-Type", "")
        body_error = ""
        if raw:
            if "json" in content_type or endpoint == "webhook":
                try:
                    body = json.loads(raw)
                    if not isinstance(body, dict):
                        raise ValueError("not an object")
                    params.update(body)
                except ValueError:
                    body_error = "invalid_payload" if endpoint == "webhook" else "invalid_json"
            else:
                params.update({k: v[-1] for k, v in parse_qs(raw.decode()).items()})
        request = Request(endpoint, params, time.monotonic())
        with self.lock:
            self.requests.append(request)
            fault = next((f for f in self.faults if f.endpoint == endpoint and f.count > 0), None)
            if fault is not None:
                fault.count -= 1
        if fault is not None and not fault.delay and not fault.hold:
            headers = {}
            if fault.retry_after is not None:
                headers["Retry-After"] = f"{fault.retry_after:g}"
            if endpoint == "webhook":
                body_text = fault.error or ("rate_limited" if fault.status == 429 else
                                            "rollup_error")
                return self._reply(handler, request, fault.status, body_text, "text/plain",
                                   headers)
            error = fault.error or ("ratelimited" if fault.status == 429 else "")
            if fault.status >= 500 and not fault.error:
                return self._reply(handler, request, fault.status,
                                   "<html>upstream error</html>", "text/html", headers)
            return self._reply(handler, request, fault.status,
                               json.dumps({"ok": False, "error": error}),
                               "application/json", headers)
        if endpoint == "webhook":
            status, text = self._webhook(parts.path, params, body_error)
            reply: tuple[int, str, str] = (status, text, "text/html")
        else:
            result = self._api(endpoint, params, handler.headers.get("Authorization", ""),
                               body_error)
            reply = (200, json.dumps(result), "application/json")
        if fault is not None and fault.hold:
            self.held.set()
            self.released.wait(60)
        elif fault is not None and fault.delay:
            time.sleep(fault.delay)
        self._reply(handler, request, *reply)

    def _reply(self, handler: BaseHTTPRequestHandler, request: Request, status: int,
               body: str, content_type: str, headers: dict[str, str] | None = None) -> None:
        request.status = status
        data = body.encode()
        try:
            handler.send_response(status)
            handler.send_header("Content-Type", content_type)
            handler.send_header("Content-Length", str(len(data)))
            for key, value in (headers or {}).items():
                handler.send_header(key, value)
            handler.end_headers()
            handler.wfile.write(data)
        except OSError:
            pass  # the client is gone (killed, or gave up waiting)

    def _webhook(self, path: str, body: dict[str, Any], body_error: str) -> tuple[int, str]:
        channel = self.webhooks.get(path)
        if channel is None:
            return 404, "no_service"
        if body_error:
            return 400, body_error
        if channel in self.archived:
            return 410, "channel_is_archived"
        if not body.get("text") and not body.get("blocks") and not body.get("attachments"):
            return 400, "no_text"
        if not _valid_blocks(body.get("blocks")):
            return 400, "invalid_blocks"
        if not _valid_attachments(body.get("attachments")):
            return 400, "invalid_attachments"
        with self.lock:
            self.webhook_messages.append(body)
            self.messages.append(Message(channel, self._ts(), body.get("text", ""),
                                         body.get("blocks")))
        return 200, "ok"

    def _api(self, method: str, p: dict[str, Any], auth: str, body_error: str) -> dict[str, Any]:
        token = auth.removeprefix("Bearer ").strip() or p.get("token", "")
        if not token:
            return {"ok": False, "error": "not_authed"}
        if token != self.token:
            return {"ok": False, "error": "invalid_auth"}
        if body_error:
            return {"ok": False, "error": body_error}
        if method == "auth.test":
            return {"ok": True, "user_id": "U0BOT", "team": "test"}
        if method not in ("chat.postMessage", "chat.update", "conversations.history",
                          "conversations.replies"):
            return {"ok": False, "error": "unknown_method"}
        channel = self._channel(str(p.get("channel", "")), by_name=method.startswith("chat."))
        if channel is None:
            return {"ok": False, "error": "channel_not_found"}
        if method == "chat.postMessage":
            return self._post(channel, p)
        if method == "chat.update":
            return self._update(channel, p)
        return self._read(method, channel, p)

    def _channel(self, given: str, by_name: bool) -> str | None:
        if given in self.channels:
            return given
        if by_name:
            name = given.removeprefix("#")
            return next((cid for cid, n in self.channels.items() if n == name), None)
        return None  # conversations.* take IDs only, as Slack's do

    def _post(self, channel: str, p: dict[str, Any]) -> dict[str, Any]:
        if channel in self.archived:
            return {"ok": False, "error": "is_archived"}
        if not p.get("text") and not p.get("blocks"):
            return {"ok": False, "error": "no_text"}
        blocks = _blocks(p.get("blocks"))
        if blocks is False or not _valid_blocks(blocks):
            return {"ok": False, "error": "invalid_blocks"}
        thread_ts = p.get("thread_ts") or None
        with self.lock:
            if thread_ts and not any(m.ts == thread_ts and m.channel == channel
                                     for m in self.messages):
                return {"ok": False, "error": "thread_not_found"}
            metadata = p.get("metadata")
            if isinstance(metadata, str):
                metadata = json.loads(metadata)
            message = Message(channel, self._ts(), p.get("text", ""), blocks or None, thread_ts,
                              str(p.get("reply_broadcast")).lower() in ("true", "1"),
                              metadata if isinstance(metadata, dict) else None)
            self.messages.append(message)
        return {"ok": True, "channel": channel, "ts": message.ts,
                "message": {"type": "message", "text": message.text, "ts": message.ts}}

    def _update(self, channel: str, p: dict[str, Any]) -> dict[str, Any]:
        blocks = _blocks(p.get("blocks"))
        if blocks is False or not _valid_blocks(blocks):
            return {"ok": False, "error": "invalid_blocks"}
        with self.lock:
            message = next((m for m in self.messages if m.ts == p.get("ts") and
                            m.channel == channel), None)
            if message is None:
                return {"ok": False, "error": "message_not_found"}
            if not p.get("text") and not blocks:
                return {"ok": False, "error": "no_text"}
            message.updates.append({"text": p.get("text", ""), "blocks": blocks})
            message.text, message.blocks = p.get("text", message.text), blocks or message.blocks
        return {"ok": True, "channel": channel, "ts": message.ts, "text": message.text}

    def _read(self, method: str, channel: str, p: dict[str, Any]) -> dict[str, Any]:
        oldest = float(p.get("oldest") or 0)
        limit = int(p.get("limit") or 100)
        start = int(p.get("cursor") or 0)
        with_meta = str(p.get("include_all_metadata")).lower() in ("1", "true")
        with self.lock:
            if method == "conversations.history":
                found = [m for m in self.messages if m.channel == channel and
                         (not m.thread_ts or m.reply_broadcast)]
                found.sort(key=lambda m: float(m.ts), reverse=True)  # newest first
            else:
                ts = p.get("ts")
                parent = [m for m in self.messages if m.channel == channel and m.ts == ts]
                if not parent:
                    return {"ok": False, "error": "thread_not_found"}
                found = parent + sorted((m for m in self.messages if m.thread_ts == ts),
                                        key=lambda m: float(m.ts))
            found = [m for m in found if float(m.ts) >= oldest]
        page = found[start:start + limit]
        more = start + limit < len(found)
        out = []
        for m in page:
            item: dict[str, Any] = {"type": "message", "ts": m.ts, "text": m.text}
            if m.thread_ts:
                item["thread_ts"] = m.thread_ts
            if with_meta and m.metadata:
                item["metadata"] = m.metadata
            out.append(item)
        return {"ok": True, "messages": out, "has_more": more,
                "response_metadata": {"next_cursor": str(start + limit) if more else ""}}

    def _ts(self) -> str:
        self._seq += 1
        return f"{int(time.time())}.{self._seq:06d}"


def _blocks(value: Any) -> list[dict[str, Any]] | bool | None:
    if value is None or value == "":
        return None
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return False
    return value if isinstance(value, list) else False


def _valid_attachments(attachments: Any) -> bool:
    if attachments is None:
        return True
    if not isinstance(attachments, list) or len(attachments) > 100:
        return False
    return all(isinstance(a, dict) and (a.get("text") or a.get("fallback") or a.get("title")
                                        or a.get("fields") or a.get("blocks"))
               for a in attachments)


def _valid_blocks(blocks: Any) -> bool:
    if blocks is None:
        return True
    if not isinstance(blocks, list) or len(blocks) > 50:
        return False
    return all(isinstance(b, dict) and b.get("type") in BLOCK_TYPES for b in blocks)
