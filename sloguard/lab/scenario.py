"""A lab scenario: the LS service and its load, the BE antagonists' schedule (the ground truth the
guardrail is judged against), and the ways it is run.

    name: cache
    ls:
      rate: 5000            # requests per second, open loop
      slo: {percentile: p99, latency_ms: 0.3, window: 3s}
    be:
      workers: 2
    schedule:               # quiet before the first episode, between episodes and after the last
      quiet: 20s
      episodes:
        - {antagonist: cache, duration: 40s}
        - {antagonist: cache, duration: 40s}

A file that does not validate is reported as `file:line:column: field: problem`, like rule files.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from sloguard.core.config import Duration
from sloguard.core.cpulist import parse_cpulist
from sloguard.core.yamlfile import YamlFileError, load_model

SCENARIO_DIR = Path(__file__).parent / "scenarios"
WAYS = ("baseline", "unguarded", "guarded", "guarded-tier", "guarded-suspects", "guarded-mixed",
        "guarded-standing", "guarded-episodic")
DEFAULT_WAYS = WAYS[:3]

# stress-ng stressors per antagonist kind (colocation-lab.md): what each one contends for
ANTAGONISTS: dict[str, list[str]] = {
    "cpu": ["--cpu", "{workers}"],
    "cache": ["--cache", "{workers}"],
    # memory bandwidth: three 512 MiB arrays per worker, past the 480 MiB L3 this VM reports.
    # stress-ng's own sizing (4x L3 per array) took ~6 GiB per worker here and one bogo-op
    # per ~10 s, too few in a lab cell to tell BE's throughput apart (benchmarks/lab_levers.py)
    "stream": ["--stream", "{workers}", "--stream-l3-size", "128M"],
    "io": ["--iomix", "{workers}"],
    "vm": ["--vm", "{workers}", "--vm-bytes", "{vm_bytes}"],
}
# Innocent BE jobs (docs/attribution.md): they run for the whole way and do not cause the LS
# slowdown; the guard should leave them their throughput. stress-ng's --cpu-load keeps a worker
# at that percentage of one CPU (busy, then asleep, in 100 ms slices). `half-cpu` is the one
# that wants real CPU: what a lever on the whole tier takes from it shows.
INNOCENTS: dict[str, list[str]] = {
    "sleepy": ["--cpu", "1", "--cpu-load", "2"],
    "light-cpu": ["--cpu", "1", "--cpu-load", "10"],
    "half-cpu": ["--cpu", "1", "--cpu-load", "50"],
}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SloSpec(_Strict):
    percentile: str = Field("p99", description="the objective's percentile (p50..p999)")
    latency_ms: float = Field(0.25, gt=0, description="the percentile must stay at or under "
                                                         "this (the agent defends it)")
    window: Duration = Field(2.0, gt=0, description="requests of this recent window count")


class LsSpec(_Strict):
    server: Literal["redis"] = "redis"
    rate: float = Field(5000.0, gt=0, le=50_000, description="requests per second (open loop)")
    keys: int = Field(10_000, ge=1)
    value_size: int = Field(256, ge=1, le=1 << 20, description="bytes per value (GET replies)")
    cpus: str = Field("0", description="the LS cgroup's cpuset (a pod with its own cores, "
                      "e.g. Koordinator LSR; BE may still use them until a lever moves it); "
                      "empty: every CPU")
    rt_priority: int = Field(20, ge=0, le=99, description="the load generator's SCHED_FIFO "
                                                          "priority; 0: normal priority")
    slo: SloSpec = Field(default_factory=SloSpec)

    @field_validator("cpus")
    @classmethod
    def _cpus(cls, value: str) -> str:
        parse_cpulist(value)  # checked here, not once redis and the agent have started
        return value


NAME = r"[a-z0-9][a-z0-9-]{0,30}"  # a BE job's name: part of its cgroup's (re.fullmatch)


class ProgramSpec(_Strict):
    argv: list[Annotated[str, Field(min_length=1, pattern=r"^[^\x00]*$")]] = Field(
        min_length=1, description="the program and its arguments, run without a shell; "
                                  "started again each time it ends, for as long as its job "
                                  "runs")

    @field_validator("argv", mode="before")
    @classmethod
    def _words(cls, value: object) -> object:
        """`[xz, -9]` means the word "-9", not a number YAML made of it. Only a whole number
        is taken back as a word: YAML turns `1.50` into 1.5 and `0644` into 420, words that
        were never written, so those must be quoted."""
        if not isinstance(value, list):
            return value
        words = []
        for v in value:
            if isinstance(v, float):
                raise ValueError(f"{v!r}: YAML read a number here; quote the word as you "
                                 "mean it (\"1.50\")")
            words.append(str(v) if isinstance(v, int) and not isinstance(v, bool) else v)
        return words


class InnocentSpec(_Strict):
    name: str = Field(pattern=rf"^{NAME}$", description="its cgroup's name")
    kind: Literal["sleepy", "light-cpu", "half-cpu"] | None = Field(
        None, description="a stress-ng innocent")
    program: str | None = Field(None, description="or one of `be.programs`, by name")

    @model_validator(mode="after")
    def _one(self, info: ValidationInfo) -> InnocentSpec:
        if (self.kind is None) == (self.program is None):
            raise ValueError(f"innocent {self.name!r}: give `kind` or `program`, one of them")
        programs = (info.context or {}).get("programs")  # a file's: said at this line
        if self.program is not None and programs is not None and self.program not in programs:
            raise ValueError(f"innocent {self.name!r}: no program {self.program!r} in "
                             f"be.programs ({', '.join(sorted(programs)) or 'none'})")
        return self

    @property
    def job(self) -> str:
        """What it runs: its stress-ng kind or its program's name."""
        return self.kind or self.program or ""


