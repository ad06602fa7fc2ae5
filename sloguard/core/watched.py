"""Items loaded from YAML files (rules, escalation policies), reloaded per file as they change.

One semantics for every such set, so that an SRE learns it once:

- a file that fails to load keeps its last good items, and says why in `errors`;
- a configured path that does not exist or cannot be listed (an unmounted ConfigMap, a
  permission problem) keeps every item loaded from under it, and says so;
- a file removed from a directory that is still there takes its items with it (and its error);
- an item whose key an earlier file already defines (in the configured order of the paths,
  then sorted within a folder) is ignored, and the error names both places;
- `reload()` says whether the active items changed and what is wrong now.

`reload` runs on one thread (the agent's loop); readers on other threads (the API, /readyz) get
immutable snapshots through `items` and `errors`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Generic, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(frozen=True)
class Reloaded:
    changed: bool  # the active items differ from before this reload
    errors: dict[str, str] = field(default_factory=dict)  # what is wrong now, by file or path

    @property
    def ok(self) -> bool:
        return not self.errors


class WatchedFiles(Generic[T]):
    def __init__(self, what: str, paths: list[str], load: Callable[[Path], list[T]],
                 key: Callable[[T], str], source: Callable[[T], str],
                 load_errors: tuple[type[Exception], ...]) -> None:
        self.what = what  # "rule", "policy": the word errors and logs use
        self.paths = paths
        self._load, self._key, self._source = load, key, source
        self._load_errors = load_errors
        self.by_file: dict[str, list[T]] = {}
        self._file_errors: dict[str, str] = {}
        self._mtimes: dict[str, float] = {}
        self._rank: dict[str, int] = {}  # a file's place in the configured order
        self._active: tuple[T, ...] = ()
        self._errors: dict[str, str] = {}

    @property
    def items(self) -> list[T]:
        return list(self._active)

    @property
    def errors(self) -> dict[str, str]:
        return dict(self._errors)

    def files(self) -> tuple[list[Path], dict[str, str], set[str]]:
        """The files found, the errors of configured paths, and the paths not seen whole."""
        found: list[Path] = []
        errors: dict[str, str] = {}
        unseen: set[str] = set()
        for entry in self.paths:
            path = Path(entry)
            try:
                if path.is_dir():
                    found.extend(sorted(p for p in path.iterdir()
                                        if p.suffix in (".yaml", ".yml") and p.is_file()))
                elif path.exists():
                    found.append(path)
                else:
                    errors[entry] = f"{entry}: does not exist"
                    unseen.add(entry)
            except OSError as exc:
                errors[entry] = f"{entry}: cannot list: {exc.strerror}"
                unseen.add(entry)
        return found, errors, unseen

    def check(self) -> tuple[list[tuple[Path, list[T]]], list[str]]:
        """Every file loaded once, as `reload` would judge it, keeping nothing: what the
        `rules check` and `policies check` commands print."""
        found, path_errors, _ = self.files()
        loaded: list[tuple[Path, list[T]]] = []
        problems = list(path_errors.values())
        seen: dict[str, str] = {}
        for path in found:
            try:
                items = self._load(path)
            except self._load_errors as exc:
                problems.append(str(exc))
                continue
            for item in items:
                key = self._key(item)
                if key in seen:
                    problems.append(f"{self._source(item)}: {self.what} {key} is already "
                                    f"defined at {seen[key]}")
                seen.setdefault(key, self._source(item))
            loaded.append((path, items))
        return loaded, problems

    def reload(self) -> Reloaded:
        """Load the files that changed; drop the ones removed; recompute the active set."""
        before = self._active
        found, path_errors, unseen = self.files()
        path_errors = {entry: f"{why}; keeping the {self.what} definitions loaded from it"
                       for entry, why in path_errors.items()}
        current = {str(p): p for p in found}

        def kept(name: str) -> bool:  # under a path that could not be seen whole
            return any(Path(name) == Path(u) or Path(name).is_relative_to(Path(u))
                       for u in unseen)

        for rank, name in enumerate(current):  # the configured order, then sorted in a folder
            self._rank[name] = rank

        for name in list(self.by_file):
            if name not in current and not kept(name):
                del self.by_file[name]
        for name in list(self._mtimes):
            if name not in current and not kept(name):
                del self._mtimes[name]
        for name in list(self._file_errors):
            if name not in current and not kept(name):
                del self._file_errors[name]  # a broken file removed: nothing is wrong with it
        for name in list(self._rank):
            if name not in self.by_file and name not in current:
                del self._rank[name]
        for name, path in current.items():
            try:
                mtime = path.stat().st_mtime
            except OSError as exc:
                self._file_errors[name] = f"{name}: cannot read: {exc.strerror}"
                continue
            if self._mtimes.get(name) == mtime:
                continue
            self._mtimes[name] = mtime
            try:
                items = self._load(path)
            except self._load_errors as exc:
                self._file_errors[name] = str(exc)
                log.error("%s file rejected, keeping its %d previous %s definitions:\n%s",
                          self.what, len(self.by_file.get(name, [])), self.what, exc)
                continue
            self._file_errors.pop(name, None)
            self.by_file[name] = items
            log.info("loaded %d %s definitions from %s", len(items), self.what, name)
        active: list[T] = []
        # a configured file that is gone: that is what is wrong now, not how it last failed
        errors = {**self._file_errors, **path_errors}
        seen: dict[str, str] = {}
        for name in sorted(self.by_file, key=lambda n: (self._rank.get(n, len(self._rank)), n)):
            for item in self.by_file[name]:
                key = self._key(item)
                if key in seen:
                    duplicate = (f"{self._source(item)}: {self.what} {key} is already defined "
                                 f"at {seen[key]}; this one is ignored")
                    errors[name] = f"{errors[name]}\n{duplicate}" if name in errors else duplicate
                    continue
                seen[key] = self._source(item)
                active.append(item)
        self._active = tuple(active)
        self._errors = errors
        return Reloaded(changed=self._active != before, errors=dict(errors))
