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
# The QoS cgroups' files a lever may write (v1 and v2 names): what `restore` puts back.
LEVER_FILES = ("cpu.idle", "cpu.shares", "cpu.weight", "cpu.cfs_quota_us", "cpu.max",
               "cpuset.cpus", "memory.high", "memory.limit_in_bytes", "memory.max")
REDIS_PORT = 6379


class PodPlacement:
    """Creates, watches and removes the lab's pods on `node` through a kubeconfig."""

    def __init__(self, kubeconfig: str, node: str, image: str = IMAGE,
                 namespace: str = NAMESPACE) -> None:
        from kubernetes import client, config

        self.node, self.image, self.namespace = node, image, namespace
        self.api = client.CoreV1Api(config.new_client_from_config(config_file=kubeconfig))
        self._client = client
        self.run = secrets.token_hex(4)  # this session's pods, and no other lab's
        self._files: dict[Path, str] = {}
        self._node_state: dict[str, Any] | None = None

    def check(self) -> None:
        """The node exists, is Ready and is this machine, runs no other sloguard agent, no BE
        pod but the lab's and no other lab; the lab's namespace and its service account exist.
        The lab's agent acts for real on every BE pod of the node and on the node itself."""
        try:
            node = self.api.read_node(self.node)
        except self._client.ApiException as exc:
            raise LabSetupError(f"--kube: node {self.node!r}: {exc.status} {exc.reason}") from None
        if not any(c.type == "Ready" and c.status == "True"
                   for c in node.status.conditions or []):
            raise LabSetupError(f"--kube: node {self.node} is not Ready")
        machine = Path("/etc/machine-id")
        node_machine = (node.status.node_info.machine_id or "") if node.status.node_info else ""
        if machine.exists() and node_machine and \
                machine.read_text().strip() != node_machine.strip():
            raise LabSetupError(f"--kube: node {self.node} is another machine (its machine-id "
                                "is not this one's): the lab measures its pods here")
        layout = detect_layout()
        roots = [*layout.v1.values(), *([layout.unified] if layout.unified else [])]
        if not any((root / top).is_dir() for root in roots
                   for top in ("kubepods", "kubepods.slice")):
            raise LabSetupError(f"--kube: no kubepods cgroup on this machine: node {self.node} "
                                "must be this machine (its kubelet's pods are measured here)")
        in_the_way = []
        for pod in self.api.list_pod_for_all_namespaces(
                field_selector=f"spec.nodeName={self.node}").items:
            if pod.status.phase in ("Succeeded", "Failed"):
                continue
            labels = pod.metadata.labels or {}
            ref = f"{pod.metadata.namespace}/{pod.metadata.name}"
            if labels.get("app.kubernetes.io/name") == "sloguard":
                in_the_way.append(f"{ref} (a sloguard agent: two would both act)")
            elif labels.get("sloguard.io/lab") == "true":
                in_the_way.append(f"{ref} (another lab's, or a killed one's)")
            elif labels.get(CLASS_LABEL, "").upper() == "BE" or \
                    pod.status.qos_class == "BestEffort":
                in_the_way.append(f"{ref} (BE: the lab's levers and evictions would hit it)")
        if in_the_way:
            raise LabSetupError(f"--kube: node {self.node} must be the lab's alone; on it: "
                                + ", ".join(in_the_way[:10]))
        with contextlib.suppress(self._client.ApiException):  # 409: it exists
            self.api.create_namespace({"metadata": {"name": self.namespace,
                                                    "labels": {"sloguard.io/lab": "true"}}})
        deadline = time.monotonic() + 60
        while True:  # pods are refused until the namespace's `default` account exists
            try:
                self.api.read_namespaced_service_account("default", self.namespace)
                return
            except self._client.ApiException as exc:
                if exc.status != 404 or time.monotonic() > deadline:
                    raise LabSetupError(f"--kube: namespace {self.namespace}: no service "
                                        f"account `default` ({exc.status})") from None
            time.sleep(0.2)

    # ------------------------------------------------------------ what must come back
    def snapshot(self) -> None:
        """What the levers may change that outlives the way: the files of the kubelet's QoS
        cgroups, the node's schedulability, taints and batch resources. `restore` puts back
        whatever the agent did not (a way that failed, an agent that was killed)."""
        layout = detect_layout()
        roots = [*layout.v1.values(), *([layout.unified] if layout.unified else [])]
        self._files = {}
        for root in dict.fromkeys(roots):
            for qos in ("kubepods/besteffort", "kubepods/burstable",
                        "kubepods.slice/kubepods-besteffort.slice",
                        "kubepods.slice/kubepods-burstable.slice"):
                for name in LEVER_FILES:
                    path = root / qos / name
                    with contextlib.suppress(OSError):
                        self._files[path] = path.read_text()
        node = self.api.read_node(self.node)
        self._node_state = {
            "unschedulable": node.spec.unschedulable,
            "taints": [t.to_dict() for t in node.spec.taints or []],
            "capacity": {k: v for k, v in (node.status.capacity or {}).items()
                         if k.startswith("kubernetes.io/batch-")},
            "allocatable": {k: v for k, v in (node.status.allocatable or {}).items()
                            if k.startswith("kubernetes.io/batch-")},
        }

    def restore(self) -> list[str]:
        """Put back what changed since `snapshot`; what was put back."""
        restored = []
        for path, value in self._files.items():
            with contextlib.suppress(OSError):
                if path.read_text() != value:
                    path.write_text(value.strip() or "0")
                    restored.append(str(path))
        if self._node_state is not None:
            was = self._node_state
            node = self.api.read_node(self.node)
            taints = [t.to_dict() for t in node.spec.taints or []]
            if bool(node.spec.unschedulable) != bool(was["unschedulable"]) or \
                    taints != was["taints"]:
                self.api.patch_node(self.node, {"spec": {
                    "unschedulable": was["unschedulable"], "taints": was["taints"]}})
                restored.append(f"node {self.node} schedulability and taints")
            now = {k: v for k, v in (node.status.capacity or {}).items()
                   if k.startswith("kubernetes.io/batch-")}
            if now != was["capacity"]:
                self.api.patch_node_status(self.node, {"status": {
                    "capacity": was["capacity"], "allocatable": was["allocatable"]}})
                restored.append(f"node {self.node} batch resources")
        return restored

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
                                        "sloguard.io/lab": "true",
                                        "sloguard.io/lab-run": self.run}},
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
        """redis as a Guaranteed LS pod; (its pod IP, port, a note of its cpuset). What the
        way's levers may change is noted first (`snapshot`)."""
        self.snapshot()
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
        container = (pod.status.container_statuses[0].container_id or "").split("://")[-1]
        if not container:
            return "any CPU (the container has no id yet)"
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
        """This session's pods go, the lab waits until the kubelet has stopped them (their
        cgroups gone, not only their API objects), then puts back whatever the way's levers
        left (`restore`). Raises when a pod outlives the wait."""
        selector = f"sloguard.io/lab-run={self.run}"
        uids = set()
        with contextlib.suppress(self._client.ApiException):
            for pod in self.api.list_namespaced_pod(self.namespace,
                                                    label_selector=selector).items:
                uids.add(pod.metadata.uid)
                with contextlib.suppress(self._client.ApiException):
                    self.api.delete_namespaced_pod(pod.metadata.name, self.namespace,
                                                   grace_period_seconds=1)
        deadline = time.monotonic() + 90
        while (left := self._running(uids)) and time.monotonic() < deadline:
            time.sleep(0.5)
        restored = self.restore()
        if left:
            raise RuntimeError(f"lab pods still running 90 s after their deletion: {left}"
                               + (f"; put back: {', '.join(restored)}" if restored else ""))

    def _running(self, uids: set[str]) -> list[str]:
        """Of `uids`, the pods still in the API or still with a cgroup on this machine."""
        with contextlib.suppress(self._client.ApiException):
            listed = {p.metadata.uid for p in self.api.list_namespaced_pod(
                self.namespace, label_selector=f"sloguard.io/lab-run={self.run}").items}
            if listed & uids:
                return sorted(listed & uids)
        # The hierarchy the kubelet's pods live in (the agent's): on this hybrid host the
        # kubelet leaves a stopped pod's empty directory in the unified mount, which it does
        # not manage, so that one says nothing about whether the pod still runs.
        root = detect_layout().primary
        return sorted(uid for uid in uids
                      if any(root.glob(f"kubepods*/**/*pod{uid.replace('-', '?')}*")))


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
        why = ""
        try:
            pod = placement._wait(self.name, "finished", lambda p: p.status.phase in (
                "Succeeded", "Failed"), timeout=timeout)
            statuses = pod.status.container_statuses or []
            state = statuses[0].state.terminated if statuses else None
            code = state.exit_code if state is not None else -1
            why = pod.status.reason or ""
        except RuntimeError:
            code = -1
            with contextlib.suppress(placement._client.ApiException, IndexError, TypeError,
                                     AttributeError):
                pod = placement.api.read_namespaced_pod(self.name, placement.namespace)
                waiting = pod.status.container_statuses[0].state.waiting
                why = f"{waiting.reason}: {waiting.message}" if waiting else pod.status.phase
        ended = time.time_ns()
        self.kill()
        try:
            started = int((self.out / f"{self.name}.start").read_text().strip())
        except (OSError, ValueError):
            # Not an episode with no work: an episode that never was (the image missing,
            # the pod refused); the comparison must not count it.
            raise RuntimeError(f"the antagonist pod {self.name} never started"
                               + (f" ({why})" if why else "")) from None
        return EpisodeRun(self.antagonist, started, ended,
                          bogo_ops(self.out / f"{self.name}.yaml"), code)

    def kill(self) -> None:
        with contextlib.suppress(self.placement._client.ApiException):
            self.placement.api.delete_namespaced_pod(self.name, self.placement.namespace,
                                                     grace_period_seconds=1)
