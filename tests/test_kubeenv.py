"""Integration tests of the real kube-apiserver test environment (tests/support/kubeenv.py).

Skipped when the cached binaries are missing (after waiting for a background build, as the
`kube` fixture does), unless CI is set: then they fail with the reason.
Build the binaries with `bash scripts/kube-testenv.sh`.
"""

from __future__ import annotations

import os
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from conftest import kube_binaries_missing, need
from kubernetes import client
from kubernetes.client.rest import ApiException
from support.kubeenv import KubeTestEnv

NODE = "node-a"
pytestmark = pytest.mark.kube


class KubeEnvHandle:
    """The started env plus the tokens registered before start."""

    def __init__(self, kube: KubeTestEnv, restricted_token: str) -> None:
        self.kube = kube
        self.restricted_token = restricted_token
        self.admin = kube.api_client()
        self.core = client.CoreV1Api(self.admin)


@pytest.fixture(scope="module")
def kube_env(request: pytest.FixtureRequest) -> Iterator[KubeEnvHandle]:
    missing = kube_binaries_missing(request.config)
    need(not missing, missing)
    kube = KubeTestEnv(audit=True)
    restricted = kube.add_token("nobody", ["sloguard:no-bindings"])
    with kube:
        yield KubeEnvHandle(kube, restricted)


@pytest.fixture(scope="module")
def node_a(kube_env: KubeEnvHandle) -> client.V1Node:
    body = client.V1Node(metadata=client.V1ObjectMeta(name=NODE, labels={"sloguard/test": "1"}))
    return kube_env.core.create_node(body)


@pytest.fixture
def kube_namespace(kube_env: KubeEnvHandle) -> Iterator[str]:
    name = f"t-{uuid.uuid4().hex[:8]}"
    kube_env.core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    yield name
    kube_env.core.delete_namespace(name)


def _pod(name: str, labels: dict[str, str] | None = None) -> client.V1Pod:
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name=name, labels=labels or {}),
        spec=client.V1PodSpec(
            node_name=NODE,
            containers=[client.V1Container(name="main", image="registry.invalid/pause:1")],
        ),
    )


def _make_running_ready(core: client.CoreV1Api, name: str, namespace: str) -> None:
    """Play the kubelet: Pending pods skip PDB checks, so mark the pod Running and Ready."""
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    status = {
        "status": {
            "phase": "Running",
            "conditions": [
                {"type": "Ready", "status": "True", "lastTransitionTime": now},
                {"type": "ContainersReady", "status": "True", "lastTransitionTime": now},
            ],
        }
    }
    core.patch_namespaced_pod_status(name, namespace, status)


def _wait_for(what: str, check: Callable[[], bool], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.25)


def _policy_version(api: client.ApiClient) -> str:
    """policy/v1 where served (1.21+), else policy/v1beta1 (1.20): chosen by discovery."""
    groups = client.ApisApi(api).get_api_versions().groups
    versions = {v.version for g in groups if g.name == "policy" for v in g.versions}
    return "v1" if "v1" in versions else "v1beta1"


def test_kube_binaries_present(request: pytest.FixtureRequest) -> None:
    missing = kube_binaries_missing(request.config)
    need(not missing, missing)  # skipped without them, except on CI
    assert not missing


