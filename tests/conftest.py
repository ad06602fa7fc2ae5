"""Shared fixtures: real cgroups, a running agent, and the checks that decide whether a test may
skip. On CI (CI=true) nothing that this machine can run is allowed to skip."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from sloguard.core.cgroup_layout import CgroupLayout, detect_layout

ON_CI = os.environ.get("CI") == "true"
DEPLOY_BASE = Path(__file__).resolve().parent.parent / "deploy" / "base"
# The identity deploy/base/rbac.yaml binds; the test apiserver authenticates it by a static
# token, so the shipped ClusterRoleBinding applies to it unchanged.
AGENT_USER = "system:serviceaccount:sloguard:sloguard-agent"
AGENT_GROUPS = ("system:serviceaccounts", "system:serviceaccounts:sloguard")


# The run order (pytest_collection_modifyitems): `make test` builds Kubernetes in the background
# (scripts/kube-testenv.sh --background, its compile at idle CPU priority), so the tests that
# need no Kubernetes go first, beside the build; then the Kubernetes tests, which wait for the
# build (wait_for_background_build); the timing tests last, on a machine the build has left.
KUBE_FIXTURES = frozenset({"kube", "kube_agent", "kube_node"})


def run_phase(item: pytest.Item) -> int:
    """0: needs no Kubernetes; 1: needs the Kubernetes binaries; 2: measures time (marker
    `timing`), never beside a background build."""
    if item.get_closest_marker("timing"):
        return 2
    if item.get_closest_marker("kube") or KUBE_FIXTURES & set(getattr(item, "fixturenames", ())):
        return 1
    return 0


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    items.sort(key=run_phase)  # stable: the file order within each phase


def say(config: pytest.Config, line: str) -> None:
    """A progress line on the terminal now, past pytest's capture (a fixture that waits
    minutes should say so while it waits, not in a report afterwards)."""
    capman = config.pluginmanager.getplugin("capturemanager")
    with capman.global_and_fixture_disabled() if capman else contextlib.nullcontext():
        print(f"\n[{time.strftime('%H:%M:%S')}] {line}", file=sys.stderr, flush=True)


def wait_for_kube_build(config: pytest.Config) -> None:
    """Until a background Kubernetes build is over, with its progress on the terminal."""
    from support.kubeenv import wait_for_background_build

    wait_for_background_build(lambda line: say(config, line))


def kube_binaries_missing(config: pytest.Config) -> str:
    """What the Kubernetes tests lack ('' if nothing), once the background build is over."""
    from support.kubeenv import missing_binaries_message

    wait_for_kube_build(config)
    return missing_binaries_message()


def need(condition: bool, reason: str) -> None:
    """Skip when a capability truly does not exist here, but never on CI, where it must."""
    if not condition:
        if ON_CI:
            pytest.fail(f"required on CI: {reason}")
        pytest.skip(reason)


class RealCgroups:
    """Creates child cgroups in every mounted hierarchy this test needs, and removes them.

    Safe to call from threads (the crash sweep's runs go side by side): two creates under a
    common parent would race for its mkdir and its cpuset copy."""

    def __init__(self, layout: CgroupLayout, prefix: str) -> None:
        self.layout = layout
        self.prefix = prefix
        self.procs: list[subprocess.Popen] = []
        self.created: list[Path] = []  # every directory made, parents included
        self.cpuset = False
        self._lock = threading.Lock()

    def use_cpuset(self) -> None:
        """Create the cgroups in the v1 cpuset hierarchy too (call before `create`). Opt-in:
        a new v1 cpuset starts with no CPUs and no memory nodes, and no task can join it until
        both are set; `create` copies them from the parent."""
        self.cpuset = True

    def hierarchies(self) -> list[Path]:
        names = ("cpu", "cpuacct", "memory") + (("cpuset",) if self.cpuset else ())
        roots = [self.layout.v1[c] for c in names if c in self.layout.v1]
        if self.layout.unified is not None:
            roots.append(self.layout.unified)
        return list(dict.fromkeys(roots))

    def create(self, rel: str) -> str:
        """Create `<prefix>/<rel>` everywhere; return its path relative to the roots."""
        full = f"{self.prefix}/{rel}".strip("/")
        with self._lock:
            for root in self.hierarchies():
                path = root
                for part in full.split("/"):
                    path = path / part
                    if not path.exists():
                        path.mkdir()
                        self.created.append(path)
                        if self.cpuset and root == self.layout.v1.get("cpuset"):
                            for name in ("cpuset.cpus", "cpuset.mems"):
                                (path / name).write_text((path.parent / name).read_text())
        return full

    def write(self, rel: str, filename: str, value: str) -> None:
        for root in self.hierarchies():
            target = root / rel / filename
            if target.exists():
                target.write_text(value)
                return
        raise FileNotFoundError(f"{filename} in no hierarchy for {rel}")

    def spawn(self, rel: str, code: str = "while True: pass") -> subprocess.Popen:
        """Start a Python process in the cgroup (in every hierarchy) before it runs `code`.

        The child waits on stdin until it has been moved, so everything `code` does (CPU,
        memory) is charged to the cgroup under test.
        """
        gate = "import sys\nsys.stdin.read(1)\n"
        proc = subprocess.Popen([sys.executable, "-c", gate + code], stdin=subprocess.PIPE)
        self.procs.append(proc)
        self.move(proc.pid, rel)
        proc.stdin.write(b"go")
        proc.stdin.close()
        return proc

    def prioritise(self, rel: str) -> None:
        """Give `rel` and its parents under the prefix the highest CPU weight, so that a test's
        busy loop gets its core even while other work loads the machine (the CI machine may be
        shared). cgroup v1 `cpu.shares`, or v2 `cpu.weight` where the controller is enabled."""
        parts = rel.split("/")
        for depth in range(1, len(parts) + 1):
            path = "/".join(parts[:depth])
            for root in self.hierarchies():
                for name, value in (("cpu.shares", "262144"), ("cpu.weight", "10000")):
                    target = root / path / name
                    if target.exists():
                        target.write_text(value)

    def limit(self, rel: str, cores: float, period_us: int = 10_000) -> None:
        """Cap `rel` at `cores` of CPU (a CFS quota; a short period keeps its rate even over a
        few hundred ms). Two prioritised busy loops on a 2-CPU machine leave the test's own
        process nothing (CI stalled in a test that had two): cap all but one."""
        quota = str(int(cores * period_us))
        for root in self.hierarchies():
            if (root / rel / "cpu.cfs_quota_us").exists():
                (root / rel / "cpu.cfs_period_us").write_text(str(period_us))
                (root / rel / "cpu.cfs_quota_us").write_text(quota)
                return
            if (root / rel / "cpu.max").exists():
                (root / rel / "cpu.max").write_text(f"{quota} {period_us}")
                return
        raise FileNotFoundError(f"no CPU quota file for {rel}")

    def move(self, pid: int, rel: str) -> None:
        for root in self.hierarchies():
            (root / rel / "cgroup.procs").write_text(str(pid))

    def stop(self) -> None:
        """End every process spawned so far."""
        for proc in self.procs:
            proc.kill()
            proc.wait()
        self.procs = []

    def cleanup(self) -> None:
        self.stop()
        for path in sorted(self.created, key=lambda p: len(p.parts), reverse=True):
            for _ in range(50):
                try:
                    path.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.05)


@pytest.fixture
def real_cgroups() -> Iterator[RealCgroups]:
    need(os.geteuid() == 0, "creating cgroups needs root")
    layout = detect_layout()
    cg = RealCgroups(layout, f"sloguard-test-{uuid.uuid4().hex[:8]}")
    try:
        yield cg
    finally:
        cg.cleanup()


@pytest.fixture
def suspects_node(tmp_path, real_cgroups):
    """Real BE and LS cgroups under the real ladder (support/suspects_node.py), for the tests of
    levers at `target: suspects` and of what guarding costs."""
    from support.suspects_node import Node

    need((real_cgroups.layout.v1.get("cpu", Path("/nonexistent")) / "cpu.idle").exists(),
         "cpu.idle (kernel >= 5.15)")
    made = Node(tmp_path, real_cgroups)
    yield made
    made.ladder.close()


@pytest.fixture(scope="session")
def kube(request):
    """A real kube-apiserver (+ etcd, controller-manager) on loopback for this test session."""
    from support.kubeenv import KubeTestEnv

    missing = kube_binaries_missing(request.config)
    need(not missing, missing)
    env = KubeTestEnv(audit=True)  # the audit log is the record of what the agent asked for
    env.add_token(AGENT_USER, AGENT_GROUPS)
    with env:
        yield env


@pytest.fixture(scope="module")
def kube_node(request, tmp_path_factory):
    """A real node for the tests of one module: a control plane plus kube-scheduler,
    containerd + runc, a CNI bridge and a kubelet that registers one Ready node and runs pods
    (support/kubenode.py says what it changes on the host and undoes). Its images (the agent
    from deploy/Dockerfile, pause, the LS/BE workload image) are built with Docker and
    imported into the node's containerd; no registry is involved. A separate control plane
    from `kube`'s: that one has no kubelet on purpose (its tests bind pods to nodes that do not
    exist, and play the kubelet themselves). Module-scoped: the node (~50 s to start) is gone
    before the next module, whose timing-sensitive tests (the lab's) must not share the CPUs
    with a kubelet and its pods."""
    from support.kubenode import KubeNodeEnv, build_images, daemonset_image, node_prerequisites

    wait_for_kube_build(request.config)
    reason = node_prerequisites()
    need(not reason, reason)
    root = DEPLOY_BASE.parent.parent
    images = build_images(tmp_path_factory.mktemp("node-images"), root, daemonset_image(root),
                          log=lambda line: print(line, file=sys.stderr))
    env = KubeNodeEnv(images=images, audit=True)
    with env:
        print("; ".join(env.image_log), file=sys.stderr)
        yield env


@dataclass
class KubeAgent:
    """The agent's side of the test apiserver: its token, bound by the RBAC in deploy/base."""

    env: Any  # support.kubeenv.KubeTestEnv
    user: str
    token: str

    def api_client(self) -> Any:
        return self.env.api_client(self.token)

    def kubeconfig(self) -> str:
        return self.env.kubeconfig_path(self.token)

    def audit(self) -> list[dict[str, Any]]:
        """Every request the agent's token made so far, as the apiserver audited it."""
        return self.env.audit_events(self.user)


# What deploy/base grants: the namespace, the agent's identity and its RBAC. The base's other
# objects (the DaemonSet, its generated ConfigMaps) are tests/test_deploy.py's business: the
# session applies only these to the test apiserver (a DaemonSet there would put pods on the
# tests' nodes).
ACCESS_KINDS = frozenset({"Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding",
                          "Role", "RoleBinding"})


def deploy_objects(base: Path = DEPLOY_BASE) -> list[dict[str, Any]]:
    """The namespace and access objects (ACCESS_KINDS) of a kustomization's `resources` files,
    in order."""
    kustomization = yaml.safe_load((base / "kustomization.yaml").read_text())
    objects = []
    for name in kustomization["resources"]:
        objects.extend(d for d in yaml.safe_load_all((base / name).read_text())
                       if d and d["kind"] in ACCESS_KINDS)
    return objects


def shipped_grants(base: Path = DEPLOY_BASE) -> set[tuple[str, str, str, str]]:
    """(apiGroup, resource, verb, namespace or '*') for every rule of the Roles and
    ClusterRoles a kustomization ships; wildcards, resourceNames and nonResourceURLs are
    refused (least privilege is checked rule by rule, and those cannot be)."""
    grants = set()
    for obj in deploy_objects(base):
        if obj["kind"] not in ("ClusterRole", "Role"):
            continue
        scope = obj["metadata"].get("namespace", "*") if obj["kind"] == "Role" else "*"
        for rule in obj["rules"]:
            assert "resourceNames" not in rule and "nonResourceURLs" not in rule, rule
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    for verb in rule["verbs"]:
                        assert "*" not in (group, resource, verb), f"wildcard in {rule}"
                        grants.add((group, resource, verb, scope))
    return grants


@pytest.fixture(scope="session")
def kube_agent(kube) -> KubeAgent:
    """deploy/base applied to the test apiserver (as an admin would), and the agent's token."""
    from kubernetes import client, utils

    admin = kube.api_client()
    for obj in deploy_objects():
        utils.create_from_dict(admin, obj)
    # RBAC reaches the authorizer through an informer: wait until every shipped rule is in
    # force for the agent (whether the rules are the right ones is the tests' business).
    deadline = time.monotonic() + 30
    for group, resource, verb, scope in sorted(shipped_grants()):
        name, _, subresource = resource.partition("/")
        attributes = {"group": group, "resource": name, "subresource": subresource,
                      "verb": verb, "namespace": "" if scope == "*" else scope}
        review = {"spec": {"user": AGENT_USER, "groups": list(AGENT_GROUPS),
                           "resourceAttributes": attributes}}
        while not client.AuthorizationV1Api(admin).create_subject_access_review(
                review).status.allowed:
            assert time.monotonic() < deadline, f"the shipped RBAC never allowed {attributes}"
            time.sleep(0.1)
    return KubeAgent(kube, AGENT_USER, kube.token_of(AGENT_USER))


@pytest.fixture
def sloguard_bin() -> str:
    path = shutil.which("sloguard", path=str(Path(sys.executable).parent))
    assert path, "the sloguard console script is not installed in this environment"
    return path


@pytest.fixture(scope="session")
def influx_server():
    """Debian's InfluxDB 1.x on loopback for the session (auth on; see support/influxenv.py)."""
    from support.influxenv import InfluxServer, missing_message

    missing = missing_message("influxd", "influxdb")
    need(not missing, missing)
    with InfluxServer() as server:
        yield server


@pytest.fixture
def influx_db(influx_server) -> str:
    """A fresh database on the session's InfluxDB server."""
    return influx_server.create_database()


@pytest.fixture
def own_influx_server():
    """An InfluxDB server of this test's own, which the test may stop and start."""
    from support.influxenv import InfluxServer, missing_message

    missing = missing_message("influxd", "influxdb")
    need(not missing, missing)
    with InfluxServer() as server:
        yield server


@pytest.fixture
def make_influx_server():
    """Starts InfluxDB servers with options of the test's own (e.g. max_body_size)."""
    from support.influxenv import InfluxServer, missing_message

    missing = missing_message("influxd", "influxdb")
    need(not missing, missing)
    servers = []

    def make(**options):
        server = InfluxServer(**options)
        servers.append(server)
        server.start()
        return server

    yield make
    for server in servers:
        server.close()


@pytest.fixture
def alertmanagers():
    """Starts HA clusters of Debian's Alertmanager (support/alertmanager.py): `make(count,
    config)` returns settled peers; every one is killed and removed at the end."""
    from support.alertmanager import cluster, missing_message

    missing = missing_message()
    need(not missing, missing)
    started = []

    def make(count, config, **options):
        servers = cluster(count, config, **options)
        started.extend(servers)
        return servers

    yield make
    for server in started:
        server.close()


@pytest.fixture(scope="session")
def victoria_server():
    """Debian's VictoriaMetrics (NOT InfluxDB: it accepts line protocol on /api/v2/write)."""
    from support.influxenv import VictoriaMetricsServer, missing_message

    missing = missing_message("victoria-metrics", "victoria-metrics")
    need(not missing, missing)
    with VictoriaMetricsServer() as server:
        yield server


@pytest.fixture(scope="session")
def postgres_server():
    """Debian's PostgreSQL on loopback for the session, from initdb in a temp dir, run as the
    `postgres` user under root (support/postgres.py); password authentication over TCP."""
    from support.postgres import PostgresServer, missing_message

    missing = missing_message()
    need(not missing, missing)
    with PostgresServer() as server:
        yield server


@pytest.fixture
def postgres_db(postgres_server) -> str:
    """A fresh, empty database on the session's PostgreSQL: its URL (no password in it; the
    password is `postgres_server.password`)."""
    return postgres_server.create_database()


@pytest.fixture(params=["sqlite", "postgres"])
def cluster_db(request, tmp_path):
    """Each implementation of the one interface (sloguard/store/cluster_db.py), so that a
    test of it holds both stores to the same answers."""
    if request.param == "sqlite":
        from sloguard.actuators.ledger import Ledger
        from sloguard.store.cluster_sqlite import SqliteClusterDB

        db = SqliteClusterDB(tmp_path, Ledger(tmp_path / "actuators.db"))
    else:
        from sloguard.store.cluster_pg import PostgresClusterDB

        server = request.getfixturevalue("postgres_server")
        db = PostgresClusterDB(request.getfixturevalue("postgres_db"), server.password, 2,
                               where="test")
    yield db
    db.close()
