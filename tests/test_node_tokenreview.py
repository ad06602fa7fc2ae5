"""Node identity from Kubernetes (`server.node_auth: tokenreview`): an agent's pod-bound
service-account token posts as the node its pod runs on, and as no other.

Two apiservers. The real one (the `kube` fixture's kube-apiserver v1.20): the shipped
deploy/server RBAC applied, a token requested with the TokenRequest API for the agent's
service account bound to a pod whose spec.nodeName is set (no kubelet needed), a real
`sloguard server` reviewing it with the server's own service-account token. And a stand-in
answering the two requests the server makes in the shape v1.20 answers them, to make the
apiserver say what a real one only says by accident (a token of another account, an
unbound token, a replaced pod, a 500) and to count the reviews (the cache)."""

from __future__ import annotations

import json
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
import yaml
from test_agent_e2e import _free_port
from test_cluster_e2e import UI, ServerProcess, wait_for
from test_forward_changes_e2e import _held, _incident

from sloguard.actuators.ledger import Ledger
from sloguard.forwarder import ForwardConfig, Forwarder
from sloguard.store.incidents_db import IncidentStore

INGEST = "/api/v1/ingest"
AUDIENCE = "sloguard-server"
AGENT_SA = "system:serviceaccount:sloguard:sloguard-agent"
DEPLOY_SERVER = Path(__file__).resolve().parent.parent / "deploy" / "server"


def post(server: ServerProcess, token: str, node: str, **body) -> httpx.Response:
    return httpx.post(server.url + INGEST, json={"node": node, **body}, timeout=10,
                      headers={"Authorization": f"Bearer {token}"})


def start_server(tmp_path: Path, binary: str, kubeconfig: str, extra: str = "") -> ServerProcess:
    config = tmp_path / "server.yaml"
    config.write_text(f"ui:\n  token: {UI}\n  auth_failures_per_minute: 1000\n"  # polls 401
                      "server:\n  node_auth: tokenreview\n"
                      f"  kubeconfig: {kubeconfig}\n" + extra)
    return ServerProcess(binary, config, tmp_path / "server-data", tmp_path / "server.log",
                         _free_port())


# -- a stand-in apiserver ---------------------------------------------------------------------

class StandIn:
    """Answers TokenReview and pod GETs from `tokens` and `pods`, as v1.20 shapes them."""

    def __init__(self) -> None:
        self.tokens: dict[str, dict] = {}  # token -> status.user (absent: not authenticated)
        self.pods: dict[str, dict] = {}  # name -> pod (namespace sloguard)
        self.reviews: list[dict] = []
        self.failing = False
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def answer(self, code: int, doc: dict) -> None:
                data = json.dumps(doc).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                assert self.path == "/apis/authentication.k8s.io/v1/tokenreviews", self.path
                assert self.headers["Authorization"] == "Bearer stand-in-admin"
                stand_in.reviews.append(body["spec"])
                if stand_in.failing:
                    return self.answer(500, {"kind": "Status", "status": "Failure",
                                             "message": "etcd away", "code": 500})
                user = stand_in.tokens.get(body["spec"]["token"])
                status = {"authenticated": True, "user": user,
                          "audiences": body["spec"]["audiences"]} if user else {
                    "user": {}, "error": "invalid bearer token"}
                self.answer(201, {"apiVersion": "authentication.k8s.io/v1",
                                  "kind": "TokenReview", "metadata": {},
                                  "spec": body["spec"], "status": status})

            def do_GET(self) -> None:
                prefix = "/api/v1/namespaces/sloguard/pods/"
                assert self.path.startswith(prefix), self.path
                pod = stand_in.pods.get(self.path[len(prefix):])
                if pod is None:
                    return self.answer(404, {"kind": "Status", "status": "Failure",
                                             "reason": "NotFound", "code": 404})
                self.answer(200, pod)

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.http.serve_forever, daemon=True).start()

    def kubeconfig(self, path: Path) -> str:
        path.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "c",
            "clusters": [{"name": "s", "cluster": {
                "server": f"http://127.0.0.1:{self.http.server_port}"}}],
            "users": [{"name": "u", "user": {"token": "stand-in-admin"}}],
            "contexts": [{"name": "c", "context": {"cluster": "s", "user": "u"}}]}))
        return str(path)

    def agent_on(self, node: str, account: str = AGENT_SA, bound: bool = True) -> str:
        """A token of `account`, bound (or not) to a new pod scheduled on `node`."""
        token, name, uid = f"jwt-{uuid.uuid4()}", f"agent-{uuid.uuid4().hex[:6]}", \
            str(uuid.uuid4())
        extra = {"authentication.kubernetes.io/pod-name": [name],
                 "authentication.kubernetes.io/pod-uid": [uid]} if bound else {}
        self.tokens[token] = {"username": account, "uid": str(uuid.uuid4()),
                              "groups": ["system:serviceaccounts"], "extra": extra}
        self.pods[name] = {"apiVersion": "v1", "kind": "Pod", "metadata": {
            "name": name, "namespace": "sloguard", "uid": uid}, "spec": {
            "nodeName": node, "containers": [{"name": "agent", "image": "sloguard"}]}}
        return token

    def close(self) -> None:
        self.http.shutdown()


