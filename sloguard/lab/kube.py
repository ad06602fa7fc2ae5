"""The lab's Node object, when the lab is given an API server (the test setup's, or a cluster's
that an operator points it at on purpose): what cordon and reduce_capacity act on.

The node is registered as a co-location node advertises itself (Koordinator's batch resources
in status), and removed after the way only if the lab created it.
"""

from __future__ import annotations

import contextlib
from typing import Any

NODE_STATUS = {
    "capacity": {"cpu": "2", "memory": "24Gi", "pods": "110",
                 "kubernetes.io/batch-cpu": "2k", "kubernetes.io/batch-memory": "8Gi"},
    "allocatable": {"cpu": "2", "memory": "24Gi", "pods": "110",
                    "kubernetes.io/batch-cpu": "2k", "kubernetes.io/batch-memory": "8Gi"},
}


class LabNode:
    def __init__(self, kubeconfig: str, name: str) -> None:
        from kubernetes import client, config

        self.name = name
        self.api = client.CoreV1Api(config.new_client_from_config(config_file=kubeconfig))
        self.created = False
        try:
            self.api.read_node(name)
        except client.ApiException as exc:
            if exc.status != 404:
                raise
            self.api.create_node({"metadata": {"name": name,
                                               "labels": {"sloguard.io/lab": "true"}}})
            self.created = True
        if self.created:
            self.api.patch_node_status(name, {"status": NODE_STATUS})

    def state(self) -> dict[str, Any]:
        node = self.api.read_node(self.name)
        return {"unschedulable": bool(node.spec.unschedulable),
                "batch_cpu": (node.status.allocatable or {}).get("kubernetes.io/batch-cpu")}

    def remove(self) -> None:
        if self.created:
            with contextlib.suppress(Exception):
                self.api.delete_node(self.name)
