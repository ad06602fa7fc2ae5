"""A real, throw-away Kubernetes control plane for integration tests.

``KubeTestEnv`` starts etcd, kube-apiserver (v1.20.2) and kube-controller-manager from the
binaries cached by ``scripts/kube-testenv.sh`` (default cache:
``/var/cache/sloguard/kube/bin``, override with ``SLOGUARD_KUBE_CACHE``), on free loopback
ports and in a private temp dir, and tears everything down on exit::

    env = KubeTestEnv()
    viewer = env.add_token("viewer", ["viewers"])      # before start
    with env:
        api = kubernetes.client.CoreV1Api(env.api_client())
        ...

There is no kubelet, no scheduler and no node-lifecycle controller: pods stay where
``spec.nodeName`` puts them, their status must be written through the status subresource, and
a pod evicted or deleted with a grace period stays Terminating until deleted with grace 0.

This module must not import the sloguard package.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import fcntl
import json
import os
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kubernetes.client import ApiClient

SETUP_SCRIPT = "scripts/kube-testenv.sh"
DEFAULT_CACHE_DIR = "/var/cache/sloguard/kube"
REQUIRED_BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager")
KUBE_VERSION = "v1.20.2"
CONTROLLERS = "disruption,podgc,garbagecollector,namespace"
SERVICE_CLUSTER_IP_RANGE = "10.96.0.0/24"
SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"


class KubeTestEnvError(RuntimeError):
    """The test control plane could not be started."""


class KubeBinariesMissing(KubeTestEnvError):
    """The cached control-plane binaries are not there: run the setup script."""


def cache_bin_dir() -> Path:
    """Directory where ``scripts/kube-testenv.sh`` caches the binaries."""
    return Path(os.environ.get("SLOGUARD_KUBE_CACHE") or DEFAULT_CACHE_DIR) / "bin"


def background_build_log() -> Path:
    """Where ``scripts/kube-testenv.sh --background`` writes its build's output."""
    return cache_bin_dir().parent / "background-build.log"


def build_running() -> bool:
    """True while a ``scripts/kube-testenv.sh`` holds the cache's lock (builds or verifies)."""
    lock = cache_bin_dir().parent / ".lock"
    try:
        with open(lock, "rb") as f:
            try:
                fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
            fcntl.flock(f, fcntl.LOCK_UN)
    except FileNotFoundError:
        pass
    return False


def wait_for_background_build(progress: Callable[[str], None] = lambda line: None,
                              every: float = 60.0, poll: float = 1.0) -> float:
    """Returns once no ``scripts/kube-testenv.sh`` holds the cache's lock; the seconds waited.

    ``make test`` starts the Kubernetes build in the background (``--background``: its
    compile at idle CPU priority) and runs the installs and the tests that need no Kubernetes
    meanwhile (tests/conftest.py orders them first); a Kubernetes test that arrives before the
    build has finished waits here, with a line of progress every ``every`` seconds, instead of
    finding the binaries missing. Without a build running it returns at once."""
    started = time.monotonic()
    told = started
    if build_running():
        progress(f"waiting for the Kubernetes build running in the background "
                 f"(log: {background_build_log()})")
    while build_running():
        time.sleep(poll)
        now = time.monotonic()
        if now - told >= every:
            told = now
            progress(f"still building after {now - started:.0f} s: "
                     f"{_last_line(background_build_log())}")
    waited = time.monotonic() - started
    if waited >= poll:
        progress(f"the Kubernetes build finished; waited {waited:.0f} s")
    return waited


def _last_line(path: Path) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - 4096))
            lines = f.read().decode(errors="replace").strip().splitlines()
    except OSError:
        return "(no log)"
    return lines[-1][:200] if lines else "(log empty)"


def missing_binaries(bin_dir: Path | None = None) -> list[str]:
    """Names of the required binaries that are absent (or not executable) in ``bin_dir``."""
    directory = bin_dir or cache_bin_dir()
    return [
        name
        for name in REQUIRED_BINARIES
        if not (directory / name).is_file() or not os.access(directory / name, os.X_OK)
    ]


def missing_binaries_message(bin_dir: Path | None = None) -> str:
    """Human readable explanation of what is missing and how to fix it ('' if nothing)."""
    directory = bin_dir or cache_bin_dir()
    missing = missing_binaries(directory)
    if not missing:
        return ""
    failed = ""
    if bin_dir is None and background_build_log().exists():
        failed = (f"; the last background build's log ({background_build_log()}) ends: "
                  f"{_last_line(background_build_log())}")
    return (
        f"kube test binaries missing in {directory}: {', '.join(missing)}; "
        f"run `bash {SETUP_SCRIPT}` (as root; honours SLOGUARD_KUBE_CACHE) to build them"
        + failed
    )


