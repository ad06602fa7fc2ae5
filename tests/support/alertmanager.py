"""Real Alertmanager servers for tests: Debian's prometheus-alertmanager (0.25), on loopback, in
temp dirs, peered into an HA cluster as in production.

Each ``AlertmanagerServer`` has its own config file, storage path, web port and cluster port;
``cluster(n, ...)`` starts n of them, each given every other as a ``--cluster.peer``, and waits
until each sees all of them and has settled (its notifications wait for that). The config
routes everything to one Slack receiver (``slack_configs`` with ``api_url`` at the test's
SlackServer incoming webhook), with group timers short enough for a test.

With ``web_config`` (the ``--web.config.file`` document: ``basic_auth_users`` with bcrypt
hashes, ``tls_server_config``), the web API wants credentials or TLS; ``url`` is https when
TLS is on. The helpers' own requests (readiness, reading alerts back) then use ``credentials``
(username, password) and ``client_cert`` (cert, key) and do not verify the server's
certificate: what is under test is the sloguard client's checking, not this harness's.

Installed by ``scripts/alertmanager-testenv.sh`` (``make test`` runs it). This module must not
import the sloguard package.
"""

from __future__ import annotations

import base64
import json
import shutil
import signal
import ssl
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from support.influxenv import _Server, free_port, stop_process

BINARY = "prometheus-alertmanager"
SETUP_SCRIPT = "scripts/alertmanager-testenv.sh"


def missing_message() -> str:
    """'' when Alertmanager is installed, else how to install it."""
    if shutil.which(BINARY):
        return ""
    return (f"{BINARY} not installed: run `bash {SETUP_SCRIPT}` (as root; installs Debian's "
            f"prometheus-alertmanager without starting its service)")


def slack_config(webhook_url: str, group_by: list[str], group_wait: str = "1s",
                 group_interval: str = "5s", repeat_interval: str = "1h") -> str:
    """One Slack receiver. `group_interval` stays well above the peers' `--cluster.peer-timeout`
    (2 s here), as in production (5m against 15s): a peer at position 1 sends what its flush
    saw one peer-timeout later, so with a shorter interval a flush taken just before a resolve
    arrived is sent after the first peer's resolve notification, as a stale "firing" one."""
    return json.dumps({  # YAML is a superset of JSON
        "route": {"receiver": "slack", "group_by": group_by, "group_wait": group_wait,
                  "group_interval": group_interval, "repeat_interval": repeat_interval},
        "receivers": [{"name": "slack", "slack_configs": [{
            "api_url": webhook_url, "channel": "#alerts", "send_resolved": True}]}],
    }, indent=1)


class AlertmanagerServer(_Server):
    name = "alertmanager"

    def __init__(self, config: str, peer_timeout: str = "2s",
                 web_config: dict[str, Any] | None = None,
                 credentials: tuple[str, str] | None = None,
                 client_cert: tuple[str, str] | None = None, clustered: bool = True) -> None:
        super().__init__()
        self.clustered = clustered
        self.cluster_port = free_port()
        self.peers: list[str] = []
        self.peer_timeout = peer_timeout
        self.config_path = self.workdir / "alertmanager.yml"
        self.config_path.write_text(config)
        self.web_config_path = None
        if web_config is not None:
            self.web_config_path = self.workdir / "web.yml"
            self.web_config_path.write_text(json.dumps(web_config, indent=1))
            if "tls_server_config" in web_config:
                self.url = f"https://127.0.0.1:{self.port}"
        self.credentials = credentials
        self._context = None
        if self.url.startswith("https:"):
            self._context = ssl.create_default_context()
            self._context.check_hostname = False
            self._context.verify_mode = ssl.CERT_NONE
            if client_cert:
                self._context.load_cert_chain(*client_cert)

    def argv(self) -> list[str]:
        return [shutil.which(BINARY) or BINARY,
                f"--config.file={self.config_path}",
                f"--storage.path={self.workdir}/data",
                f"--web.listen-address=127.0.0.1:{self.port}",
                *([f"--cluster.listen-address=127.0.0.1:{self.cluster_port}",
                   f"--cluster.advertise-address=127.0.0.1:{self.cluster_port}",
                   *(f"--cluster.peer={peer}" for peer in self.peers),
                   f"--cluster.peer-timeout={self.peer_timeout}",
                   "--cluster.settle-timeout=10s"] if self.clustered
                  else ["--cluster.listen-address="]),
                *([f"--web.config.file={self.web_config_path}"] if self.web_config_path
                  else []),
                "--log.level=debug"]

    def _request(self, method: str, path: str, params: dict[str, str] | None = None,
                 body: bytes | None = None, headers: dict[str, str] | None = None,
                 ) -> tuple[int, dict[str, str], bytes]:
        """As _Server's, with this harness's credentials and client certificate."""
        url = self.url + path + ("?" + urllib.parse.urlencode(params) if params else "")
        headers = dict(headers or {})
        if self.credentials:
            pair = base64.b64encode(":".join(self.credentials).encode()).decode()
            headers["Authorization"] = f"Basic {pair}"
        request = urllib.request.Request(url, data=body, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=60, context=self._context) as response:
                return response.status, dict(response.headers), response.read()
        except urllib.error.HTTPError as exc:
            return exc.code, dict(exc.headers), exc.read()

    def ready(self) -> bool:
        status, _, _ = self._request("GET", "/-/ready")
        return status == 200

    def kill(self) -> None:
        """SIGKILL: no goodbye to the cluster, as a crashed or partitioned peer."""
        proc, self._proc = self._proc, None
        stop_process(proc, signal.SIGKILL, grace=10)
        if self._log is not None:
            self._log.close()
            self._log = None

    # -- the API -------------------------------------------------------------------------------

    def get(self, path: str, **params: str) -> Any:
        status, _, data = self._request("GET", path, params=params or None)
        if status != 200:
            raise RuntimeError(f"GET {path}: HTTP {status}: {data[:300]!r}")
        return json.loads(data)

    def status(self) -> dict[str, Any]:
        return self.get("/api/v2/status")

    def position(self) -> int:
        """This peer's place in the cluster: the peer at 0 notifies first, the one at n waits
        n peer-timeouts for the others' notification log before it notifies itself."""
        cluster = self.status()["cluster"]
        return sorted(p["name"] for p in cluster["peers"]).index(cluster["name"])

    def alerts(self, **params: str) -> list[dict[str, Any]]:
        return self.get("/api/v2/alerts", **params)

    def post_alerts(self, alerts: list[dict[str, Any]]) -> tuple[int, bytes]:
        status, _, data = self._request("POST", "/api/v2/alerts",
                                        body=json.dumps(alerts).encode(),
                                        headers={"Content-Type": "application/json"})
        return status, data

    def add_silence(self, matchers: list[dict[str, Any]], minutes: float = 60,
                    comment: str = "test") -> str:
        now = time.time()
        body = {"matchers": matchers, "createdBy": "tests", "comment": comment,
                "startsAt": _rfc3339(now - 1), "endsAt": _rfc3339(now + minutes * 60)}
        status, _, data = self._request("POST", "/api/v2/silences",
                                        body=json.dumps(body).encode(),
                                        headers={"Content-Type": "application/json"})
        if status != 200:
            raise RuntimeError(f"POST /api/v2/silences: HTTP {status}: {data[:300]!r}")
        return json.loads(data)["silenceID"]

    def silences(self) -> list[dict[str, Any]]:
        return self.get("/api/v2/silences")


