"""deploy/: the kustomizations render with kubectl 1.20's built-in kustomize, the test setup's
real kube-apiserver accepts what they render (server-side dry run), the agent's own config
loader accepts the generated configuration, the RBAC stays exactly deploy/base/rbac.yaml's,
and the Dockerfile says what deploy/README.md says it does (built here only when a Docker
daemon answers)."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import ACCESS_KINDS, KubeAgent, need
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
BASE = DEPLOY / "base"
OVERLAYS = sorted(p.name for p in (DEPLOY / "overlays").iterdir() if p.is_dir())
KUSTOMIZATIONS = ["base", *(f"overlays/{name}" for name in OVERLAYS)]
DOCKERFILE = DEPLOY / "Dockerfile"
ENTRYPOINT = ["sloguard", "run", "--config", "/etc/sloguard/config.yaml"]


def kubectl_binary() -> str:
    """The cached Debian kubectl 1.20 of the kube fixture (rendering needs no apiserver)."""
    from support.kubeenv import cache_bin_dir

    path = cache_bin_dir() / "kubectl"
    need(path.exists(), "the cached kubectl is missing (bash scripts/kube-testenv.sh)")
    return str(path)


_rendered: dict[str, str] = {}


def render_text(name: str) -> str:
    if name not in _rendered:
        done = subprocess.run([kubectl_binary(), "kustomize", str(DEPLOY / name)],
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, f"kubectl kustomize deploy/{name}: {done.stderr}"
        _rendered[name] = done.stdout
    return _rendered[name]


def render(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(render_text(name)) if d]


def one(objects: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [o for o in objects if o["kind"] == kind
             and (name is None or o["metadata"]["name"] == name)]
    assert len(found) == 1, f"{len(found)} {kind} {name or ''} in {[o['kind'] for o in objects]}"
    return found[0]


def agent_container(objects: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    spec = one(objects, "DaemonSet", "sloguard-agent")["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    return spec, container


def volume(spec: dict[str, Any], name: str) -> dict[str, Any]:
    return next(v for v in spec["volumes"] if v["name"] == name)


def mount(container: dict[str, Any], name: str) -> dict[str, Any]:
    return next(m for m in container["volumeMounts"] if m["name"] == name)


# -- rendering -----------------------------------------------------------------------------------

@pytest.mark.parametrize("name", KUSTOMIZATIONS)
def test_renders_with_kubectl_1_20s_kustomize(name: str):
    objects = render(name)
    kinds = sorted(o["kind"] for o in objects)
    extra = list(POLICY_KINDS) if name == OWN_NODE else []
    assert kinds == sorted(["Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding",
                            "Role", "RoleBinding", "DaemonSet", "ConfigMap", "ConfigMap",
                            "ConfigMap", *extra]), kinds
    assert not [o for o in objects if o["kind"] == "Secret"], "no secrets in git"
    spec, container = agent_container(objects)
    # Every generated ConfigMap the DaemonSet names is in the output, by its hashed name.
    configmaps = {o["metadata"]["name"]: o for o in objects if o["kind"] == "ConfigMap"}
    for vol in ("config", "rules", "policies"):
        ref = volume(spec, vol)["configMap"]["name"]
        assert ref in configmaps and re.fullmatch(r"sloguard-\w+-[a-z0-9]{10}", ref), ref
        assert configmaps[ref]["metadata"]["namespace"] == "sloguard"
    assert spec["hostPID"] is True and spec["hostNetwork"] is True
    assert spec["dnsPolicy"] == "ClusterFirstWithHostNet"
    assert spec["serviceAccountName"] == "sloguard-agent"
    env = {e["name"]: e for e in container["env"]}
    assert env["SLOGUARD_NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert mount(container, "config")["mountPath"] == ENTRYPOINT[-1]
    hostpaths = {v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
    assert {"/sys/fs/cgroup", "/sys/kernel/tracing", "/var/lib/sloguard"} <= hostpaths
    assert mount(container, "tracefs")["readOnly"] is True
    assert not mount(container, "cgroup").get("readOnly"), "the levers write BE cgroups"
    # Secrets are referenced, never generated: the UI token is required, the others optional.
    assert "optional" not in volume(spec, "ui-token")["secret"]
    assert volume(spec, "slack")["secret"]["optional"] is True


@pytest.mark.parametrize("name", KUSTOMIZATIONS)
def test_the_rbac_rendered_is_exactly_rbac_yaml(name: str):
    shipped = [d for d in yaml.safe_load_all((BASE / "rbac.yaml").read_text()) if d]
    rendered = [o for o in render(name) if o["kind"] in ACCESS_KINDS - {"Namespace"}]

    def key(obj: dict[str, Any]) -> tuple[str, str, str]:
        return obj["kind"], obj["metadata"].get("namespace", ""), obj["metadata"]["name"]

    assert sorted(rendered, key=key) == sorted(shipped, key=key)


def test_overlays_change_only_what_they_are_for():
    _, base = agent_container(render("base"))
    assert base["securityContext"] == {"privileged": True, "runAsUser": 0}
    _, caps = agent_container(render("overlays/capabilities"))
    assert caps["securityContext"]["privileged"] is False
    assert sorted(caps["securityContext"]["capabilities"]["add"]) == [
        "BPF", "PERFMON", "SYS_ADMIN", "SYS_RESOURCE"]
    assert caps["securityContext"]["capabilities"]["drop"] == ["ALL"]
    spec, resctrl = agent_container(render("overlays/resctrl"))
    assert mount(resctrl, "resctrl")["mountPath"] == "/sys/fs/resctrl"
    assert volume(spec, "resctrl")["hostPath"] == {"path": "/sys/fs/resctrl", "type": "Directory"}
    _, influx = agent_container(render("overlays/influxdb"))
    env = {e["name"]: e for e in influx["env"]}
    assert env["SLOGUARD_STORE__KIND"]["value"] == "influxdb"
    assert env["SLOGUARD_STORE__PASSWORD"]["valueFrom"]["secretKeyRef"]["name"] == \
        "sloguard-influxdb"
    assert "SLOGUARD_NODE_NAME" in env  # the base's env is kept, not replaced


def test_the_shipped_rules_and_policies_are_the_repositorys():
    """deploy/base/rules and policies are copies (kustomize loads no file outside its
    directory); they must not drift from rules/."""
    for copy, original in ((BASE / "rules", ROOT / "rules"),
                           (BASE / "policies", ROOT / "rules" / "policies")):
        want = {p.name: p.read_bytes() for p in original.glob("*.yaml")}
        have = {p.name: p.read_bytes() for p in copy.glob("*.yaml")}
        assert have == want, f"cp {original.relative_to(ROOT)}/*.yaml {copy.relative_to(ROOT)}/"
    objects = render("base")
    spec, _ = agent_container(objects)
    for vol, original in (("rules", ROOT / "rules"), ("policies", ROOT / "rules" / "policies")):
        data = one(objects, "ConfigMap", volume(spec, vol)["configMap"]["name"])["data"]
        assert data == {p.name: p.read_text() for p in original.glob("*.yaml")}


# -- the agent's own loader ------------------------------------------------------------------

def materialise(name: str, tmp_path: Path) -> tuple[dict[str, str], dict[str, Path]]:
    """The DaemonSet's environment (fieldRef and Secret values made up) and its ConfigMaps
    written out as the kubelet would mount them, by volume name."""
    objects = render(name)
    spec, container = agent_container(objects)
    env = {}
    for var in container["env"]:
        if "value" in var:
            env[var["name"]] = var["value"]
        elif "fieldRef" in var["valueFrom"]:
            env[var["name"]] = "node-under-test"
        else:
            env[var["name"]] = "not-a-real-secret"
    dirs = {}
    for vol in ("config", "rules", "policies"):
        configmap = one(objects, "ConfigMap", volume(spec, vol)["configMap"]["name"])
        dirs[vol] = tmp_path / vol
        dirs[vol].mkdir()
        for key, value in configmap["data"].items():
            (dirs[vol] / key).write_text(value)
    return env, dirs


def sloguard(args: list[str], env: dict[str, str], cwd: Path,
             sloguard_bin: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SLOGUARD_")}
    return subprocess.run([sloguard_bin, *args], env={**clean, **env}, cwd=cwd,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("name", KUSTOMIZATIONS)
def test_the_generated_configuration_loads(name: str, tmp_path: Path, sloguard_bin: str):
    env, dirs = materialise(name, tmp_path)
    _, container = agent_container(render(name))
    done = sloguard(["config", "show", "--json", "--config", str(dirs["config"] / "config.yaml")],
                    env, tmp_path, sloguard_bin)
    assert done.returncode == 0, done.stderr
    config = {row["key"]: row["value"] for row in json.loads(done.stdout)}
    assert config["node_name"] == "node-under-test"
    assert config["data_dir"] == mount(container, "data")["mountPath"]
    assert config["rules.paths"] == [mount(container, "rules")["mountPath"]]
    assert config["actuators.policies"] == [mount(container, "policies")["mountPath"]]
    assert config["ui.token_file"] == mount(container, "ui-token")["mountPath"] + "/token"
    assert config["actuators.dry_run"] is True
    assert config["kubernetes.enabled"] is True
    port = int(config["listen"].rpartition(":")[2])
    assert [p["containerPort"] for p in container["ports"]] == [port]
    assert config["store.kind"] == ("influxdb" if name == "overlays/influxdb" else "embedded")
    if name == "overlays/influxdb":
        assert "not-a-real-secret" not in done.stdout  # the password is masked
    for command, vol in (("rules", "rules"), ("policies", "policies")):
        done = sloguard([command, "check", str(dirs[vol])], env, tmp_path, sloguard_bin)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "ok" in done.stdout


def test_listening_beyond_loopback_without_the_token_is_refused(tmp_path: Path,
                                                                sloguard_bin: str):
    """Why the ui-token Secret is required: without ui.token_file the agent would not start."""
    env, dirs = materialise("base", tmp_path)
    config = yaml.safe_load((dirs["config"] / "config.yaml").read_text())
    del config["ui"]
    (tmp_path / "no-token.yaml").write_text(yaml.safe_dump(config))
    done = sloguard(["config", "show", "--config", str(tmp_path / "no-token.yaml")], env,
                    tmp_path, sloguard_bin)
    assert done.returncode == 2
    assert "ui.token" in done.stderr


# -- the real apiserver ----------------------------------------------------------------------

@pytest.mark.kube
@pytest.mark.parametrize("name", KUSTOMIZATIONS)
def test_the_apiserver_accepts_the_manifests(name: str, kube, kube_agent: KubeAgent):
    """Server-side dry run with the admin kubeconfig: schema, defaulting and admission of the
    real kube-apiserver 1.20, nothing stored. kube_agent has applied the namespace and RBAC
    (objects in a namespace that does not exist would be refused by admission)."""
    kubectl = kube.kubectl_path
    need(kubectl is not None, "the cached kubectl is missing (bash scripts/kube-testenv.sh)")
    # 1.20 serves no ValidatingAdmissionPolicy: overlays/own-node's policy is checked by
    # test_the_own_node_policy_* instead; the rest of what it renders is dry-run here.
    objects = [o for o in render(name) if o["kind"] not in POLICY_KINDS]
    done = subprocess.run(
        [kubectl, "--kubeconfig", kube.kubeconfig_path(), "apply", "--dry-run=server", "-f", "-"],
        input=yaml.safe_dump_all(objects), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    assert len(lines) == len(objects), done.stdout
    assert all(line.endswith("(server dry run)") for line in lines), done.stdout
    assert "daemonset.apps/sloguard-agent" in done.stdout
    # A dry run stores nothing: no agent pods for the tests' nodes.
    from kubernetes import client

    apps = client.AppsV1Api(kube.api_client())
    assert not apps.list_namespaced_daemon_set("sloguard").items


# -- the image -------------------------------------------------------------------------------

def dockerfile_instructions() -> list[tuple[str, str]]:
    text = DOCKERFILE.read_text().replace("\\\n", " ")
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def test_the_dockerfile_is_multi_stage_on_bookworm_and_runs_the_agent():
    steps = dockerfile_instructions()
    froms = [rest for word, rest in steps if word == "FROM"]
    assert froms == ["debian:bookworm-slim AS build", "debian:bookworm-slim AS runtime"]
    runtime = steps[[i for i, (w, _) in enumerate(steps) if w == "FROM"][-1]:]
    entry = [rest for word, rest in runtime if word == "ENTRYPOINT"]
    assert [json.loads(e) for e in entry] == [ENTRYPOINT]
    runs = " ".join(rest for word, rest in runtime if word == "RUN")
    for package in ("python3-bpfcc", "libbpfcc", "linux-libc-dev"):
        assert re.search(rf"\b{package}\b", runs), package
    assert "SLOGUARD_BCC_IMAGE_BUILD=1 bash /usr/local/lib/sloguard/bcc-setup.sh" in runs
    env = " ".join(rest for word, rest in runtime if word == "ENV")
    assert "BCC_KERNEL_SOURCE=/var/cache/sloguard/bcc-kernel" in env
    assert "COPY --from=build /opt/sloguard /opt/sloguard" in [
        f"{w} {r}" for w, r in runtime]
    # Every file copied from the context exists, and .dockerignore does not hide it.
    ignored = {line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
               if line.strip() and not line.startswith("#")}
    for word, rest in steps:
        if word == "COPY" and not rest.startswith("--from"):
            source = shlex.split(rest)[0]
            assert (ROOT / source).exists(), source
            assert source.split("/")[0] not in ignored, source
    # The port the DaemonSet probes is the one the image exposes.
    _, container = agent_container(render("base"))
    assert [f"{p['containerPort']}" for p in container["ports"]] == [
        rest for word, rest in runtime if word == "EXPOSE"]


def test_every_dependency_is_pinned_in_the_lock():
    pins = {}
    for line in (DEPLOY / "requirements.lock").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            req = Requirement(line)
            (spec,) = req.specifier
            assert spec.operator == "==", line
            pins[req.name.lower().replace("_", "-")] = spec.version
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    # the server image may keep its incidents in PostgreSQL (server.database)
    postgres = project["optional-dependencies"]["postgres"]
    assert {"psycopg-binary", "psycopg-pool"} <= set(pins)  # psycopg[binary,pool]
    for dependency in project["dependencies"] + postgres:
        req = Requirement(dependency)
        name = req.name.lower().replace("_", "-")
        assert name in pins, f"{name} is not pinned in deploy/requirements.lock"
        assert req.specifier.contains(pins[name]), f"{name}=={pins[name]} is not {req}"


def docker_daemon() -> str | None:
    """Why no image can be built here, or None when a Docker daemon answers."""
    try:
        done = subprocess.run(["docker", "info", "--format", "{{.ServerVersion}}"],
                              capture_output=True, text=True, timeout=30)
    except FileNotFoundError:
        return "no docker binary"
    if done.returncode != 0:
        return f"no Docker daemon reachable ({done.stderr.strip().splitlines()[-1:]})"
    return None


def test_the_image_builds_and_starts_the_cli():
    """The image really builds from deploy/Dockerfile (scripts/docker-testenv.sh starts Debian's
    Docker engine and makes the debian:bookworm-slim base with debootstrap, no registry being
    reachable here) and its CLI and BCC work inside it. The build host's locally added CAs
    (/usr/local/share/ca-certificates, where a TLS-intercepting proxy's CA goes) are passed to
    the build stage for PyPI; the runtime image does not keep them."""
    reason = docker_daemon()
    need(not reason, f"image not built: {reason} (bash scripts/docker-testenv.sh)")
    local_cas = sorted(Path("/usr/local/share/ca-certificates").glob("*.crt"))
    ca_args = ["--build-arg", "PIP_CA_PEM=" + "".join(p.read_text() for p in local_cas)] \
        if local_cas else []
    tag = "sloguard:test-deploy"
    build = subprocess.run(["docker", "build", "-f", str(DOCKERFILE), *ca_args, "-t", tag,
                            str(ROOT)], capture_output=True, text=True, timeout=1800)
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    version = subprocess.run(["docker", "run", "--rm", "--entrypoint", "sloguard", tag,
                              "version"], capture_output=True, text=True, timeout=120)
    assert version.returncode == 0, version.stderr
    inside = subprocess.run(
        ["docker", "run", "--rm", "--entrypoint", "python3", tag, "-c",
         "import bcc, sloguard, os; print(os.path.exists('/etc/pip-ca.pem'))"],
        capture_output=True, text=True, timeout=120)
    assert inside.returncode == 0, inside.stderr  # Debian's BCC is importable in the venv
    assert inside.stdout.strip() == "False"  # the build stage's CA did not reach the image
    shown = subprocess.run(["docker", "run", "--rm", tag, "--help"], capture_output=True,
                           text=True, timeout=120)
    assert shown.returncode == 0 and "--config" in shown.stdout  # the entrypoint is `run`


# -- the cluster view: deploy/server -----------------------------------------------------------

def test_the_server_renders_and_its_config_runs_the_real_server(tmp_path: Path,
                                                               sloguard_bin: str):
    """deploy/server renders; the generated config, with the Secrets' files where the
    Deployment mounts them (moved under tmp_path), starts the real `sloguard server`, which
    then refuses reading without the UI token and ingest with the wrong one."""
    import socket
    import time

    import httpx

    objects = render("server")
    assert sorted(o["kind"] for o in objects) == [
        "ClusterRole", "ClusterRoleBinding", "ConfigMap", "Deployment", "Role", "RoleBinding",
        "Service", "ServiceAccount"]
    deployment = one(objects, "Deployment", "sloguard-server")
    pod = deployment["spec"]["template"]["spec"]
    [container] = pod["containers"]
    assert container["command"][:2] == ["sloguard", "server"]
    # no Kubernetes API token unless node_auth: tokenreview is chosen (rbac.yaml)
    assert pod["automountServiceAccountToken"] is False
    assert pod["serviceAccountName"] == "sloguard-server"
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    configmap = one(objects, "ConfigMap")
    names = {v["configMap"]["name"] for v in pod["volumes"] if "configMap" in v}
    assert names == {configmap["metadata"]["name"]}  # the hashed name is followed
    text = configmap["data"]["config.yaml"]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    for name, path in mounts.items():  # the pod's paths, moved under tmp_path
        text = text.replace(path, str(tmp_path / name))
    (tmp_path / "ui-token").mkdir()
    (tmp_path / "ui-token" / "token").write_text("ui-secret")
    (tmp_path / "ingest-token").mkdir()
    (tmp_path / "ingest-token" / "token").write_text("ingest-secret")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    config = tmp_path / "config.yaml"
    config.write_text(text.replace("listen: 0.0.0.0:8080", f"listen: 0.0.0.0:{port}"))
    log = tmp_path / "server.log"
    with open(log, "wb") as out:
        server = subprocess.Popen([sloguard_bin, "server", "--config", str(config)],
                                  stdout=out, stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert server.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        assert httpx.get(f"{url}/api/incidents", timeout=5).status_code == 401
        bearer = {"Authorization": "Bearer ui-secret"}
        assert httpx.get(f"{url}/api/incidents", headers=bearer, timeout=5).status_code == 200
        wrong = httpx.post(f"{url}/api/v1/ingest", headers=bearer, timeout=5,
                           json={"node": "n", "incidents": [], "actions": []})
        assert wrong.status_code == 401  # the UI's token cannot ingest
        assert (tmp_path / "data").is_dir()  # the data dir is the mounted volume
    finally:
        server.terminate()
        server.wait(timeout=30)


@pytest.mark.kube
def test_the_apiserver_accepts_the_server_manifests(kube, kube_agent: KubeAgent):
    kubectl = kube.kubectl_path
    need(kubectl is not None, "the cached kubectl is missing (bash scripts/kube-testenv.sh)")
    done = subprocess.run(
        [kubectl, "--kubeconfig", kube.kubeconfig_path(), "apply", "--dry-run=server", "-f", "-"],
        input=render_text("server"), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "deployment.apps/sloguard-server created (server dry run)" in done.stdout
    assert "service/sloguard-server created (server dry run)" in done.stdout


# -- overlays/own-node: the apiserver binds the agent's writes to its own node -------------------
# The test apiserver is 1.20, which serves no ValidatingAdmissionPolicy (v1 since 1.30): the
# policy cannot be admitted or enforced here. What runs instead: its YAML is checked field by
# field against the admissionregistration.k8s.io/v1 models of the kubernetes client (generated
# from the API's OpenAPI schema), and its CEL is compiled and evaluated with cel-python on
# AdmissionRequests as the apiserver would build them. cel-python is not the apiserver's
# cel-go and lacks Kubernetes' CEL libraries, so the policy keeps to core CEL.

OWN_NODE = "overlays/own-node"
POLICY_KINDS = ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")
NODE_CLAIM = "authentication.kubernetes.io/node-name"


def _strict(data: Any, type_name: str, where: str) -> None:
    """`data` as the kubernetes client model `type_name` would read it, refusing unknown
    fields and wrong types (the client itself ignores unknown fields)."""
    from kubernetes import client

    for prefix in ("List[", "list["):
        if type_name.startswith(prefix):
            assert isinstance(data, list), f"{where}: not a list"
            for n, item in enumerate(data):
                _strict(item, type_name[len(prefix):-1], f"{where}[{n}]")
            return
    if type_name.startswith(("Dict[", "dict(")):
        assert isinstance(data, dict), f"{where}: not a map"
        return
    simple = {"str": str, "int": int, "bool": bool, "object": object}
    if type_name in simple:
        assert isinstance(data, simple[type_name]), f"{where}: not {type_name}: {data!r}"
        return
    model = getattr(client, type_name)
    assert isinstance(data, dict), f"{where}: not an object"
    fields = {json_name: attr for attr, json_name in model.attribute_map.items()}
    for key, value in data.items():
        assert key in fields, f"{where}.{key}: not a field of {type_name}"
        _strict(value, model.openapi_types[fields[key]], f"{where}.{key}")


def _policy_objects() -> dict[str, dict[str, Any]]:
    return {o["kind"]: o for o in render(OWN_NODE) if o["kind"] in POLICY_KINDS}


def test_the_own_node_policy_is_valid_admissionregistration_v1():
    from kubernetes import client

    objects = _policy_objects()
    assert sorted(objects) == sorted(POLICY_KINDS)
    api = client.ApiClient()
    for kind, obj in objects.items():
        assert obj["apiVersion"] == "admissionregistration.k8s.io/v1"
        assert "namespace" not in obj["metadata"], "cluster-scoped"
        _strict(obj, f"V1{kind}", kind)
        # required fields and enums, as the client models check them
        model = api._ApiClient__deserialize(obj, f"V1{kind}")
        assert model.spec is not None
    policy, binding = objects["ValidatingAdmissionPolicy"], objects[
        "ValidatingAdmissionPolicyBinding"]
    assert binding["spec"]["policyName"] == policy["metadata"]["name"]
    assert binding["spec"]["validationActions"] == ["Deny"]
    assert policy["spec"]["failurePolicy"] == "Fail"
    # the rest of the overlay is the base, unchanged
    rest = [o for o in render(OWN_NODE) if o["kind"] not in POLICY_KINDS]
    assert rest == render("base")


class Admission:
    """The policy's admission decision for one request, evaluated as the apiserver does:
    matchConstraints, then matchConditions, then variables, then every validation."""

    def __init__(self, policy: dict[str, Any]) -> None:
        import celpy

        self.spec = policy["spec"]
        self.env = celpy.Environment()
        self.programs: dict[str, Any] = {}
        expressions = [c["expression"] for c in self.spec["matchConditions"]]
        expressions += [v["expression"] for v in self.spec["variables"]]
        for v in self.spec["validations"]:
            expressions += [v["expression"], v.get("messageExpression", "'x'")]
        for expression in expressions:  # every expression must compile
            self.programs[expression] = self.env.program(self.env.compile(expression))

    def _run(self, expression: str, activation: dict[str, Any]) -> Any:
        return self.programs[expression].evaluate(activation)

    def _matches(self, request: dict[str, Any]) -> bool:
        resource = request["resource"]["resource"] + (
            f"/{request['subResource']}" if request.get("subResource") else "")
        return any(request["resource"]["group"] in rule["apiGroups"]
                   and request["resource"]["version"] in rule["apiVersions"]
                   and request["operation"] in rule["operations"]
                   and resource in rule["resources"]
                   for rule in self.spec["matchConstraints"]["resourceRules"])

    def __call__(self, request: dict[str, Any], obj: dict[str, Any]) -> tuple[bool, str]:
        import celpy
        from celpy import celtypes

        if not self._matches(request):
            return True, "not matched"
        activation: dict[str, Any] = {"request": celpy.json_to_cel(request),
                                      "object": celpy.json_to_cel(obj)}
        if not all(self._run(c["expression"], activation)
                   for c in self.spec["matchConditions"]):
            return True, "not matched"
        variables = celtypes.MapType({})
        for v in self.spec["variables"]:
            activation["variables"] = variables
            variables[celtypes.StringType(v["name"])] = self._run(v["expression"], activation)
        activation["variables"] = variables
        for v in self.spec["validations"]:
            verdict = self._run(v["expression"], activation)
            assert isinstance(verdict, celtypes.BoolType), (v["expression"], verdict)
            if not verdict:
                message = (str(self._run(v["messageExpression"], activation))
                           if "messageExpression" in v else v["message"])
                return False, message
        return True, "allowed"


def _request(resource: str, operation: str, name: str, node: str | None = "node-a",
             user: str = "system:serviceaccount:sloguard:sloguard-agent",
             subresource: str = "", namespace: str = "") -> dict[str, Any]:
    extra = {NODE_CLAIM: [node], "authentication.kubernetes.io/pod-name": ["sloguard-agent-x"]}
    return {"uid": "0", "kind": {"group": "", "version": "v1", "kind": "X"},
            "resource": {"group": "", "version": "v1", "resource": resource},
            "subResource": subresource, "operation": operation, "name": name,
            "namespace": namespace,
            "userInfo": {"username": user, "groups": ["system:serviceaccounts"],
                         "extra": extra if node is not None else {}}}


def _node(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name},
            "spec": {"unschedulable": True}}


def _event(kind: str, name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Event",
            "metadata": {"generateName": f"{name}.sloguard-", "namespace": "default"},
            "involvedObject": {"apiVersion": "v1", "kind": kind, "name": name, "uid": name},
            "reason": "SloguardCordoned", "message": "m", "type": "Normal"}


def test_the_own_node_policy_allows_the_own_node_and_denies_others():
    admit = Admission(_policy_objects()["ValidatingAdmissionPolicy"])
    allowed = [
        (_request("nodes", "UPDATE", "node-a"), _node("node-a")),
        (_request("nodes", "UPDATE", "node-a", subresource="status"), _node("node-a")),
        (_request("events", "CREATE", "", namespace="default"), _event("Node", "node-a")),
        # not the agent: an admin cordons any node
        (_request("nodes", "UPDATE", "node-b", user="admin", node=None), _node("node-b")),
    ]
    for request, obj in allowed:
        ok, why = admit(request, obj)
        assert ok, (request["resource"], obj["metadata"], why)
    denied = [
        (_request("nodes", "UPDATE", "node-b"), _node("node-b"),
         "the sloguard agent on node node-a may change only its own node, not node-b"),
        (_request("nodes", "UPDATE", "node-b", subresource="status"), _node("node-b"),
         "may change only its own node, not node-b"),
        (_request("events", "CREATE", "", namespace="default"), _event("Node", "node-b"),
         "records events about its own node only"),
        (_request("events", "CREATE", "", namespace="default"), _event("Pod", "node-a"),
         "records events about its own node only"),
        (_request("nodes", "UPDATE", "node-a", node=None), _node("node-a"),
         "token names no node"),
    ]
    for request, obj, message in denied:
        ok, why = admit(request, obj)
        assert not ok and message in why, (request["resource"], obj["metadata"], why)
    # What a ValidatingAdmissionPolicy cannot bind: an Eviction names a pod, not its node,
    # and the policy cannot look the pod up. The agent's own re-read refuses those
    # (tests/test_actuators_kube.py::test_a_pod_rebound_elsewhere_since_the_ranking_is_not_evicted).
    eviction = _request("pods", "CREATE", "web-1", subresource="eviction", namespace="shop")
    assert admit(eviction, {"apiVersion": "policy/v1", "kind": "Eviction",
                            "metadata": {"name": "web-1", "namespace": "shop"}}) == (
        True, "not matched")
