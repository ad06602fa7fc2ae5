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


class NotThisNode(Exception):
    """A step asked to act on another node, or on a pod not bound to this one: refused before
    any request is sent (the ClusterRole would allow it; this agent must not)."""


class OwnNodeApi:
    """The only Kubernetes API the steps get: CoreV1Api narrowed to this agent's node.

    RBAC cannot say "your own node" (a ClusterRole grants every node and every pod), so the
    agent says it in code: a node read or written must be `node`; pods are listed only with
    the `spec.nodeName=<node>` selector; a pod is evicted only if the API, asked just before
    the eviction, says it is bound to `node`; events are only about `node`. Any other method
    of CoreV1Api does not exist here, so a new step cannot reach further by accident.
    deploy/overlays/own-node adds the same binding on the server for node writes.
    """

    def __init__(self, core: Any, node: str) -> None:
        if not node:
            raise NotThisNode("the agent's node_name is empty: no Kubernetes step may act")
        self._core = core
        self.node = node

    def _own(self, name: str, what: str = "node") -> None:
        if name != self.node:
            raise NotThisNode(f"refused: {what} {name!r} is not this agent's node "
                              f"{self.node!r}")

    def read_node(self, name: str, **kwargs: Any) -> Any:
        self._own(name)
        return self._core.read_node(name, **kwargs)

    def patch_node(self, name: str, body: Any, **kwargs: Any) -> Any:
        self._own(name)
        return self._core.patch_node(name, body, **kwargs)

    def patch_node_status(self, name: str, body: Any, **kwargs: Any) -> Any:
        self._own(name)
        return self._core.patch_node_status(name, body, **kwargs)

    def list_pod_for_all_namespaces(self, **kwargs: Any) -> Any:
        selector = kwargs.get("field_selector")
        if selector != f"spec.nodeName={self.node}":
            raise NotThisNode(f"refused: listing pods needs field_selector "
                              f"spec.nodeName={self.node} (got {selector!r})")
        return self._core.list_pod_for_all_namespaces(**kwargs)

    def get_api_resources(self, **kwargs: Any) -> Any:
        return self._core.get_api_resources(**kwargs)

    def create_namespaced_event(self, namespace: str, body: Any, **kwargs: Any) -> Any:
        involved = (body.get("involvedObject") or {}) if isinstance(body, dict) else {}
        if involved.get("kind") != "Node":
            raise NotThisNode("refused: the agent records events about its node only")
        self._own(str(involved.get("name")), "event about node")
        return self._core.create_namespaced_event(namespace, body, **kwargs)

    def find_pod(self, name: str, namespace: str, timeout: Any = None) -> Any | None:
        """The pod as the API says it now (None: no such pod), wherever it is bound: what an
        eviction whose outcome is unknown is looked up by. A list with a name selector, not a
        get: the agent's RBAC lists pods and gets none."""
        found = self._core.list_namespaced_pod(
            namespace, field_selector=f"metadata.name={name}", _request_timeout=timeout).items
        return found[0] if found else None

    def bound_node(self, name: str, namespace: str, timeout: Any = None) -> str | None:
        """The pod's spec.nodeName as the API says it now (None: no such pod)."""
        pod = self.find_pod(name, namespace, timeout)
        if pod is None:
            return None
        return pod.spec.node_name if pod.spec else ""

    def create_namespaced_pod_eviction(self, name: str, namespace: str, body: Any,
                                       **kwargs: Any) -> Any:
        bound = self.bound_node(name, namespace, kwargs.get("_request_timeout"))
        if bound is not None and bound != self.node:
            raise NotThisNode(f"refused: pod {namespace}/{name} is bound to node "
                              f"{bound or '(none)'!r}, not this agent's node {self.node!r}")
        # A pod gone since (None) is left to the eviction's own 404.
        return self._core.create_namespaced_pod_eviction(name, namespace, body, **kwargs)

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(f"{name}: not an API call the agent's steps may make "
                             "(actuators/kubeapi.py OwnNodeApi)")
