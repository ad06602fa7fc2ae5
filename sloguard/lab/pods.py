"""The lab's LS service and BE antagonists as pods on a real node (`sloguard lab --kube`).

The same scenario then runs twice in one session: as processes in the lab's own cgroups, and
as pods the node's kubelet runs in its kubepods hierarchy, found by the agent the way it finds
any pod (the API and the kubelet's cgroups, not `cgroups.declare`). What differs between the
two is what Kubernetes adds: the kubelet's QoS cgroups (BE pods sit under besteffort, whose
cpu.shares the kubelet holds at 2), the pod network between the client and redis, and the
discovery of each new BE pod.

The node must be this machine (the load generator, the agent and the antagonists' reports are
local): its pods' cgroups must be here. The image must hold redis-server and stress-ng
(deploy/lab/workload.Dockerfile; the node must have it, there is no pull). The LS pod is
Guaranteed and pinned to the scenario's LS CPUs by its container's cpuset, as the kubelet's
static CPU manager would pin it; BE pods are BestEffort, labelled
`koordinator.sh/qosClass: BE`, and write stress-ng's report into the way's folder through a
hostPath.
"""

from __future__ import annotations

import contextlib
import secrets
import time
from pathlib import Path
from typing import Any

from sloguard.core.cgroup_layout import detect_layout
from sloguard.lab.antagonists import EpisodeRun, LabSetupError, bogo_ops
from sloguard.lab.scenario import BeSpec, LsSpec, stress_args

NAMESPACE = "sloguard-lab"
IMAGE = "sloguard-lab/workload:1"
CLASS_LABEL = "koordinator.sh/qosClass"
REDIS_PORT = 6379


class PodPlacement:
    """Creates, watches and removes the lab's pods on `node` through a kubeconfig."""

    def __init__(self, kubeconfig: str, node: str, image: str = IMAGE,
                 namespace: str = NAMESPACE) -> None:
        from kubernetes import client, config

        self.node, self.image, self.namespace = node, image, namespace
        self.api = client.CoreV1Api(config.new_client_from_config(config_file=kubeconfig))
        self._client = client

    def check(self) -> None:
        """The node exists, is Ready, and its pods' cgroups are on this machine."""
        try:
            node = self.api.read_node(self.node)
        except self._client.ApiException as exc:
            raise LabSetupError(f"--kube: node {self.node!r}: {exc.status} {exc.reason}") from None
        if not any(c.type == "Ready" and c.status == "True"
                   for c in node.status.conditions or []):
            raise LabSetupError(f"--kube: node {self.node} is not Ready")
        layout = detect_layout()
        roots = [*layout.v1.values(), *([layout.unified] if layout.unified else [])]
        if not any((root / top).is_dir() for root in roots
                   for top in ("kubepods", "kubepods.slice")):
            raise LabSetupError(f"--kube: no kubepods cgroup on this machine: node {self.node} "
                                "must be this machine (its kubelet's pods are measured here)")
        with contextlib.suppress(self._client.ApiException):
            self.api.create_namespace({"metadata": {"name": self.namespace,
                                                    "labels": {"sloguard.io/lab": "true"}}})

    # ------------------------------------------------------------------------- the pods
    def _pod(self, name: str, qos_class: str, command: list[str], *,
             resources: dict[str, Any] | None = None, out: Path | None = None,
             restart: str = "Never") -> dict[str, Any]:
        container: dict[str, Any] = {"name": "main", "image": self.image,
                                     "imagePullPolicy": "Never", "command": command,
                                     "resources": resources or {}}
        spec: dict[str, Any] = {"nodeName": self.node, "containers": [container],
                                "restartPolicy": restart, "terminationGracePeriodSeconds": 2,
                                "automountServiceAccountToken": False,
                                "enableServiceLinks": False}
        if out is not None:
            container["volumeMounts"] = [{"name": "out", "mountPath": "/out"}]
            spec["volumes"] = [{"name": "out", "hostPath": {"path": str(out),
                                                            "type": "Directory"}}]
        return {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "namespace": self.namespace,
                             "labels": {"app": name.rsplit("-", 1)[0], CLASS_LABEL: qos_class,
                                        "sloguard.io/lab": "true"}},
                "spec": spec}

    def _wait(self, name: str, what: str, done: Any, timeout: float) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            with contextlib.suppress(self._client.ApiException):
                pod = self.api.read_namespaced_pod(name, self.namespace)
                if done(pod):
                    return pod
            if time.monotonic() > deadline:
                raise RuntimeError(f"pod {self.namespace}/{name} not {what} after {timeout:g} s")
            time.sleep(0.2)

    def start_ls(self, ls: LsSpec) -> tuple[str, int, str]:
        """redis as a Guaranteed LS pod; (its pod IP, port, a note of its cpuset)."""
        name = f"redis-{secrets.token_hex(3)}"
        self.api.create_namespaced_pod(self.namespace, self._pod(
            name, "LS", ["redis-server", "--bind", "0.0.0.0", "--port", str(REDIS_PORT),
                         "--protected-mode", "no", "--save", "", "--appendonly", "no"],
            resources={"requests": {"cpu": "1", "memory": "512Mi"},
                       "limits": {"cpu": "1", "memory": "512Mi"}}, restart="Always"))
        pod = self._wait(name, "Running", lambda p: p.status.phase == "Running"
                         and p.status.pod_ip and p.status.container_statuses
                         and p.status.container_statuses[0].ready, timeout=120)
        note = self._pin(pod, ls.cpus) if ls.cpus else "any CPU"
        return pod.status.pod_ip, REDIS_PORT, note

    def _pin(self, pod: Any, cpus: str) -> str:
        """The container's cpuset set to the LS CPUs (the static CPU manager's place); the
        kubelet's `none` policy does not write cpusets after it created the cgroup."""
        container = pod.status.container_statuses[0].container_id.split("://")[-1]
        layout = detect_layout()
        written = []
        for root in ([layout.v1["cpuset"]] if "cpuset" in layout.v1 else []) + (
                [layout.unified] if layout.unified else []):
            for folder in root.glob(f"kubepods*/**/*pod{pod.metadata.uid.replace('-', '?')}*"):
                for target in (folder / container, *folder.glob(f"*{container}*")):
                    cpuset = target / "cpuset.cpus"
                    if cpuset.exists():
                        cpuset.write_text(cpus)
                        written.append(str(target))
                        break
        return f"cpuset {cpus}" if written else "any CPU (no cpuset cgroup for the pod)"

    def antagonist(self, kind: str, duration: float, be: BeSpec, workdir: Path) -> PodAntagonist:
        return PodAntagonist(self, kind, duration, be, workdir)

    def close(self) -> None:
        """Every lab pod goes (grace 0), and the lab waits until the kubelet has stopped them."""
        selector = "sloguard.io/lab=true"
        with contextlib.suppress(self._client.ApiException):
            for pod in self.api.list_namespaced_pod(self.namespace,
                                                    label_selector=selector).items:
                with contextlib.suppress(self._client.ApiException):
                    self.api.delete_namespaced_pod(pod.metadata.name, self.namespace,
                                                   grace_period_seconds=0)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with contextlib.suppress(self._client.ApiException):
                if not self.api.list_namespaced_pod(self.namespace,
                                                    label_selector=selector).items:
                    return
            time.sleep(0.5)


