"""Recognise Kubernetes pod and container cgroups from their paths.

The kubelet lays pods out differently under its two cgroup drivers:
  cgroupfs: /kubepods/burstable/pod<uid>/<container-id>
  systemd:  /kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid_>.slice/
            cri-containerd-<container-id>.scope
Guaranteed pods sit directly under the kubepods root in both. The QoS tier in the path is what
classifies a pod as LS or BE when the Kubernetes API is not configured.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# A pod's uid is a UUID from the apiserver, or, for a static pod (a manifest the kubelet runs
# from a file or URL: etcd and the apiserver on a kubeadm control-plane node), the hex of an
# MD5 the kubelet makes of the manifest, without dashes (applyDefaults, pkg/kubelet/config/
# common.go). Its mirror pod in the API has a uid of its own, and the annotation that would tie
# the two (`kubernetes.io/config.mirror`) may be set by anyone who can create a pod: a forged
# one could label etcd BE. So a static pod is known by its kind (`static`), not its labels,
# and the collector protects it as LS, whatever its QoS tier (a node admin placed it there).
_POD = re.compile(
    r"^(?:kubepods(?:-(?:besteffort|burstable))?-)?pod"
    r"([0-9a-fA-F]{8}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{12}"
    r"|[0-9a-fA-F]{32})"
    r"(?:\.slice)?$"
)
_CONTAINER = re.compile(
    r"^(?:(?:cri-containerd|docker|crio|containerd)-)?([0-9a-f]{64})(?:\.scope)?$"
)
_QOS = {
    "burstable": "burstable",
    "besteffort": "besteffort",
    "kubepods-burstable.slice": "burstable",
    "kubepods-besteffort.slice": "besteffort",
}
_ROOTS = ("kubepods", "kubepods.slice")


@dataclass(frozen=True, slots=True)
class PodCgroup:
    level: str  # root | qos | pod | container
    qos: str  # guaranteed | burstable | besteffort | "" (root)
    pod_uid: str = ""
    container_id: str = ""
    static: bool = False  # a static pod's (its uid: 32 hex digits)


def static_pod_uid(uid: str) -> bool:
    """A static pod's uid (the kubelet's, 32 hex digits), not the apiserver's UUID."""
    return len(uid) == 32


def parse_pod_cgroup(path: str) -> PodCgroup | None:
    """Classify a cgroup path (relative to its hierarchy root); None if it is not a pod's."""
    parts = [p for p in path.split("/") if p]
    try:
        start = next(i for i, part in enumerate(parts) if part in _ROOTS)
    except StopIteration:
        return None
    rest = parts[start + 1:]
    if not rest:
        return PodCgroup("root", "")
    qos = "guaranteed"
    if rest[0] in _QOS:
        qos = _QOS[rest[0]]
        rest = rest[1:]
        if not rest:
            return PodCgroup("qos", qos)
    pod = _POD.match(rest[0])
    if not pod:
        return None
    uid = pod.group(1).replace("_", "-").lower()
    static = static_pod_uid(uid)
    if len(rest) == 1:
        return PodCgroup("pod", qos, uid, static=static)
    container = _CONTAINER.match(rest[1])
    return PodCgroup("container", qos, uid, container.group(1) if container else "",
                     static=static)
