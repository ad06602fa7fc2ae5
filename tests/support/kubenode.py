"""A real, throw-away Kubernetes node for integration tests: the control plane of
``KubeTestEnv`` plus kube-scheduler, Debian's containerd and runc as the CRI runtime, a CNI
bridge from Debian's containernetworking-plugins, and a kubelet (v1.20.2, built by
``scripts/kube-testenv.sh``) that really runs pods::

    with KubeNodeEnv(images=node_images(docker_images(...))) as env:
        api = kubernetes.client.CoreV1Api(env.api_client())
        ...                          # pods bound to env.node_name really run

The kubelet uses the cgroupfs driver on this machine's hybrid layout (every v1 controller its
own mount, plus name=systemd and the unified v2 mount): pods' cgroups are
``/sys/fs/cgroup/<controller>/kubepods/<qos>/pod<uid>/<container>``, as on a cgroupfs node.
There is no kube-proxy: a ClusterIP does not route, so in-cluster clients on the host network
name the apiserver by ``KUBERNETES_SERVICE_HOST=127.0.0.1`` (the test overlay sets it).

What a node changes on the host, and what ``stop()`` undoes:
- ``/sys/fs/cgroup`` is made a shared mount when it is not (a DaemonSet's HostToContainer
  mount needs a shared or slave source; systemd hosts have it already). Left shared.
- the kubelet's ``kubepods`` cgroups in every v1 hierarchy: removed.
- a bridge ``sgnode0`` (10.88.77.0/24), the pods' veths and network namespaces: removed.
- containerd's and the kubelet's state live in the env's temp dir; mounts under it are
  unmounted, and every container shim of this containerd is killed.
- ``/var/log/pods`` entries of the env's pods: removed.
- the kernel settings a 1.20 kubelet sets at start (``KUBELET_SYSCTLS``: overcommit, panic on
  oops, ...): put back as they were.

One node at a time on a machine (a lock in /run), and none where another kubelet runs (k3s,
a real node's): what the teardown removes (the kubepods tree, ``cni-*`` network namespaces,
pod logs) is then this env's alone. The control plane, containerd and the kubelet die with the
test process (PR_SET_PDEATHSIG); what a SIGKILLed test leaves (the container shims and their
containers, mounts, cgroups) is swept when the next node starts.
This module must not import the sloguard package.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from support.kubeenv import (
    KubeTestEnv,
    KubeTestEnvError,
    _free_ports,
    _tail,
    cache_bin_dir,
)

NODE_BINARIES = ("kube-scheduler", "kubelet", "pause")
NODE_CONTROLLERS = ("daemonset,disruption,garbagecollector,namespace,nodelifecycle,podgc,"
                    "replicaset,serviceaccount,serviceaccount-token")
BRIDGE = "sgnode0"
POD_SUBNET = "10.88.77.0/24"
CNI_BIN_DIR = "/usr/lib/cni"
V1_ROOT = Path("/sys/fs/cgroup")
LOCK = Path("/run/sloguard-kubenode.lock")
# What a 1.20 kubelet writes at start unless protectKernelDefaults (kubelet's
# setupKernelTunables): kept and put back, since a test machine is not a node.
KUBELET_SYSCTLS = ("vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic",
                   "kernel/panic_on_oops", "kernel/keys/root_maxkeys",
                   "kernel/keys/root_maxbytes")
POD_LOGS = Path("/var/log/pods")
NETNS_DIR = Path("/var/run/netns")


def pause_image() -> str:
    """The sandbox image's name: upstream's, with the version the cached pause program says
    it is (`pause -v`: "pause.c v3.4" for the 1.20 tree)."""
    out = subprocess.run([str(cache_bin_dir() / "pause"), "-v"], capture_output=True,
                         text=True, timeout=10, check=False).stdout.split()
    version = out[-1].lstrip("v") if out else "unknown"
    return f"k8s.gcr.io/pause:{version}"


def host_ip() -> str:
    """The address of the route out of this host (no packet is sent), else the first global
    IPv4 address: the node's InternalIP, as the kubelet would pick it."""
    done = subprocess.run(["ip", "-4", "-o", "route", "get", "192.0.2.255"],
                          capture_output=True, text=True, timeout=10, check=False)
    words = done.stdout.split()
    if "src" in words:
        return words[words.index("src") + 1]
    done = subprocess.run(["ip", "-4", "-o", "addr", "show", "scope", "global"],
                          capture_output=True, text=True, timeout=10, check=False)
    for line in done.stdout.splitlines():
        return line.split()[3].split("/")[0]
    raise KubeTestEnvError("this host has no global IPv4 address for the node's InternalIP")


