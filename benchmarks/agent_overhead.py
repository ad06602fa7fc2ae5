"""What the agent costs a node: CPU (% of one core) and RSS while it watches 100 cgroups.

Target (issue #2): under 2% of a core and under 100 MB RSS at a 1 s interval, without eBPF.
The benchmark creates 100 real cgroups (each with a sleeping process), runs the real
`sloguard run` against them with the default rules, and samples the agent process with psutil.
Machines here are noisy, so it also measures, in the same run, the same agent watching no
cgroups (the fixed cost of the process) and a fixed pure-Python workload (a CPU-speed yardstick),
and reports ratios against both.

    sudo .venv/bin/python benchmarks/agent_overhead.py [--cgroups 100] [--seconds 60]
        [--push-every 0.1 [--swinging 8]]

With `--push-every P`, a service pushes latency observations every P seconds to the loaded
agent, which is measured twice more: with the shipped rules evaluated on arrival (issue #23:
`arrival_floor` 100 ms) and with `arrival_floor: 0` (the tick only); their ratio is what
evaluation on arrival costs. The tick-only agent is then sent 1,000 pushes back to back, on
new connections and on one kept open: what receiving a push costs. With `--swinging N`, both
are measured once more with N more BE cgroups whose CPU swings (0.18 core for a second, none
for the next, each at its own offset): the worst case of the look that bounds a held-back rule's
reads (issue #23). An arrival can then find a BE cgroup's CPU risen by 0.1 core while all stay
under the shipped "BE busy" bar, so the rule stays held back and the cgroups are read afresh.

With `--rules FILE` (repeatable), the loaded agent is measured once more per FILE, loaded beside
the shipped rules (issue #25 asked what a `changepoint` rule costs the agent:
`--rules docs/rules-examples/ls-shifts.yaml`).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import psutil

from sloguard.core.cgroup_layout import detect_layout
from sloguard.core.config import shipped_rule_paths


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _hierarchies() -> list[Path]:
    layout = detect_layout()
    roots = [layout.v1[c] for c in ("cpu", "cpuacct", "memory") if c in layout.v1]
    if layout.unified is not None:
        roots.append(layout.unified)
    return list(dict.fromkeys(roots))


class BenchCgroups:
    """`count` real cgroups (every v1 hierarchy the agent reads, and v2), one process in each:
    `sleep` by default, or Python `code` that starts only once it has been moved in (and
    never, should this process die first). A failure half-way removes what was made."""

    def __init__(self, count: int, code: str | None = None, name: str = "bench",
                 grouped: bool = False) -> None:
        """`grouped`: the LS cgroups under `ls/`, the BE ones under `be/` (as the kubelet puts
        BestEffort pods under its besteffort QoS cgroup), not all side by side."""
        self.prefix = f"sloguard-{name}-{os.getpid()}"
        self.grouped = grouped
        self.roots = _hierarchies()
        self.procs: list[subprocess.Popen] = []
        try:
            self._make(count, code)
        except BaseException:
            self.remove()
            raise

    def _make(self, count: int, code: str | None) -> None:
        for i in range(count):
            group = ("ls/" if i % 10 == 0 else "be/") if self.grouped else ""
            rel = f"{self.prefix}/{group}cg{i:03d}"
            for root in self.roots:
                (root / rel).mkdir(parents=True, exist_ok=True)
            if code is None:
                proc = subprocess.Popen(["sleep", "86400"])
            else:
                proc = subprocess.Popen([sys.executable, "-c", "import sys\nif sys.stdin.read(1) "
                                         f"!= 'g':\n    sys.exit()\n{code}"],
                                        stdin=subprocess.PIPE)
            self.procs.append(proc)
            for root in self.roots:
                (root / rel / "cgroup.procs").write_text(str(proc.pid))
            if proc.stdin is not None:  # moved everywhere: let it run
                proc.stdin.write(b"g")
                proc.stdin.close()

    def remove(self) -> None:
        for proc in self.procs:
            proc.kill()
            proc.wait()
        time.sleep(0.2)
        for root in self.roots:
            base = root / self.prefix
            if base.exists():
                below = [Path(d) for d, _, _ in os.walk(base)]
                for directory in sorted(below, key=lambda d: len(d.parts), reverse=True):
                    directory.rmdir()

    def declare(self) -> str:
        """The agent's `collectors.cgroups` lines for them: one LS in ten, the rest BE (the
        names run cg000-cg099: `cg0*` was every one of them, and no BE at all until #23)."""
        group = ("ls/", "be/") if self.grouped else ("", "")
        return (f"    include: [{self.prefix}]\n"
                "    declare:\n"
                f"      - {{path: '{self.prefix}/{group[0]}cg??0', class: LS}}\n"
                f"      - {{path: '{self.prefix}/{group[1]}cg??[1-9]', class: BE}}\n")


