"""What the agent knows of a pod, and whether it is LS or BE.

Both the collectors (which attribute cgroups to pods) and the levers (which must never act on an
LS pod) decide the class the same way, from this one function.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field

# Koordinator's QoS classes (koordinator.sh/qosClass). Anything not BE is protected as LS.
BE_CLASSES = frozenset({"BE"})


@dataclass(frozen=True, slots=True)
class PodMeta:
    name: str
    namespace: str
    uid: str
    labels: dict[str, str] = field(default_factory=dict)
    qos_class: str = ""  # the pod's status.qosClass: Guaranteed | Burstable | BestEffort
    containers: dict[str, str] = field(default_factory=dict)  # container id -> name
    # For scraping annotated pods (collectors/app_targets.py):
    annotations: dict[str, str] = field(default_factory=dict)
    ip: str = ""  # status.podIP
    phase: str = ""  # status.phase
    owner: str = ""  # the controlling owner's name (e.g. the ReplicaSet)
    ports: tuple[int, ...] = ()  # declared container ports, in order


def pod_class(meta: PodMeta | None, qos_from_path: str, class_label: str,
              trusted: Collection[str] | None = None) -> str:
    """LS or BE: the co-location label first, else the Kubernetes QoS tier (BestEffort is BE).

    Whoever may create a pod may label it LS, and an LS pod's suffering is what drives the
    ladder against the BE pods of others. With `trusted` (collectors.cgroups.
    trusted_namespaces), an LS label counts only in those namespaces; elsewhere the QoS tier
    decides, as if there were no label. A BE label is honoured everywhere (claiming less
    protection harms no one else).
    """
    if meta is not None:
        label = meta.labels.get(class_label)
        if label:
            if label.upper() in BE_CLASSES:
                return "BE"
            if trusted is None or meta.namespace in trusted:
                return "LS"
        if meta.qos_class:
            return "BE" if meta.qos_class == "BestEffort" else "LS"
    return "BE" if qos_from_path == "besteffort" else "LS"