def node_prerequisites() -> str:
    """Why a node cannot run here ('' when it can): root, the cached binaries, Debian's
    containerd, runc and CNI plugins (scripts/kube-testenv.sh installs them all)."""
    if os.geteuid() != 0:
        return "a kubelet node needs root"
    bin_dir = cache_bin_dir()
    missing = [n for n in NODE_BINARIES if not os.access(bin_dir / n, os.X_OK)]
    if missing:
        return (f"node binaries missing in {bin_dir}: {', '.join(missing)}; run `bash "
                "scripts/kube-testenv.sh`")
    for tool in ("containerd", "ctr", "runc"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (bash scripts/kube-testenv.sh installs containerd)"
    for tool in ("ip", "mount", "umount", "docker"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    for plugin in ("bridge", "host-local", "loopback"):
        if not os.access(Path(CNI_BIN_DIR) / plugin, os.X_OK):
            return f"CNI plugin {plugin} missing in {CNI_BIN_DIR} (containernetworking-plugins)"
    foreign = foreign_kubelets()
    if foreign:
        return ("a kubelet already runs on this machine (" + "; ".join(foreign)[:300]
                + "): a test node would share its kubepods tree, and its teardown would "
                "remove that kubelet's pods")
    return ""


def foreign_kubelets() -> list[str]:
    """Command lines of kubelets running here that no test node started: a kubelet binary,
    or k3s/k0s/microk8s, which run one inside."""
    found = []
    for cmdline in _live_cmdlines():
        argv = cmdline.split(b"\0")
        name = os.path.basename(argv[0]).decode(errors="replace")
        if (name == "kubelet" or name.startswith(("k3s", "k0s", "kubelite"))) and \
                b"sloguard-kubeenv-" not in cmdline:
            found.append(b" ".join(argv[:3]).decode(errors="replace"))
    return found


def _mounts() -> list[tuple[str, str]]:
    """(mount point, optional fields) of this mount namespace, in mount order."""
    out = []
    with open("/proc/self/mountinfo") as fh:
        for line in fh:
            fields = line.split()
            sep = fields.index("-")
            point = fields[4].replace("\\040", " ")
            out.append((point, " ".join(fields[6:sep])))
    return out


def _unmount_under(root: Path) -> None:
    """Lazily unmount every mount at or under ``root``, deepest first."""
    prefix = str(root).rstrip("/")
    points = [p for p, _ in _mounts() if p == prefix or p.startswith(prefix + "/")]
    for point in sorted(set(points), key=len, reverse=True):
        subprocess.run(["umount", "-l", point], capture_output=True, check=False)


class KubeNodeEnv(KubeTestEnv):
    """The control plane, kube-scheduler, containerd and a kubelet that registers one node.

    ``images``: tags of the local Docker engine's images (``build_images``), piped from
    ``docker save`` into containerd's ``k8s.io`` namespace before the kubelet starts; the
    pause image among them must be tagged ``pause_image()`` (the sandbox image containerd is
    configured with). ``node_labels`` are the kubelet's ``--node-labels``. Attributes once
    started: ``node_name``, ``node_ip`` (the host's own address: the kubelet refuses loopback;
    host-network pods are reached there), ``cri_socket``, ``kubelet_root``.
    """

    authorization_mode = "Node,RBAC"

    def __init__(self, *, node_name: str = "sloguard-node", images: Sequence[str] = (),
                 node_labels: dict[str, str] | None = None, **kwargs: Any) -> None:
        kwargs.setdefault("controllers", NODE_CONTROLLERS)
        super().__init__(**kwargs)
        self.node_name = node_name
        self.node_ip = ""
        self.images = list(images)
        self.node_labels = dict(node_labels or {})
        self.kubelet_token = self.add_token(f"system:node:{node_name}", ["system:nodes"])
        self.cri_socket = ""
        self.kubelet_root: Path | None = None
        self._netns_before: set[str] = set()
        self._pod_logs_before: set[str] = set()
        self._node_started = False
        self.image_log: list[str] = []

    # ---------------------------------------------------------------------- lifecycle
    def start(self) -> None:
        reason = node_prerequisites()
        if reason:
            raise KubeTestEnvError(reason)
        import fcntl

        self._lock = open(LOCK, "w")  # noqa: SIM115 - held for the node's lifetime
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lock.close()
            raise KubeTestEnvError(f"another test node runs on this machine ({LOCK} is "
                                   "held): one at a time") from None
        sweep_stale_nodes()
        self._sysctls = {key: (Path("/proc/sys") / key).read_text()
                         for key in KUBELET_SYSCTLS if (Path("/proc/sys") / key).exists()}
        try:
            super().start()
        except BaseException:
            self._release()
            raise
        try:
            self._node_started = True
            self._netns_before = set(os.listdir(NETNS_DIR)) if NETNS_DIR.is_dir() else set()
            self._pod_logs_before = set(os.listdir(POD_LOGS)) if POD_LOGS.is_dir() else set()
            self._share_cgroup_mount()
            self._start_scheduler()
            self._start_containerd()
            for image in self.images:
                self._import_image(image)
            self.node_ip = host_ip()
            self._start_kubelet()
            self._wait_node_ready()
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Pods deleted (the kubelet stops them and tears their network down), the kubelet
        and containerd stopped, then whatever a crash could have left: shims, mounts, network
        namespaces, the bridge, the kubepods cgroups, the pods' log dirs."""
        errors: list[str] = []

        def attempt(step: Any, *args: Any) -> None:
            try:
                step(*args)
            except Exception as exc:  # every other step still runs; reported at the end
                errors.append(f"{getattr(step, '__name__', step)}: {exc!r}")

        if self._node_started:
            self._node_started = False
            attempt(self._drain_pods)
            attempt(self._stop_named, "kubelet")
            attempt(self._stop_named, "containerd")
            attempt(self._kill_shims)
            if self.workdir is not None:
                attempt(_unmount_under, self.workdir)
            attempt(self._remove_netns)
            attempt(_delete_bridge)
            attempt(self._remove_kubepods)
            attempt(self._remove_pod_logs)
        try:
            super().stop()
        finally:
            attempt(self._release)
        if errors:
            raise KubeTestEnvError("the node's teardown left things behind: "
                                   + "; ".join(errors))

    def _release(self) -> None:
        """The kernel settings back as they were, and the machine's node lock let go."""
        for key, value in getattr(self, "_sysctls", {}).items():
            with contextlib.suppress(OSError):
                (Path("/proc/sys") / key).write_text(value)
        self._sysctls = {}
        lock = getattr(self, "_lock", None)
        if lock is not None and not lock.closed:
            lock.close()

    # ------------------------------------------------------------------------ helpers
    def ctr(self, *args: str, timeout: float = 60) -> str:
        """Run Debian's ``ctr`` against this node's containerd (namespace k8s.io)."""
        done = subprocess.run(["ctr", "--address", self.cri_socket, "--namespace", "k8s.io",
                               *args], capture_output=True, text=True, timeout=timeout,
                              check=False)
        if done.returncode != 0:
            raise KubeTestEnvError(f"ctr {' '.join(args)} failed: {done.stderr[-2000:]}")
        return done.stdout

    def _import_image(self, tag: str) -> None:
        started = time.monotonic()
        save = subprocess.Popen(["docker", "save", tag], stdout=subprocess.PIPE)
        try:
            done = subprocess.run(["ctr", "--address", self.cri_socket, "--namespace", "k8s.io",
                                   "images", "import", "-"], stdin=save.stdout,
                                  capture_output=True, text=True, timeout=600, check=False)
        finally:
            assert save.stdout is not None
            save.stdout.close()
            save.wait(timeout=60)
        if done.returncode != 0 or save.returncode != 0:
            raise KubeTestEnvError(f"importing {tag} into the node's containerd failed: "
                                   f"{done.stderr[-2000:]}")
        self.image_log.append(f"{tag} imported in {time.monotonic() - started:.0f} s")

    def running_tasks(self) -> list[str]:
        """Container ids with a task in this node's containerd (sandboxes included)."""
        out = self.ctr("tasks", "ls", "-q")
        return [line for line in out.split() if line]

    def pod_log(self, namespace: str, pod: str, container: str) -> str:
        """The container's log as the kubelet keeps it (there is no `kubectl logs` path:
        the apiserver holds no kubelet client credentials here)."""
        if not POD_LOGS.is_dir():
            return ""
        texts = []
        for entry in sorted(os.listdir(POD_LOGS)):
            if entry.startswith(f"{namespace}_{pod}_"):
                folder = POD_LOGS / entry / container
                for log in sorted(folder.glob("*.log")) if folder.is_dir() else []:
                    texts.append(log.read_text(errors="replace"))
        return "".join(texts)

    # ---------------------------------------------------------------------- internals
    def _admission_args(self) -> list[str]:
        return []  # the defaults of 1.20, ServiceAccount among them: pods get their tokens

    def _controller_manager_args(self) -> list[str]:
        pki = self._dir("pki")
        return [f"--service-account-private-key-file={pki / 'sa.key'}",
                f"--root-ca-file={pki / 'ca.crt'}",
                "--node-monitor-grace-period=40s", "--pod-eviction-timeout=5m"]

    def _share_cgroup_mount(self) -> None:
        for point, optional in _mounts():
            if point == str(V1_ROOT):
                if "shared:" not in optional and "master:" not in optional:
                    subprocess.run(["mount", "--make-rshared", str(V1_ROOT)], check=True,
                                   capture_output=True)
                return

    def _start_scheduler(self) -> None:
        [port] = _free_ports(1)
        kubeconfig = self.kubeconfig_path(self.admin_token)
        proc = self._spawn("kube-scheduler", [
            str(self.bin_dir / "kube-scheduler"),
            f"--kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            "--leader-elect=false", "--bind-address=127.0.0.1", f"--secure-port={port}",
            "--port=0", f"--cert-dir={self._dir('kube-scheduler')}", "--v=1",
        ])
        self._wait_until(proc, "kube-scheduler /healthz",
                         lambda: _https_ok(f"https://127.0.0.1:{port}/healthz"), timeout=60)

    def _start_containerd(self) -> None:
        base = self._dir("containerd")
        self.cri_socket = str(base / "containerd.sock")
        cni_conf = self._dir("cni-conf")
        (cni_conf / "10-sgnode.conflist").write_text(json.dumps({
            "cniVersion": "0.4.0", "name": "sgnode",
            "plugins": [{"type": "bridge", "bridge": BRIDGE, "isGateway": True,
                         "ipMasq": False, "hairpinMode": True,
                         "ipam": {"type": "host-local", "ranges": [[{"subnet": POD_SUBNET}]],
                                  "dataDir": str(self._dir("cni-ipam"))}}],
        }, indent=1) + "\n")
        (cni_conf / "99-loopback.conf").write_text(json.dumps(
            {"cniVersion": "0.4.0", "name": "lo", "type": "loopback"}) + "\n")
        config = base / "config.toml"
        config.write_text(f"""version = 2
root = "{base / 'root'}"
state = "{base / 'state'}"
[grpc]
  address = "{self.cri_socket}"
[ttrpc]
  address = "{self.cri_socket}.ttrpc"
[debug]
  level = "info"
[metrics]
  address = ""
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{pause_image()}"
  enable_selinux = false
  disable_apparmor = true
  # This machine refuses a lower oom_score_adj than our own (no CAP_SYS_RESOURCE in the
  # sandbox): the sandboxes ask for -998, and runc dies on it. containerd then caps the value
  # at its own, as it does for rootless nodes.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "{base / 'runc'}"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{CNI_BIN_DIR}"
    conf_dir = "{cni_conf}"
    max_conf_num = 1
""")
        proc = self._spawn("containerd", ["containerd", "--config", str(config)])

        def serving() -> bool:
            done = subprocess.run(["ctr", "--address", self.cri_socket, "version"],
                                  capture_output=True, timeout=10, check=False)
            return done.returncode == 0

        self._wait_until(proc, "containerd's socket", serving, timeout=60)

    def _start_kubelet(self) -> None:
        root = self.kubelet_root = self._dir("kubelet")
        port, healthz = _free_ports(2)
        kubeconfig = self.kubeconfig_path(self.kubelet_token)
        config = self._dir("kubelet-config") / "kubelet.yaml"
        config.write_text(json.dumps({
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "cgroupDriver": "cgroupfs",
            "cgroupsPerQOS": True,
            "enforceNodeAllocatable": ["pods"],
            "failSwapOn": False,
            "address": "127.0.0.1", "port": port, "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1", "healthzPort": healthz,
            "authentication": {"anonymous": {"enabled": False},
                               "webhook": {"enabled": False},
                               "x509": {"clientCAFile": self.ca_file}},
            "authorization": {"mode": "AlwaysAllow"},
            "makeIPTablesUtilChains": False,
            "resolvConf": "/etc/resolv.conf",
            "nodeStatusUpdateFrequency": "5s",
            "syncFrequency": "10s",
            "fileCheckFrequency": "10s",
            "serializeImagePulls": False,
            # This shared test machine's disk may be fuller than a node's defaults allow; the
            # node must not evict the tests' pods for it.
            "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%",
                             "imagefs.available": "1%", "nodefs.inodesFree": "1%"},
            "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,
            "maxPods": 30,
        }, indent=1) + "\n")
        labels = ",".join(f"{k}={v}" for k, v in sorted(self.node_labels.items()))
        argv = [
            str(self.bin_dir / "kubelet"),
            f"--config={config}",
            f"--kubeconfig={kubeconfig}",
            f"--root-dir={root}",
            f"--cert-dir={self._dir('kubelet-pki')}",
            f"--hostname-override={self.node_name}",
            f"--node-ip={self.node_ip}",
            "--container-runtime=remote",
            f"--container-runtime-endpoint=unix://{self.cri_socket}",
            "--runtime-request-timeout=5m",
            f"--pod-infra-container-image={pause_image()}",
            "--v=1",
        ]
        if labels:
            argv.append(f"--node-labels={labels}")
        proc = self._spawn("kubelet", argv)
        self._wait_until(proc, "kubelet /healthz",
                         lambda: _http_ok(f"http://127.0.0.1:{healthz}/healthz"), timeout=90)

    def _wait_node_ready(self, timeout: float = 120) -> None:
        from kubernetes import client

        api = client.CoreV1Api(self.api_client())
        kubelet = next(p for p in self._procs if p.name == "kubelet")

        def ready() -> bool:
            try:
                node = api.read_node(self.node_name)
            except client.ApiException:
                return False
            return any(c.type == "Ready" and c.status == "True"
                       for c in node.status.conditions or [])

        self._wait_until(kubelet, f"node {self.node_name} Ready", ready, timeout=timeout)

    def _drain_pods(self, timeout: float = 90) -> None:
        from kubernetes import client

        api = client.CoreV1Api(self.api_client())
        with contextlib.suppress(client.ApiException):  # DaemonSets would re-create theirs
            for ds in client.AppsV1Api(self.api_client()).list_daemon_set_for_all_namespaces(
                    ).items:
                client.AppsV1Api(self.api_client()).delete_namespaced_daemon_set(
                    ds.metadata.name, ds.metadata.namespace,
                    body=client.V1DeleteOptions(propagation_policy="Orphan"))
        deadline = time.monotonic() + timeout
        for pod in api.list_pod_for_all_namespaces(
                field_selector=f"spec.nodeName={self.node_name}").items:
            with contextlib.suppress(client.ApiException):
                api.delete_namespaced_pod(pod.metadata.name, pod.metadata.namespace,
                                          grace_period_seconds=0)
        while self.running_tasks() and time.monotonic() < deadline:
            time.sleep(0.5)

    def _stop_named(self, name: str) -> None:
        for proc in list(self._procs):
            if proc.name == name:
                proc.stop(self.stop_grace)
                self._procs.remove(proc)

    def _kill_shims(self) -> None:
        if not self.cri_socket:
            return
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                cmdline = (Path("/proc") / entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if cmdline and cmdline[0].endswith(b"containerd-shim-runc-v2") and \
                    self.cri_socket.encode() in b" ".join(cmdline):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(int(entry), signal.SIGKILL)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(entry), signal.SIGKILL)

    def _remove_netns(self) -> None:
        if not NETNS_DIR.is_dir():
            return
        for name in set(os.listdir(NETNS_DIR)) - self._netns_before:
            if name.startswith("cni-"):
                path = NETNS_DIR / name
                subprocess.run(["umount", "-l", str(path)], capture_output=True, check=False)
                with contextlib.suppress(OSError):
                    path.unlink()

    def _remove_kubepods(self) -> None:
        for hierarchy in V1_ROOT.iterdir() if V1_ROOT.is_dir() else []:
            top = hierarchy / "kubepods"
            if not top.is_dir():
                continue
            for dirpath, _dirs, _files in sorted(os.walk(top), key=lambda w: -len(w[0])):
                for _ in range(50):  # a cgroup whose last task is still exiting is busy
                    try:
                        os.rmdir(dirpath)
                        break
                    except FileNotFoundError:
                        break
                    except OSError:
                        _kill_tasks(Path(dirpath))
                        time.sleep(0.1)
                else:
                    raise KubeTestEnvError(f"cgroup {dirpath} could not be removed")

    def _remove_pod_logs(self) -> None:
        if POD_LOGS.is_dir():
            for name in set(os.listdir(POD_LOGS)) - self._pod_logs_before:
                shutil.rmtree(POD_LOGS / name, ignore_errors=True)
        containers = Path("/var/log/containers")
        if containers.is_dir():
            for link in containers.iterdir():
                if link.is_symlink() and not link.exists():
                    with contextlib.suppress(OSError):
                        link.unlink()

    def diagnostics(self) -> str:
        """The last lines of every process's log, for a failed test's message."""
        parts = []
        for name in ("kubelet", "containerd", "kube-scheduler", "kube-controller-manager"):
            with contextlib.suppress(KubeTestEnvError):
                parts.append(f"--- {name}\n{_tail(self.log_path(name), 30)}")
        return "\n".join(parts)


def _live_cmdlines() -> list[bytes]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                out.append((Path("/proc") / entry / "cmdline").read_bytes())
    return out


def sweep_stale_nodes() -> None:
    """What a test node killed without its teardown left (its kubelet, containerd, and the
    control plane die with the test process, the container shims and mounts do not): shims
    and mounts of env dirs no live containerd uses, then the kubepods cgroups and the bridge
    when no kubelet runs. A live node (another session's) is left alone."""
    cmdlines = _live_cmdlines()
    kubelet_alive = any(c.split(b"\0")[0].endswith(b"/kubelet") for c in cmdlines)
    for workdir in Path(tempfile.gettempdir()).glob("sloguard-kubeenv-*"):
        marker = str(workdir).encode()
        if not (workdir / "containerd").is_dir():
            continue
        if any(c.startswith(b"containerd\0") and marker in c for c in cmdlines):
            continue
        for entry in os.listdir("/proc"):
            with contextlib.suppress(OSError, ValueError):
                cmdline = (Path("/proc") / entry / "cmdline").read_bytes()
                if b"containerd-shim" in cmdline and marker in cmdline:
                    os.kill(int(entry), signal.SIGKILL)
        _unmount_under(workdir)
        shutil.rmtree(workdir, ignore_errors=True)
    if not kubelet_alive:
        stale = KubeNodeEnv.__new__(KubeNodeEnv)
        stale._netns_before = set()
        stale._remove_kubepods()
        _delete_bridge()


def _delete_bridge() -> None:
    subprocess.run(["ip", "link", "delete", BRIDGE], capture_output=True, check=False)


def _kill_tasks(cgroup: Path) -> None:
    with contextlib.suppress(OSError):
        for line in (cgroup / "cgroup.procs").read_text().split():
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(line), signal.SIGKILL)


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status == 200
    except urllib.error.HTTPError:
        return False


