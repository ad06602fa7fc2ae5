"""Rule files and policy files are watched with one semantics (sloguard/core/watched.py): the
same sequence of edits gives the same answers for both."""

from __future__ import annotations

import os
import shutil

import pytest

from sloguard.actuators.policy import PolicySet
from sloguard.detector.rules import RuleSet

RULE = ("groups:\n  - name: g\n    rules:\n      - alert: {name}\n        expr: lat\n"
        "        field: p99\n        params: {{above: 10}}\n")
POLICY = "policies:\n  - name: {name}\n    steps:\n      - step: notify\n"


def _rules(paths):
    return RuleSet(paths), lambda s: [r.key.split("/")[1] for r in s.rules], RULE


def _policies(paths):
    return PolicySet(paths), lambda s: s.names, POLICY


@pytest.fixture(params=[_rules, _policies], ids=["rules", "policies"])
def kind(request):
    return request.param


def _write(path, text, stamp):
    path.write_text(text)
    os.utime(path, (stamp, stamp))


def test_edits_removals_and_duplicates(tmp_path, kind):
    folder = tmp_path / "d"
    folder.mkdir()
    watched, names, template = kind([str(folder)])
    _write(folder / "a.yaml", template.format(name="A"), 1)
    first = watched.reload()
    assert first.changed and first.ok and names(watched) == ["A"]
    assert not watched.reload().changed  # nothing changed

    _write(folder / "a.yaml", "not: [valid", 2)  # broken: the last good ones stay
    broken = watched.reload()
    assert not broken.changed and not broken.ok and names(watched) == ["A"]
    assert str(folder / "a.yaml") in broken.errors

    _write(folder / "a.yaml", template.format(name="A"), 3)
    _write(folder / "b.yaml", template.format(name="A") , 4)  # the same name again
    duplicate = watched.reload()
    assert names(watched) == ["A"]
    [(where, why)] = duplicate.errors.items()
    assert where == str(folder / "b.yaml")
    assert "already defined at" in why and str(folder / "a.yaml") in why and "ignored" in why

    (folder / "b.yaml").unlink()  # removed from a folder that is still there: gone, and its error
    removed = watched.reload()
    assert removed.ok and names(watched) == ["A"]
    (folder / "a.yaml").unlink()
    assert watched.reload().changed and names(watched) == []


def test_a_vanished_path_keeps_what_was_loaded_from_it(tmp_path, kind):
    folder, single = tmp_path / "mounted", tmp_path / "cm" / "one.yaml"
    folder.mkdir()
    single.parent.mkdir()
    watched, names, template = kind([str(folder), str(single)])
    _write(folder / "a.yaml", template.format(name="A"), 1)
    _write(single, template.format(name="B"), 1)
    assert watched.reload().ok and sorted(names(watched)) == ["A", "B"]
    shutil.rmtree(folder)  # an unmounted ConfigMap
    single.unlink()  # a single configured file gone, its folder still there
    gone = watched.reload()
    assert not gone.changed and sorted(names(watched)) == ["A", "B"]  # still armed
    assert "does not exist" in gone.errors[str(folder)]
    assert "does not exist" in gone.errors[str(single)]


@pytest.mark.parametrize("spelling", ["./{rel}", "{root}//{rel}", "{root}/./{rel}"])
def test_a_vanished_path_keeps_its_definitions_however_it_is_spelled(tmp_path, kind, spelling,
                                                                     monkeypatch):
    monkeypatch.chdir(tmp_path)
    folder = tmp_path / "pol"
    folder.mkdir()
    configured = spelling.format(root=tmp_path, rel="pol")
    watched, names, template = kind([configured])
    _write(folder / "a.yaml", template.format(name="A"), 1)
    assert watched.reload().ok and names(watched) == ["A"]
    shutil.rmtree(folder)
    gone = watched.reload()
    assert names(watched) == ["A"] and "does not exist" in gone.errors[configured]


def test_the_first_definition_is_the_configured_one_and_errors_add_up(tmp_path, kind):
    late, early = tmp_path / "a-late", tmp_path / "z-early"
    late.mkdir()
    early.mkdir()
    watched, _, template = kind([str(early), str(late)])  # z-early is configured first
    _write(early / "x.yaml", template.format(name="A"), 1)
    _write(late / "x.yaml", template.format(name="A"), 1)
    reloaded = watched.reload()
    [(where, why)] = reloaded.errors.items()
    assert where == str(late / "x.yaml") and f"defined at {early / 'x.yaml'}" in why
    _write(late / "x.yaml", "not: [valid", 2)  # broken now, and its last good copy duplicates
    both = watched.reload().errors[str(late / "x.yaml")]
    assert "already defined" in both and "x.yaml:1" in both  # neither hides the other
