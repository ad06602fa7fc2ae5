"""A real PostgreSQL server for tests: Debian's postgresql (15), on loopback, in a temp dir.

``PostgresServer`` runs initdb into its own temp dir and starts ``postgres`` on a free
127.0.0.1 port with password authentication over TCP (a superuser ``sloguard`` with a random
password, as a deployment would have one) and durability off (fsync: a test's data need not
survive a crash of the machine). ``create_database()`` gives each test a database of its own.
It is stopped and removed at the end.

Two traps, both met here:
- PostgreSQL refuses to run as root. Under root (CI, this machine) initdb and postgres run as
  the package's ``postgres`` user (Popen's user/group: no runuser or su between, so the pid we
  hold is the postmaster's and signals reach it), and the temp dir, which mkdtemp makes 0700
  for root, is handed to that user first, or initdb cannot write into it.
- SIGTERM is PostgreSQL's *smart* shutdown: it waits for every client to disconnect, and a
  server replica or pool a test leaves open would hold it to the SIGKILL. ``stop`` sends
  SIGINT (fast shutdown: clients are disconnected, the data is kept).

Installed by ``scripts/postgres-testenv.sh`` (``make test`` runs it); its binaries are not on
PATH (/usr/lib/postgresql/VERSION/bin). This module must not import the sloguard package.
"""

from __future__ import annotations

import atexit
import contextlib
import glob
import os
import pwd
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import IO, Any

from support.influxenv import _tail, free_port, stop_process

SETUP_SCRIPT = "scripts/postgres-testenv.sh"
RUN_AS = "postgres"  # the package's user, when we are root
SUPERUSER = "sloguard"


