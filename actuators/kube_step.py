"""What every step that acts through the Kubernetes API shares: it needs the API configured,
acts on this node only (its client is kubeapi.OwnNodeApi, which refuses any other node), and
builds its client on first use (a node whose policies never reach it never loads the
kubernetes package)."""

from __future__ import annotations

from typing import Any, ClassVar

from sloguard.actuators.env import ActuatorEnv


class KubeStep:
    env: ActuatorEnv
    _core: Any = None
    # talks to the API server: the agent's ladder runs it on its API worker, never on the
    # collection/evaluation thread (actuators/ladder.py)
    remote: ClassVar[bool] = True

    def available(self) -> str | None:
        if self.env.kube is None:
            return self.env.kube_error or "Kubernetes is not configured (kubernetes.enabled)"
        return None

    @property
    def target(self) -> str:
        return f"node/{self.env.node}"

    def _api(self) -> Any:
        if self._core is None:
            from kubernetes import client

            from sloguard.actuators.kubeapi import OwnNodeApi

            self._core = OwnNodeApi(client.CoreV1Api(self.env.kube()), self.env.node)
        return self._core