def _https_ok(url: str) -> bool:
    import ssl

    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE  # the component's own throw-away self-signed cert
    try:
        with urllib.request.urlopen(url, timeout=5, context=context) as resp:
            return resp.status == 200
    except urllib.error.HTTPError:
        return False


WORKLOAD_IMAGE = "sloguard-lab/workload:1"  # deploy/lab/workload.Dockerfile


def build_images(out: Path, root: Path, agent_image: str | None,
                 log: Any = print, pause: bool = True) -> list[str]:
    """The node's images, without a registry, built by the local Docker engine: the
    agent from deploy/Dockerfile (tagged as the DaemonSet names it), the pause image from the
    cached pause program, the LS/BE workload image (deploy/lab/, the lab's). Docker's layer cache
    makes a second build quick; the image test (tests/test_deploy.py) builds the same agent
    layers. The build host's local CAs reach the agent's build stage as the image test passes
    them (a TLS-intercepting proxy's CA). ``agent_image`` None: no agent (the lab's node).
    ``pause`` False: no pause image (`make test-deps` builds the rest while the Kubernetes
    build, which makes the pause program, still runs)."""
    assets = root / "tests" / "kube-node"
    local_cas = sorted(Path("/usr/local/share/ca-certificates").glob("*.crt"))
    ca_args = (["--build-arg", "PIP_CA_PEM=" + "".join(p.read_text() for p in local_cas)]
               if local_cas else [])
    builds = []
    if pause:
        pause_ctx = out / "pause-context"
        pause_ctx.mkdir(parents=True, exist_ok=True)
        shutil.copy2(cache_bin_dir() / "pause", pause_ctx / "pause")
        builds.append((pause_image(), ["-f", str(assets / "pause.Dockerfile"), str(pause_ctx)]))
    builds.append((WORKLOAD_IMAGE, ["-f", str(root / "deploy" / "lab" / "workload.Dockerfile"),
                                    str(root / "deploy" / "lab")]))
    if agent_image:
        builds.append((agent_image, ["-f", str(root / "deploy" / "Dockerfile"), *ca_args,
                                     str(root)]))
    for tag, args in builds:
        started = time.monotonic()
        done = subprocess.run(["docker", "build", "-q", "-t", tag, *args], capture_output=True,
                              text=True, timeout=1800, check=False)
        if done.returncode != 0:
            raise KubeTestEnvError(f"docker build of {tag} failed:\n{done.stdout[-2000:]}"
                                   f"{done.stderr[-3000:]}")
        log(f"node image {tag}: built in {time.monotonic() - started:.0f} s")
    return [tag for tag, _ in builds]