def _yardstick() -> float:
    """CPU seconds of a fixed pure-Python workload (file reads and parsing, like a tick)."""
    start = time.process_time()
    for _ in range(3000):
        with open("/proc/self/stat", "rb") as handle:
            handle.read().split()
        sorted({f"k{i}": i for i in range(50)}.items())
    return time.process_time() - start


PUSH_TOKEN = "bench-token"
# A BE process under the shipped rules' "BE busy" (0.2 core): 0.18 core for a second, then
# none for a second, in 1.8 ms slices so that a fresh read 100 ms long sees 0.18 too (a burst
# would read as 1 core: busy). Each of the `{count}` starts its second at its own offset (from
# its cgroup's number): whenever a collection falls, one of them starts soon after, and its
# CPU has then risen by the look's 0.1 core since that collection.
SWING = """
import re, time
index = int(re.findall(r"cg([0-9]+)", open("/proc/self/cgroup").read())[-1])
offset = 2.0 * index / {count}
while True:
    now = time.time() + offset
    if now % 2.0 < 1.0:
        end = time.time() + 0.0018
        while time.time() < end:
            pass
        time.sleep(0.0082)
    else:
        time.sleep(2.0 - now % 2.0)
"""


PUSH_BODY = json.dumps({"observations": [{"service": "bench", "latency_ms": [
    1.0 if i % 2 else 300.0 for i in range(50)]}]}).encode()
PUSH_HEADERS = {"Authorization": f"Bearer {PUSH_TOKEN}", "Content-Type": "application/json"}


def _push(port: int, connection: http.client.HTTPConnection | None = None) -> None:
    """50 observations, half of them over the SLO (so the interference rules have something
    to judge): on `connection`, kept open, or on a new one, as urllib makes."""
    if connection is not None:
        connection.request("POST", "/api/v1/observations", PUSH_BODY, PUSH_HEADERS)
        connection.getresponse().read()
    else:
        urllib.request.urlopen(urllib.request.Request(
            f"http://127.0.0.1:{port}/api/v1/observations", data=PUSH_BODY, method="POST",
            headers=PUSH_HEADERS), timeout=5).read()


def _pusher(port: int, every: float, stop: threading.Event,
            failed: list[str]) -> threading.Thread:
    """A service pushing every `every` seconds."""

    def run() -> None:
        while not stop.wait(every):
            try:
                _push(port)
            except OSError as exc:  # counted and reported: a push that failed cost nothing
                failed.append(str(exc))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def _cpu(process: psutil.Process) -> float:
    times = process.cpu_times()
    return times.user + times.system