class BeSpec(_Strict):
    workers: int = Field(2, ge=1, le=64, description="stress-ng workers per antagonist")
    vm_bytes: str = Field("1G", description="memory per vm worker (stress-ng --vm-bytes)")
    programs: dict[str, ProgramSpec] = Field(
        default_factory=dict, description="real programs as BE jobs, by name: an episode's "
        "antagonist or an innocent may name one instead of a stress-ng kind; its throughput "
        "is its completed runs")
    innocents: list[InnocentSpec] = Field(
        default_factory=list, description="BE jobs that run for the whole way and barely "
                                          "contend, each in its own cgroup (attribution)")

    @field_validator("programs")
    @classmethod
    def _program_names(cls, value: dict[str, ProgramSpec]) -> dict[str, ProgramSpec]:
        for name in value:
            if not re.fullmatch(NAME, name):
                raise ValueError(f"program name {name!r}: lower-case letters, digits and "
                                 "'-', at most 31 (it names a cgroup)")
            if name in ANTAGONISTS:
                raise ValueError(f"program name {name!r} is a stress-ng kind's: name it "
                                 "otherwise")
            if name.startswith("innocent-"):  # its cgroup would be an innocent's
                raise ValueError(f"program name {name!r}: 'innocent-' begins the innocents' "
                                 "cgroups; name it otherwise")
        return value

    @field_validator("innocents")
    @classmethod
    def _unique(cls, value: list[InnocentSpec]) -> list[InnocentSpec]:
        names = [i.name for i in value]
        if len(set(names)) != len(names):
            raise ValueError(f"innocent names must differ: {', '.join(names)}")
        return value

    @model_validator(mode="after")
    def _known_programs(self) -> BeSpec:
        for innocent in self.innocents:
            if innocent.name in self.programs:  # two BE workloads of one name in a report
                raise ValueError(f"innocent {innocent.name!r} has a program's name: name "
                                 "it otherwise")
            if innocent.program is not None and innocent.program not in self.programs:
                raise ValueError(f"innocent {innocent.name!r}: no program "
                                 f"{innocent.program!r} in be.programs "
                                 f"({', '.join(self.programs) or 'none'})")
        return self


