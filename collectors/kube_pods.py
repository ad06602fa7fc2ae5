"""Pod names, namespaces, labels and container names from the Kubernetes API.

Cgroup paths carry only pod UIDs and container IDs; SREs think in pod names. The cache lists the
pods bound to this node in a background thread, so a slow or unreachable API server never stalls
collection: samples then carry what the cgroup path alone tells.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from sloguard.core.health import ComponentStatus
from sloguard.core.pods import PodMeta

log = logging.getLogger(__name__)


def _meta_from_pod(pod: Any) -> PodMeta:
    containers = {}
    status = pod.status
    for cs in [*(status.container_statuses or []), *(status.init_container_statuses or [])]:
        if cs.container_id:
            containers[cs.container_id.split("://", 1)[-1]] = cs.name
    owners = pod.metadata.owner_references or []
    owner = next((o.name for o in owners if o.controller), owners[0].name if owners else "")
    ports = tuple(port.container_port for c in (pod.spec.containers if pod.spec else None) or []
                  for port in c.ports or [] if port.container_port)
    return PodMeta(
        name=pod.metadata.name,
        namespace=pod.metadata.namespace,
        uid=pod.metadata.uid,
        labels=dict(pod.metadata.labels or {}),
        qos_class=status.qos_class or "",
        containers=containers,
        annotations=dict(pod.metadata.annotations or {}),
        ip=status.pod_ip or "",
        phase=status.phase or "",
        owner=owner,
        ports=ports,
    )


class PodMetadataCache:
    """Pods bound to `node_name`, refreshed every `refresh_s` by a daemon thread, and soon
    (within `soon_s`) after a lookup of a pod it does not know: a BE pod that starts between
    two listings is named, and classed by its label, seconds after its cgroup appears, not up
    to `refresh_s` later (seen on a real node: a 15 s antagonist was never named with the
    30 s default). Each unknown uid asks once, and listings stay at least `soon_s` apart, so a
    stream of unknown cgroups costs at most one listing per `soon_s`; after a failed listing
    that gap doubles, up to `refresh_s` (the uids asked for ask again once the API answers:
    an API server that is away is not listed every 2 s by every node)."""

    MAX_ASKED = 10_000  # unknown uids remembered; beyond, forgotten (and may ask again)

    def __init__(self, api_client: Any, node_name: str, refresh_s: float = 30.0,
                 soon_s: float = 2.0) -> None:
        from kubernetes import client  # heavy import: only when Kubernetes is configured

        self._core = client.CoreV1Api(api_client)
        self.node_name = node_name
        self.refresh_s = refresh_s
        self.soon_s = soon_s
        self._pods: dict[str, PodMeta] = {}
        self._error = "not listed yet"
        self._stop = threading.Event()
        self._wanted = threading.Event()
        self._asked: set[str] = set()
        self._failures = 0  # listings failed in a row: the gap before the next asked one
        self._thread: threading.Thread | None = None

    def refresh(self) -> None:
        try:
            pods = self._core.list_pod_for_all_namespaces(
                field_selector=f"spec.nodeName={self.node_name}", _request_timeout=(5, 15)
            )
        except Exception as exc:  # the API being away must never stop collection
            self._error = f"listing pods failed: {exc.__class__.__name__}: {exc}"[:300]
            log.warning("kubernetes: %s", self._error)
            self._asked.clear()  # the pods it was asked for may ask again
            self._failures += 1
            return
        self._pods = {p.metadata.uid: _meta_from_pod(p) for p in pods.items}
        self._error = ""
        self._failures = 0

    def gap(self) -> float:
        """How long after the last listing an asked one may start: `soon_s`, doubled for each
        listing that failed in a row, at most `refresh_s`."""
        return min(max(self.refresh_s, self.soon_s), self.soon_s * 2 ** min(self._failures, 16))

    def start(self) -> None:
        """List pods now and every `refresh_s`, in a daemon thread: a hung API never blocks."""
        self._thread = threading.Thread(target=self._loop, name="pod-metadata", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        self.refresh()
        while not self._stop.is_set():
            last = time.monotonic()
            self._wanted.wait(self.refresh_s)  # the period, or a lookup of an unknown pod
            if self._stop.is_set():
                return
            if self._wanted.is_set() and self._stop.wait(max(0.0, last + self.gap()
                                                             - time.monotonic())):
                return
            self._wanted.clear()
            self.refresh()

    def stop(self) -> None:
        self._stop.set()
        self._wanted.set()

    def get(self, uid: str) -> PodMeta | None:
        meta = self._pods.get(uid)
        if meta is None and uid not in self._asked:
            if len(self._asked) >= self.MAX_ASKED:
                self._asked.clear()
            self._asked.add(uid)
            self._wanted.set()
        return meta

    def pods(self) -> list[PodMeta]:
        """Every pod of the last listing (a snapshot: the refresh thread replaces the dict)."""
        return list(self._pods.values())

    def status(self) -> ComponentStatus:
        return ComponentStatus(
            "kubernetes", ok=not self._error, reason=self._error,
            details={"node": self.node_name, "pods": len(self._pods)},
        )


def load_api_client(kubeconfig: str | None) -> Any:
    """An ApiClient from a kubeconfig file, or the in-cluster service account when None."""
    from kubernetes import client, config

    configuration = client.Configuration()
    if kubeconfig:
        config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
    else:
        config.load_incluster_config(client_configuration=configuration)
    # The refresh loop is the retry: urllib3's own retries would multiply the request timeout.
    configuration.retries = False
    return client.ApiClient(configuration)