def _receive_cost(agent: psutil.Process, port: int, pushes: int,
                  background: float) -> dict[str, float]:
    """CPU ms a push costs the agent, `pushes` of them back to back on new connections and as
    many on one kept open, alternated in rounds of 100, less the agent's `background` (CPU s a
    second) over their time. Pushes every 0.5 s cost less than the difference of two runs
    varies by on this VM; a thousand together stand clear of it."""
    spent = {"new": 0.0, "kept": 0.0}
    rounds = max(1, pushes // 100)
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    for turn in range(2 * rounds):
        way = "kept" if turn % 2 else "new"
        cpu0, wall0 = _cpu(agent), time.monotonic()
        for _ in range(100):
            _push(port, connection if way == "kept" else None)
        spent[way] += _cpu(agent) - cpu0 - background * (time.monotonic() - wall0)
    connection.close()
    return {f"receive_ms_{way}": 1000 * cpu / (100 * rounds) for way, cpu in spent.items()}


def run_agent(config: Path, seconds: float, label: str, push_every: float = 0.0,
              burst: int = 0) -> dict[str, float]:
    """The agent's cost over `seconds`; with `burst`, then the receive cost of a push."""
    data = Path(tempfile.mkdtemp(prefix="sloguard-bench-data-"))
    stop = threading.Event()
    failed: list[str] = []
    port = _free_port()
    binary = shutil.which("sloguard", path=str(Path(sys.executable).parent))
    proc = subprocess.Popen(
        [binary, "run", "-c", str(config), "--data-dir", str(data),
         "--listen", f"127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1)
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise SystemExit(f"{label}: the agent did not start") from None
                time.sleep(0.2)
        agent = psutil.Process(proc.pid)
        if push_every:
            _pusher(port, push_every, stop, failed)
        print(f"[{label}] warming up 10 s", file=sys.stderr, flush=True)
        time.sleep(10)
        cpu0, wall0, io0 = agent.cpu_times(), time.monotonic(), agent.io_counters()
        rss_max = 0
        while (elapsed := time.monotonic() - wall0) < seconds:
            time.sleep(1)
            rss_max = max(rss_max, agent.memory_info().rss)
            if int(elapsed) % 10 == 0:
                print(f"[{label}] {elapsed:4.0f}/{seconds:.0f} s", file=sys.stderr, flush=True)
        cpu1, wall1, io1 = agent.cpu_times(), time.monotonic(), agent.io_counters()
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read().decode()
        written = sum(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
                      if line.startswith("sloguard_samples_written_total"))
        cpu = (cpu1.user - cpu0.user) + (cpu1.system - cpu0.system)
        ready = json.loads(urllib.request.urlopen(
            f"http://127.0.0.1:{port}/readyz").read().decode())
        loop = next(c for c in ready["components"] if c["name"] == "loop")
        if failed:
            print(f"[{label}] {len(failed)} pushes failed, e.g. {failed[0]}", file=sys.stderr)
        receive = {}
        if burst:
            stop.set()
            print(f"[{label}] {burst} pushes back to back, new and kept connections",
                  file=sys.stderr, flush=True)
            receive = _receive_cost(agent, port, burst, cpu / (wall1 - wall0))
        return {
            **receive,
            "pushes_failed": len(failed),
            "arrival_evaluations": loop["details"].get("arrival_evaluations", 0),
            "arrival_reads": loop["details"].get("arrival_reads", 0),
            "cpu_percent": 100 * cpu / (wall1 - wall0),
            "cpu_per_tick_ms": 1000 * cpu / (wall1 - wall0),
            "rss_mb": agent.memory_info().rss / 1e6,
            "rss_max_mb": rss_max / 1e6,
            "samples_written": written,
            # what it writes to disk (the store's WAL and checkpoints, logs): a node's SSD
            "disk_kb_per_s": (io1.write_bytes - io0.write_bytes) / 1024 / (wall1 - wall0),
        }
    finally:
        stop.set()
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        shutil.rmtree(data, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cgroups", type=int, default=100)
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--push-every", type=float, default=0.0,
                        help="also measure evaluation on arrival under pushes this often (s)")
    parser.add_argument("--swinging", type=int, default=0,
                        help="with --push-every: also measure with this many BE cgroups whose "
                             "CPU swings (the worst case of evaluation on arrival)")
    parser.add_argument("--rules", type=Path, action="append", default=[],
                        help="also measure the loaded agent with this rule file added")
    args = parser.parse_args()
    if args.swinging and not args.push_every:
        raise SystemExit("--swinging needs --push-every: it measures evaluation on arrival")
    for extra in args.rules:
        if not extra.is_file():
            raise SystemExit(f"{extra}: no such rule file")
    if os.geteuid() != 0:
        raise SystemExit("creating cgroups needs root")
    work = Path(tempfile.mkdtemp(prefix="sloguard-bench-"))
    print(f"creating {args.cgroups} cgroups", file=sys.stderr, flush=True)
    cgroups = BenchCgroups(args.cgroups)
    try:
        loaded = work / "loaded.yaml"
        loaded.write_text("collectors:\n  cgroups:\n" + cgroups.declare())
        idle = work / "idle.yaml"
        idle.write_text("collectors:\n  cgroups:\n    include: []\n")
        yard_before = _yardstick()
        with_cgroups = run_agent(loaded, args.seconds, f"{args.cgroups} cgroups")
        without = run_agent(idle, args.seconds, "no cgroups")
        arrival: dict[str, dict[str, float]] = {}
        swinging: dict[str, dict[str, float]] = {}
        if args.push_every:
            token = work / "token"
            token.write_text(PUSH_TOKEN)
            for floor in ("100ms", "0s"):
                pushed = work / f"pushed-{floor}.yaml"
                pushed.write_text(
                    loaded.read_text() + f"arrival_floor: {floor}\n"
                    f"app_latency: {{receive: {{enabled: true, token_file: '{token}'}}}}\n"
                    "slos:\n  - {service: bench, latency_ms: 100, window: 2s}\n")
                arrival[floor] = run_agent(pushed, args.seconds,
                                           f"pushes every {args.push_every:g} s, "
                                           f"arrival_floor {floor}", args.push_every,
                                           burst=1000 if floor == "0s" else 0)
            if args.swinging:
                swingers = BenchCgroups(args.swinging, code=SWING.replace(
                    "{count}", str(args.swinging)), name="swing")
                try:
                    for floor in ("100ms", "0s"):
                        config = work / f"swinging-{floor}.yaml"
                        config.write_text(
                            (work / f"pushed-{floor}.yaml").read_text()
                            .replace(f"include: [{cgroups.prefix}]",
                                     f"include: [{cgroups.prefix}, {swingers.prefix}]")
                            .replace("    declare:\n", "    declare:\n"
                                     f"      - {{path: '{swingers.prefix}/cg*', class: BE}}\n"))
                        swinging[floor] = run_agent(
                            config, args.seconds, f"pushes every {args.push_every:g} s, "
                            f"{args.swinging} BE swinging, arrival_floor {floor}",
                            args.push_every)
                finally:
                    swingers.remove()
        with_rules: dict[str, dict[str, float]] = {}
        for extra in args.rules:
            paths = [*shipped_rule_paths(), str(extra.resolve())]
            config = work / f"rules-{len(with_rules)}.yaml"
            config.write_text(loaded.read_text() + f"rules: {{paths: {json.dumps(paths)}}}\n")
            with_rules[extra.name] = run_agent(config, args.seconds, f"+ {extra.name}")
        yard = (yard_before + _yardstick()) / 2
    finally:
        cgroups.remove()
        shutil.rmtree(work, ignore_errors=True)

    print(f"\nagent at a 1 s interval, default rules, embedded store ({args.seconds:.0f} s "
          "measured after 10 s warm-up)\n")
    print(f"| metric | {args.cgroups} cgroups | no cgroups | ratio |")
    print("|---|---|---|---|")
    for key, unit in (("cpu_percent", "% of one core"), ("rss_mb", "MB RSS at end"),
                      ("rss_max_mb", "MB RSS max"), ("samples_written", "samples written"),
                      ("disk_kb_per_s", "KB written to disk per second")):
        a, b = with_cgroups[key], without[key]
        print(f"| {unit} | {a:.2f} | {b:.2f} | {a / b if b else float('nan'):.2f}x |")
    print(f"| CPU per tick / yardstick ({yard * 1000:.1f} ms) | "
          f"{with_cgroups['cpu_per_tick_ms'] / 1000 / yard:.2f} | "
          f"{without['cpu_per_tick_ms'] / 1000 / yard:.2f} | |")
    if arrival:
        on, off = arrival["100ms"], arrival["0s"]
        print(f"\npushes every {args.push_every:g} s to the {args.cgroups}-cgroup agent:\n")
        print("| metric | on arrival (100 ms floor) | tick only | ratio |")
        print("|---|---|---|---|")
        for key, unit in (("cpu_percent", "% of one core"), ("rss_max_mb", "MB RSS max"),
                          ("arrival_evaluations", "evaluations on arrival"),
                          ("arrival_reads", "of them, cgroups read afresh"),
                          ("pushes_failed", "pushes failed")):
            a, b = on[key], off[key]
            print(f"| {unit} | {a:.2f} | {b:.2f} | "
                  f"{f'{a / b:.2f}x' if b else '-'} |")
        print(f"\nreceive cost per push (the tick-only agent, 1000 pushed back to back): "
              f"{off['receive_ms_new']:.2f} ms of CPU on a new connection each, "
              f"{off['receive_ms_kept']:.2f} ms on one kept open")
    if swinging:
        on, off = swinging["100ms"], swinging["0s"]
        print(f"\nthe same, with {args.swinging} more BE cgroups whose CPU swings (the worst "
              "case of the look):\n")
        print("| metric | on arrival (100 ms floor) | tick only | ratio |")
        print("|---|---|---|---|")
        for key, unit in (("cpu_percent", "% of one core"),
                          ("arrival_evaluations", "evaluations on arrival"),
                          ("arrival_reads", "of them, cgroups read afresh"),
                          ("pushes_failed", "pushes failed")):
            a, b = on[key], off[key]
            print(f"| {unit} | {a:.2f} | {b:.2f} | "
                  f"{f'{a / b:.2f}x' if b else '-'} |")
    for name, extra in with_rules.items():
        print(f"\nthe {args.cgroups}-cgroup agent with {name} beside the shipped rules:\n")
        print(f"| metric | + {name} | shipped rules only | ratio |")
        print("|---|---|---|---|")
        for key, unit in (("cpu_percent", "% of one core"), ("rss_max_mb", "MB RSS max")):
            a, b = extra[key], with_cgroups[key]
            print(f"| {unit} | {a:.2f} | {b:.2f} | {a / b if b else float('nan'):.2f}x |")
    ok_cpu = with_cgroups["cpu_percent"] < 2.0
    ok_rss = with_cgroups["rss_max_mb"] < 100
    print(f"\ntarget <2% of a core: {'met' if ok_cpu else 'NOT met'}; "
          f"target <100 MB RSS: {'met' if ok_rss else 'NOT met'}")


if __name__ == "__main__":
    main()