def daemonset_image(root: Path) -> str:
    """The agent image as deploy/base's DaemonSet names it (the node fixture's tag)."""
    import yaml

    daemonset = yaml.safe_load((root / "deploy" / "base" / "daemonset.yaml").read_text())
    [agent] = daemonset["spec"]["template"]["spec"]["containers"]
    return agent["image"]


def main(argv: Sequence[str] | None = None) -> int:
    """Hold a test node up until Ctrl-C, for what a test does not run: a full
    ``sloguard lab --kube`` comparison (docs/lab.md). The same node as the ``kube_node``
    fixture's, with the same safeguards (one per machine, refused beside another kubelet)."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m support.kubenode",
                                     description=main.__doc__)
    parser.add_argument("--agent-image", default=None,
                        help="also build and import the agent image with this tag")
    parser.add_argument("--work", type=Path, default=None, help="where the images are built")
    parser.add_argument("--images-only", action="store_true",
                        help="build the agent and workload images into Docker's layer cache "
                             "and exit, no node (make test-deps: the image test and the node "
                             "fixture then build from the cache)")
    args = parser.parse_args(argv)
    root = Path(__file__).resolve().parents[2]
    work = args.work or Path(tempfile.mkdtemp(prefix="sloguard-node-images-"))
    if args.images_only:
        build_images(work, root, args.agent_image or daemonset_image(root), pause=False)
        return 0
    images = build_images(work, root, args.agent_image)
    stop = False

    def _stop(signum: int, frame: Any) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    with KubeNodeEnv(images=images) as env:
        print(f"node {env.node_name} Ready; kubeconfig {env.kubeconfig_path()}", flush=True)
        print("Ctrl-C (or SIGTERM) stops it and undoes what it changed", flush=True)
        while not stop:
            time.sleep(0.5)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
