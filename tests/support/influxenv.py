"""Real InfluxDB 1.x and VictoriaMetrics servers for tests, on loopback, in temp dirs.

``InfluxServer`` runs Debian's ``influxd`` (1.6.7) with its own config file: data, meta and WAL
in a temp dir, HTTP and RPC on free 127.0.0.1 ports, authentication on (an admin user is created
on first start), reporting and the internal monitor off. It can be stopped and started again
on the same port and data (the outage tests), and is killed and removed at the end.

``VictoriaMetricsServer`` runs Debian's ``victoria-metrics``. It is NOT InfluxDB: it accepts
InfluxDB line protocol on /write and /api/v2/write, which is what the v2 write path needs to be
exercised against a real server here (no InfluxDB 1.8+/2.x/3.x package exists on this
machine). It has no InfluxQL; its own /api/v1/export API reads the data back.

Installed by ``scripts/influx-testenv.sh`` (``make test`` runs it). This module must not import
the sloguard package.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import IO, Any

SETUP_SCRIPT = "scripts/influx-testenv.sh"


def stop_process(proc: subprocess.Popen | None, first: int, grace: float,
                 group: bool = True) -> None:
    """`first` (to the process group, or to the process alone for a server that signals its own
    children), then SIGKILL to the whole group after `grace`: a test server never outlives its
    test, whatever state it hangs in."""
    if proc is None or proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        (os.killpg if group else os.kill)(proc.pid, first)
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def missing_message(binary: str, package: str) -> str:
    """'' when `binary` is installed, else how to install it."""
    if shutil.which(binary):
        return ""
    return (f"{binary} not installed: run `bash {SETUP_SCRIPT}` (as root; installs Debian's "
            f"{package} without starting its service)")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as exc:
        return f"<cannot read {path}: {exc}>"


class _Server:
    """A child process in its own session with a log file; start/stop/close."""

    name = "server"

    def __init__(self) -> None:
        self.workdir = Path(tempfile.mkdtemp(prefix=f"sloguard-{self.name}-"))
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = self.workdir / f"{self.name}.log"
        self._proc: subprocess.Popen | None = None
        self._log: IO[bytes] | None = None
        atexit.register(self.close)

    def argv(self) -> list[str]:
        raise NotImplementedError

    def ready(self) -> bool:
        raise NotImplementedError

    def start(self, timeout: float = 30.0) -> None:
        if self.running:
            return
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        self._proc = subprocess.Popen(
            self.argv(), stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT,
            start_new_session=True, close_fds=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self._proc.returncode}; log:\n"
                                   f"{_tail(self.log_path)}")
            with contextlib.suppress(OSError, urllib.error.URLError):
                if self.ready():
                    return
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"{self.name} not ready after {timeout} s; log:\n"
                           f"{_tail(self.log_path)}")

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self.running and self._proc is not None else None

    def rss_bytes(self) -> int:
        """Resident memory of the server process (0 when it is not running)."""
        if self.pid is None:
            return 0
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        return 0

    def cpu_seconds(self) -> float:
        """CPU time the server process has used (user + system)."""
        if self.pid is None:
            return 0.0
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM (a clean shutdown, data kept), SIGKILL after `grace`."""
        proc, self._proc = self._proc, None
        stop_process(proc, signal.SIGTERM, grace)
        if self._log is not None:
            self._log.close()
            self._log = None

    def close(self) -> None:
        atexit.unregister(self.close)
        self.stop(grace=5.0)
        shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> _Server:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _request(self, method: str, path: str, params: dict[str, str] | None = None,
                 body: bytes | None = None, headers: dict[str, str] | None = None,
                 ) -> tuple[int, dict[str, str], bytes]:
        url = self.url + path + ("?" + urllib.parse.urlencode(params) if params else "")
        request = urllib.request.Request(url, data=body, method=method, headers=headers or {})
        try:
            with urllib.request.urlopen(request, timeout=60) as response:  # a loaded CI box
                return response.status, dict(response.headers), response.read()
        except urllib.error.HTTPError as exc:
            return exc.code, dict(exc.headers), exc.read()


