"""What steps are built with: the node, the ledger, and handles to the things they act on.

Handles are factories, not connections: a step that never runs never loads the kubernetes
client, and a node without Kubernetes still runs its local levers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sloguard.actuators.ledger import Ledger

ANNOTATION_PREFIX = "sloguard.io/"


@dataclass
class ActuatorEnv:
    node: str
    ledger: Ledger
    kube: Callable[[], Any] | None = None  # -> kubernetes ApiClient; None: not configured
    kube_error: str = ""  # why `kube` is None when Kubernetes is enabled
    cgroup_root: Path = Path("/sys/fs/cgroup")
    resctrl_root: Path = Path("/sys/fs/resctrl")
    notifier: Any = None  # the alert pipeline, when one is configured
    request_timeout_s: float = 5.0
    # pod uid, resource ("cpu", "memory") -> current usage (cores, bytes), None when unknown:
    # what the evict step ranks by; without it, it ranks by requests and says so
    usage: Callable[[str, str], float | None] | None = None