def find_binaries(bin_dir: Path | None = None) -> dict[str, Path]:
    """Paths of the required binaries; raises ``KubeBinariesMissing`` naming the script."""
    directory = bin_dir or cache_bin_dir()
    message = missing_binaries_message(directory)
    if message:
        raise KubeBinariesMissing(message)
    return {name: directory / name for name in REQUIRED_BINARIES}


def _free_ports(count: int) -> list[int]:
    """Distinct free TCP ports on 127.0.0.1 (all sockets held open while choosing)."""
    sockets: list[socket.socket] = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for sock in sockets:
            sock.close()


def _tail(path: Path, lines: int = 40) -> str:
    try:
        content = path.read_text(errors="replace").splitlines()
    except OSError as exc:
        return f"<cannot read {path}: {exc}>"
    return "\n".join(content[-lines:])


def _run(cmd: Sequence[str], cwd: Path) -> None:
    result = subprocess.run(
        list(cmd), cwd=cwd, capture_output=True, text=True, stdin=subprocess.DEVNULL, check=False
    )
    if result.returncode != 0:
        raise KubeTestEnvError(
            f"command failed ({result.returncode}): {' '.join(cmd)}\n{result.stderr[-2000:]}"
        )


_PRCTL = ctypes.CDLL(None, use_errno=True).prctl  # loaded here: no dlopen in a forked child
_PR_SET_PDEATHSIG = 1


def _die_with_parent(parent: int) -> Callable[[], None]:
    """For the child, before exec: SIGKILL when the test process dies, however it dies (a
    SIGKILLed pytest runs no atexit hook; its servers must not outlive it). The signal follows
    the thread that started the child: start envs from the main thread."""

    def arm() -> None:
        _PRCTL(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:  # the parent died before the signal was armed
            os._exit(1)

    return arm


class _Process:
    """A child process in its own session, logging to a file; killed if the test process
    dies."""

    def __init__(self, name: str, argv: list[str], log_path: Path) -> None:
        self.name = name
        self.argv = argv
        self.log_path = log_path
        self._log: IO[bytes] = open(log_path, "ab")  # noqa: SIM115 - closed in stop()
        try:
            self.popen = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=self._log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                close_fds=True,
                preexec_fn=_die_with_parent(os.getpid()),
            )
        except BaseException:
            self._log.close()
            raise

    def alive(self) -> bool:
        return self.popen.poll() is None

    def _signal_group(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.popen.pid, sig)

    def stop(self, grace: float) -> None:
        if self.alive():
            self._signal_group(signal.SIGTERM)
            try:
                self.popen.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                self._signal_group(signal.SIGKILL)
                self.popen.wait(timeout=10)
        # Kill anything the process may have left in its session.
        self._signal_group(signal.SIGKILL)
        self._log.close()


