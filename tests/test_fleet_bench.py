"""benchmarks/fleet.py at tiny scale, faults included: CI proves the fleet benchmark still runs
and that its checks hold (nothing lost or duplicated when a replica is killed and PostgreSQL
restarted under forwarding agents). Its figures are not asserted: they are the benchmark's to
print, and a loaded CI machine would make a timed assertion fail for reasons of its own."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from conftest import need

ROOT = Path(__file__).resolve().parent.parent


def test_the_fleet_benchmark_runs_its_faults_and_checks_at_tiny_scale():
    from support.postgres import missing_message

    missing = missing_message()
    need(not missing, missing)
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "fleet.py"), "--agents", "20",
         "--workers", "2", "--threads", "4", "--steady", "5", "--kill-at", "1",
         "--pg-restart-at", "3", "--replica-down", "7", "--burst-incidents", "3",
         "--list-incidents", "0", "--progress", "3", "--drain-timeout", "60"],
        capture_output=True, text=True, timeout=180, cwd=ROOT)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-5000:]
    for line in ("*** replica 0 killed (-9)", "*** PostgreSQL: pg_ctl restart -m fast",
                 "*** replica 0 restarted and healthy", "ok   incidents lost: 0",
                 "ok   incidents duplicated: 0", "ok   audit entries lost: 0",
                 "ok   audit entries duplicated: 0", "result: every check passed"):
        assert line in out, out[-5000:]
    # the burst reached the database: 2 nodes x 3 incidents at least
    held = next(line for line in out.splitlines() if "held by the agents" in line)
    assert int(held.split("incidents: ")[1].split()[0]) >= 6, held
