"""A real Prometheus for tests: Debian's ``prometheus`` (2.42 on bookworm) on loopback, in a temp
dir, with its ``promtool``.

``PrometheusServer`` runs one server with the test's own config file (scrape and evaluation
intervals of a second or so, so that an alert's whole life fits in a test), storage in its
temp dir and ``--web.enable-lifecycle`` so that the test may change the config and reload it
(targets that vanish). ``promtool()`` runs the checker the same package ships, so that the
files checked are the ones a real Prometheus of that version accepts.

Debian builds Prometheus without Kubernetes service discovery (no ``kubernetes_sd_configs``:
client-go is not packaged); ``kubernetes_sd_supported()`` says whether the promtool found
has it.

Installed by ``scripts/prometheus-testenv.sh`` (``make test`` runs it). This module must not
import the sloguard package.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import yaml

from support.influxenv import _Server

BINARY = "prometheus"
PROMTOOL = "promtool"
SETUP_SCRIPT = "scripts/prometheus-testenv.sh"


def missing_message() -> str:
    """'' when Prometheus and promtool are installed, else how to install them."""
    missing = [b for b in (BINARY, PROMTOOL) if not shutil.which(b)]
    if not missing:
        return ""
    return (f"{' and '.join(missing)} not installed: run `bash {SETUP_SCRIPT}` (as root; "
            f"installs Debian's prometheus without starting its service)")


def promtool(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """promtool's answer, exit status and all output (its reasons go to stdout or stderr
    depending on the check)."""
    return subprocess.run([shutil.which(PROMTOOL) or PROMTOOL, *args], cwd=cwd,
                          capture_output=True, text=True, timeout=60, check=False)


def kubernetes_sd_supported() -> bool:
    """Whether this promtool knows `kubernetes_sd_configs` (upstream builds do, Debian's not)."""
    with tempfile.TemporaryDirectory(prefix="sloguard-promtool-") as tmp:
        probe = Path(tmp) / "probe.yml"
        probe.write_text(json.dumps({"scrape_configs": [{
            "job_name": "probe", "kubernetes_sd_configs": [{"role": "pod"}]}]}))
        done = promtool("check", "config", "--syntax-only", str(probe))
    return "kubernetes_sd_configs not found" not in done.stdout + done.stderr


def with_for(rules_text: str, duration: str) -> str:
    """The same rule groups with every alert's `for:` set to `duration`: the expressions, labels
    and annotations stay the shipped ones, only the waiting a test cannot afford goes."""
    groups = yaml.safe_load(rules_text)
    for group in groups["groups"]:
        for rule in group["rules"]:
            if "alert" in rule:
                rule["for"] = duration
    return yaml.safe_dump(groups, sort_keys=False)


class PrometheusServer(_Server):
    name = "prometheus"

    def __init__(self, config: str, files: dict[str, str] | None = None) -> None:
        """`config` is prometheus.yml's text; `files` are written beside it (rule files, token
        files), by name, so that relative paths in the config find them."""
        super().__init__()
        self.config_path = self.workdir / "prometheus.yml"
        for name, text in (files or {}).items():
            (self.workdir / name).write_text(text)
        self.config_path.write_text(config)

    def argv(self) -> list[str]:
        return [shutil.which(BINARY) or BINARY,
                f"--config.file={self.config_path}",
                f"--storage.tsdb.path={self.workdir}/data",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--web.enable-lifecycle",
                "--log.level=info"]

    def ready(self) -> bool:
        status, _, _ = self._request("GET", "/-/ready")
        return status == 200

    def reload(self, config: str) -> None:
        """A new prometheus.yml, taken as a running Prometheus takes it (POST /-/reload)."""
        self.config_path.write_text(config)
        status, _, data = self._request("POST", "/-/reload")
        if status != 200:
            raise RuntimeError(f"reload refused: HTTP {status}: {data[:500]!r}")

    # -- the API -------------------------------------------------------------------------------

    def api(self, path: str, **params: str) -> Any:
        status, _, data = self._request("GET", path, params=params or None)
        body = json.loads(data) if data else {}
        if status != 200 or body.get("status") != "success":
            raise RuntimeError(f"GET {path}: HTTP {status}: {data[:500]!r}")
        return body["data"]

    def alerts(self) -> list[dict[str, Any]]:
        """Every alert pending or firing now, with its labels and state."""
        return self.api("/api/v1/alerts")["alerts"]

    def rules(self) -> list[dict[str, Any]]:
        """Every rule loaded, with its health and last error (a rule that failed to evaluate
        says so here, not in /alerts)."""
        return [rule for group in self.api("/api/v1/rules")["groups"]
                for rule in group["rules"]]

    def targets(self) -> list[dict[str, Any]]:
        return self.api("/api/v1/targets")["activeTargets"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        return self.api("/api/v1/query", query=expr)["result"]