def test_env_basics(kube_env: KubeEnvHandle) -> None:
    kube = kube_env.kube
    assert kube.server.startswith("https://127.0.0.1:")
    assert os.path.isfile(kube.ca_file)
    assert kube.log_path("kube-apiserver").is_file()
    version = client.VersionApi(kube_env.admin).get_code()
    assert version.git_version == "v1.20.2"
    with open(kube.kubeconfig_path()) as fh:
        assert kube.admin_token in fh.read()
    with pytest.raises(RuntimeError):
        kube.add_token("late", [])
    if kube.kubectl_path:
        out = subprocess.run(
            [kube.kubectl_path, "--kubeconfig", kube.kubeconfig_path(), "get", "--raw", "/readyz"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
        assert out.stdout.strip() == "ok"


def test_create_node(kube_env: KubeEnvHandle, node_a: client.V1Node) -> None:
    got = kube_env.core.read_node(NODE)
    assert got.metadata.name == NODE
    assert got.metadata.labels["sloguard/test"] == "1"


def test_pods_by_node_field_selector(
    kube_env: KubeEnvHandle, node_a: client.V1Node, kube_namespace: str
) -> None:
    namespace = kube_namespace
    kube_env.core.create_namespaced_pod(namespace, _pod("on-node-a"))
    other = _pod("elsewhere")
    other.spec.node_name = "node-b"
    kube_env.core.create_namespaced_pod(namespace, other)

    pods = kube_env.core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={NODE}").items
    names = {(p.metadata.namespace, p.metadata.name) for p in pods}
    assert (namespace, "on-node-a") in names
    assert (namespace, "elsewhere") not in names
    assert all(p.spec.node_name == NODE for p in pods)


def test_restricted_token_is_forbidden(kube_env: KubeEnvHandle, kube_namespace: str) -> None:
    namespace = kube_namespace
    restricted = client.CoreV1Api(kube_env.kube.api_client(kube_env.restricted_token))
    with pytest.raises(ApiException) as err:
        restricted.list_namespaced_pod(namespace)
    assert err.value.status == 403
    assert "nobody" in err.value.body
    # The admin token can do the same call.
    kube_env.core.list_namespaced_pod(namespace)
    # The audit log records both, with who asked, what, and the answer.
    [refused] = kube_env.kube.audit_events("nobody")
    assert (refused["verb"], refused["objectRef"]["resource"]) == ("list", "pods")
    assert refused["objectRef"]["namespace"] == namespace
    assert refused["responseStatus"]["code"] == 403
    admin = [e for e in kube_env.kube.audit_events("admin")
             if e.get("objectRef", {}).get("namespace") == namespace and e["verb"] == "list"]
    assert admin and admin[-1]["responseStatus"]["code"] == 200


def test_pdb_blocks_eviction(
    kube_env: KubeEnvHandle, node_a: client.V1Node, kube_namespace: str
) -> None:
    namespace = kube_namespace
    api = kube_env.admin
    policy = f"policy/{_policy_version(api)}"
    assert policy == "policy/v1beta1"  # the 1.20 apiserver has no policy/v1
    labels = {"app": "guarded"}
    kube_env.core.create_namespaced_pod(namespace, _pod("guarded-0", labels))
    _make_running_ready(kube_env.core, "guarded-0", namespace)

    # CustomObjectsApi builds plain /apis/<group>/<version>/... paths, so it also serves
    # built-in resources, in every client version, without a typed policy/v1beta1 API.
    custom = client.CustomObjectsApi(api)
    group, version = policy.split("/")
    custom.create_namespaced_custom_object(
        group,
        version,
        namespace,
        "poddisruptionbudgets",
        {
            "apiVersion": policy,
            "kind": "PodDisruptionBudget",
            "metadata": {"name": "guarded"},
            "spec": {"minAvailable": 1, "selector": {"matchLabels": labels}},
        },
    )

    def pdb_status(healthy: int, allowed: int) -> Callable[[], bool]:
        def check() -> bool:
            pdb: dict[str, Any] = custom.get_namespaced_custom_object(
                group, version, namespace, "poddisruptionbudgets", "guarded"
            )
            status = pdb.get("status") or {}
            return (
                status.get("observedGeneration") == pdb["metadata"]["generation"]
                and status.get("currentHealthy") == healthy
                and status.get("disruptionsAllowed") == allowed
            )

        return check

    # The disruption controller (kube-controller-manager) computes the status.
    _wait_for("PDB status 1 healthy, 0 allowed", pdb_status(1, 0))

    eviction = {
        "apiVersion": policy,
        "kind": "Eviction",
        "metadata": {"name": "guarded-0", "namespace": namespace},
    }
    with pytest.raises(ApiException) as err:
        kube_env.core.create_namespaced_pod_eviction("guarded-0", namespace, eviction)
    assert err.value.status == 429, err.value.body

    # With a second ready pod one disruption is allowed: the same eviction now succeeds.
    kube_env.core.create_namespaced_pod(namespace, _pod("guarded-1", labels))
    _make_running_ready(kube_env.core, "guarded-1", namespace)
    _wait_for("PDB status 2 healthy, 1 allowed", pdb_status(2, 1))
    kube_env.core.create_namespaced_pod_eviction("guarded-0", namespace, eviction)
    evicted = kube_env.core.read_namespaced_pod("guarded-0", namespace)
    assert evicted.metadata.deletion_timestamp is not None  # Terminating: no kubelet here
    # Play the kubelet and finish the deletion.
    kube_env.core.delete_namespaced_pod("guarded-0", namespace, grace_period_seconds=0)