class EpisodeSpec(_Strict):
    antagonist: str | list[str] = Field(
        description="a stress-ng kind (cpu, cache, stream, io, vm) or a program of "
                    "`be.programs`, or several at once (each in its own BE cgroup)")
    duration: Duration = Field(gt=0)

    @field_validator("antagonist")
    @classmethod
    def _kinds(cls, value: str | list[str], info: ValidationInfo) -> str | list[str]:
        if isinstance(value, list) and (not value or len(set(value)) != len(value)):
            raise ValueError("several antagonists at once must be different kinds")
        # a file's programs come in the context (load_scenario), so that a name that is
        # neither is reported at its own line; ScenarioSpec checks a spec built in code
        programs = (info.context or {}).get("programs")
        for name in [value] if isinstance(value, str) else value:
            if not re.fullmatch(NAME, name) or (programs is not None and name not in ANTAGONISTS
                                            and name not in programs):
                raise ValueError(unknown_antagonist(name, programs or ()))
        return value

    @property
    def kinds(self) -> list[str]:
        return [self.antagonist] if isinstance(self.antagonist, str) else list(self.antagonist)


def unknown_antagonist(name: str, programs: Iterable[str]) -> str:
    return (f"{name!r} is neither a stress-ng kind ({', '.join(ANTAGONISTS)}) nor a program "
            f"of be.programs ({', '.join(sorted(programs)) or 'none'})")


class ScheduleSpec(_Strict):
    quiet: Duration = Field(20.0, gt=0, description="before, between and after the episodes")
    episodes: list[EpisodeSpec] = Field(min_length=1)


class ScenarioSpec(_Strict):
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$")
    description: str = ""
    ls: LsSpec = Field(default_factory=LsSpec)
    be: BeSpec = Field(default_factory=BeSpec)
    schedule: ScheduleSpec
    ways: list[Literal["baseline", "unguarded", "guarded", "guarded-tier", "guarded-suspects",
                       "guarded-mixed", "guarded-standing", "guarded-episodic"]] = Field(
        default_factory=lambda: list(DEFAULT_WAYS), min_length=1,
        description="guarded: the shipped policies as they are; guarded-tier: every lever on "
                    "the whole BE tier; guarded-suspects: the per-workload levers at `target: "
                    "suspects`; guarded-mixed: SCHED_IDLE tier-wide, the others at `target: "
                    "suspects`; guarded-standing: SCHED_IDLE standing (in force at all times); "
                    "guarded-episodic: no standing lever, every lever from the ladder")

    @field_validator("schedule")
    @classmethod
    def _known_antagonists(cls, value: ScheduleSpec, info: ValidationInfo) -> ScheduleSpec:
        be = info.data.get("be")
        if not isinstance(be, BeSpec):
            return value  # `be` is wrong itself, and said so: its programs are unknown
        programs = be.programs
        for n, episode in enumerate(value.episodes):
            for name in episode.kinds:
                if name not in ANTAGONISTS and name not in programs:
                    raise ValueError(f"episodes.{n}.antagonist: "
                                     + unknown_antagonist(name, programs))
        return value

    @property
    def culprits(self) -> bool:
        """Several BE workloads at once (innocents, or antagonists together): a scenario that
        tests attribution, for which the agent runs its eBPF programs."""
        return bool(self.be.innocents) or any(len(e.kinds) > 1 for e in self.schedule.episodes)


class ScenarioError(Exception):
    """Every problem of one scenario file, one `file:line:column: field: problem` per line."""


@dataclass(frozen=True)
class Episode:
    """One antagonist period, in seconds from the start of a way."""

    antagonist: str  # its kinds joined by "+" when several run at once
    start_s: float
    end_s: float

    @property
    def kinds(self) -> list[str]:
        return self.antagonist.split("+")