@pytest.fixture
def stand_in():
    made = StandIn()
    yield made
    made.close()


def test_a_pod_bound_agent_token_posts_as_its_pods_node_only(tmp_path, sloguard_bin,
                                                             stand_in):
    server = start_server(tmp_path, sloguard_bin, stand_in.kubeconfig(tmp_path / "kc.yaml"),
                          "  tokenreview_cache: 1m\n")
    try:
        on_a = stand_in.agent_on("node-a")
        incident = _incident(1, "node-a")
        assert post(server, on_a, "node-a", incidents=[incident.to_dict()]).status_code == 200
        assert stand_in.reviews[-1]["audiences"] == [AUDIENCE]
        reviews = len(stand_in.reviews)
        refused = post(server, on_a, "node-b")
        assert refused.status_code == 403
        assert refused.json()["detail"].startswith("node: 'node-b' is not 'node-a'")
        theirs = post(server, on_a, "node-a", incidents=[_incident(2, "node-b").to_dict()])
        assert theirs.status_code == 403
        assert len(stand_in.reviews) == reviews  # the node is remembered (tokenreview_cache)
        assert set(_held(server)) == {incident.id}

        # the forwarder with the token in a file (as the projected volume mounts it)
        (tmp_path / "token").write_text(on_a)
        home = tmp_path / "node-a"
        home.mkdir()
        forwarder = Forwarder(ForwardConfig(url=server.url, token_file=str(tmp_path / "token")),
                              "node-a", IncidentStore(home / "incidents.db"),
                              Ledger(home / "actuators.db"), home)
        forwarder.incidents.save(_incident(3, "node-a"))
        forwarder.round()
        assert forwarder.last_error == "" and "node-a-inc-003" in _held(server)

        # not an agent's: another service account, an unbound token, an unknown one, a pod
        # replaced since (another uid under the name), a pod deleted
        other = stand_in.agent_on("node-a", account="system:serviceaccount:default:web")
        unbound = stand_in.agent_on("node-a", bound=False)
        replaced = stand_in.agent_on("node-a")
        name = stand_in.tokens[replaced]["extra"]["authentication.kubernetes.io/pod-name"][0]
        stand_in.pods[name]["metadata"]["uid"] = str(uuid.uuid4())
        deleted = stand_in.agent_on("node-a")
        del stand_in.pods[stand_in.tokens[deleted]["extra"][
            "authentication.kubernetes.io/pod-name"][0]]
        for token in (other, unbound, "jwt-never-issued", replaced, deleted):
            answer = post(server, token, "node-a")
            assert answer.status_code == 401, (token, answer.text)
            assert token not in answer.text
        log = (tmp_path / "server.log").read_text()
        assert "system:serviceaccount:default:web, not of a service account" in log
        assert "not bound to a pod" in log
        assert all(token not in log for token in (on_a, other, unbound, replaced, deleted))

        # the apiserver failing: 503 (retry), reported, never a pass; then well again
        stand_in.failing = True
        fresh = stand_in.agent_on("node-c")
        answer = post(server, fresh, "node-c")
        assert answer.status_code == 503 and "HTTP 500" in answer.json()["detail"]
        ready = next(c for c in server.get("/readyz").json()["components"]
                     if c["name"] == "tokenreview")
        assert not ready["ok"] and "TokenReview: HTTP 500" in ready["reason"]
        stand_in.failing = False
        assert post(server, fresh, "node-c").status_code == 200
    finally:
        server.terminate()


def test_tokenreview_without_a_kubeconfig_outside_a_cluster_exits_2(tmp_path, sloguard_bin):
    import subprocess

    config = tmp_path / "server.yaml"
    config.write_text("server:\n  node_auth: tokenreview\n")
    env = {k: v for k, v in __import__("os").environ.items()
           if not k.startswith("KUBERNETES_SERVICE")}
    done = subprocess.run([sloguard_bin, "server", "-c", str(config), "--data-dir",
                           str(tmp_path / "d")], capture_output=True, text=True, timeout=30,
                          env=env)
    assert done.returncode == 2, done.stderr
    assert "server.node_auth: tokenreview: cannot load the in-cluster service account" \
        in done.stderr