class KubeTestEnv:
    """etcd + kube-apiserver + kube-controller-manager on loopback, as a context manager.

    Attributes available once started: ``server`` (https URL), ``ca_file`` (CA bundle that
    verifies the serving certificate), ``insecure`` (always False: TLS is verified),
    ``admin_token`` (user ``admin``, group ``system:masters``), ``workdir`` (temp dir holding
    data, certificates, kubeconfigs and the ``*.log`` file of each process).

    With ``audit=True`` the apiserver writes an audit log (every request at the Metadata level:
    who, verb, resource, subresource, response code), read back with ``audit_events()``: the
    record of what a client really asked for, which is what a least-privilege check needs.
    """

    def __init__(
        self,
        bin_dir: Path | str | None = None,
        *,
        start_timeout: float = 120.0,
        stop_grace: float = 5.0,
        controllers: str = CONTROLLERS,
        keep_workdir: bool = False,
        audit: bool = False,
    ) -> None:
        self.bin_dir = Path(bin_dir) if bin_dir is not None else cache_bin_dir()
        self.start_timeout = start_timeout
        self.stop_grace = stop_grace
        self.controllers = controllers
        self.keep_workdir = keep_workdir or bool(os.environ.get("SLOGUARD_KUBEENV_KEEP"))
        self.audit = audit
        self.admin_token = secrets.token_hex(24)
        self.insecure = False
        self.server = ""
        self.workdir: Path | None = None
        self._tokens: list[tuple[str, str, list[str]]] = [
            (self.admin_token, "admin", ["system:masters"])
        ]
        self._procs: list[_Process] = []
        self._started = False
        self._kubeconfigs: dict[str, Path] = {}

    # ------------------------------------------------------------------ configuration
    def add_token(self, user: str, groups: Sequence[str] = ()) -> str:
        """Register a bearer token for ``user`` in ``groups``; call before ``start()``."""
        if self._started:
            raise KubeTestEnvError("add_token() must be called before the env is started")
        for ch in ',"\n':
            if ch in user or any(ch in g for g in groups):
                raise ValueError(f"user and group names must not contain {ch!r}")
        token = secrets.token_hex(24)
        self._tokens.append((token, user, list(groups)))
        return token

    def token_of(self, user: str) -> str:
        """The token registered for ``user`` by ``add_token`` (the first one)."""
        for token, name, _ in self._tokens:
            if name == user:
                return token
        raise KeyError(f"no token registered for {user!r}")

    @property
    def ca_file(self) -> str:
        """Path of the CA certificate that signed the apiserver's serving certificate."""
        return str(self._dir("pki") / "ca.crt")

    @property
    def kubectl_path(self) -> str | None:
        """The cached kubectl v1.20.2 (use with ``--kubeconfig``), or None if absent."""
        path = self.bin_dir / "kubectl"
        return str(path) if os.access(path, os.X_OK) else None

    def audit_events(self, user: str | None = None) -> list[dict[str, Any]]:
        """The apiserver's audit events so far, of ``user`` if given: one per request at
        ResponseComplete (or Panic), plus ResponseStarted for long-running ones (watch).

        Each is the audit.k8s.io/v1 Event as logged: ``verb``, ``user.username``,
        ``objectRef`` (``apiGroup``, ``resource``, ``subresource``, ``namespace``, ``name``;
        absent for non-resource URLs such as /apis), ``responseStatus.code``.
        """
        if not self.audit:
            raise KubeTestEnvError("the env was started without audit=True")
        events = []
        with open(self._dir("kube-apiserver") / "audit.log") as fh:
            for line in fh:
                if not line.endswith("\n"):
                    break  # a line still being written
                event = json.loads(line)
                if user is None or event.get("user", {}).get("username") == user:
                    events.append(event)
        return events

    def log_path(self, process: str) -> Path:
        """Log file of ``etcd``, ``kube-apiserver`` or ``kube-controller-manager``."""
        return self._dir(process) / f"{process}.log"

    # ---------------------------------------------------------------------- lifecycle
    def __enter__(self) -> KubeTestEnv:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> None:
        """Start all processes; on any failure everything already started is stopped."""
        if self._started:
            raise KubeTestEnvError("KubeTestEnv already started")
        binaries = find_binaries(self.bin_dir)
        self._started = True
        self.workdir = Path(tempfile.mkdtemp(prefix="sloguard-kubeenv-"))
        atexit.register(self.stop)
        try:
            etcd_client, etcd_peer, api_port, kcm_port = _free_ports(4)
            self._write_pki()
            self._write_token_file()
            self._start_etcd(binaries["etcd"], etcd_client, etcd_peer)
            self._start_apiserver(binaries["kube-apiserver"], etcd_client, api_port)
            if self.controllers:
                self._start_controller_manager(binaries["kube-controller-manager"], kcm_port)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Terminate the processes (SIGTERM, then SIGKILL) and remove the temp dir."""
        atexit.unregister(self.stop)
        errors: list[BaseException] = []
        for proc in reversed(self._procs):
            try:
                proc.stop(self.stop_grace)
            except Exception as exc:  # keep stopping the others
                errors.append(exc)
        self._procs.clear()
        if self.workdir is not None and not self.keep_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)
        if errors:
            raise KubeTestEnvError(f"errors while stopping: {errors}")

    # -------------------------------------------------------------------- client side
    def kubeconfig_path(self, token: str | None = None) -> str:
        """Write (once) and return a kubeconfig file that authenticates with ``token``."""
        token = token or self.admin_token
        if not self.server:
            raise KubeTestEnvError("the env is not started")
        path = self._kubeconfigs.get(token)
        if path is None:
            path = self._dir("kubeconfigs") / f"kubeconfig-{len(self._kubeconfigs)}.json"
            self._write_kubeconfig(path, token)
            self._kubeconfigs[token] = path
        return str(path)

    def api_client(self, token: str | None = None) -> ApiClient:
        """An official ``kubernetes`` client ``ApiClient`` using ``token`` (default: admin)."""
        from kubernetes import client

        if not self.server:
            raise KubeTestEnvError("the env is not started")
        config = client.Configuration()
        config.host = self.server
        config.ssl_ca_cert = self.ca_file
        config.verify_ssl = True
        config.api_key = {"authorization": token or self.admin_token}
        config.api_key_prefix = {"authorization": "Bearer"}
        return client.ApiClient(config)

    # ---------------------------------------------------------------------- internals
    # With no kubelet, no pod needs a service-account token: the admission plugin that would
    # refuse pods until a namespace's `default` account exists stays off. KubeNodeEnv
    # (support/kubenode.py) turns it on, with the Node authorizer for its kubelet.
    authorization_mode = "RBAC"

    def _admission_args(self) -> list[str]:
        return ["--disable-admission-plugins=ServiceAccount"]

    def _controller_manager_args(self) -> list[str]:
        return []

    def _dir(self, name: str) -> Path:
        if self.workdir is None:
            raise KubeTestEnvError("the env is not started")
        path = self.workdir / name
        path.mkdir(mode=0o700, exist_ok=True)
        return path

    def _write_pki(self) -> None:
        pki = self._dir("pki")
        ext = pki / "server.ext"
        ext.write_text(
            "basicConstraints=critical,CA:FALSE\n"
            "keyUsage=critical,digitalSignature,keyEncipherment\n"
            "extendedKeyUsage=serverAuth\n"
            "subjectKeyIdentifier=hash\n"
            "authorityKeyIdentifier=keyid\n"
            "subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:kubernetes,"
            "DNS:kubernetes.default,DNS:kubernetes.default.svc\n"
        )
        steps: list[list[str]] = [
            ["openssl", "genrsa", "-out", "ca.key", "2048"],
            [
                "openssl", "req", "-x509", "-new", "-key", "ca.key", "-sha256", "-days", "2",
                "-subj", "/CN=sloguard-kubeenv-ca", "-out", "ca.crt",
                "-addext", "basicConstraints=critical,CA:TRUE",
                "-addext", "keyUsage=critical,keyCertSign,cRLSign,digitalSignature",
            ],
            ["openssl", "genrsa", "-out", "server.key", "2048"],
            [
                "openssl", "req", "-new", "-key", "server.key", "-subj", "/CN=kube-apiserver",
                "-out", "server.csr",
            ],
            [
                "openssl", "x509", "-req", "-in", "server.csr", "-CA", "ca.crt",
                "-CAkey", "ca.key", "-CAcreateserial", "-sha256", "-days", "2",
                "-extfile", "server.ext", "-out", "server.crt",
            ],
            ["openssl", "genrsa", "-out", "sa.key", "2048"],
        ]  # fmt: skip
        for cmd in steps:
            _run(cmd, cwd=pki)

    def _write_token_file(self) -> None:
        lines = []
        for token, user, groups in self._tokens:
            line = f"{token},{user},{user}"
            if groups:
                line += ',"' + ",".join(groups) + '"'
            lines.append(line)
        path = self._dir("apiserver-auth") / "tokens.csv"
        path.write_text("\n".join(lines) + "\n")
        path.chmod(0o600)

    def _write_kubeconfig(self, path: Path, token: str) -> None:
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "kubeenv",
                    "cluster": {"server": self.server, "certificate-authority": self.ca_file},
                }
            ],
            "users": [{"name": "user", "user": {"token": token}}],
            "contexts": [{"name": "kubeenv", "context": {"cluster": "kubeenv", "user": "user"}}],
            "current-context": "kubeenv",
        }
        path.write_text(json.dumps(config, indent=2) + "\n")  # JSON is valid YAML
        path.chmod(0o600)

    def _spawn(self, name: str, argv: list[str]) -> _Process:
        proc = _Process(name, argv, self.log_path(name))
        self._procs.append(proc)
        return proc

    def _wait_until(
        self,
        proc: _Process,
        what: str,
        probe: Callable[[], bool],
        timeout: float | None = None,
    ) -> None:
        deadline = time.monotonic() + (timeout or self.start_timeout)
        last_error = ""
        while True:
            if not proc.alive():
                raise KubeTestEnvError(
                    f"{proc.name} exited with code {proc.popen.returncode} before {what}; "
                    f"last lines of {proc.log_path}:\n{_tail(proc.log_path)}"
                )
            try:
                if probe():
                    return
            except (OSError, urllib.error.URLError, ValueError) as exc:
                last_error = str(exc)
            if time.monotonic() > deadline:
                raise KubeTestEnvError(
                    f"timed out after {timeout or self.start_timeout:.0f} s waiting for {what} "
                    f"(last error: {last_error or 'none'}); last lines of {proc.log_path}:\n"
                    f"{_tail(proc.log_path)}"
                )
            time.sleep(0.2)

    def _start_etcd(self, binary: Path, client_port: int, peer_port: int) -> None:
        data = self._dir("etcd") / "data"
        client_url = f"http://127.0.0.1:{client_port}"
        peer_url = f"http://127.0.0.1:{peer_port}"
        proc = self._spawn(
            "etcd",
            [
                str(binary),
                "--name=kubeenv",
                f"--data-dir={data}",
                f"--listen-client-urls={client_url}",
                f"--advertise-client-urls={client_url}",
                f"--listen-peer-urls={peer_url}",
                f"--initial-advertise-peer-urls={peer_url}",
                f"--initial-cluster=kubeenv={peer_url}",
                "--initial-cluster-state=new",
                "--logger=zap",
                "--log-level=warn",
                "--quota-backend-bytes=1073741824",
            ],
        )

        def healthy() -> bool:
            with urllib.request.urlopen(f"{client_url}/health", timeout=2) as resp:
                return json.loads(resp.read()).get("health") == "true"

        self._wait_until(proc, "etcd /health", healthy, timeout=30)

    def _start_apiserver(self, binary: Path, etcd_port: int, port: int) -> None:
        pki = self._dir("pki")
        self.server = f"https://127.0.0.1:{port}"
        audit: list[str] = []
        if self.audit:
            policy = self._dir("apiserver-auth") / "audit-policy.json"
            policy.write_text(json.dumps({
                "apiVersion": "audit.k8s.io/v1",
                "kind": "Policy",
                "omitStages": ["RequestReceived"],
                "rules": [{"level": "Metadata"}],
            }) + "\n")
            log = self._dir("kube-apiserver") / "audit.log"
            log.touch()
            audit = [
                f"--audit-policy-file={policy}",
                f"--audit-log-path={log}",
                "--audit-log-format=json",
                "--audit-log-mode=blocking",  # each event written by the request's handler
            ]
        proc = self._spawn(
            "kube-apiserver",
            [
                str(binary),
                f"--etcd-servers=http://127.0.0.1:{etcd_port}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={port}",
                "--insecure-port=0",
                f"--cert-dir={self._dir('apiserver')}",
                f"--tls-cert-file={pki / 'server.crt'}",
                f"--tls-private-key-file={pki / 'server.key'}",
                f"--client-ca-file={pki / 'ca.crt'}",
                f"--token-auth-file={self._dir('apiserver-auth') / 'tokens.csv'}",
                f"--authorization-mode={self.authorization_mode}",
                f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
                f"--service-account-key-file={pki / 'sa.key'}",
                f"--service-account-signing-key-file={pki / 'sa.key'}",
                f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
                "--endpoint-reconciler-type=none",
                *self._admission_args(),
                "--allow-privileged=true",
                "--profiling=false",
                "--v=1",
                *audit,
            ],
        )
        context = ssl.create_default_context(cafile=self.ca_file)

        def ready() -> bool:
            request = urllib.request.Request(
                f"{self.server}/readyz",
                headers={"Authorization": f"Bearer {self.admin_token}"},
            )
            try:
                with urllib.request.urlopen(request, timeout=5, context=context) as resp:
                    return resp.status == 200
            except urllib.error.HTTPError:
                return False  # 500 while post-start hooks are still running

        self._wait_until(proc, "kube-apiserver /readyz", ready)

    def _start_controller_manager(self, binary: Path, port: int) -> None:
        kubeconfig = self.kubeconfig_path(self.admin_token)
        proc = self._spawn(
            "kube-controller-manager",
            [
                str(binary),
                f"--kubeconfig={kubeconfig}",
                f"--authentication-kubeconfig={kubeconfig}",
                f"--authorization-kubeconfig={kubeconfig}",
                f"--controllers={self.controllers}",
                "--leader-elect=false",
                "--bind-address=127.0.0.1",
                f"--secure-port={port}",
                "--port=0",
                f"--cert-dir={self._dir('kube-controller-manager')}",
                "--use-service-account-credentials=false",
                "--v=1",
                *self._controller_manager_args(),
            ],
        )
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE  # its own throw-away self-signed cert

        def healthy() -> bool:
            url = f"https://127.0.0.1:{port}/healthz"
            try:
                with urllib.request.urlopen(url, timeout=5, context=context) as resp:
                    return resp.status == 200
            except urllib.error.HTTPError:
                return False

        self._wait_until(proc, "kube-controller-manager /healthz", healthy, timeout=60)
