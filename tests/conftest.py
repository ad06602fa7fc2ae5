"""Shared fixtures: real cgroups, a running agent, and the checks that decide whether a test may
skip. On CI (CI=true) nothing that this machine can run is allowed to skip."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from sloguard.collectors.cgroup_layout import CgroupLayout, detect_layout

ON_CI = os.environ.get("CI") == "true"


def need(condition: bool, reason: str) -> None:
    """Skip when a capability truly does not exist here, but never on CI, where it must."""
    if not condition:
        if ON_CI:
            pytest.fail(f"required on CI: {reason}")
        pytest.skip(reason)


class RealCgroups:
    """Creates child cgroups in every mounted hierarchy this test needs, and removes them."""

    def __init__(self, layout: CgroupLayout, prefix: str) -> None:
        self.layout = layout
        self.prefix = prefix
        self.procs: list[subprocess.Popen] = []
        self.created: list[Path] = []  # every directory made, parents included

    def hierarchies(self) -> list[Path]:
        roots = [self.layout.v1[c] for c in ("cpu", "cpuacct", "memory") if c in self.layout.v1]
        if self.layout.unified is not None:
            roots.append(self.layout.unified)
        return list(dict.fromkeys(roots))

    def create(self, rel: str) -> str:
        """Create `<prefix>/<rel>` everywhere; return its path relative to the roots."""
        full = f"{self.prefix}/{rel}".strip("/")
        for root in self.hierarchies():
            path = root
            for part in full.split("/"):
                path = path / part
                if not path.exists():
                    path.mkdir()
                    self.created.append(path)
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

    def move(self, pid: int, rel: str) -> None:
        for root in self.hierarchies():
            (root / rel / "cgroup.procs").write_text(str(pid))

    def cleanup(self) -> None:
        for proc in self.procs:
            proc.kill()
            proc.wait()
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


@pytest.fixture(scope="session")
def kube():
    """A real kube-apiserver (+ etcd, controller-manager) on loopback for this test session."""
    from support.kubeenv import KubeTestEnv, missing_binaries_message

    missing = missing_binaries_message()
    need(not missing, missing)
    with KubeTestEnv() as env:
        yield env


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


@pytest.fixture(scope="session")
def victoria_server():
    """Debian's VictoriaMetrics (NOT InfluxDB: it accepts line protocol on /api/v2/write)."""
    from support.influxenv import VictoriaMetricsServer, missing_message

    missing = missing_message("victoria-metrics", "victoria-metrics")
    need(not missing, missing)
    with VictoriaMetricsServer() as server:
        yield server