# -- the real apiserver -----------------------------------------------------------------------

def server_objects() -> list[dict]:
    """deploy/server's ServiceAccount and RBAC, as the kustomization lists them."""
    kustomization = yaml.safe_load((DEPLOY_SERVER / "kustomization.yaml").read_text())
    return [d for name in kustomization["resources"]
            for d in yaml.safe_load_all((DEPLOY_SERVER / name).read_text())
            if d and d["kind"] in ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role",
                                  "RoleBinding")]


def test_against_the_real_apiserver(tmp_path, sloguard_bin, kube, kube_agent):
    import time

    from kubernetes import client, utils

    admin = kube.api_client()
    core = client.CoreV1Api(admin)
    for obj in server_objects():
        try:
            utils.create_from_dict(admin, obj)
        except utils.FailToCreateError as exc:  # a second run in one session
            assert all(e.status == 409 for e in exc.api_exceptions), exc
    # the server's own credential: its service account's token (audiences defaulted to the
    # apiserver's own)
    server_token = core.create_namespaced_service_account_token(
        "sloguard-server", "sloguard", {"apiVersion": "authentication.k8s.io/v1",
                                        "kind": "TokenRequest", "spec": {"audiences": []}}
    ).status.token
    deadline = time.monotonic() + 30
    for attributes in ({"group": "authentication.k8s.io", "resource": "tokenreviews",
                        "verb": "create"},
                       {"group": "", "resource": "pods", "verb": "get",
                        "namespace": "sloguard"}):
        review = {"spec": {"user": "system:serviceaccount:sloguard:sloguard-server",
                           "resourceAttributes": attributes}}
        while not client.AuthorizationV1Api(admin).create_subject_access_review(
                review).status.allowed:
            assert time.monotonic() < deadline, f"deploy/server's RBAC never allowed {attributes}"
            time.sleep(0.1)

    def agent_pod(node: str, account: str = "sloguard-agent") -> client.V1Pod:
        return core.create_namespaced_pod("sloguard", client.V1Pod(
            metadata=client.V1ObjectMeta(generate_name=f"{account}-"),
            spec=client.V1PodSpec(node_name=node, service_account_name=account,
                                  automount_service_account_token=False,
                                  containers=[client.V1Container(name="agent",
                                                                 image="sloguard")])))

    def token_for(pod: client.V1Pod, audiences: list[str] | None = None) -> str:
        """A token of the pod's service account bound to the pod, as the kubelet gets it for
        a projected serviceAccountToken volume."""
        return core.create_namespaced_service_account_token(
            pod.spec.service_account_name, "sloguard", {
                "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                "spec": {"audiences": [AUDIENCE] if audiences is None else audiences,
                         "expirationSeconds": 600, "boundObjectRef": {
                             "kind": "Pod", "apiVersion": "v1", "name": pod.metadata.name,
                             "uid": pod.metadata.uid}}}).status.token

    pod_a = agent_pod("node-a")
    server = start_server(tmp_path, sloguard_bin, kube.kubeconfig_path(server_token),
                          "  tokenreview_cache: 0s\n")
    try:
        on_a = token_for(pod_a)
        answer = post(server, on_a, "node-a", incidents=[_incident(1, "node-a").to_dict()])
        assert answer.status_code == 200, answer.text
        assert post(server, on_a, "node-b").status_code == 403
        # issued for the apiserver's audience (which the server could replay against it)
        assert post(server, token_for(pod_a, audiences=[]), "node-a").status_code == 401
        # a pod-bound token of another service account, its pod on node-a too
        other = f"web-{uuid.uuid4().hex[:6]}"
        core.create_namespaced_service_account("sloguard", client.V1ServiceAccount(
            metadata=client.V1ObjectMeta(name=other)))
        assert post(server, token_for(agent_pod("node-a", other)), "node-a").status_code == 401
        assert "not of a service account" in (tmp_path / "server.log").read_text()
        # the pod deleted: its token is invalid (the apiserver says so, or the pod is gone)
        core.delete_namespaced_pod(pod_a.metadata.name, "sloguard", grace_period_seconds=0)
        wait_for(lambda: post(server, on_a, "node-a").status_code == 401, 20,
                 "a deleted pod's token was still accepted", tmp_path / "server.log")
    finally:
        server.terminate()
