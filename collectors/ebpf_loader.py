"""Compile and attach the eBPF programs in a short-lived child process; keep only their fds.

BCC compiles with LLVM inside the process that uses it: importing it adds ~60 MB of RSS and
compiling ~40 MB more, which stays (measured here: an agent of 75 MB grew to ~200 MB). The
attached programs themselves need none of it: a tracepoint attachment lives as long as its
perf event file descriptor, and the histograms are read through their map's descriptor with
plain bpf(2) calls (collectors/bpf_maps.py). So a child process imports BCC, compiles and
attaches each family, hands the map and perf event descriptors to the agent over a Unix socket
(SCM_RIGHTS) and exits without BCC's cleanup (which would disable the handed-over events).
A compiler crash or hang costs the child, not the agent, and the child's output is the
compiler's error message, captured per family for /readyz.

    python -m sloguard.collectors.ebpf_loader SOCKET_FD cgroup|pid FAMILY...
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from sloguard.collectors.ebpf_programs import FAMILIES, program_text

LOAD_TIMEOUT_S = 120.0
_MAX_FDS = 64


@dataclass
class LoadedFamily:
    """One attached family as the agent holds it: descriptors only."""

    name: str
    map_fd: int
    attach_fds: list[int] = field(default_factory=list)
    load_seconds: float = 0.0
    tables: dict[str, int] = field(default_factory=dict)  # the family's further maps by name

    def close(self) -> None:
        for fd in (*self.attach_fds, *self.tables.values(), self.map_fd):
            with contextlib.suppress(OSError):
                os.close(fd)
        self.attach_fds, self.tables = [], {}


class LoaderError(Exception):
    """The loader process itself failed (not one family's compilation)."""


def first_error(text: str) -> str:
    """The line of BCC's output that says what went wrong (compiler errors come first)."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for marker in ("error:", "fatal", "unable", "no such file", "error"):
        for line in lines:
            if marker in line.lower():
                return line[:300]
    return lines[0][:300] if lines else ""


def load(names: list[str], key_by_pid: bool, kernel_source: str | None,
         timeout: float = LOAD_TIMEOUT_S) -> tuple[dict[str, LoadedFamily], dict[str, str]]:
    """Attach the named families; (attached by name, failure reason by name)."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    env = dict(os.environ)
    if kernel_source:
        env["BCC_KERNEL_SOURCE"] = kernel_source
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "sloguard.collectors.ebpf_loader", str(theirs.fileno()),
             "pid" if key_by_pid else "cgroup", *names],
            pass_fds=[theirs.fileno()], env=env, stdin=subprocess.DEVNULL, stdout=log,
            stderr=subprocess.STDOUT)
        theirs.close()
        loaded: dict[str, LoadedFamily] = {}
        failed: dict[str, str] = {}
        try:
            _receive(ours, proc, timeout, loaded, failed)
        except BaseException:
            for family in loaded.values():
                family.close()
            raise
        finally:
            ours.close()
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            log.seek(0)
            output = log.read().decode(errors="replace")
        missing = [n for n in names if n not in loaded and n not in failed]
        if missing:
            detail = first_error(output) or f"exit status {proc.returncode}"
            raise LoaderError(f"the loader process ended before loading {', '.join(missing)}: "
                              f"{detail}")
    return loaded, failed


def _receive(sock: socket.socket, proc: subprocess.Popen, timeout: float,
             loaded: dict[str, LoadedFamily], failed: dict[str, str]) -> None:
    deadline = time.monotonic() + timeout
    # a selector, not select(2): an agent holding over 1,024 descriptors (connections, loaded
    # programs) would get "filedescriptor out of range" from select and never load its programs
    with selectors.DefaultSelector() as ready:
        ready.register(sock, selectors.EVENT_READ)
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not ready.select(left):
                raise LoaderError(f"the loader did not finish within {timeout:.0f} s")
            if _take(sock, loaded, failed):
                return


def _take(sock: socket.socket, loaded: dict[str, LoadedFamily],
          failed: dict[str, str]) -> bool:
    """One message of the loader; True when it was the last."""
    data, fds, _, _ = socket.recv_fds(sock, 1 << 16, _MAX_FDS)
    if not data:  # the child closed its end
        for fd in fds:
            os.close(fd)
        return True
    message = json.loads(data)
    if "fatal" in message:
        raise LoaderError(message["fatal"])
    if message.get("done"):
        return True
    name = message["family"]
    if "error" in message:
        detail = first_error(message.get("output", ""))
        failed[name] = message["error"] + (f": {detail}" if detail else "")
    else:
        tables = message.get("tables", [])
        loaded[name] = LoadedFamily(name, fds[0], list(fds[1 + len(tables):]),
                                    message["load_seconds"],
                                    dict(zip(tables, fds[1:1 + len(tables)], strict=True)))
    return False


# ------------------------------------------------------------------------- the child process
class _Captured:
    text = ""


@contextlib.contextmanager
def _output_captured() -> Iterator[_Captured]:
    """BCC prints compiler errors (and "Unable to find kernel headers") from C++ straight to
    file descriptors 1 and 2: catch them to send them with the failure."""
    captured = _Captured()
    with tempfile.TemporaryFile() as tmp:
        sys.stdout.flush()
        sys.stderr.flush()
        saved = [os.dup(1), os.dup(2)]
        os.dup2(tmp.fileno(), 1)
        os.dup2(tmp.fileno(), 2)
        try:
            yield captured
        finally:
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved:
                os.close(fd)
            tmp.seek(0)
            captured.text = tmp.read().decode(errors="replace")


def _send(sock: socket.socket, message: dict, fds: list[int] | None = None) -> None:
    socket.send_fds(sock, [json.dumps(message).encode()], fds or [])


def main(argv: list[str]) -> None:
    sock = socket.socket(fileno=int(argv[0]))
    key_by_pid = argv[1] == "pid"
    try:
        import bcc
    except (ImportError, OSError) as exc:
        _send(sock, {"fatal": f"BCC cannot be imported by the loader: {exc}"})
        os._exit(0)
    families = {f.name: f for f in FAMILIES}
    keep = []  # the BPF objects must outlive the sends: their fds are what we hand over
    for name in argv[2:]:
        family = families[name]
        text, cflags = program_text(family, key_by_pid)
        started = time.perf_counter()
        try:
            with _output_captured() as output:
                program = bcc.BPF(text=text.encode(), cflags=cflags)
            table = program[family.table.encode()]
            tables = [name for name, _, _ in family.tables]
            fds = [table.map_fd, *(program[t.encode()].map_fd for t in tables),
                   *program.tracepoint_fds.values()]
        except Exception as exc:
            _send(sock, {"family": name, "error": str(exc), "output": output.text[-20000:]})
            continue
        keep.append(program)
        _send(sock, {"family": name, "load_seconds": time.perf_counter() - started,
                     "tables": tables}, fds)
    _send(sock, {"done": True})
    sock.close()
    sys.stdout.flush()
    # Not sys.exit: BCC's atexit cleanup would disable the perf events the agent now holds.
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1:])
