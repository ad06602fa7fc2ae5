"""Named points where a fault-injection run may kill the agent (gofail's failpoints, reduced to
the one fault that matters for crash consistency: SIGKILL).

Every write the agent makes to its node or its memory passes one of these points: each cgroup or
resctrl write, each ledger write, each Kubernetes API call that changes something, before and
after. The sweep in benchmarks/fault_sweep.py (and tests/test_crash_consistency.py) first runs a
whole episode recording the points hit, then once more per hit, killing the agent right there,
restarts it and checks that the node ends as it began.

Off unless the environment asks, and then read once at import: the cost on the normal path is
one global load and a branch.

- `SLOGUARD_FAILPOINT_LOG=FILE`: append each point's name to FILE as it is hit (flushed line by
  line, so a killed process leaves the list complete).
- `SLOGUARD_FAILPOINT_KILL=N`: SIGKILL this process at the N-th point hit (1-based), after
  logging it.
"""

from __future__ import annotations

import os
import signal
import threading
from typing import Any

_LOG = os.environ.get("SLOGUARD_FAILPOINT_LOG", "")
_KILL = int(os.environ.get("SLOGUARD_FAILPOINT_KILL", "0") or 0)
ACTIVE = bool(_LOG or _KILL)
_lock = threading.Lock()
_hits = 0


def hit(name: str) -> None:
    """Pass point `name`: log it, and die here if this is the hit the run asked for."""
    if not ACTIVE:
        return
    global _hits
    with _lock:
        _hits += 1
        if _LOG:
            with open(_LOG, "a") as out:
                out.write(f"{_hits} {name}\n")
                out.flush()
                os.fsync(out.fileno())
        if _KILL and _hits == _KILL:
            os.kill(os.getpid(), signal.SIGKILL)


def around(name: str, action: Any, *args: Any, **kwargs: Any) -> Any:
    """Call `action` between the points `name:before` and `name:after`."""
    hit(f"{name}:before")
    result = action(*args, **kwargs)
    hit(f"{name}:after")
    return result


def watch_api_client(api_client: Any) -> Any:
    """Put every changing request of a kubernetes ApiClient between failpoints (reads are not
    writes: a crash around them changes nothing)."""
    if not ACTIVE:
        return api_client
    rest = api_client.rest_client
    request = rest.request

    def watched(method: str, url: str, *args: Any, **kwargs: Any) -> Any:
        if method.upper() in ("GET", "HEAD", "OPTIONS"):
            return request(method, url, *args, **kwargs)
        what = url.rsplit("/api", 1)[-1].split("?")[0]
        return around(f"kube.{method.upper()} {what}", request, method, url, *args, **kwargs)

    rest.request = watched
    return api_client