class PodAntagonist:
    """One stress-ng run as a BestEffort BE pod; the same `finish`/`kill` as `Antagonist`.
    Its start is the time its container stamped (the episode's ground truth starts when the
    stressor does, not when the pod was asked for)."""

    def __init__(self, placement: PodPlacement, kind: str, duration: float, be: BeSpec,
                 workdir: Path) -> None:
        self.placement, self.antagonist = placement, kind
        self.name = f"be-{kind}-{secrets.token_hex(3)}"
        self.out = workdir / "stress"
        self.out.mkdir(parents=True, exist_ok=True)
        self.duration = duration
        self.asked_ns = time.time_ns()
        args = " ".join([*stress_args(kind, be), "--timeout", f"{duration:g}s",
                         "--metrics-brief", "--yaml", f"/out/{self.name}.yaml",
                         "--temp-path", "/tmp"])
        placement.api.create_namespaced_pod(placement.namespace, placement._pod(
            self.name, "BE", ["sh", "-c", f"date +%s%N > /out/{self.name}.start; "
                                          f"exec stress-ng {args}"], out=self.out))

    def finish(self, timeout: float = 30.0) -> EpisodeRun:
        placement = self.placement
        try:
            pod = placement._wait(self.name, "finished", lambda p: p.status.phase in (
                "Succeeded", "Failed"), timeout=timeout)
            state = pod.status.container_statuses[0].state.terminated
            code = state.exit_code if state is not None else -1
        except RuntimeError:
            code = -1
        ended = time.time_ns()
        self.kill()
        try:
            started = int((self.out / f"{self.name}.start").read_text().strip())
        except (OSError, ValueError):
            started = self.asked_ns  # it never started: no work, from when it was asked for
        return EpisodeRun(self.antagonist, started, ended,
                          bogo_ops(self.out / f"{self.name}.yaml"), code)

    def kill(self) -> None:
        with contextlib.suppress(self.placement._client.ApiException):
            self.placement.api.delete_namespaced_pod(self.name, self.placement.namespace,
                                                     grace_period_seconds=0)