class InfluxServer(_Server):
    """Debian's influxd 1.x with authentication on; ``username``/``password`` are the admin."""

    name = "influxd"

    def __init__(self, max_body_size: int = 25_000_000) -> None:
        super().__init__()
        self.rpc_port = free_port()
        self.username = "sloguard-admin"
        self.password = "pw-" + secrets.token_hex(12)
        self._user_created = False
        self.config_path = self.workdir / "influxdb.conf"
        self.config_path.write_text(
            f'reporting-enabled = false\n'
            f'bind-address = "127.0.0.1:{self.rpc_port}"\n'
            f'[meta]\n  dir = "{self.workdir}/meta"\n'
            f'[data]\n  dir = "{self.workdir}/data"\n  wal-dir = "{self.workdir}/wal"\n'
            f'  query-log-enabled = false\n'
            f'[monitor]\n  store-enabled = false\n'
            f'[http]\n  bind-address = "127.0.0.1:{self.port}"\n  auth-enabled = true\n'
            f'  log-enabled = false\n  pprof-enabled = false\n'
            f'  max-body-size = {max_body_size}\n'
            f'[ifql]\n  enabled = false\n'
            f'[continuous_queries]\n  enabled = false\n'
            f'[logging]\n  level = "warn"\n  suppress-logo = true\n')

    def argv(self) -> list[str]:
        return [shutil.which("influxd") or "influxd", "run", "-config", str(self.config_path)]

    def ready(self) -> bool:
        status, _, _ = self._request("GET", "/ping")
        return status == 204

    def start(self, timeout: float = 30.0) -> None:
        super().start(timeout)
        if not self._user_created:  # the first user may be created without credentials
            self.query(f"CREATE USER \"{self.username}\" WITH PASSWORD '{self.password}' "
                       "WITH ALL PRIVILEGES", auth=False)
            self._user_created = True

    def version(self) -> str:
        _, headers, _ = self._request("GET", "/ping")
        return headers.get("X-Influxdb-Version", "")

    def _auth(self) -> dict[str, str]:
        import base64

        pair = f"{self.username}:{self.password}".encode()
        return {"Authorization": "Basic " + base64.b64encode(pair).decode()}

    def query(self, statement: str, db: str | None = None, auth: bool = True) -> dict[str, Any]:
        """Run InfluxQL (POST /query, epoch=ns); raise on an error."""
        params = {"q": statement, "epoch": "ns", **({"db": db} if db else {})}
        body = urllib.parse.urlencode(params).encode()
        headers = {"Content-Type": "application/x-www-form-urlencoded",
                   **(self._auth() if auth else {})}
        status, _, data = self._request("POST", "/query", body=body, headers=headers)
        result = json.loads(data or b"{}")
        errors = [r["error"] for r in result.get("results", []) if "error" in r]
        if status != 200 or "error" in result or errors:
            raise RuntimeError(f"InfluxQL {statement!r}: HTTP {status}: {result}")
        return result

    def create_database(self, name: str | None = None) -> str:
        name = name or "t_" + secrets.token_hex(4)
        self.query(f'CREATE DATABASE "{name}"')
        return name

    def count(self, db: str, measurement: str, field: str) -> int:
        series = self.query(f'SELECT COUNT("{field}") FROM "{measurement}"', db=db)
        rows = series["results"][0].get("series") or []
        return int(rows[0]["values"][0][1]) if rows else 0


class VictoriaMetricsServer(_Server):
    """Debian's victoria-metrics: line protocol in, /api/v1/export out. Not InfluxDB."""

    name = "victoria-metrics"

    def argv(self) -> list[str]:
        return [shutil.which("victoria-metrics") or "victoria-metrics",
                f"-storageDataPath={self.workdir}/data", f"-httpListenAddr=127.0.0.1:{self.port}",
                "-retentionPeriod=100y", "-loggerLevel=ERROR", "-search.latencyOffset=0s"]

    def ready(self) -> bool:
        status, _, _ = self._request("GET", "/health")
        return status == 200

    def export(self, match: str) -> list[dict[str, Any]]:
        """Every series matching the selector, with values and millisecond timestamps."""
        self._request("GET", "/internal/force_flush")
        status, _, data = self._request("GET", "/api/v1/export", params={"match[]": match})
        if status != 200:
            raise RuntimeError(f"export {match!r}: HTTP {status}: {data[:300]!r}")
        return [json.loads(line) for line in data.splitlines() if line.strip()]
