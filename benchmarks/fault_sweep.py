"""The crash sweep with progress: kill the real agent at every write point of an episode.

    .venv/bin/python benchmarks/fault_sweep.py [--only N,M,...] [--out DIR] [--workers N]

Starts its own kube-apiserver (as the tests do: `bash scripts/kube-testenv.sh` builds it once),
applies deploy/base's RBAC, and runs tests/support/fault_sweep.py: one episode without faults
to list the write points, then one run per point with SIGKILL there (see that module for the
invariant). Prints a line per run and a summary: write points, kills, invariant violations,
kills by kind of point, seconds per run. Needs root (real cgroups).
"""

from __future__ import annotations

import argparse
import collections
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from conftest import AGENT_GROUPS, AGENT_USER, RealCgroups, deploy_objects  # noqa: E402
from kubernetes import utils  # noqa: E402
from support.fault_sweep import Sweep  # noqa: E402
from support.kubeenv import KubeTestEnv, missing_binaries_message  # noqa: E402

from sloguard.core.cgroup_layout import detect_layout  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="kill only at these points (1-based)")
    parser.add_argument("--out", default="", help="keep each run's logs here")
    parser.add_argument("--workers", type=int, default=3,
                        help="runs side by side (each has its own node, cgroups and agent)")
    args = parser.parse_args()
    missing = missing_binaries_message()
    if missing:
        print(missing, file=sys.stderr)
        return 2
    binary = str(Path(sys.executable).parent / "sloguard")
    workdir = Path(args.out or tempfile.mkdtemp(prefix="sloguard-sweep-"))
    env = KubeTestEnv(audit=True)
    env.add_token(AGENT_USER, AGENT_GROUPS)
    cgroups = RealCgroups(detect_layout(), f"sloguard-sweep-{uuid.uuid4().hex[:8]}")
    with env:
        for obj in deploy_objects():
            utils.create_from_dict(env.api_client(), obj)
        time.sleep(2)  # RBAC reaches the authorizer through an informer
        sweep = Sweep(binary, env.api_client(), env.kubeconfig_path(env.token_of(AGENT_USER)),
                      lambda: env.audit_events(AGENT_USER), cgroups, workdir)
        try:
            baseline = sweep.run()
            print(f"episode without faults: {len(baseline.points)} write points, "
                  f"{baseline.seconds:.1f}s, violations: {baseline.violations or 'none'}",
                  flush=True)
            kills = [int(n) for n in args.only.split(",") if n] or list(
                range(1, len(baseline.points) + 1))
            killed: collections.Counter[str] = collections.Counter()
            violations, seconds = 0, []
            for i, run in enumerate(sweep.run_all(kills, args.workers), 1):
                kill = run.kill
                seconds.append(run.seconds)
                killed[run.point.split(":")[0].split(" /")[0]] += run.killed
                violations += len(run.violations)
                print(f"[{i}/{len(kills)}] kill at #{kill} {run.point or '-'}: "
                      f"{'killed' if run.killed else 'not reached'}, {run.seconds:.1f}s, "
                      f"{'; '.join(run.violations) or 'invariant holds'}", flush=True)
        finally:
            cgroups.cleanup()
    print(f"\nwrite points {len(baseline.points)}, runs {len(kills)}, kills "
          f"{sum(killed.values())}, invariant violations {violations}")
    print("kills by point: " + ", ".join(f"{k} {v}" for k, v in sorted(killed.items())))
    if seconds:
        print(f"seconds per run: median {statistics.median(seconds):.1f}, max {max(seconds):.1f}")
    print(f"logs: {workdir}")
    return 1 if violations or baseline.violations else 0


if __name__ == "__main__":
    sys.exit(main())
