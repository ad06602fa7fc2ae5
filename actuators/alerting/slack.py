"""Delivery to Slack with slack-sdk: one sender thread per receiver drains its outbox in order.

What each failure means, and so what is done about it:

- 429: Slack refused the request. Wait what Retry-After says (it is honoured exactly, not
  shortened by the backoff), then send the same entry again.
- 5xx, a timeout, a reset connection: Slack may or may not have the message. An incoming
  webhook has no way to ask, so the entry is sent again marked "possibly repeated"; with a bot
  token the sender first looks for the message in the channel (conversations.history, or
  conversations.replies in a thread) by the `post_key` it put in the message's metadata, and
  adopts it when found. A chat.update is idempotent and is simply sent again.
- Connection refused, DNS failure (the request never left): send again, after a backoff.
- A receiver problem (revoked token or webhook, archived channel, bot not in the channel):
  the entry waits, re-tried after a backoff, and /readyz says what is wrong; nothing is dropped.
- A message Slack refuses (invalid blocks, too long): sent again as plain text; if that is
  refused too, recorded as failed and skipped, so one bad message cannot block the channel.

slack-sdk's own retry handlers are off: a blind retry of chat.postMessage after a lost
response is exactly how duplicates happen. Its logger is silenced (at debug level it logs
webhook URLs); secrets are redacted from every error this module records or logs.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from collections.abc import Callable
from typing import Any
from urllib.error import URLError
from urllib.parse import urlsplit

from slack_sdk import WebClient, WebhookClient
from slack_sdk.errors import SlackApiError

from sloguard.actuators.alerting.blocks import mark_possible_repeat, text_only
from sloguard.actuators.alerting.config import SlackConfig
from sloguard.actuators.alerting.outbox import (
    FAILED,
    POST,
    REPLY,
    SENDING,
    UPDATE,
    WEBHOOK,
    Entry,
    Outbox,
)
from sloguard.actuators.alerting.retry import backoff_s
from sloguard.core.config import SecretUnavailable, read_secret, secret_sources

log = logging.getLogger(__name__)

# slack-sdk logs request URLs (webhook URLs are secrets) at debug level and every connection
# error at error level; this module logs what matters, once per change, redacted.
SDK_LOG = logging.getLogger("sloguard.alerting.slack_sdk")
SDK_LOG.setLevel(logging.CRITICAL)
SDK_LOG.propagate = False

METADATA_EVENT = "sloguard_alert"
MESSAGE_ERRORS = frozenset({
    "invalid_payload", "no_text", "invalid_blocks", "invalid_blocks_format", "msg_too_long",
    "too_many_attachments", "invalid_attachments", "invalid_metadata_format",
    "invalid_metadata_schema", "metadata_too_large", "metadata_must_be_sent_from_app",
    "invalid_arguments", "invalid_array_arg", "invalid_json", "json_not_object",
})
GONE_ERRORS = frozenset({"message_not_found", "cant_update_message", "edit_window_closed",
                         "thread_not_found"})
CANNOT_VERIFY = frozenset({"missing_scope", "not_in_channel", "channel_not_found",
                           "not_allowed_token_type", "no_permission"})
RECEIVER_RETRY_S = 60.0
RETRY_AFTER_MAX_S = 3600.0
HISTORY_WINDOW_S = 600.0  # how far before the first attempt to look (clock skew)
HISTORY_PAGES = 10
_CHANNEL_ID = re.compile(r"^[CGD][A-Z0-9]{6,}$")


class _TryLater(Exception):
    def __init__(self, reason: str, delay_s: float | None = None) -> None:
        super().__init__(reason)
        self.delay_s = delay_s


class _CannotVerify(Exception):
    """The channel cannot be searched (scope, membership): a re-send may repeat."""


def _never_sent(exc: BaseException) -> bool:
    """The request did not leave: urllib raises URLError while connecting or sending, and the
    bare socket error (timeout, reset) once it waits for the response."""
    return isinstance(exc, URLError)


def _retry_after(headers: Any) -> float:
    value = None
    for key in ("Retry-After", "retry-after"):
        if headers and key in headers:
            value = headers[key]
            break
    if isinstance(value, list):
        value = value[0] if value else None
    try:
        return min(max(float(value), 0.0), RETRY_AFTER_MAX_S)
    except (TypeError, ValueError):
        return 30.0


class SlackSender:
    """One receiver: its client, its place in the outbox, its health."""

    def __init__(self, name: str, config: SlackConfig, outbox: Outbox,
                 on_result: Callable[[str, str], None] = lambda kind, result: None,
                 backoff_s: tuple[float, float] = (1.0, 300.0)) -> None:
        self.name = name
        self.config = config
        self.outbox = outbox
        self.on_result = on_result
        self.backoff_s = backoff_s
        self.mode = WEBHOOK if secret_sources(config, "webhook_url") else "api"
        self.problem = ""  # what keeps this receiver from delivering, for /readyz
        self.delivered = 0
        self.last_delivery_ns = 0
        self._client: Any = None
        self._secrets: set[str] = set()
        self._next_send = 0.0  # monotonic: the rate limit
        # outbox id -> monotonic time its retry is due: the wall time saved in the outbox is
        # for a restarted agent (bounded then); a wall clock stepped back must not hold it
        self._retry_at: dict[int, float] = {}
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    # -- lifecycle ---------------------------------------------------------------------------

    def watched(self) -> list[tuple[str, Callable[[], threading.Thread | None],
                                    Callable[[], None]]]:
        """Its thread for the agent's supervisor: (name, the thread now, restart)."""
        return [(f"slack-{self.name}", lambda: self._thread, self.start)]

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=f"slack-{self.name}",
                                        daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def wake(self) -> None:
        self._wake.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                wait = self.step()
            except Exception:  # a bug here must not end delivery for good
                log.exception("receiver %s: delivery failed", self.name)
                wait = 5.0
            if wait > 0:
                self._wake.wait(wait)
                self._wake.clear()

    def step(self) -> float:
        """Deliver the receiver's oldest entry if it is due; return how long to wait."""
        entry = self.outbox.head(self.name)
        if entry is None:
            return 2.0
        due = self._retry_at.get(entry.id)
        if due is not None:
            wait = due - time.monotonic()
        else:  # decided before a restart: the wall time left, at most the longest wait
            longest = max(self.backoff_s[1], RECEIVER_RETRY_S, RETRY_AFTER_MAX_S)
            wait = min((entry.not_before_ns - time.time_ns()) / 1e9, longest)
        if wait > 0:
            return min(wait, 2.0)
        self._retry_at.pop(entry.id, None)
        hold = self._next_send - time.monotonic()
        if hold > 0:
            return hold
        self._deliver(entry)
        return 0.0

    # -- one entry ---------------------------------------------------------------------------

    def _deliver(self, entry: Entry) -> None:
        try:
            client = self._get_client()
        except SecretUnavailable as exc:
            self._receiver_problem(entry, str(exc), unknown=entry.state == SENDING)
            return
        if self.mode == WEBHOOK:
            self._webhook(client, entry)
        else:
            self._api(client, entry)

    def _webhook(self, client: WebhookClient, entry: Entry) -> None:
        unknown_before = entry.state == SENDING
        payload = mark_possible_repeat(entry.payload) if unknown_before else entry.payload
        if unknown_before:
            self.on_result(WEBHOOK, "possibly_repeated")
        self.outbox.sending(entry, time.time_ns())
        try:
            response = client.send_dict(payload)
        except Exception as exc:
            self._transient(entry, self._describe(exc), unknown_before or not _never_sent(exc))
            return
        finally:
            self._sent_now()
        status, body = response.status_code, str(response.body or "").strip()
        if status == 200:
            self._delivered(entry)
        elif status == 429:
            self._rate_limited(entry, _retry_after(response.headers), unknown_before)
        elif status >= 500:
            self._transient(entry, f"HTTP {status} {body[:200]}", unknown_before)
        elif body in MESSAGE_ERRORS:
            self._bad_message(entry, f"HTTP {status} {body}")
        else:  # no_service, channel_not_found, action_prohibited, channel_is_archived, ...
            self._client = None  # re-read the secret: it may have been rotated
            self._receiver_problem(entry, f"HTTP {status} {body[:200]}", unknown_before)

    def _api(self, client: WebClient, entry: Entry) -> None:
        unknown_before = entry.state == SENDING
        kind = entry.kind
        thread = self.outbox.thread(self.name, entry.thread)
        if kind == UPDATE and self.outbox.supersede_older_updates(entry, time.time_ns()):
            self.on_result(kind, "superseded")
            return
        if thread is None and kind in (UPDATE, REPLY):
            kind = POST  # the group's message was never posted (refused): this one starts it
        payload = entry.payload
        if kind != UPDATE and unknown_before:
            self.outbox.attempted(entry)
            try:
                found = self._find_prior(client, entry, kind, thread)
            except _TryLater as exc:
                self._transient(entry, f"cannot check for an earlier attempt: {exc}", True,
                                exc.delay_s)
                return
            except _CannotVerify as exc:
                log.warning("receiver %s: cannot check whether Slack got an earlier attempt "
                            "(%s); sending it again, marked as possibly repeated", self.name,
                            exc)
                payload = mark_possible_repeat(payload)
                self.on_result(kind, "possibly_repeated")
                found = None
            if found is not None:
                channel, ts = found
                self.outbox.done(entry, time.time_ns(), channel, ts, new_thread=kind == POST)
                self.on_result(kind, "found_earlier_attempt")
                self._ok()
                return
        self.outbox.sending(entry, time.time_ns())
        try:
            if kind == UPDATE:
                assert thread is not None
                response = client.chat_update(channel=thread[0], ts=thread[1],
                                              text=payload.get("text", ""),
                                              blocks=payload.get("blocks"))
            else:
                response = client.chat_postMessage(
                    channel=thread[0] if thread else str(self.config.channel),
                    text=payload.get("text", ""), blocks=payload.get("blocks"),
                    thread_ts=thread[1] if thread and kind == REPLY else None,
                    reply_broadcast=bool(payload.get("broadcast")) or None,
                    unfurl_links=False, unfurl_media=False,
                    metadata={"event_type": METADATA_EVENT,
                              "event_payload": {"post_key": entry.post_key,
                                                "thread": entry.thread}})
        except SlackApiError as exc:
            self._api_error(entry, kind, exc, unknown_before)
            return
        except Exception as exc:
            unknown = unknown_before or (kind != UPDATE and not _never_sent(exc))
            self._transient(entry, self._describe(exc), unknown)
            return
        finally:
            self._sent_now()
        channel = str(response.get("channel") or (thread[0] if thread else ""))
        self.outbox.done(entry, time.time_ns(), channel, str(response.get("ts") or ""),
                         new_thread=kind == POST)
        self._delivered(entry, record=False)

    def _api_error(self, entry: Entry, kind: str, exc: SlackApiError,
                   unknown_before: bool) -> None:
        response = exc.response
        status = response.status_code
        error = str(response.get("error", "") if isinstance(response.data, dict) else "")
        if status == 429 or error == "ratelimited":
            self._rate_limited(entry, _retry_after(response.headers), unknown_before)
        elif status >= 500 or error in ("internal_error", "fatal_error", "service_unavailable",
                                        "request_timeout") or error.startswith("Received"):
            # Slack's side failed: it may have posted (an update is harmless to send again)
            self._transient(entry, f"HTTP {status} {error[:200]}",
                            unknown_before or kind != UPDATE)
        elif error in GONE_ERRORS and kind in (UPDATE, REPLY):
            # the message was deleted: the next attempt posts the group's message anew
            self.outbox.db.execute("DELETE FROM threads WHERE receiver = ? AND thread = ?",
                                   (self.name, entry.thread))
            self.outbox.retry(entry, time.time_ns(), f"{error}: posting anew", unknown_before)
        elif error in MESSAGE_ERRORS:
            self._bad_message(entry, error)
        else:  # invalid_auth, token_revoked, channel_not_found, not_in_channel, is_archived...
            if error in ("invalid_auth", "token_revoked", "token_expired", "account_inactive"):
                self._client = None  # re-read the secret: it may have been rotated
            self._receiver_problem(entry, f"HTTP {status} {error}", unknown_before)

    def _find_prior(self, client: WebClient, entry: Entry, kind: str,
                    thread: tuple[str, str] | None) -> tuple[str, str] | None:
        """(channel, ts) of a message an earlier attempt of this entry posted, or None."""
        channel = thread[0] if thread else self.outbox.channel_id(self.name)
        configured = str(self.config.channel or "")
        if channel is None and _CHANNEL_ID.match(configured):
            channel = configured
        if channel is None:
            raise _CannotVerify(f"the channel is given by name ({configured}) and no message "
                                "has been sent yet: give its ID")
        oldest = f"{max(0.0, entry.first_attempt_ns / 1e9 - HISTORY_WINDOW_S):.6f}"
        cursor = None
        for _ in range(HISTORY_PAGES):
            try:
                if kind == REPLY and thread is not None:
                    page = client.conversations_replies(
                        channel=channel, ts=thread[1], oldest=oldest, limit=200,
                        include_all_metadata=True, cursor=cursor)
                else:
                    page = client.conversations_history(
                        channel=channel, oldest=oldest, limit=200, include_all_metadata=True,
                        cursor=cursor)
            except SlackApiError as exc:
                error = str(exc.response.get("error", "")
                            if isinstance(exc.response.data, dict) else "")
                if exc.response.status_code == 429:
                    raise _TryLater("rate limited", _retry_after(exc.response.headers)) from None
                if error in CANNOT_VERIFY:
                    raise _CannotVerify(error) from None
                raise _TryLater(f"HTTP {exc.response.status_code} {error[:200]}") from None
            except Exception as exc:
                raise _TryLater(self._describe(exc)) from None
            for message in page.get("messages") or []:
                payload = (message.get("metadata") or {}).get("event_payload") or {}
                if payload.get("post_key") == entry.post_key:
                    return channel, str(message.get("ts"))
            cursor = (page.get("response_metadata") or {}).get("next_cursor")
            if not page.get("has_more") or not cursor:
                return None
        return None

    # -- outcomes ----------------------------------------------------------------------------

    def _delivered(self, entry: Entry, record: bool = True) -> None:
        if record:
            self.outbox.done(entry, time.time_ns())
        self.delivered += 1
        self.last_delivery_ns = time.time_ns()
        self.on_result(entry.kind, "sent")
        self._ok()

    def _ok(self) -> None:
        if self.problem:
            log.info("receiver %s delivers again", self.name)
        self.problem = ""

    def _rate_limited(self, entry: Entry, wait_s: float, unknown: bool) -> None:
        self._retry(entry, wait_s, f"rate limited: Retry-After {wait_s:g}s", unknown)
        self.on_result(entry.kind, "rate_limited")
        log.info("receiver %s: rate limited, waiting %gs as Slack asks", self.name, wait_s)

    def _transient(self, entry: Entry, error: str, unknown: bool,
                   delay_s: float | None = None) -> None:
        delay = delay_s if delay_s is not None else self._backoff(entry.attempts)
        error = self._redact(error)
        self._retry(entry, delay, error, unknown)
        self.on_result(entry.kind, "retry")
        self._set_problem(f"{error} (retrying in {delay:.1f}s)")

    def _receiver_problem(self, entry: Entry, error: str, unknown: bool) -> None:
        error = self._redact(error)
        delay = max(RECEIVER_RETRY_S, self._backoff(entry.attempts))
        delay = min(delay, max(self.backoff_s[1], 1.0))
        self._retry(entry, delay, error, unknown)
        self.on_result(entry.kind, "receiver_error")
        self._set_problem(error)

    def _retry(self, entry: Entry, delay_s: float, error: str, unknown: bool) -> None:
        if len(self._retry_at) > 1000:  # entries gone from the outbox meanwhile
            self._retry_at.clear()
        self._retry_at[entry.id] = time.monotonic() + delay_s
        self.outbox.retry(entry, time.time_ns() + int(delay_s * 1e9), error, unknown)

    def _bad_message(self, entry: Entry, error: str) -> None:
        if entry.payload.get("blocks"):
            fallback = text_only(entry.payload)
            log.warning("receiver %s: Slack refused a message (%s); sending it as plain text",
                        self.name, error)
            self.outbox.db.execute("UPDATE outbox SET payload = ?, state = 'queued' WHERE "
                                   "id = ?", (json.dumps(fallback), entry.id))
            return
        log.error("receiver %s: Slack refused a message (%s); skipped", self.name, error)
        self.outbox.fail(entry, time.time_ns(), error)
        self.on_result(entry.kind, FAILED)

    def _set_problem(self, problem: str) -> None:
        if problem != self.problem:
            log.warning("receiver %s: %s", self.name, problem)
        self.problem = problem

    def _backoff(self, attempts: int) -> float:
        return backoff_s(attempts, *self.backoff_s)

    def _sent_now(self) -> None:
        """The rate limit counts from the end of a request: Slack sees at least that gap."""
        self._next_send = time.monotonic() + self.config.min_interval

    # -- the client and its secret -----------------------------------------------------------

    def _get_client(self) -> Any:
        if self._client is None:
            timeout = self.config.timeout
            if self.mode == WEBHOOK:
                url = read_secret(self.config, "webhook_url") or ""
                self._remember(url)
                self._client = WebhookClient(url, timeout=timeout,  # type: ignore[arg-type]
                                             logger=SDK_LOG, retry_handlers=[])
            else:
                token = read_secret(self.config, "bot_token") or ""
                self._remember(token)
                base = self.config.api_url.rstrip("/") + "/"
                self._client = WebClient(token=token, base_url=base,
                                         timeout=timeout,  # type: ignore[arg-type]
                                         logger=SDK_LOG, retry_handlers=[])
        return self._client

    def _remember(self, secret: str) -> None:
        if secret:
            self._secrets.add(secret)
            path = urlsplit(secret).path
            if len(path) > 8:
                self._secrets.add(path)

    def _redact(self, text: str) -> str:
        for secret in sorted(self._secrets, key=len, reverse=True):
            text = text.replace(secret, "***")
        return text

    def _describe(self, exc: BaseException) -> str:
        reason = exc.reason if isinstance(exc, URLError) else exc
        return self._redact(f"{reason.__class__.__name__}: {reason}"[:300])

    def status(self) -> dict[str, Any]:
        return {"mode": "webhook" if self.mode == WEBHOOK else "web api",
                "channel": self.config.channel or "(the webhook's)",
                "delivered": self.delivered, "problem": self.problem}

