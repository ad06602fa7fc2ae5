"""A real program as a BE job (`be.programs` in a scenario): the lab judged on workloads it did
not design, not only on stress-ng's stressors.

The program runs again each time it ends, in its BE cgroup, until its job's time is up; a run
still going then is stopped and not counted. Its throughput is its completed runs, which is
what a batch user counts, in the place stress-ng's bogo-ops take for a stressor (the report
compares each job with itself in the unguarded way, so the unit drops out). A run killed by
SIGKILL (an OOM kill under a memory lever; a shell reports its child's as exit code 137) is a
lost run, and the job goes on as its controller would restart it; a run that exits with an
error or dies of another signal (a crash) is the program's or the scenario's fault, so the job
stops, the way checks `error` every half second and stops too, and the error says why, with
the end of what the program wrote to stderr (its stdout, a compressor's output say, is
discarded; stderr is kept in `program-<name>.log`).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

from sloguard.lab.antagonists import EpisodeRun, LabSetupError
from sloguard.lab.cgroups import LabCgroup

LOG_TAIL = 2000  # bytes of the program's output quoted when it fails
# a run ended by SIGKILL, itself or (through a shell) its last command: lost, not a failure
KILLED = (-signal.SIGKILL, 128 + signal.SIGKILL)


class ProgramJob:
    """The same `finish`/`kill` as `Antagonist`, for one program run over and over."""

    def __init__(self, name: str, argv: list[str], duration: float, cgroup: LabCgroup,
                 workdir: Path) -> None:
        found = shutil.which(argv[0])
        if found is None:
            raise LabSetupError(f"program {name!r}: {argv[0]!r} is not installed or not on "
                                "PATH")
        self.antagonist = name
        self.cgroup = cgroup.rel
        self.argv = [found, *argv[1:]]
        self.runs = 0
        self.killed = 0  # runs ended by a signal: lost, and started again
        self.error: str | None = None
        self._where = cgroup
        self._log_path = workdir / f"program-{name}.log"
        self._log = self._log_path.open("ab")
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None
        self.started_ns = time.time_ns()
        self._deadline = time.monotonic() + duration
        self._thread = threading.Thread(target=self._loop, name=f"program-{name}", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        try:
            self._run_until_done()
        except Exception as exc:  # a program that cannot start: the way must hear of it
            self.error = f"program {self.antagonist!r} could not start: {exc}"

    def _run_until_done(self) -> None:
        while not self._stop.is_set():
            left = self._deadline - time.monotonic()
            if left <= 0:
                return
            with self._lock:
                if self._stop.is_set():
                    return
                self._proc = proc = self._where.spawn(self.argv, stdout=subprocess.DEVNULL,
                                                      stderr=self._log)
            try:
                code = proc.wait(timeout=left)
            except subprocess.TimeoutExpired:
                return  # its time is up mid-run: that run is not counted
            if self._stop.is_set():
                return
            if code == 0:
                self.runs += 1
            elif code in KILLED:
                self.killed += 1
            else:
                self.error = (f"program {self.antagonist!r} "
                              + (f"died of signal {-code}" if code < 0 else
                                 f"exited with {code}"))
                return

    def check(self) -> None:
        """Raise the job's error as soon as there is one (the way polls it), not only at
        `finish`: a program that cannot run stops the way instead of spending it."""
        if self.error is not None:
            tail = self._log_path.read_bytes()[-LOG_TAIL:].decode(errors="replace")
            raise LabSetupError(f"{self.error} (argv: {' '.join(self.argv)}); the end of its "
                                f"stderr ({self._log_path}):\n{tail}")

    def _end_run(self) -> None:
        """Stop the run in hand and whatever it started (a shell's children outlive it),
        which is everything left in the job's cgroup: it runs there alone."""
        with self._lock:
            self._stop.set()
            proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        deadline = time.monotonic() + 5
        while (left := self._where.pids()) and time.monotonic() < deadline:
            for pid in left:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.01)

    def finish(self, timeout: float = 30.0) -> EpisodeRun:
        self._thread.join(timeout=max(self._deadline - time.monotonic(), 0) + timeout)
        self._end_run()
        self._thread.join(timeout=10)
        ended = time.time_ns()
        self._log.close()
        self.check()
        return EpisodeRun(self.antagonist, self.started_ns, ended, float(self.runs), 0)

    def kill(self) -> None:
        self._end_run()
        self._thread.join(timeout=10)
        self._log.close()
