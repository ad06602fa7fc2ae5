"""`sloguard backtest` replays stored history through rules, as the agent would have."""

from __future__ import annotations

import subprocess

from sloguard.core.samples import Sample
from sloguard.store.embedded import EmbeddedStore

S = 10**9
T0 = 1_800_000_000 * S  # 2027-01-15T08:00:00Z

RULES = """\
groups:
  - name: lab
    rules:
      - alert: LSSlow
        expr: lat{class="LS"}
        field: p99
        aggregate: mean
        window: 5s
        params: {above: 10, recover_below: 5}
        for: 5s
        recover_for: 10s
        annotations:
          summary: "{{ $labels.pod }} p99 {{ $value }} ms"
"""


def _history(data_dir) -> None:
    store = EmbeddedStore(data_dir / "samples.db", 10 * 86400, 1 << 30)
    samples = []
    for second in range(600):  # 10 minutes; web-1 slow from 200 s to 299 s
        slow = 200 <= second < 300
        samples.append(Sample("lat", {"node": "n", "class": "LS", "pod": "web-1"},
                              {"p99": 25.0 if slow else 2.0}, T0 + second * S))
        samples.append(Sample("lat", {"node": "n", "class": "LS", "pod": "web-2"},
                              {"p99": 2.0}, T0 + second * S))
    store.write(samples)
    store.close()


def test_backtest_shows_what_would_have_fired_and_plots_it(tmp_path, sloguard_bin):
    _history(tmp_path / "data")
    (tmp_path / "rules.yaml").write_text(RULES)
    plot = tmp_path / "plot.png"
    result = subprocess.run(
        [sloguard_bin, "backtest", "--rules", str(tmp_path / "rules.yaml"),
         "--data-dir", str(tmp_path / "data"), "--from", "2027-01-15T08:00:00Z",
         "--to", str(T0 // S + 599), "--plot", str(plot)],
        capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "600 evaluations every 1s: 1 incidents" in out
    assert "lab/LSSlow [warning] class=LS, pod=web-1" in out
    # slow from 08:03:20 to 08:04:59; the mean over [t - 5 s, t] crosses 10 at 08:03:22 (3 of
    # 6 points slow); `for: 5s` fires it at 08:03:27; the mean is back at or under 5 at 08:05:05
    # (no slow point left) and stays there for `recover_for: 10s`: resolved at 08:05:15
    assert "pending 2027-01-15 08:03:22  fired 2027-01-15 08:03:27" in out
    assert "resolved 2027-01-15 08:05:15" in out
    assert "web-1 p99 25 ms" in out and "would notify" in out
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and plot.stat().st_size > 10_000


def test_backtest_refuses_bad_input(tmp_path, sloguard_bin):
    (tmp_path / "rules.yaml").write_text(RULES.replace("window: 5s", "window: five"))
    _history(tmp_path / "data")
    bad_rules = subprocess.run(
        [sloguard_bin, "backtest", "--rules", str(tmp_path / "rules.yaml"), "--data-dir",
         str(tmp_path / "data"), "--from", "-1h"], capture_output=True, text=True, timeout=60)
    assert bad_rules.returncode == 1 and "rules.yaml:8:9: groups.0.rules.0.window" in (
        bad_rules.stderr)
    (tmp_path / "rules.yaml").write_text(RULES)
    no_data = subprocess.run(
        [sloguard_bin, "backtest", "--rules", str(tmp_path / "rules.yaml"), "--data-dir",
         str(tmp_path / "nothing"), "--from", "-1h"], capture_output=True, text=True, timeout=60)
    assert no_data.returncode == 2 and "no stored history" in no_data.stderr
    backwards = subprocess.run(
        [sloguard_bin, "backtest", "--rules", str(tmp_path / "rules.yaml"), "--data-dir",
         str(tmp_path / "data"), "--from", "now", "--to", "-1h"],
        capture_output=True, text=True, timeout=60)
    assert backwards.returncode == 2 and "--to must be after --from" in backwards.stderr


def test_rules_sharing_a_signal_see_each_sample_once(tmp_path, sloguard_bin):
    _history(tmp_path / "data")
    counting = """\
groups:
  - name: lab
    rules:
      - alert: Count{n}
        expr: lat{{pod="web-2"}}
        field: p99
        aggregate: count
        window: 10s
        params: {{above: 15}}
"""
    (tmp_path / "rules.yaml").write_text(counting.format(n=1) + "\n".join(
        counting.format(n=2).splitlines()[3:]) + "\n")
    result = subprocess.run(
        [sloguard_bin, "backtest", "--rules", str(tmp_path / "rules.yaml"), "--data-dir",
         str(tmp_path / "data"), "--from", str(T0 // S + 20), "--to", str(T0 // S + 60)],
        capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "2 rules, 51 samples" in result.stdout  # 41 s + the 10 s window before, once
    assert ": 0 incidents" in result.stdout  # 11 points per 10 s window, not 22
