"""NAB scoring, checked on hand-computed cases, and `sloguard score nab` on the shared subset."""

from __future__ import annotations

import csv
import json
import math
import subprocess
from pathlib import Path

import pytest
from conftest import need

from sloguard.detector.scoring import nab

NAB = Path(__file__).resolve().parent.parent.parent / "shared" / "bench" / "nab"
STANDARD = {"standard": {"tpWeight": 1.0, "fnWeight": 1.0, "fpWeight": 0.11}}
LEFT_EDGE = 2 / (1 + math.exp(-5)) - 1  # 0.9866: the weight of a detection at a window's start


def test_scaled_sigmoid():
    assert nab.scaled_sigmoid(-1.0) == pytest.approx(LEFT_EDGE)
    assert nab.scaled_sigmoid(0.0) == 0.0
    assert nab.scaled_sigmoid(3.5) == -1.0
    assert nab.scaled_sigmoid(0.5) < 0  # just after a window: a cheaper false alarm


def _corpus(tmp_path: Path) -> list[nab.DataFile]:
    data = tmp_path / "data" / "cat"
    data.mkdir(parents=True)
    with (data / "a.csv").open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["timestamp", "value"])
        for minute in range(1000):
            writer.writerow([f"2020-01-01 {minute // 60:02d}:{minute % 60:02d}:00", 1.0])
    windows = tmp_path / "windows.json"
    # rows 500..599 (08:20 to 09:59)
    windows.write_text(json.dumps({"cat/a.csv": [["2020-01-01 08:20:00.000000",
                                                   "2020-01-01 09:59:00.000000"]]}))
    return nab.load(tmp_path / "data", windows)


def _with(files, rows):
    files[0].scores = [1.0 if r in rows else 0.0 for r in range(1000)]
    return nab.score(files, STANDARD)[0].normalized


def test_hand_computed_scores(tmp_path):
    files = _corpus(tmp_path)
    assert files[0].windows == [(500, 599)] and files[0].probation == 150
    assert _with(files, {500}) == pytest.approx(100.0)  # the perfect detection
    assert _with(files, set()) == 0.0  # the null detector
    right_edge = 2 / (1 + math.exp(5 * -0.01)) - 1  # position -(599 - 599 + 1) / 100
    assert _with(files, {599}) == pytest.approx(100 * (right_edge + 1) / (LEFT_EDGE + 1))
    # a far false alarm before any window costs the full fpWeight; only the earliest
    # detection in the window counts
    assert _with(files, {200, 500, 520}) == pytest.approx(100 * (LEFT_EDGE - 0.11 + 1)
                                                          / (LEFT_EDGE + 1))
    assert _with(files, {100, 500}) == pytest.approx(100.0)  # probation is not scored
    events = nab.events(files, 0.5)
    assert (events.recall, events.false_alarms) == (1.0, 0)  # row 100 is in probation