def bin_dir() -> Path | None:
    """The newest installed PostgreSQL's bin dir (Debian's layout, then PATH)."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/postgres"),
                   key=lambda p: int(Path(p).parts[-3]) if Path(p).parts[-3].isdigit() else 0)
    if found:
        return Path(found[-1]).parent
    on_path = shutil.which("postgres")
    return Path(on_path).resolve().parent if on_path else None


def missing_message() -> str:
    """'' when PostgreSQL (and the user to run it as root) is there, else how to get it."""
    hint = (f"run `bash {SETUP_SCRIPT}` (as root; installs Debian's postgresql without "
            "starting its own cluster)")
    where = bin_dir()
    if where is None or not (where / "initdb").exists():
        return f"PostgreSQL (initdb, postgres) not installed: {hint}"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam(RUN_AS)
        except KeyError:
            return f"no {RUN_AS!r} user to run PostgreSQL as (it refuses root): {hint}"
    try:
        import psycopg  # noqa: F401
    except ImportError:
        return "psycopg not installed: pip install -e '.[test]'"
    return ""


class PostgresServer:
    def __init__(self, durable: bool = False) -> None:
        """`durable`: PostgreSQL's own defaults (fsync, synchronous commit, full pages) for a
        benchmark whose figures and whose claim that nothing acknowledged is lost must hold
        for a deployment (benchmarks/fleet.py); off by default, a test's data need not."""
        self.durable = durable
        self.bin = bin_dir()
        assert self.bin is not None, missing_message()
        self.workdir = Path(tempfile.mkdtemp(prefix="sloguard-postgres-"))
        self.data = self.workdir / "data"
        self.port = free_port()
        self.password = "pw-" + secrets.token_hex(12)
        self.log_path = self.workdir / "postgres.log"
        self._proc: subprocess.Popen | None = None
        self._log: IO[bytes] | None = None
        self._initialised = False
        self._as: dict[str, Any] = {}
        if os.geteuid() == 0:
            user = pwd.getpwnam(RUN_AS)
            self._as = {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": []}
            os.chown(self.workdir, user.pw_uid, user.pw_gid)
        atexit.register(self.close)

    def url(self, database: str = "postgres") -> str:
        """The URL the server setting takes: no password in it (give `password` apart)."""
        return f"postgresql://{SUPERUSER}@127.0.0.1:{self.port}/{database}"

    def _init(self) -> None:
        pwfile = self.workdir / "pwfile"
        pwfile.write_text(self.password + "\n")
        if self._as:
            os.chown(pwfile, self._as["user"], self._as["group"])
        done = subprocess.run(
            [str(self.bin / "initdb"), "-D", str(self.data), "-U", SUPERUSER,
             f"--pwfile={pwfile}", "--auth-local=trust", "--auth-host=scram-sha-256",
             "-E", "UTF8", "--locale=C.UTF-8", "--no-sync"],
            cwd=self.workdir, capture_output=True, text=True, timeout=120, **self._as)
        pwfile.unlink()
        if done.returncode != 0:
            raise RuntimeError(f"initdb failed ({done.returncode}):\n{done.stdout}\n"
                               f"{done.stderr}")
        self._initialised = True

    def start(self, timeout: float = 60.0) -> None:
        if self.running:
            return
        if not self._initialised:
            self._init()
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        self._proc = subprocess.Popen(
            [str(self.bin / "postgres"), "-D", str(self.data), "-p", str(self.port),
             "-c", "listen_addresses=127.0.0.1", "-c", f"unix_socket_directories={self.workdir}",
             *(() if self.durable else ("-c", "fsync=off", "-c", "synchronous_commit=off",
                                        "-c", "full_page_writes=off")),
             "-c", "max_connections=200"],
            cwd=self.workdir, stdin=subprocess.DEVNULL, stdout=self._log,
            stderr=subprocess.STDOUT, start_new_session=True, close_fds=True, **self._as)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"postgres exited with {self._proc.returncode}; log:\n"
                                   f"{_tail(self.log_path)}")
            if self.ready():
                return
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"postgres not ready after {timeout} s; log:\n{_tail(self.log_path)}")

    def connect(self, database: str = "postgres") -> Any:
        import psycopg

        return psycopg.connect(self.url(database), password=self.password, autocommit=True,
                               connect_timeout=5)

    def ready(self) -> bool:
        import psycopg

        try:
            with self.connect() as conn:
                conn.execute("SELECT 1")
            return True
        except psycopg.OperationalError:
            return False

    def create_database(self) -> str:
        """A new empty database; its URL (the password is `self.password`)."""
        name = "t_" + secrets.token_hex(6)
        with self.connect() as conn:
            conn.execute(f"CREATE DATABASE {name}")
        return self.url(name)

    @property
    def running(self) -> bool:
        if self._proc is not None:
            return self._proc.poll() is None
        return self.postmaster_pid() is not None  # since restart(): pg_ctl's child

    def postmaster_pid(self) -> int | None:
        """The running postmaster's pid from its postmaster.pid (ours, or the one `pg_ctl
        restart` started), None when none runs."""
        try:
            pid = int((self.data / "postmaster.pid").read_text().split("\n", 1)[0])
        except (OSError, ValueError):
            return None
        return pid if _alive(pid) else None

    def restart(self, mode: str = "fast", timeout: float = 120.0) -> None:
        """`pg_ctl restart -m MODE`, as an operator restarts the server (benchmarks/fleet.py
        does it under load). The new postmaster is pg_ctl's (daemonized), not our child:
        `postmaster_pid` finds it and `stop` signals it by that pid."""
        old, self._proc = self._proc, None
        done = subprocess.run(
            [str(self.bin / "pg_ctl"), "restart", "-D", str(self.data), "-m", mode, "-w",
             "-t", str(int(timeout)), "-l", str(self.workdir / "postgres-restarted.log")],
            cwd=self.workdir, capture_output=True, text=True, timeout=timeout + 10,
            **self._as)
        if old is not None:
            old.wait(timeout=10)  # exited by now: reaped
        if done.returncode != 0:
            raise RuntimeError(f"pg_ctl restart failed ({done.returncode}):\n{done.stdout}\n"
                               f"{done.stderr}\n{_tail(self.log_path)}")

    def stop(self, grace: float = 20.0) -> None:
        """Fast shutdown (SIGINT), SIGKILL to the whole group after `grace`."""
        if self._proc is None and (pid := self.postmaster_pid()) is not None:
            _stop_detached(pid, grace)  # started by restart()
        proc, self._proc = self._proc, None
        stop_process(proc, signal.SIGINT, grace, group=False)
        if self._log is not None:
            self._log.close()
            self._log = None

    def close(self) -> None:
        atexit.unregister(self.close)
        self.stop(grace=10.0)
        shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> PostgresServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _alive(pid: int) -> bool:
    """Whether `pid` runs: not gone, and not a zombie (a postmaster pg_ctl started is not our
    child; whoever reaps it may not have yet)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def _stop_detached(pid: int, grace: float) -> None:
    """Fast shutdown of a postmaster that is not our child: SIGINT, SIGKILL after `grace`."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGINT)
    deadline = time.monotonic() + grace
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    if _alive(pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
