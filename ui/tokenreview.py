"""Node identity from Kubernetes (`server.node_auth: tokenreview`): the agent's pod-bound
service-account token says which node is posting, with no token of sloguard's to provision.

The agent presents a projected service-account token (issued for the audience in
`server.tokenreview_audiences`, so that the server, which sees it, cannot replay it against
the apiserver as the agent; the kubelet rotates it and the forwarder re-reads `token_file` on
every request). The server asks the apiserver:

1. TokenReview (`tokenreviews: create`): is the token valid, for our audience, and whose? It
   must be a service account of `server.tokenreview_service_accounts` (namespace:name: the
   agent's, not any pod's of the cluster) and bound to a pod: the answer's `extra` carries
   `authentication.kubernetes.io/pod-name` and `pod-uid` (v1.20 gives no node name there).
2. The pod (`pods: get`): it must still be the pod the token was bound to (its uid) and be
   scheduled; its `spec.nodeName` is the node the token may post as.

A positive answer is cached by the token's SHA-256 for `server.tokenreview_cache` (bounded to
MAX_CACHED tokens, the stalest dropped): the forwarder posts every few seconds and should not
cost the apiserver two requests each time. The price: a token whose pod was deleted is still
accepted for at most that long. Negative answers are not cached; wrong tokens count against
the client address (ui/auth.py's limiter), which bounds how many reviews a client can cause.
When the apiserver cannot answer, the request gets 503 (the forwarder keeps its batch and
retries), never a 401 that would be taken for a bad token, and never a pass.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections import OrderedDict
from typing import Any

from sloguard.core.health import ComponentStatus

log = logging.getLogger(__name__)

MAX_CACHED = 10_000
MAX_TOKEN_CHARS = 16_384  # a service-account JWT is 1-2 kB
REQUEST_TIMEOUT_S = 5.0
POD_NAME = "authentication.kubernetes.io/pod-name"
POD_UID = "authentication.kubernetes.io/pod-uid"
SA_PREFIX = "system:serviceaccount:"


class ReviewUnavailable(Exception):
    """The apiserver did not answer the review (the message says what it said instead)."""


class TokenReviewer:
    """Which node a pod-bound service-account token's pod runs on, asked of the apiserver."""

    def __init__(self, api_client: Any, audiences: list[str], service_accounts: list[str],
                 cache_s: float, max_cached: int = MAX_CACHED) -> None:
        from kubernetes import client

        self.authn = client.AuthenticationV1Api(api_client)
        self.core = client.CoreV1Api(api_client)
        self.audiences = list(audiences)
        self.accounts = frozenset(service_accounts)
        self.cache_s = cache_s
        self.max_cached = max_cached
        self._cache: OrderedDict[bytes, tuple[str, float]] = OrderedDict()
        self._lock = threading.Lock()
        self.reviews = 0  # TokenReviews asked
        self.last_error = ""  # the apiserver's last failure to answer; "" once it answers

    def node_of(self, token: str) -> str | None:
        """The node the token's pod runs on; None when the token is not an agent's valid
        pod-bound token; ReviewUnavailable when the apiserver cannot say. Blocking: call it
        from a worker thread."""
        if not token or len(token) > MAX_TOKEN_CHARS:
            return None
        key = hashlib.sha256(token.encode("utf-8", "surrogateescape")).digest()
        now = time.monotonic()
        with self._lock:
            cached = self._cache.get(key)
            if cached is not None:
                if cached[1] > now:
                    return cached[0]
                del self._cache[key]
        node = self._review(token)
        if node is not None and self.cache_s > 0:
            with self._lock:
                self._cache[key] = (node, now + self.cache_s)
                self._cache.move_to_end(key)
                while len(self._cache) > self.max_cached:
                    self._cache.popitem(last=False)
        return node

    def _review(self, token: str) -> str | None:
        from kubernetes.client.exceptions import ApiException

        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
                "spec": {"token": token, "audiences": self.audiences}}
        self.reviews += 1
        try:
            review = self.authn.create_token_review(body, _request_timeout=REQUEST_TIMEOUT_S)
        except ApiException as exc:
            raise self._unavailable("TokenReview", exc, "tokenreviews: create") from None
        except Exception as exc:  # urllib3's connection errors and timeouts
            raise self._unavailable("TokenReview", exc, "") from None
        self.last_error = ""
        status = review.status
        if status is None or not status.authenticated or status.user is None:
            return None
        if self.audiences and not set(status.audiences or []) & set(self.audiences):
            return None  # an apiserver that ignored the audiences asked for
        user = status.user.username or ""
        account = user[len(SA_PREFIX):] if user.startswith(SA_PREFIX) else ""
        if account not in self.accounts:
            log.warning("ingest: a token of %s, not of a service account in "
                        "server.tokenreview_service_accounts, refused", user[:300])
            return None
        extra = status.user.extra or {}
        pod_names, pod_uids = extra.get(POD_NAME) or [], extra.get(POD_UID) or []
        if len(pod_names) != 1 or len(pod_uids) != 1:
            log.warning("ingest: a token of %s that is not bound to a pod (a legacy Secret "
                        "token?) refused: give the agent a projected token", user[:300])
            return None
        namespace = account.partition(":")[0]
        try:
            pod = self.core.read_namespaced_pod(pod_names[0], namespace,
                                                _request_timeout=REQUEST_TIMEOUT_S)
        except ApiException as exc:
            if exc.status == 404:
                return None  # the pod is gone: its token is no node's any more
            raise self._unavailable("pod", exc, "pods: get") from None
        except Exception as exc:
            raise self._unavailable("pod", exc, "") from None
        if pod.metadata is None or pod.metadata.uid != pod_uids[0]:
            return None  # a pod of that name, not the one the token was bound to
        return (pod.spec.node_name if pod.spec is not None else None) or None

    def _unavailable(self, what: str, exc: Exception, grant: str) -> ReviewUnavailable:
        status = getattr(exc, "status", None)
        if status is not None:
            reason = f"HTTP {status} {getattr(exc, 'reason', '')}".strip()
            if status in (401, 403) and grant:
                reason += f" (the server's service account needs `{grant}`: deploy/server)"
        else:
            reason = f"{type(exc).__name__}: {str(exc)[:300]}"
        self.last_error = f"{what}: {reason}"
        log.error("ingest: cannot check a token with the Kubernetes API: %s", self.last_error)
        return ReviewUnavailable(self.last_error)

    def status(self) -> ComponentStatus:
        with self._lock:
            cached = len(self._cache)
        return ComponentStatus("tokenreview", ok=not self.last_error, reason=self.last_error,
                               details={"reviews": self.reviews, "cached": cached,
                                        "audiences": self.audiences,
                                        "service_accounts": sorted(self.accounts)})
