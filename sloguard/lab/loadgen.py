"""An open-loop Redis load generator that measures from the intended send time.

Requests are due on a Poisson schedule fixed in advance; each one is sent when due whether or
not earlier replies have come back (pipelined on one connection, as Redis allows), and its
latency is `reply received - intended send time`. A slow server therefore cannot slow the
client down and hide its own slowness (coordinated omission): requests that wait in the socket
count as waiting. The send lag (`sent - intended`) is recorded too, so a report can show that
the client itself was on time.

The client must not be a victim of the interference it measures (colocation-lab.md: a
co-located client at normal priority measured mostly its own lateness). It asks for
SCHED_FIFO, as a remote client on an idle machine would be: the BE stressors, at normal
priority, then cannot delay its sends. Nor may the client delay the server: a real-time client
on the LS service's core preempts it at every send (traced here: ~118,000 preemptions of redis
by the client in 28 s, and an LS p99 that depended on which core the client last woke on). A
remote client costs the server none of its CPU, so the lab keeps the client off the LS cores
(`--cpus`).

Run as a child process; records go to stdout as little-endian int64 triples
(intended_ns, sent_ns, done_ns) in CLOCK_REALTIME nanoseconds, written every 100 ms; a request
with no reply by the end has done_ns = -1.

    python -m sloguard.lab.loadgen --port 6379 --rate 2000 --duration 60
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import select
import socket
import sys
import time
from array import array
from collections import deque

from sloguard.core.cpulist import parse_cpulist

RECORD = 3  # int64s per request
FLUSH_NS = 100_000_000


def reply_length(value_size: int) -> int:
    """A GET of an existing key: `$<size>\\r\\n<value>\\r\\n`."""
    return len(f"${value_size}\r\n") + value_size + 2


def command(*args: bytes) -> bytes:
    out = [b"*%d\r\n" % len(args)]
    for arg in args:
        out.append(b"$%d\r\n%s\r\n" % (len(arg), arg))
    return b"".join(out)


def preload(sock: socket.socket, keys: int, value_size: int) -> None:
    """SET every key once (pipelined) so every GET has a reply of the same length."""
    value = b"v" * value_size
    sock.setblocking(True)
    batch = 1000
    for first in range(0, keys, batch):
        n = min(batch, keys - first)
        sock.sendall(b"".join(command(b"SET", b"k%d" % i, value)
                              for i in range(first, first + n)))
        want, got = 5 * n, b""  # +OK\r\n each
        while len(got) < want:
            chunk = sock.recv(65536)
            if not chunk:
                raise ConnectionError("redis closed the connection during preload")
            got += chunk
        if got != b"+OK\r\n" * n:
            raise ConnectionError(f"unexpected reply during preload: {got[:80]!r}")


def realtime(priority: int) -> str:
    """SCHED_FIFO at `priority`; the reason as text when the kernel says no."""
    if priority <= 0:
        return "normal priority (asked)"
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(priority))
        return f"SCHED_FIFO {priority}"
    except OSError as exc:
        return f"normal priority: SCHED_FIFO refused ({exc.strerror})"


def pin(cpus: set[int] | None) -> str:
    """Keep to `cpus`; what was done, as text for the report."""
    if not cpus:
        return "any CPU"
    try:
        os.sched_setaffinity(0, cpus)
    except OSError as exc:
        return f"any CPU: pinning to {sorted(cpus)} refused ({exc.strerror})"
    return "CPUs " + ",".join(map(str, sorted(cpus)))


def run(host: str, port: int, rate: float, duration: float, keys: int, value_size: int,
        seed: int, out: int, drain: float = 5.0, start_ns: int | None = None) -> None:
    sock = socket.create_connection((host, port), timeout=10)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    preload(sock, keys, value_size)
    sock.setblocking(False)
    rng = random.Random(seed)
    length = reply_length(value_size)
    mean_gap_ns = 1e9 / rate
    start = start_ns if start_ns is not None else time.time_ns()
    while time.time_ns() < start:
        time.sleep(min(0.05, (start - time.time_ns()) / 1e9))
    end = start + int(duration * 1e9)
    next_ns = start
    pending: deque[tuple[int, int]] = deque()
    records = array("q")
    outbuf = b""
    partial = 0  # bytes of a reply received but not yet complete
    last_flush = start
    now = time.time_ns()
    while next_ns < end or (pending and now < end + int(drain * 1e9)):
        now = time.time_ns()
        while next_ns <= now and next_ns < end:
            outbuf += command(b"GET", b"k%d" % rng.randrange(keys))
            pending.append((next_ns, now))
            next_ns += max(1, int(rng.expovariate(1.0) * mean_gap_ns))
        if outbuf:
            try:
                sent = sock.send(outbuf)
                outbuf = outbuf[sent:]
            except BlockingIOError:
                pass
        wait = max(0.0, (next_ns - time.time_ns()) / 1e9) if next_ns < end else 0.05
        readable, _, _ = select.select([sock], [sock] if outbuf else [], [], wait)
        if readable:
            data = sock.recv(1 << 20)
            if not data:
                raise ConnectionError("redis closed the connection")
            done = time.time_ns()
            partial += len(data)
            while partial >= length and pending:
                intended, sent_at = pending.popleft()
                records.extend((intended, sent_at, done))
                partial -= length
        if time.time_ns() - last_flush >= FLUSH_NS:
            _write(out, records)
            records = array("q")
            last_flush = time.time_ns()
    for intended, sent_at in pending:
        records.extend((intended, sent_at, -1))
    _write(out, records)
    with contextlib.suppress(OSError):
        sock.close()


def _write(fd: int, records: array) -> None:
    if records:
        if sys.byteorder != "little":
            records.byteswap()
        view = memoryview(records.tobytes())
        while view:
            view = view[os.write(fd, view):]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--rate", type=float, default=2000.0, help="requests per second")
    parser.add_argument("--duration", type=float, required=True, help="seconds of load")
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--value-size", type=int, default=256)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--rt-priority", type=int, default=20, help="0: stay at normal priority")
    parser.add_argument("--cpus", type=lambda text: set(parse_cpulist(text)), default=set(),
                        help="run only on these CPUs (a cpulist such as 1-3); empty: any")
    parser.add_argument("--start-ns", type=int, default=None,
                        help="CLOCK_REALTIME ns of the first request (default: now)")
    args = parser.parse_args(argv)
    print(f"{realtime(args.rt_priority)} on {pin(args.cpus)}", file=sys.stderr, flush=True)
    run(args.host, args.port, args.rate, args.duration, args.keys, args.value_size, args.seed,
        sys.stdout.fileno(), start_ns=args.start_ns)


if __name__ == "__main__":
    main()
