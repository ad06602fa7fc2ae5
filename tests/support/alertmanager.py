"""Real Alertmanager servers for tests: Debian's prometheus-alertmanager (0.25), on loopback, in
temp dirs, peered into an HA cluster as in production.

Each ``AlertmanagerServer`` has its own config file, storage path, web port and cluster port;
``cluster(n, ...)`` starts n of them, each given every other as a ``--cluster.peer``, and waits
until each sees all of them and has settled (its notifications wait for that). The config
routes everything to one Slack receiver (``slack_configs`` with ``api_url`` at the test's
SlackServer incoming webhook), with group timers short enough for a test.

Installed by ``scripts/alertmanager-testenv.sh`` (``make test`` runs it). This module must not
import the sloguard package.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import time
from typing import Any

from support.influxenv import _Server, free_port

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

    def __init__(self, config: str, peer_timeout: str = "2s") -> None:
        super().__init__()
        self.cluster_port = free_port()
        self.peers: list[str] = []
        self.peer_timeout = peer_timeout
        self.config_path = self.workdir / "alertmanager.yml"
        self.config_path.write_text(config)

    def argv(self) -> list[str]:
        return [shutil.which(BINARY) or BINARY,
                f"--config.file={self.config_path}",
                f"--storage.path={self.workdir}/data",
                f"--web.listen-address=127.0.0.1:{self.port}",
                f"--cluster.listen-address=127.0.0.1:{self.cluster_port}",
                f"--cluster.advertise-address=127.0.0.1:{self.cluster_port}",
                *(f"--cluster.peer={peer}" for peer in self.peers),
                f"--cluster.peer-timeout={self.peer_timeout}",
                "--cluster.settle-timeout=10s",
                "--log.level=debug"]

    def ready(self) -> bool:
        status, _, _ = self._request("GET", "/-/ready")
        return status == 200

    def kill(self) -> None:
        """SIGKILL: no goodbye to the cluster, as a crashed or partitioned peer."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
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
    """`count` peers of one HA cluster, started and settled (each sees all)."""
    servers = [AlertmanagerServer(config, **options) for _ in range(count)]
    for server in servers:
        server.peers = [f"127.0.0.1:{o.cluster_port}" for o in servers if o is not server]
    try:
        for server in servers:
            server.start(timeout=timeout)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            states = [s.status()["cluster"] for s in servers]
            if all(len(c.get("peers") or []) == count and c.get("status") == "ready"
                   for c in states):
                return servers
            time.sleep(0.2)
        raise RuntimeError(f"the Alertmanager cluster did not settle in {timeout} s: {states}")
    except BaseException:
        for server in servers:
            server.close()
        raise
