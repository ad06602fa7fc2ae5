"""The LLC / memory bandwidth rung: BE tasks in a resctrl group with few cache ways and less
memory bandwidth (Intel RDT CAT/MBA, AMD QoS), through the kernel's resctrl filesystem.

colocation-lab found cache antagonists invisible to every node and cgroup signal while LS p99
rose 16x (docs/actuators.md), and only cpuset separation helped there; on hardware with RDT,
confining BE's cache fills to a few LLC ways is the direct remedy, so this rung comes after the
CPU levers. The lab machine has no resctrl (no CONFIG_X86_CPU_RESCTRL, no RDT in the VM's CPU):
this step is written against the kernel's documented formats (Documentation/arch/x86/resctrl.rst)
and tested against a tree in those formats; on a node without resctrl `available()` says why
and the ladder skips the rung with that reason. It never pretends to have acted.

What it does, per the kernel documentation:
- mkdir <root>/<group> (a CTRL_MON group; fails with ENOSPC when CLOSIDs run out);
- writes its `schemata`: `L3:<cache id>=<cbm>;...` (or L3CODE/L3DATA lines with CDP) with the
  lowest `l3_percent` of the ways of info/L3/cbm_mask (at least min_cbm_bits, contiguous, away
  from the high shareable/IO bits), and `MB:<id>=<percent>;...` rounded up to min_bandwidth +
  N x bandwidth_gran. Cache ids come from the root group's schemata. MB in absolute units (AMD,
  or the mba_MBps mount option) is left alone: a percentage would mean something else there;
- writes every thread id of the BE cgroups (v1 `tasks`, v2 `cgroup.threads`, whole subtree) to
  the group's `tasks`, one per write (kernels before 6.2 take one id per write); children they
  fork later inherit the group;
- undo moves the threads it moved (and that are still there) back to the group they came from
  (the root group, normally) and removes the group it created. A group of that name that
  existed before the first apply is adopted: its schemata is restored and it is not removed. If
  its schemata changed since we wrote it, someone else is using it now: it is left as it is.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
from pathlib import Path
from typing import Any, ClassVar

from sloguard.actuators.cgroupfs import (
    Cgroups,
    Changes,
    Guard,
    read_value,
    select_targets,
)
from sloguard.actuators.env import ActuatorEnv
from sloguard.actuators.hookspecs import hookimpl
from sloguard.actuators.step import (
    DONE,
    FAILED,
    PROPOSED,
    SKIPPED,
    StepContext,
    StepResult,
    reject_unknown,
)
from sloguard.core import failpoints

WHAT = "LLC ways / memory bandwidth for BE (resctrl)"
_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")
_RESERVED = {"info", "mon_groups", "mon_data"}
_GONE = (errno.ESRCH, errno.ENOENT)  # a thread that exited meanwhile


def parse_schemata(text: str) -> dict[str, dict[str, str]]:
    """`    L3:0=fffff;1=fffff` lines (names right-aligned by the kernel) -> {L3: {0: fffff}}."""
    out: dict[str, dict[str, str]] = {}
    for line in text.splitlines():
        name, sep, domains = line.strip().partition(":")
        if not sep:
            continue
        values = out.setdefault(name.strip(), {})
        for item in domains.split(";"):
            domain, eq, value = item.partition("=")
            if eq:
                values[domain.strip()] = value.strip()
    return out


def format_line(name: str, values: dict[str, str]) -> str:
    return f"{name}:" + ";".join(f"{d}={v}" for d, v in sorted(values.items(),
                                                                key=lambda i: int(i[0])))


def be_mask(cbm_mask: str, min_bits: int, percent: float) -> str:
    """The lowest `percent` of the ways of a contiguous capacity bitmask, as hex."""
    mask = int(cbm_mask, 16)
    if mask <= 0:
        raise ValueError(f"cbm_mask {cbm_mask!r} has no bits")
    ways = bin(mask).count("1")
    shift = (mask & -mask).bit_length() - 1
    bits = min(ways, max(min_bits, 1, round(ways * percent / 100)))
    return f"{((1 << bits) - 1) << shift:x}"


def mb_value(percent: float, min_bandwidth: int, gran: int) -> int:
    """The percentage rounded up to the next control step the hardware has."""
    if percent <= min_bandwidth:
        return min_bandwidth
    steps = -(-(percent - min_bandwidth) // max(gran, 1))
    return min(100, int(min_bandwidth + steps * max(gran, 1)))


def _flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("flags"):
                    return set(line.partition(":")[2].split())
    except OSError:
        pass
    return set()


def _kernel_has_resctrl() -> bool:
    try:
        with open("/proc/filesystems") as handle:
            return any(line.split()[-1:] == ["resctrl"] for line in handle)
    except OSError:
        return False


class Resctrl:
    kind: ClassVar[str] = "resctrl"
    per_workload: ClassVar[bool] = True  # targets ctx.be_workloads(): `target: suspects`
    can_stand: ClassVar[bool] = True  # its value needs no measurement: a policy's `standing:`

    def __init__(self, params: dict[str, Any], env: ActuatorEnv) -> None:
        reject_unknown(params, {"group", "l3_percent", "mb_percent"}, self.kind)
        self.group = params.get("group", "sloguard-be")
        if not isinstance(self.group, str) or not _NAME.match(self.group) or \
                self.group in _RESERVED:
            raise ValueError("group must be a plain directory name (letters, digits, _ . -)")
        self.l3_percent = _percent(params, "l3_percent", 30)
        self.mb_percent = _percent(params, "mb_percent", 50)
        if self.l3_percent is None and self.mb_percent is None:
            raise ValueError("l3_percent and mb_percent are both null: nothing to restrict")
        self.params = dict(params)
        self.env = env

    @property
    def root(self) -> Path:
        return self.env.resctrl_root

    @property
    def path(self) -> Path:
        return self.root / self.group

    @staticmethod
    def target_name(ctx: StepContext) -> str:
        return f"node/{ctx.node} BE tasks (resctrl)"

    # -- availability ------------------------------------------------------------------------

    def available(self) -> str | None:
        if not (self.root / "info").is_dir() or not (self.root / "schemata").exists():
            reasons = [f"resctrl is not mounted at {self.root}"]
            flags = _flags()
            if not flags & {"rdt_a", "cat_l3", "mba"}:
                reasons.append("this CPU has no RDT/L3 CAT (no rdt_a, cat_l3 or mba flag in "
                               "/proc/cpuinfo)")
            if not _kernel_has_resctrl():
                reasons.append("this kernel has no resctrl filesystem (CONFIG_X86_CPU_RESCTRL "
                               "is off)")
            if len(reasons) == 1:
                reasons.append(f"mount -t resctrl resctrl {self.root}")
            return "; ".join(reasons)
        if not self._l3_names() and not (self.root / "info" / "MB").is_dir():
            return "this CPU has no RDT/L3 CAT or MBA: resctrl has no info/L3 or info/MB"
        if self.l3_percent is not None and self.mb_percent is None and not self._l3_names():
            return "this CPU has no RDT/L3 CAT: resctrl has no info/L3"
        if self.mb_percent is not None and self.l3_percent is None and not (
                self.root / "info" / "MB").is_dir():
            return "this CPU has no MBA: resctrl has no info/MB"
        try:
            Cgroups(self.env.cgroup_root)
        except (OSError, LookupError) as exc:
            return f"no cgroup hierarchy at {self.env.cgroup_root} to find BE tasks: {exc}"
        return None

    def _l3_names(self) -> list[str]:
        info = self.root / "info"
        if (info / "L3CODE").is_dir() and (info / "L3DATA").is_dir():
            return ["L3CODE", "L3DATA"]  # mounted with -o cdp
        return ["L3"] if (info / "L3").is_dir() else []

    # -- the schemata ------------------------------------------------------------------------

    def schemata(self) -> tuple[dict[str, dict[str, str]], list[str]]:
        """The lines to write ({resource: {cache id: value}}) and notes on what is left out."""
        info = self.root / "info"
        domains = parse_schemata(read_value(self.root / "schemata") or "")
        wanted: dict[str, dict[str, str]] = {}
        notes: list[str] = []
        if self.l3_percent is not None:
            names = self._l3_names()
            if not names:
                notes.append("no L3 CAT here: cache ways not restricted")
            for name in names:
                mask = read_value(info / name / "cbm_mask")
                min_bits = int(read_value(info / name / "min_cbm_bits") or "1")
                if not mask or name not in domains:
                    notes.append(f"no {name} cbm_mask or domains: cache ways not restricted")
                    continue
                value = be_mask(mask, min_bits, self.l3_percent)
                wanted[name] = {domain: value for domain in domains[name]}
        if self.mb_percent is not None:
            if not (info / "MB").is_dir() or "MB" not in domains:
                notes.append("no MBA here: memory bandwidth not restricted")
            elif any(not v.isdigit() or int(v) > 100 for v in domains["MB"].values()):
                notes.append("MB is not in percent here (AMD units, or mounted with "
                             "mba_MBps): memory bandwidth not restricted")
            else:
                low = int(read_value(info / "MB" / "min_bandwidth") or "10")
                gran = int(read_value(info / "MB" / "bandwidth_gran") or "10")
                value = str(mb_value(self.mb_percent, low, gran))
                wanted["MB"] = {domain: value for domain in domains["MB"]}
        return wanted, notes

    # -- tasks ---------------------------------------------------------------------------------

    def be_threads(self, ctx: StepContext, changes: Changes) -> tuple[list[int], list[str], int]:
        """(thread ids of the BE cgroups, refusals, how many cgroups) minus any LS thread."""
        cgroups = Cgroups(self.env.cgroup_root)
        targets, refused = select_targets(ctx, "workload")
        tids: set[int] = set()
        for target in targets:
            for parts in self._subtree(cgroups, target.parts):
                why = changes.refusal(target, parts)
                if why:
                    refused.append(why)
                    continue
                tids.update(self._threads_of(cgroups, parts))
        ls: set[int] = set()
        for protected in Guard(ctx.inventory()).protected:
            for parts in self._subtree(cgroups, protected):
                ls.update(self._threads_of(cgroups, parts))
        return sorted(tids - ls), refused, len(targets)

    @staticmethod
    def _subtree(cgroups: Cgroups, parts: tuple[str, ...]) -> list[tuple[str, ...]]:
        located = cgroups.controller_dir("cpu", parts)
        if located is None or not parts:
            return []
        top = located[0]
        found = []
        for dirpath, _dirs, _files in os.walk(top):
            found.append(parts + Path(dirpath).relative_to(top).parts)
        return found

    @staticmethod
    def _threads_of(cgroups: Cgroups, parts: tuple[str, ...]) -> set[int]:
        located = cgroups.controller_dir("cpu", parts)
        if located is None:
            return set()
        directory, version = located
        text = read_value(directory / ("tasks" if version == "v1" else "cgroup.threads"))
        return {int(t) for t in (text or "").split() if t.isdigit()}

    def _groups(self) -> list[Path]:
        """Every CTRL_MON group but the root."""
        try:
            return [p for p in self.root.iterdir() if p.is_dir() and p.name not in _RESERVED]
        except OSError:
            return []

    def _membership(self) -> dict[int, str]:
        """thread id -> the non-root group it is in now (the root group is not listed)."""
        where: dict[int, str] = {}
        for group in self._groups():
            for tid in (read_value(group / "tasks") or "").split():
                if tid.isdigit():
                    where[int(tid)] = group.name
        return where

    # -- kernel operations (a format test replays what the kernel does on these) -------------

    def _mkdir(self, path: Path) -> None:
        failpoints.around("resctrl.mkdir", path.mkdir)

    def _rmdir(self, path: Path) -> None:
        failpoints.around("resctrl.rmdir", path.rmdir)

    def _write(self, path: Path, text: str) -> None:
        failpoints.hit("resctrl.write:before")
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
        try:
            os.write(fd, text.encode())
        finally:
            os.close(fd)
        failpoints.hit("resctrl.write:after")

    def _status(self) -> str:
        return read_value(self.root / "info" / "last_cmd_status") or ""

    def _earlier(self) -> dict[str, Any] | None:
        for row in self.env.ledger.rungs():
            if row.kind == self.kind and row.status == DONE and not row.dry_run and \
                    row.undo.get("group") == str(self.path):
                return row.undo
        return None

    # -- apply ---------------------------------------------------------------------------------

    def apply(self, ctx: StepContext) -> StepResult:
        target = self.target_name(ctx)
        changes = Changes(ctx, self.env, self.kind, self.params)
        wanted, notes = self.schemata()
        tids, refused, cgroup_count = self.be_threads(ctx, changes)
        lines = [format_line(name, values) for name, values in wanted.items()]
        if not wanted:
            return StepResult(SKIPPED, target, f"{WHAT}: nothing to restrict: "
                                               f"{'; '.join(notes)}")
        if cgroup_count == 0:
            why = f": {'; '.join(refused)}" if refused else ""
            return StepResult(SKIPPED, target, f"{WHAT}: no BE workloads to restrict{why}")
        earlier = self._earlier()
        exists = self.path.is_dir()
        current = parse_schemata(read_value(self.path / "schemata") or "") if exists else {}
        membership = self._membership() if tids else {}
        to_move = [t for t in tids if membership.get(t) != self.group]
        tail = ("; " + "; ".join(notes + refused)) if notes or refused else ""
        if ctx.dry_run:
            verb = "use" if exists else "create"
            return StepResult(PROPOSED, target, (
                f"{WHAT}: would {verb} {self.path} with schemata {' '.join(lines)} and move "
                f"{len(to_move)} BE threads of {cgroup_count} cgroups into it{tail}"),
                {"group": str(self.path), "created": not exists, "wrote": wanted,
                 "moved": [{"tid": t, "from": membership.get(t, "")} for t in to_move]})
        created = earlier["created"] if earlier else not exists
        old_schemata = earlier.get("old", {}) if earlier else (
            {name: current.get(name, {}) for name in wanted} if exists else {})
        planned = list((earlier or {}).get("moved", []))
        planned += [{"tid": t, "from": membership.get(t, "")} for t in to_move
                    if t not in {m["tid"] for m in planned}]
        # write-ahead: undo removes (or restores) the group and moves these threads back
        ctx.intend({"group": str(self.path), "created": created, "wrote": wanted,
                    "old": old_schemata, "moved": planned})
        if not exists:
            try:
                self._mkdir(self.path)
            except OSError as exc:
                why = "no free CLOSID (num_closids in use)" if exc.errno == errno.ENOSPC \
                    else exc.strerror or str(exc)
                return StepResult(FAILED, target, f"{WHAT}: cannot create {self.path}: {why} "
                                                  f"{self._status()}".rstrip(), retry=True)
        try:
            self._write(self.path / "schemata", "\n".join(lines) + "\n")
        except OSError as exc:
            status = self._status()
            if not exists:
                self._remove_quietly()
            return StepResult(FAILED, target, f"{WHAT}: schemata {' '.join(lines)} refused: "
                                              f"{exc.strerror or exc} {status}".rstrip())
        written = parse_schemata(read_value(self.path / "schemata") or "")
        wrote = {name: written.get(name, values) for name, values in wanted.items()}
        moved = list((earlier or {}).get("moved", []))
        already = {m["tid"] for m in moved}
        count, vanished = 0, 0
        for tid in to_move:
            try:
                self._write(self.path / "tasks", f"{tid}\n")
            except OSError as exc:
                if exc.errno in _GONE:
                    vanished += 1
                    continue
                refused.append(f"thread {tid}: {exc.strerror or exc}")
                continue
            count += 1
            if tid not in already:
                moved.append({"tid": tid, "from": membership.get(tid, "")})
        detail = (f"{WHAT}: {self.path} ({'created' if not exists else 'in place'}) schemata "
                  f"{' '.join(lines)}; {count} BE threads of {cgroup_count} cgroups moved in"
                  + (f", {len(tids) - len(to_move)} already there" if len(tids) > len(to_move)
                     else "")
                  + (f", {vanished} exited meanwhile" if vanished else "")
                  + ("" if created else "; the group existed before: adopted, kept on undo")
                  + tail)
        return StepResult(DONE, target, detail, {
            "group": str(self.path), "created": created, "wrote": wrote, "old": old_schemata,
            "moved": moved})

    def _remove_quietly(self) -> None:
        with contextlib.suppress(OSError):
            self._rmdir(self.path)

    # -- undo ----------------------------------------------------------------------------------

    def undo(self, ctx: StepContext, undo: dict[str, Any]) -> StepResult:
        target = self.target_name(ctx)
        path = Path(undo.get("group", str(self.path)))
        if not path.is_dir():
            return StepResult(DONE, target, f"{WHAT}: {path} is gone already")
        current = parse_schemata(read_value(path / "schemata") or "")
        wrote: dict[str, dict[str, str]] = undo.get("wrote", {})
        changed = [name for name, values in wrote.items()
                   if {d: current.get(name, {}).get(d) for d in values} != values]
        if changed and not ctx.dry_run:
            return StepResult(DONE, target, (
                f"{WHAT}: {path} schemata {', '.join(changed)} changed since we wrote it: "
                "someone else uses the group now; left as it is, with its tasks"))
        inside = {int(t) for t in (read_value(path / "tasks") or "").split() if t.isdigit()}
        moved = [m for m in undo.get("moved", []) if m["tid"] in inside]
        if ctx.dry_run:
            end = "remove the group" if undo.get("created") else "restore its schemata"
            return StepResult(PROPOSED, target, f"{WHAT}: would move {len(moved)} threads "
                                                f"back out of {path} and {end}")
        back, failures = 0, []
        for entry in moved:
            group = self.root / entry["from"] if entry.get("from") else self.root
            if not (group / "tasks").exists():
                group = self.root
            try:
                self._write(group / "tasks", f"{entry['tid']}\n")
                back += 1
            except OSError as exc:
                if exc.errno not in _GONE:
                    failures.append(f"thread {entry['tid']}: {exc.strerror or exc}")
        if undo.get("created"):
            try:
                self._rmdir(path)  # the kernel moves what is left to the root group
                end = "group removed"
            except OSError as exc:
                failures.append(f"cannot remove {path}: {exc.strerror or exc}")
                end = "group not removed"
        else:
            old = undo.get("old", {})
            restore = [format_line(name, values) for name, values in old.items() if values]
            try:
                if restore:
                    self._write(path / "schemata", "\n".join(restore) + "\n")
                end = "its schemata restored (the group is not ours to remove)"
            except OSError as exc:
                failures.append(f"cannot restore the schemata of {path}: "
                                f"{exc.strerror or exc} {self._status()}".rstrip())
                end = "schemata not restored"
        detail = f"{WHAT}: {back} threads moved back out of {path}; {end}"
        if failures:
            return StepResult(FAILED, target, f"{detail}; {'; '.join(failures)}", retry=True)
        return StepResult(DONE, target, detail)


def _percent(params: dict[str, Any], name: str, default: float) -> float | None:
    value = params.get(name, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not 1 <= value <= 100:
        raise ValueError(f"{name} must be a percentage from 1 to 100 (or null: not restricted)")
    return float(value)


@hookimpl
def sloguard_steps() -> list[type]:
    return [Resctrl]
