"""The setup scripts' apt lock: `make test` runs the Kubernetes build beside the other installs
(make -j2), and two apt-get at once fail on apt's own locks. `apt_get` in scripts/setup-lib.sh
makes them take turns. An `apt-get` that records when it ran stands in for the real one here:
the real one would change this machine's packages; the fresh-machine CI run is the real check."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

LIB = Path(__file__).resolve().parents[1] / "scripts" / "setup-lib.sh"

FAKE_APT = """#!/bin/sh
echo "start $$ $*" >> "$APT_RECORD"
sleep 0.5
echo "end $$" >> "$APT_RECORD"
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="apt_get runs apt-get as root (or through sudo)")
def test_apt_get_calls_from_two_scripts_take_turns(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "apt-get").write_text(FAKE_APT)
    (bin_dir / "apt-get").chmod(0o755)
    record = tmp_path / "record"
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "APT_RECORD": str(record),
           "SLOGUARD_APT_LOCK": str(tmp_path / "apt.lock")}
    script = f'LOG_NAME=t; source "{LIB}"; apt_get install -y pkg$1; apt_get update'
    procs = [subprocess.Popen(["bash", "-c", script, "t", str(i)], env=env) for i in range(3)]
    assert [p.wait(timeout=30) for p in procs] == [0, 0, 0]

    lines = record.read_text().splitlines()
    assert len(lines) == 12
    # every start is followed by its own end: no apt-get began while another ran
    for start, end in zip(lines[::2], lines[1::2], strict=True):
        assert start.startswith("start ") and end == f"end {start.split()[1]}"
    # apt's own lock wait is asked for too, for any other apt on the machine
    assert all("-o DPkg::Lock::Timeout=600" in line for line in lines[::2])
