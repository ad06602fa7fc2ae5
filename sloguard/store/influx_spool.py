"""A durable, bounded FIFO of line-protocol batches on disk, for while InfluxDB is away.

One gzip file per batch, named by a sequence number: appending is one write, fsync and rename
(a crash leaves either the whole batch or a temporary file that the next start deletes),
replaying in order is reading the lowest number, and dropping the oldest batch when the bound
is reached is one unlink. Batches are a few hundred KB compressed, so a 60-second outage is a
handful of files, and the bound (bytes of the files) is exact to the batch.

The files hold the gzip-compressed line protocol exactly as it is sent to a 1.x /write endpoint
with `Content-Encoding: gzip`, so a replay does not re-encode anything.
"""

from __future__ import annotations

import contextlib
import gzip
import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

log = logging.getLogger(__name__)

SUFFIX = ".lp.gz"
FullPolicy = Literal["drop_oldest", "drop_newest"]


class SpoolError(OSError):
    """The spool directory cannot be written (disk full, read-only, permissions)."""


@dataclass(frozen=True, slots=True)
class SpooledBatch:
    seq: int
    points: int
    size: int
    path: Path

    def read(self) -> bytes:
        """The batch's gzip-compressed line protocol."""
        return self.path.read_bytes()

    def lines(self) -> bytes:
        return gzip.decompress(self.read())


class Spool:
    def __init__(self, directory: Path, max_bytes: int, policy: FullPolicy = "drop_oldest") -> None:
        self.directory = Path(directory)
        self.max_bytes = max_bytes
        self.policy = policy
        self._lock = threading.Lock()
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise SpoolError(f"{self.directory}: cannot create the spool directory: {exc}") \
                from exc
        self._batches: list[SpooledBatch] = []
        for path in self.directory.iterdir():
            if path.name.endswith(".tmp"):
                path.unlink(missing_ok=True)  # a batch whose append did not complete
                continue
            batch = _parse_name(path)
            if batch is not None:
                self._batches.append(batch)
        self._batches.sort(key=lambda b: b.seq)
        self._next_seq = self._batches[-1].seq + 1 if self._batches else 1
        self.bytes = sum(b.size for b in self._batches)
        self.dropped_batches = 0
        self.dropped_points = 0

    def __len__(self) -> int:
        return len(self._batches)

    @property
    def points(self) -> int:
        return sum(b.points for b in self._batches)

    def append(self, body_gz: bytes, points: int) -> list[SpooledBatch]:
        """Add a batch at the tail; return the batches dropped to stay within the bound.

        With `drop_newest`, a batch that does not fit is itself dropped (returned, not written).
        Raises SpoolError when the file cannot be written.
        """
        with self._lock:
            dropped: list[SpooledBatch] = []
            size = len(body_gz)
            overflow = self.bytes + size > self.max_bytes
            if size > self.max_bytes or (overflow and self.policy == "drop_newest"):
                batch = SpooledBatch(self._next_seq, points, size, Path(""))
                self._count_drop([batch])
                return [batch]
            while self._batches and self.bytes + size > self.max_bytes:
                oldest = self._batches.pop(0)
                oldest.path.unlink(missing_ok=True)
                self.bytes -= oldest.size
                dropped.append(oldest)
            self._count_drop(dropped)
            seq = self._next_seq
            path = self.directory / f"{seq:016d}-{points}{SUFFIX}"
            tmp = path.with_name(path.name + ".tmp")
            try:
                with open(tmp, "wb") as out:
                    out.write(body_gz)
                    out.flush()
                    os.fsync(out.fileno())
                os.replace(tmp, path)
                _fsync_dir(self.directory)
            except OSError as exc:
                with contextlib.suppress(OSError):
                    tmp.unlink(missing_ok=True)
                raise SpoolError(f"{self.directory}: cannot spool a batch: {exc}") from exc
            self._next_seq += 1
            self._batches.append(SpooledBatch(seq, points, size, path))
            self.bytes += size
            return dropped

    def head(self) -> SpooledBatch | None:
        with self._lock:
            return self._batches[0] if self._batches else None

    def remove(self, batch: SpooledBatch) -> None:
        """Forget a batch once the server has it (or has refused it for good)."""
        with self._lock:
            if batch in self._batches:
                self._batches.remove(batch)
                self.bytes -= batch.size
            batch.path.unlink(missing_ok=True)

    def _count_drop(self, dropped: list[SpooledBatch]) -> None:
        if not dropped:
            return
        self.dropped_batches += len(dropped)
        self.dropped_points += sum(b.points for b in dropped)
        log.error(
            "InfluxDB spool %s full (%d of %d bytes, policy %s): dropped %d batch(es), "
            "%d points", self.directory, self.bytes, self.max_bytes, self.policy, len(dropped),
            sum(b.points for b in dropped))


def _parse_name(path: Path) -> SpooledBatch | None:
    if not path.name.endswith(SUFFIX):
        return None
    stem = path.name[: -len(SUFFIX)]
    seq, _, points = stem.partition("-")
    if not (seq.isdigit() and points.isdigit()):
        return None
    try:
        size = path.stat().st_size
    except OSError:
        return None
    return SpooledBatch(int(seq), int(points), size, path)


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
