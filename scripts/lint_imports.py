"""Check the import contract ([tool.importlinter] in pyproject.toml) with import-linter.

The user's top-level folders (collectors/, detector/, ...) are mapped onto sloguard.* by
pyproject's package-dir, so the package as Python imports it is spread over several folders and
grimp (import-linter's graph builder) would only see sloguard/. This script lays the package
out as a wheel would (a copy of every mapped folder's .py files under one sloguard/ in a
temporary directory), puts that first on the path and runs `lint-imports` on it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def lay_out(target: Path) -> None:
    """Copy each mapped package's Python files to where the package name puts them."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    mapping = project["tool"]["setuptools"]["package-dir"]
    for package in project["tool"]["setuptools"]["packages"]:
        parts = package.split(".")
        # the nearest mapped ancestor decides the folder (sloguard.actuators.alerting ->
        # actuators/alerting)
        for size in range(len(parts), 0, -1):
            mapped = mapping.get(".".join(parts[:size]))
            if mapped is not None:
                source = ROOT / mapped / Path(*parts[size:])
                break
        else:
            source = ROOT / Path(*parts)
        dest = target / Path(*parts)
        dest.mkdir(parents=True, exist_ok=True)
        for file in source.glob("*.py"):
            shutil.copy2(file, dest / file.name)
        if not (dest / "__init__.py").exists():
            (dest / "__init__.py").write_text("")


def lint(layout: Path, *args: str) -> int:
    """lint-imports on a laid-out package; its exit status (0: every contract kept)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(layout), *filter(None, [os.environ.get("PYTHONPATH")])]))
    command = Path(sys.executable).with_name("lint-imports")
    return subprocess.call([str(command), "--no-cache", "--no-logo", *args,
                            str(ROOT / "pyproject.toml")], env=env, cwd=layout)


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="sloguard-imports-") as tmp:
        lay_out(Path(tmp))
        return lint(Path(tmp), *sys.argv[1:])


if __name__ == "__main__":
    raise SystemExit(main())