def test_score_nab_command(tmp_path, sloguard_bin):
    need(NAB.is_dir(), f"the NAB benchmark data is not at {NAB}")
    out = tmp_path / "results"
    result = subprocess.run(
        [sloguard_bin, "score", "nab", "--data", str(NAB / "data"), "--windows",
         str(NAB / "windows.json"), "--out", str(out)], capture_output=True, text=True,
        timeout=600)
    assert result.returncode == 0, result.stderr
    rows = {line.split("|")[1].strip(): float(line.split("|")[2]) for line in
            result.stdout.splitlines() if line.startswith("| ") and "profile" not in line}
    assert set(rows) == {"standard", "reward_low_FP_rate", "reward_low_FN_rate"}
    assert all(0 <= v <= 100 for v in rows.values())
    assert rows["standard"] > 20  # well above the null detector (0) on this subset
    assert "events at the standard threshold: precision" in result.stdout
    windows = json.loads((NAB / "windows.json").read_text())
    written = sorted(str(p.relative_to(out)) for p in out.rglob("*.csv"))
    assert written == sorted(windows)
    with (out / "realAWSCloudwatch" / "ec2_cpu_utilization_24ae8d.csv").open() as handle:
        table = list(csv.DictReader(handle))
    assert list(table[0]) == ["timestamp", "value", "anomaly_score", "label"]
    assert any(r["label"] == "1" for r in table) and all(
        0 <= float(r["anomaly_score"]) <= 1 for r in table)
    bad = subprocess.run(
        [sloguard_bin, "score", "nab", "--data", str(NAB / "data"), "--windows",
         str(NAB / "windows.json"), "--out", str(out), "--detector", "ewma:band=-1"],
        capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "band" in bad.stderr


def test_a_failing_detector_is_reported_with_file_and_row(tmp_path, sloguard_bin):
    need(NAB.is_dir(), f"the NAB benchmark data is not at {NAB}")
    result = subprocess.run(
        [sloguard_bin, "score", "nab", "--data", str(NAB / "data"), "--windows",
         str(NAB / "windows.json"), "--out", str(tmp_path), "--detector",
         "burn_rate:objective=0.99"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert "row 2: the detector failed: ValueError: burn_rate expects an error ratio" in (
        result.stderr)


def _official_layout(root: Path, names: list[str]) -> Path:
    """The official NAB repository's layout, built from the shared subset with symlinks: the
    labels file names files this root does not have, as a partial clone would."""
    for name in names:
        target = root / "data" / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.symlink_to(NAB / "data" / name)
    (root / "labels").mkdir()
    (root / "labels" / "combined_windows.json").symlink_to(NAB / "windows.json")
    (root / "config").mkdir()
    (root / "config" / "profiles.json").symlink_to(NAB / "profiles.json")
    return root


def _table(stdout: str) -> list[str]:
    return [line for line in stdout.splitlines() if line.startswith(("| ", "events", "3 files"))]


def test_score_nab_reads_the_official_repository_layout(tmp_path, sloguard_bin):
    need(NAB.is_dir(), f"the NAB benchmark data is not at {NAB}")
    names = ["realAWSCloudwatch/ec2_cpu_utilization_24ae8d.csv",
             "artificialWithAnomaly/art_daily_jumpsup.csv", "artificialNoAnomaly/art_noisy.csv"]
    root = _official_layout(tmp_path / "NAB", names)
    runs = {}
    for how, args in {
        "ROOT": [str(root)],
        "--root": ["--root", str(root)],
        "paths": ["--data", str(root / "data"), "--windows",
                  str(root / "labels" / "combined_windows.json"), "--profiles",
                  str(root / "config" / "profiles.json")],
    }.items():
        out = tmp_path / how
        result = subprocess.run([sloguard_bin, "score", "nab", *args, "--out", str(out)],
                                capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stderr
        runs[how] = _table(result.stdout)
        assert sorted(str(p.relative_to(out)) for p in out.rglob("*.csv")) == sorted(names)
    assert runs["ROOT"][0].startswith("3 files, 3 windows")  # two in 24ae8d, one in jumpsup
    assert runs["ROOT"] == runs["--root"] == runs["paths"]
    (root / "config" / "profiles.json").unlink()
    missing = subprocess.run([sloguard_bin, "score", "nab", str(root), "--out",
                              str(tmp_path / "x")], capture_output=True, text=True, timeout=60)
    assert missing.returncode == 2
    assert f"the NAB profiles file {root / 'config' / 'profiles.json'} does not exist" in (
        missing.stderr)
    nothing = subprocess.run([sloguard_bin, "score", "nab", "--out", str(tmp_path / "x")],
                             capture_output=True, text=True, timeout=60)
    assert nothing.returncode == 2 and "give a NAB root" in nothing.stderr


def test_locate_the_subset_layout_and_explicit_paths_win(tmp_path):
    need(NAB.is_dir(), f"the NAB benchmark data is not at {NAB}")
    assert nab.locate(NAB) == (NAB / "data", NAB / "windows.json", NAB / "profiles.json")
    other = tmp_path / "profiles.json"
    other.write_text("{}")
    assert nab.locate(NAB, profiles=other)[2] == other
    with pytest.raises(ValueError, match="is not a directory"):
        nab.locate(tmp_path / "nowhere")
    bare = tmp_path / "bare"  # a clone whose labels folder lost its file
    (bare / "data").mkdir(parents=True)
    (bare / "labels").mkdir()
    with pytest.raises(ValueError, match=r"labels\) file .*labels/combined_windows\.json"):
        nab.locate(bare)
    with pytest.raises(ValueError, match="give a NAB root"):
        nab.locate(None, data=NAB / "data")