def load_scenario(path: Path) -> ScenarioSpec:
    try:
        return load_model(path, ScenarioSpec, "a scenario defines `name` and `schedule`",
                          context=_programs_of)[0]
    except YamlFileError as exc:
        raise ScenarioError(str(exc)) from exc


def _programs_of(document: object) -> dict[str, set[str]]:
    """The names under `be.programs` of a file as read, whatever else is wrong with it."""
    be = document.get("be") if isinstance(document, dict) else None
    programs = be.get("programs") if isinstance(be, dict) else None
    return {"programs": {str(k) for k in programs} if isinstance(programs, dict) else set()}


def find_scenario(name_or_path: str) -> Path:
    """A path as given, else a scenario shipped with sloguard (`cpu`, `cache`, ...)."""
    path = Path(name_or_path)
    if path.is_file():
        return path  # (a directory of that name, like a way's results in --out, is not one)
    shipped = SCENARIO_DIR / f"{name_or_path}.yaml"
    if shipped.exists():
        return shipped
    known = ", ".join(sorted(p.stem for p in SCENARIO_DIR.glob("*.yaml")))
    raise ScenarioError(f"{name_or_path}: no such file, and no shipped scenario of that name "
                        f"(shipped: {known})")


def timeline(spec: ScenarioSpec) -> tuple[list[Episode], float]:
    """The episodes' times and the length of one way: quiet, episode, quiet, ..., quiet."""
    episodes, t = [], spec.schedule.quiet
    for item in spec.schedule.episodes:
        episodes.append(Episode("+".join(item.kinds), t, t + item.duration))
        t += item.duration + spec.schedule.quiet
    return episodes, t


def shortened(spec: ScenarioSpec, quiet: float, episode: float,
              episodes: int | None = None) -> ScenarioSpec:
    """The same scenario with shorter periods, and maybe fewer episodes (`sloguard lab
    --short`, the CI test)."""
    kept = spec.schedule.episodes[:episodes] if episodes else spec.schedule.episodes
    schedule = ScheduleSpec(quiet=quiet, episodes=[
        EpisodeSpec(antagonist=e.antagonist, duration=episode) for e in kept])
    return spec.model_copy(update={"schedule": schedule})


def stress_args(antagonist: str, be: BeSpec) -> list[str]:
    return [a.format(workers=be.workers, vm_bytes=be.vm_bytes) for a in ANTAGONISTS[antagonist]]


def antagonist_cgroups(kinds: list[str], be_cgroup: str) -> dict[str, str]:
    """Where each antagonist of an episode runs: the first in the BE cgroup, as always; each
    other in its own (`<be>-<kind>`), so that attribution has several workloads to tell apart."""
    return {kind: be_cgroup if n == 0 else f"{be_cgroup}-{kind}" for n, kind in enumerate(kinds)}


def innocent_cgroup(name: str, be_cgroup: str) -> str:
    return f"{be_cgroup}-innocent-{name}"


def be_cgroups(spec: ScenarioSpec, be_cgroup: str) -> list[tuple[str, str]]:
    """Every BE cgroup a way of the scenario may use, with the name the agent knows it by."""
    firsts = {e.kinds[0] for e in spec.schedule.episodes}
    # the first BE cgroup runs each episode's first antagonist: named for what runs there
    found: dict[str, str] = {be_cgroup: "be" if firsts & set(spec.be.programs) else "stress-ng"}
    for episode in spec.schedule.episodes:
        for kind, rel in antagonist_cgroups(episode.kinds, be_cgroup).items():
            found.setdefault(rel, kind if kind in spec.be.programs else f"stress-ng-{kind}")
    for innocent in spec.be.innocents:
        found[innocent_cgroup(innocent.name, be_cgroup)] = innocent.name
    return list(found.items())
