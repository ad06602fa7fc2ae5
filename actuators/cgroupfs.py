"""What the cgroup levers share: where a cgroup's files are, which cgroups a lever may write, and
the bookkeeping that makes apply idempotent and undo exact.

Safety is enforced here, at the last moment before each write, not only when targets are chosen:
a lever writes a cgroup only if it stands for BE workloads (class re-checked) and the cgroup is
not an LS workload, does not lie under one and does not hold one. A bug in target selection (or
a BE pod nested in an LS cgroup) then ends in a refusal, never in a write that slows an LS pod.

Idempotence across repeats and restarts: the original value of a file is the value found before
the first write. A later apply (a `repeat`, a retry, a restarted agent) that finds in the ledger
a record of this lever kind whose written value is still in the file keeps that record's
original, so the value restored on undo is the one from before sloguard, never a value sloguard
wrote itself. Undo writes a file back only while it still holds what we wrote: a value someone
changed since is theirs, and is left alone (and reported).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import posixpath
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sloguard.actuators.env import ActuatorEnv
from sloguard.actuators.step import (
    BE,
    DONE,
    FAILED,
    PROPOSED,
    SKIPPED,
    StepContext,
    StepResult,
)
from sloguard.core import failpoints
from sloguard.core.cgroup_layout import CgroupLayout, layout_from_root
from sloguard.core.pod_cgroups import parse_pod_cgroup

SCOPES = ("auto", "workload", "parent")
_GONE = (errno.ENOENT, errno.ENODEV, errno.ESRCH)
_DETAIL_ITEMS = 6  # per result; the rest is counted, the undo record keeps everything


def parts_of(cgroup: str) -> tuple[str, ...] | None:
    """A cgroup path as its components; None when it is not a plain relative path (`..`)."""
    parts = tuple(p for p in cgroup.split("/") if p)
    if any(p in (".", "..") for p in parts):
        return None
    return parts


def path_name(parts: Iterable[str]) -> str:
    return "/" + "/".join(parts)


def norm(value: str | None) -> str | None:
    """Compare file contents as the kernel prints them, whatever whitespace we wrote."""
    return None if value is None else " ".join(value.split())


def read_value(path: Path | str) -> str | None:
    """The file's content, or None when it (or its cgroup) is gone.

    Read with os.read, not a text-mode open(): a standing lever's full check reads two files
    of every BE cgroup, and the text layer was about a fifth of it in a cProfile of it (its
    time: benchmarks/agent_tick.py's last line)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            # to the end, always: a list file (`tasks`, `cgroup.threads`) comes a line at a time
            # and the kernel ends a read short of the line that would not fit its page, so a
            # short read does not mean the end (900 threads read as 819 with one read)
            chunks = []
            while chunk := os.read(fd, 65536):
                chunks.append(chunk)
            data = b"".join(chunks)
        finally:
            os.close(fd)
    except OSError as exc:
        if exc.errno in _GONE or isinstance(exc, FileNotFoundError | NotADirectoryError):
            return None
        raise
    return data.decode().strip()


def write_value(path: Path | str, value: str) -> None:
    """One write(2) of the whole value, never creating the file: a cgroup file that does not
    exist is a missing feature (an old kernel, a disabled controller), not something to make."""
    failpoints.hit("cgroup.write:before")
    fd = os.open(path, os.O_WRONLY | os.O_TRUNC | os.O_CLOEXEC)
    try:
        os.write(fd, (value + "\n").encode())
    finally:
        os.close(fd)
    failpoints.hit("cgroup.write:after")


class Guard:
    """The cgroups a lever must never write: LS (and unclassified) workloads, what lies under
    them and what holds them. Built from the whole inventory, not from the BE list."""

    def __init__(self, inventory: list[dict[str, str]]) -> None:
        self.protected: list[tuple[str, ...]] = []
        for workload in inventory:
            if workload.get("class") == BE:
                continue
            cgroup = posixpath.normpath("/" + workload.get("cgroup", ""))
            self.protected.append(tuple(p for p in cgroup.split("/") if p))
        # A cgroup is related to a protected one only if one is a prefix of the other: most
        # (BE cgroups beside the LS ones) are told apart by a few set lookups, not compared
        # with every protected cgroup. A standing lever's full check asks twice per BE cgroup,
        # and the comparisons were a fifth of it (cProfile of it on 90 BE and 10 LS cgroups;
        # its time: benchmarks/agent_tick.py's last line).
        self._protected = set(self.protected)
        self._holders = {ls[:depth] for ls in self.protected for depth in range(len(ls) + 1)}

    def refusal(self, parts: tuple[str, ...] | None) -> str | None:
        """Why the cgroup must not be written, or None."""
        if parts is None:
            return "not a plain cgroup path"
        if not parts:
            return "the hierarchy root holds every workload"
        if parts not in self._holders and not any(
                parts[:depth] in self._protected for depth in range(len(parts))):
            return None  # neither is nor holds nor lies under a protected cgroup
        return self.compared_with_each(parts)

    def compared_with_each(self, parts: tuple[str, ...]) -> str | None:
        """`refusal` of a plain, non-root cgroup by comparing it with every protected one:
        the answer the set lookups above must agree with (tests/test_cgroup_guard.py)."""
        for ls in self.protected:
            n = min(len(ls), len(parts))
            if parts[:n] != ls[:n]:
                continue
            if len(parts) == len(ls):
                return f"is the LS workload {path_name(ls)}"
            if len(parts) > len(ls):
                return f"lies under the LS workload {path_name(ls)}"
            return f"holds the LS workload {path_name(ls)}"
        return None


@dataclass
class Target:
    """A cgroup a lever writes, and the BE workloads it stands for."""

    parts: tuple[str, ...]
    workloads: list[dict[str, str]] = field(default_factory=list)

    @property
    def name(self) -> str:
        return path_name(self.parts)


def _be_qos_cgroup(parts: tuple[str, ...]) -> bool:
    """The kubelet's besteffort QoS cgroup: BE-only by construction, and the level at which BE
    pods compete with the LS pods (its siblings are burstable and guaranteed pods)."""
    pod = parse_pod_cgroup("/".join(parts)) if parts else None
    return pod is not None and pod.level == "qos" and pod.qos == "besteffort"


def select_targets(ctx: StepContext, scope: str = "workload") -> tuple[list[Target], list[str]]:
    """The cgroups to write for the BE workloads, and the ones refused (with the reason).

    `workload`: each BE workload's own cgroup. `parent`: their parent cgroups. `auto`: the
    parent when it is the kubelet's besteffort QoS cgroup, else the workload's own cgroup
    (other parents may hold processes the agent knows nothing about). A rung narrowed to
    suspects (`ctx.narrowed`) always writes the workloads' own cgroups.
    """
    if ctx.narrowed and scope != "workload":  # the suspects' own cgroups, not their parent
        scope = "workload"
    guard = Guard(ctx.inventory())
    refused: list[str] = []
    chosen: dict[tuple[str, ...], Target] = {}
    for workload in ctx.be_workloads():
        if workload.get("class") != BE:  # the contract says it cannot happen: check anyway
            refused.append(f"{workload.get('cgroup', '?')}: class {workload.get('class')!r} "
                           "is not BE")
            continue
        parts = parts_of(workload.get("cgroup", ""))
        if parts is None or not parts:
            refused.append(f"{workload.get('cgroup', '?')}: not a plain cgroup path")
            continue
        # auto: a QoS cgroup holding an LS pod (a besteffort pod labelled LS) is not written;
        # the BE pods in it are, one by one
        if scope == "parent" or (scope == "auto" and _be_qos_cgroup(parts[:-1])
                                 and guard.refusal(parts[:-1]) is None):
            parts = parts[:-1]
        why = guard.refusal(parts)
        if why:
            refused.append(f"{path_name(parts)}: {why}")
            continue
        chosen.setdefault(parts, Target(parts)).workloads.append(workload)
    # A target inside another one is covered by it: writing both would count it twice (quota).
    # Each target's own ancestors are looked up, not every pair compared: with 90 BE cgroups
    # the pairs were about a quarter of a standing lever's full check in a cProfile of it (its
    # time: benchmarks/agent_tick.py's last line).
    targets = [t for t in chosen.values()
               if not any(t.parts[:depth] in chosen for depth in range(len(t.parts)))]
    return sorted(targets, key=lambda t: t.parts), refused


def _joined(hierarchy: str, parts: tuple[str, ...]) -> str:
    """str(Path(hierarchy).joinpath(*parts)) for clean parts (parts_of's): the undo records'
    file keys were written that way, and a hierarchy of "/" must not give "//kubepods"."""
    if not parts:
        return hierarchy
    return hierarchy + "/".join(parts) if hierarchy.endswith("/") else \
        "/".join((hierarchy, *parts))


class Cgroups:
    """Where one controller's files of a cgroup are, on v1, v2 and hybrid hosts."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.layout: CgroupLayout = layout_from_root(root)

    def controller_dir(self, controller: str, parts: tuple[str, ...]) -> tuple[Path, str] | None:
        """(the cgroup's directory in the hierarchy holding `controller`, "v1" or "v2")."""
        located = self.controller_path(controller, parts)
        return None if located is None else (Path(located[0]), located[1])

    def controller_path(self, controller: str, parts: tuple[str, ...]) -> tuple[str, str] | None:
        """`controller_dir` as a string: a standing lever's full check asks for every BE cgroup
        every few seconds, and Path objects were a third of it (see Changes.set)."""
        if controller in self.layout.v1:
            return _joined(str(self.layout.v1[controller]), parts), "v1"
        if self.layout.unified is not None:
            return _joined(str(self.layout.unified), parts), "v2"
        return None

    def hierarchy_of(self, controller: str) -> Path | None:
        located = self.controller_dir(controller, ())
        return located[0] if located else None


def cgroups_unavailable(env: ActuatorEnv, controller: str) -> str | None:
    try:
        cgroups = Cgroups(env.cgroup_root)
    except (OSError, LookupError) as exc:
        return f"no cgroup hierarchy at {env.cgroup_root}: {exc}"
    if cgroups.hierarchy_of(controller) is None:
        return f"no {controller} controller under {env.cgroup_root}"
    return None


def params_key(params: dict[str, Any]) -> str:
    return json.dumps(params, sort_keys=True, default=str)


class Changes:
    """One apply (or dry-run) of a cgroup lever: the writes, their originals and the report."""

    def __init__(self, ctx: StepContext, env: ActuatorEnv, kind: str,
                 params: dict[str, Any]) -> None:
        self.ctx = ctx
        self.guard = Guard(ctx.inventory())
        self.records: list[dict[str, Any]] = []
        self.lines: list[str] = []
        self.failures: list[str] = []  # the kernel said no: worth a retry
        self.refused: list[str] = []  # safety refusals: final
        self.written = 0
        self.kept = 0  # already in force
        self.extra: dict[str, Any] = {}  # the lever's own undo data beside the writes
        self._earlier: dict[str, list[dict[str, Any]]] = {}
        self._same_lever: list[dict[str, Any]] = []
        key = params_key(params)
        for row in env.ledger.rungs():
            if row.kind != kind or row.status != DONE or row.dry_run:
                continue
            same = params_key((row.spec or {}).get("params", {})) == key
            for record in row.undo.get("writes", []):
                self._earlier.setdefault(record["file"], []).append(record)
                if same:
                    self._same_lever.append(record)

    # -- checks ----------------------------------------------------------------------------

    def refusal(self, target: Target, parts: tuple[str, ...]) -> str | None:
        """Checked right before every write, on the cgroup the file belongs to."""
        bad = [w for w in target.workloads if w.get("class") != BE]
        if bad or not target.workloads:
            return f"{path_name(parts)}: not written: it stands for a non-BE workload"
        why = self.guard.refusal(parts)
        return f"{path_name(parts)}: not written: it {why}" if why else None

    def ours(self, path: Path, current: str | None) -> bool:
        """Whether `path` holds a value an earlier apply of this lever kind wrote."""
        return any(norm(r["wrote"]) == norm(current) for r in self._earlier.get(str(path), []))

    @contextlib.contextmanager
    def each(self, target: Target) -> Iterator[None]:
        """One target's writes: an error there (an unreadable file, a value the kernel prints
        in an unexpected form) fails that target, not the step, so that what was already
        written for the others stays recorded for undo."""
        try:
            yield
        except (OSError, ValueError) as exc:
            self.failures.append(f"{target.name}: {exc.__class__.__name__}: {exc}")

    # -- writing ---------------------------------------------------------------------------

    def set(self, target: Target, parts: tuple[str, ...], path: Path | str, value: str,
            also: Iterable[Path | str] = ()) -> str:
        """Write `value` to `path` (a file of cgroup `parts`, for `target`).

        Returns "written", "kept" (already so), "gone" (the cgroup vanished), "absent" (no such
        file), "refused" (safety) or "error: ..." (the kernel said no; nothing recorded).
        `also`: files the kernel rewrites as a side effect (cpu.idle resets cpu.shares); their
        values from before are restored on undo.

        Paths are handled as strings: a standing lever's full check calls this for every BE
        cgroup every few seconds, and pathlib's objects were a third of it in a cProfile of
        it (its time: benchmarks/agent_tick.py's last line).
        """
        why = self.refusal(target, parts)
        if why:
            self.refused.append(why)
            return "refused"
        file = os.fspath(path)
        name = file.rpartition("/")[2]
        try:
            current = read_value(file)
        except OSError as exc:
            return f"error: {exc.strerror or exc}"
        if current is None:  # the cgroup gone, or only the file (an old kernel, a controller)
            if not os.path.isdir(os.path.dirname(file)):
                self.lines.append(f"{path_name(parts)}: gone")
                return "gone"
            return "absent"
        earlier = next((r for r in self._earlier.get(file, [])
                        if norm(r["wrote"]) == norm(current)), None)
        if earlier is None and norm(current) == norm(value):
            self.kept += 1
            self.lines.append(f"{path_name(parts)}: {name} already {current}")
            return "kept"
        original = earlier["old"] if earlier else current
        side = dict(earlier.get("also", {})) if earlier else {}
        if not earlier:
            for other in also:
                old = read_value(other)
                if old is not None:
                    side[os.fspath(other)] = old
        if self.ctx.dry_run:
            self.records.append(self._record(parts, file, original, value, side))
            self.lines.append(f"{path_name(parts)}: would write {name} = {value} "
                              f"(now {current})")
            return "written"
        wrote: str | None = current
        if earlier is None or norm(current) != norm(value):
            # write-ahead: the original is on record before the file changes (raises, and
            # nothing is written, when the ledger cannot take it)
            self.intend(self._record(parts, file, original, value, side))
            try:
                write_value(file, value)
            except OSError as exc:
                if exc.errno in _GONE:
                    self.lines.append(f"{path_name(parts)}: gone")
                    return "gone"
                return f"error: {exc.strerror or exc}"
            wrote = read_value(file)
            if wrote is None:
                self.lines.append(f"{path_name(parts)}: gone")
                return "gone"
            self.written += 1
        else:
            self.kept += 1  # in force since an earlier apply: its original is kept
        self.records.append(self._record(parts, file, original, wrote or "", side))
        self.lines.append(f"{path_name(parts)}: {name} {original} -> {wrote}")
        return "written"

    def intend(self, pending: dict[str, Any] | None = None) -> None:
        """Announce the next write: the undo data as it will stand once it is made."""
        records = self.records + ([pending] if pending else [])
        self.ctx.intend({"writes": records, **self.extra})

    @staticmethod
    def _record(parts: tuple[str, ...], file: str, old: str, wrote: str,
                side: dict[str, str]) -> dict[str, Any]:
        record: dict[str, Any] = {"cgroup": path_name(parts), "file": file, "old": old,
                                  "wrote": wrote}
        if side:
            record["also"] = side
        return record

    def already(self, message: str) -> None:
        """The cgroup is already as suppressed as this lever would make it (not by us)."""
        self.kept += 1
        self.lines.append(message)

    def fail(self, message: str) -> None:
        self.failures.append(message)

    def note(self, message: str) -> None:
        self.lines.append(message)

    # -- the result ------------------------------------------------------------------------

    def carry_forward(self) -> None:
        """Keep the records of earlier applies of this same lever for files this apply did not
        touch (the target set changed since), so undo still restores them. Not those of
        cgroups outside a narrowed rung's workloads: they belong to its sibling rungs
        (`target: suspects`), which undo them from their own records."""
        touched = {r["file"] for r in self.records}
        only, exclude = self.ctx.only, set(self.ctx.exclude)
        for record in self._same_lever:
            cgroup = record.get("cgroup", "")
            if record["file"] in touched or cgroup in exclude or (
                    only is not None and cgroup not in only):
                continue
            try:
                current = read_value(Path(record["file"]))
            except OSError:
                current = None
            if current is None or norm(current) != norm(record["wrote"]):
                continue
            why = self.guard.refusal(parts_of(cgroup))
            if why and not self.ctx.dry_run:
                # an LS workload has appeared in or under it since (a besteffort QoS cgroup
                # that now holds an LS-labelled pod): what we wrote there is put back now, not
                # held until the lever ends (a standing lever never does)
                restored = undo_writes(self.ctx, "", "", [record])
                self.lines.append(f"{cgroup}: {why}: restored ({restored.detail})")
                if restored.status == FAILED:
                    self.failures.append(f"{cgroup}: {why}: cannot restore it")
                    self.records.append(record)  # still ours to undo
                touched.add(record["file"])
                continue
            self.records.append(record)
            touched.add(record["file"])

    def result(self, target: str, what: str, refused: list[str],
               extra: dict[str, Any] | None = None) -> StepResult:
        self.carry_forward()
        problems = refused + self.refused + self.failures
        undo: dict[str, Any] = {"writes": self.records, **(extra or {})}
        summary = _join(self.lines)
        if problems:
            summary = f"{summary}; not done: {_join(problems)}" if summary else \
                f"not done: {_join(problems)}"
        if self.ctx.dry_run:
            if not self.records:
                return StepResult(SKIPPED, target, f"{what}: nothing to do; {summary}".rstrip(
                    "; "), undo)
            return StepResult(PROPOSED, target, f"{what}: {summary}", undo)
        if self.records or self.kept:
            return StepResult(DONE, target, f"{what}: {summary}", undo)
        if self.failures:
            # nothing changed: a failed rung has nothing to undo; the ladder retries it
            return StepResult(FAILED, target, f"{what}: {summary}", {}, retry=True)
        return StepResult(SKIPPED, target, f"{what}: nothing to do ({summary or 'no target'})",
                          undo)


def _join(items: list[str]) -> str:
    shown = "; ".join(items[:_DETAIL_ITEMS])
    if len(items) > _DETAIL_ITEMS:
        shown += f"; and {len(items) - _DETAIL_ITEMS} more"
    return shown


def undo_writes(ctx: StepContext, target: str, what: str,
                records: list[dict[str, Any]]) -> StepResult:
    """Restore, newest first, every file still holding what we wrote; leave the others."""
    lines: list[str] = []
    failures: list[str] = []
    for record in reversed(records):
        path = Path(record["file"])
        cgroup = record.get("cgroup", str(path.parent))
        try:
            current = read_value(path)
        except OSError as exc:
            failures.append(f"{cgroup}: cannot read {path.name}: {exc.strerror or exc}")
            continue
        if current is None:
            lines.append(f"{cgroup}: gone")
            continue
        if norm(current) == norm(record["old"]):
            lines.append(f"{cgroup}: {path.name} {current} (as before already)")
            continue
        if norm(current) != norm(record["wrote"]):
            lines.append(f"{cgroup}: {path.name} is {current}, not the {record['wrote']} we "
                         "wrote: someone changed it since; left as it is")
            continue
        if ctx.dry_run:
            lines.append(f"{cgroup}: would restore {path.name} = {record['old']}")
            continue
        try:
            write_value(path, record["old"])
        except OSError as exc:
            if exc.errno in _GONE:
                lines.append(f"{cgroup}: gone")
            else:
                failures.append(f"{cgroup}: cannot restore {path.name} = {record['old']}: "
                                f"{exc.strerror or exc}")
            continue
        restored = [f"{path.name} {current} -> {record['old']}"]
        for other, old in record.get("also", {}).items():
            side = Path(other)
            try:
                now = read_value(side)
                if now is not None and norm(now) != norm(old):
                    write_value(side, old)
                    restored.append(f"{side.name} {now} -> {old}")
            except OSError as exc:
                failures.append(f"{cgroup}: cannot restore {side.name} = {old}: "
                                f"{exc.strerror or exc}")
        lines.append(f"{cgroup}: {', '.join(restored)}")
    summary = _join(lines) or "nothing was changed"
    if failures:
        return StepResult(FAILED, target, f"{what}: {_join(failures)}; {summary}", retry=True)
    return StepResult(PROPOSED if ctx.dry_run else DONE, target, f"{what}: {summary}")