def _rfc3339(seconds: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + \
        f".{int(seconds % 1 * 1000):03d}Z"


def cluster(count: int, config: str, timeout: float = 60.0,
            **options: Any) -> list[AlertmanagerServer]:
    """`count` peers of one HA cluster, started and settled (each sees all). With
    `clustered=False`, one Alertmanager with clustering off: ready at once, where a cluster of
    one waits out its settle timeout (10 s) before it notifies."""
    servers = [AlertmanagerServer(config, **options) for _ in range(count)]
    for server in servers:
        server.peers = [f"127.0.0.1:{o.cluster_port}" for o in servers if o is not server]
    try:
        for server in servers:
            server.start(timeout=timeout)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            states = [s.status()["cluster"] for s in servers]
            if not options.get("clustered", True) and all(
                    c.get("status") == "disabled" for c in states):
                return servers
            if all(len(c.get("peers") or []) == count and c.get("status") == "ready"
                   for c in states):
                return servers
            time.sleep(0.2)
        raise RuntimeError(f"the Alertmanager cluster did not settle in {timeout} s: {states}")
    except BaseException:
        for server in servers:
            server.close()
        raise


def make_pki(directory: Any, server_name: str = "alertmanager.test") -> dict[str, str]:
    """A CA, a server certificate for `server_name` only (not 127.0.0.1: so a client must be
    told the name), a client certificate, and an unrelated CA, made with the openssl CLI (P-256
    keys, valid a day). Returns the paths: ca, server_cert, server_key, client_cert,
    client_key, other_ca."""
    out = {name: str(directory / file) for name, file in (
        ("ca", "ca.pem"), ("ca_key", "ca.key"), ("server_cert", "server.pem"),
        ("server_key", "server.key"), ("client_cert", "client.pem"),
        ("client_key", "client.key"), ("other_ca", "other-ca.pem"),
        ("other_ca_key", "other-ca.key"))}
    key = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=30)

    for ca, name in (("ca", "sloguard test CA"), ("other_ca", "some other CA")):
        openssl("req", "-x509", *key, "-keyout", out[f"{ca}_key"], "-out", out[ca],
                "-days", "1", "-subj", f"/CN={name}")
    for who, cn, ext in (
            ("server", server_name, f"subjectAltName=DNS:{server_name}\n"
                                    "extendedKeyUsage=serverAuth\n"),
            ("client", "sloguard-agent", "extendedKeyUsage=clientAuth\n")):
        csr, extfile = directory / f"{who}.csr", directory / f"{who}.ext"
        extfile.write_text(ext)
        openssl("req", "-new", *key, "-keyout", out[f"{who}_key"], "-out", str(csr),
                "-subj", f"/CN={cn}")
        openssl("x509", "-req", "-in", str(csr), "-CA", out["ca"], "-CAkey", out["ca_key"],
                "-CAcreateserial", "-out", out[f"{who}_cert"], "-days", "1",
                "-extfile", str(extfile))
    return out
