"""What the Kubernetes steps share: telling a transient API failure from a real refusal, and
recording each action as an Event on the node.

Transient means "the API server could not be asked" (refused connection, timeout, 5xx): the
step returns FAILED with `retry=True` and the ladder retries with backoff. A refusal (403, 400,
422) will not change by itself, so retrying it would only repeat the same audit line.

Events are what SREs look at first (`kubectl describe node` lists them), so every action the
agent really takes on a node leaves one there. They are a courtesy: an Event that cannot be
written is logged and never fails the step that already acted.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import logging
from typing import Any

log = logging.getLogger(__name__)

# Node events live in `default` (where the kubelet puts them) with the node's name as the
# involved object's uid: that is what `kubectl describe node` searches for.
EVENT_NAMESPACE = "default"
COMPONENT = "sloguard"


def api_status(exc: BaseException) -> int | None:
    """The HTTP status of an ApiException; None for anything else."""
    status = getattr(exc, "status", None)
    return status if isinstance(status, int) and status > 0 else None


def transient(exc: BaseException) -> bool:
    """True when asking again later may succeed: the server was unreachable or failed."""
    status = api_status(exc)
    if status is not None:
        return status >= 500
    try:
        import urllib3.exceptions

        if isinstance(exc, urllib3.exceptions.HTTPError):
            return True
    except ImportError:  # pragma: no cover - urllib3 comes with the kubernetes client
        pass
    return isinstance(exc, OSError | TimeoutError)


def describe(exc: BaseException) -> str:
    """One line for the audit log: the server's message, not the client's multi-line dump."""
    status = api_status(exc)
    if status is not None:
        message = ""
        with contextlib.suppress(ValueError, AttributeError, TypeError):
            message = json.loads(getattr(exc, "body", "") or "{}").get("message", "")
        return f"HTTP {status}: {message or getattr(exc, 'reason', '')}"[:300]
    reason = getattr(exc, "reason", None)  # urllib3's MaxRetryError wraps the real cause
    text = f"{exc.__class__.__name__}: {reason or exc}"
    return f"API server unreachable: {text}"[:300]


def emit_node_event(core: Any, node: str, reason: str, message: str, timeout_s: float,
                    warning: bool = False) -> None:
    """Leave an Event on the node; a failure is logged, never raised."""
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    body = {
        "metadata": {"generateName": f"{node}.{COMPONENT}-", "namespace": EVENT_NAMESPACE},
        "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": node, "uid": node},
        "reason": reason,
        "message": message[:1024],
        "type": "Warning" if warning else "Normal",
        "source": {"component": COMPONENT, "host": node},
        "reportingComponent": COMPONENT,
        "reportingInstance": node,
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }
    try:
        core.create_namespaced_event(EVENT_NAMESPACE, body, _request_timeout=timeout_s)
    except Exception as exc:
        log.warning("node %s: event %s not recorded: %s", node, reason, describe(exc))
