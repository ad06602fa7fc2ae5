"""`make test` builds Kubernetes in the background (scripts/kube-testenv.sh --background) and the
Kubernetes tests wait for it (support/kubeenv.py, wait_for_background_build; conftest's run
order). If the lock were not handed to the detached build, the tests would find the binaries
missing and fail; if the wait did not wait, the same; if the order put a Kubernetes test first,
the suite would idle behind the build. Each is checked here on a cache of its own: stand-in
binaries that pass the script's version checks, and one real binary (kubectl, from Debian's
kubernetes-client) left to fetch, so the detached copy of the script does real work."""

from __future__ import annotations

import hashlib
import os
import subprocess
import threading
import time
from pathlib import Path

from conftest import need, run_phase
from support import kubeenv

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "kube-testenv.sh"
STANDINS = {  # what each check_version of the script wants to read
    "kube-apiserver": "Kubernetes v1.20.2", "kube-controller-manager": "Kubernetes v1.20.2",
    "kube-scheduler": "Kubernetes v1.20.2", "kubelet": "Kubernetes v1.20.2",
    "pause": "pause.c v3.4", "etcd": "etcd Version: 3.4.23", "etcdctl": "etcdctl version: 3.4.23",
}


def _cache(tmp_path: Path) -> Path:
    bin_dir = tmp_path / "kube" / "bin"
    bin_dir.mkdir(parents=True)
    sums = []
    for name, line in STANDINS.items():
        path = bin_dir / name
        path.write_text(f"#!/bin/sh\necho '{line}'\n")
        path.chmod(0o755)
        sums.append(f"{hashlib.sha256(path.read_bytes()).hexdigest()}  {name}\n")
    (bin_dir / "SHA256SUMS").write_text("".join(sums))
    return bin_dir.parent


def _script(cache: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "SLOGUARD_KUBE_CACHE": str(cache)})


def test_the_detached_build_holds_the_lock_and_the_tests_wait_for_it(tmp_path, monkeypatch):
    need(os.geteuid() == 0, "the setup script installs with apt (root)")
    cache = _cache(tmp_path)
    monkeypatch.setenv("SLOGUARD_KUBE_CACHE", str(cache))
    started = time.monotonic()
    done = _script(cache, "--background")
    assert done.returncode == 0, done.stderr
    assert "building in the background" in done.stderr
    assert kubeenv.build_running()  # held from the moment the command returned
    assert not (cache / "bin" / "kubectl").exists()

    lines: list[str] = []
    waited = kubeenv.wait_for_background_build(lines.append, every=2.0, poll=0.2)
    assert not kubeenv.build_running()
    assert waited > 0.2 and "waiting for the Kubernetes build" in lines[0]
    assert lines[-1].startswith("the Kubernetes build finished")
    log = kubeenv.background_build_log().read_text()
    assert f"kube test env ready: {cache / 'bin'}" in log, log[-2000:]
    kubectl = subprocess.run([cache / "bin" / "kubectl", "version", "--client", "--short"],
                             capture_output=True, text=True, timeout=30)
    assert "v1.20.2" in kubectl.stdout
    print(f"background fetch of kubectl: {time.monotonic() - started:.1f} s, waited "
          f"{waited:.1f} s")

    again = _script(cache, "--background")  # all cached: says so, starts nothing
    assert again.returncode == 0 and "kube test env ready" in again.stdout
    assert not kubeenv.build_running()


def test_a_second_start_while_one_runs_waits_instead_of_building_twice(tmp_path, monkeypatch):
    cache = _cache(tmp_path)
    monkeypatch.setenv("SLOGUARD_KUBE_CACHE", str(cache))
    holder = subprocess.Popen(["flock", str(cache / ".lock"), "sleep", "3"])
    try:
        deadline = time.monotonic() + 10
        while not kubeenv.build_running():
            assert time.monotonic() < deadline, "flock never took the lock"
            time.sleep(0.05)
        done = _script(cache, "--background")
        assert done.returncode == 0 and "already running" in done.stderr
        waiter = threading.Thread(target=kubeenv.wait_for_background_build,
                                  kwargs={"poll": 0.1})
        waiter.start()
        waiter.join(timeout=1)
        assert waiter.is_alive()  # the holder still has it
        waiter.join(timeout=10)
        assert not waiter.is_alive()
    finally:
        holder.kill()
        holder.wait()


def test_a_failed_build_is_named_where_the_tests_fail(tmp_path, monkeypatch):
    cache = _cache(tmp_path)
    monkeypatch.setenv("SLOGUARD_KUBE_CACHE", str(cache))
    (cache / "bin" / "etcd").unlink()
    kubeenv.background_build_log().write_text("...\n[kube-testenv] ERROR: no apt source\n")
    message = kubeenv.missing_binaries_message()
    assert "missing in" in message and "etcd" in message
    assert "ERROR: no apt source" in message and str(kubeenv.background_build_log()) in message


class _Item:
    def __init__(self, fixtures: tuple[str, ...] = (), marker: str = "") -> None:
        self.fixturenames = fixtures
        self.marker = marker

    def get_closest_marker(self, name: str) -> object | None:
        return object() if name == self.marker else None


def test_the_run_order_puts_kubernetes_after_the_rest_and_timing_last():
    items = [_Item(("kube_node", "tmp_path"), "timing"), _Item(("kube_agent",)),
             _Item(("tmp_path",)), _Item((), "kube"), _Item(("kube",)), _Item(),
             _Item((), "timing")]
    assert [run_phase(i) for i in items] == [2, 1, 0, 1, 1, 0, 2]
    items.sort(key=run_phase)
    assert [run_phase(i) for i in items] == [0, 0, 1, 1, 1, 2, 2]


def test_the_wait_says_how_long_it_has_waited(tmp_path, monkeypatch):
    cache = _cache(tmp_path)
    monkeypatch.setenv("SLOGUARD_KUBE_CACHE", str(cache))
    kubeenv.background_build_log().write_text("go build k8s.io/kubernetes/pkg/kubelet\n")
    holder = subprocess.Popen(["flock", str(cache / ".lock"), "sleep", "1.5"])
    try:
        while not kubeenv.build_running():
            time.sleep(0.05)
        lines: list[str] = []
        kubeenv.wait_for_background_build(lines.append, every=0.3, poll=0.1)
    finally:
        holder.kill()
        holder.wait()
    progress = [line for line in lines if line.startswith("still building")]
    assert progress and all("go build k8s.io/kubernetes/pkg/kubelet" in p for p in progress)
