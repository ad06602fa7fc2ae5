"""Configuration: defaults, precedence, provenance, and errors naming file, line and field."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from sloguard.core.config import ConfigError
from sloguard.core.selectors import parse_selector
from sloguard.core.units import format_duration, parse_duration, parse_size
from sloguard.settings import load_settings


def test_units():
    assert parse_duration("1m30s") == 90 and parse_duration("500ms") == 0.5
    assert parse_duration(2) == 2.0 and parse_duration("7d") == 7 * 86400
    assert parse_size("512MiB") == 512 * 1024**2 and parse_size("1GB") == 10**9
    assert format_duration(5400) == "1h30m" and format_duration(0.25) == "250ms"
    for bad in ("10 seconds", "", "5x", "-1s"):
        with pytest.raises(ValueError):
            parse_duration(bad)
    with pytest.raises(ValueError):
        parse_size("12 parsecs")


def test_defaults_without_a_file(monkeypatch):
    monkeypatch.delenv("SLOGUARD_CONFIG", raising=False)
    loaded = load_settings()
    s = loaded.settings
    assert (s.listen, s.interval, str(s.data_dir)) == ("127.0.0.1:8080", 1.0, "data")
    assert s.store.kind == "embedded" and s.actuators.dry_run is True
    assert {source for _, _, source in loaded.effective()} == {"default"}


def test_precedence_and_sources(tmp_path, monkeypatch):
    cfg = tmp_path / "sloguard.yaml"
    cfg.write_text(
        "interval: 2s\n"
        "store:\n"
        "  retention: 2h\n"
        "  max_size: 100MiB\n"
        "collectors:\n"
        "  cgroups:\n"
        "    declare:\n"
        "      - {path: 'lab/ls/*', class: LS, name: redis}\n"
    )
    monkeypatch.setenv("SLOGUARD_STORE__MAX_SIZE", "3GiB")
    monkeypatch.setenv("SLOGUARD_LISTEN", "127.0.0.1:9999")
    loaded = load_settings(cfg, {"listen": ("--listen", "127.0.0.1:7777")})
    s = loaded.settings
    assert s.interval == 2.0 and s.store.retention == 7200
    assert s.store.max_size == 3 * 1024**3  # env beats file
    assert s.listen == "127.0.0.1:7777"  # command line beats env
    assert s.collectors.cgroups.declare[0].class_ == "LS"
    sources = {key: source for key, _, source in loaded.effective()}
    assert sources["interval"] == f"{cfg}:1"
    assert sources["store.retention"] == f"{cfg}:3"
    assert sources["store.max_size"] == "environment SLOGUARD_STORE__MAX_SIZE"
    assert sources["listen"] == "command line --listen"
    assert sources["store.kind"] == "default"
    assert sources["collectors.cgroups.declare"] == f"{cfg}:7"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("store:\n  retention: 6 hours\n", ":2: store.retention: not a duration"),
        ("interval: 1s\nlisten: localhost\n", ":2: listen: must be HOST:PORT"),
        ("collectors:\n  cgroups:\n    declare:\n      - path: a\n        clas: LS\n",
         ":5: collectors.cgroups.declare.0.clas: unknown setting"),
        ("collectors:\n  cgroups:\n    declare:\n      - path: a\n",
         ":4: collectors.cgroups.declare.0.class: Field required"),
        ("store:\n  kind: [\n", ":3:1: invalid YAML"),
        ("- just\n- a list\n", ":1: the config file must be a mapping"),
    ],
)
def test_errors_name_file_line_and_field(tmp_path, text, expected):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_settings(cfg)
    assert f"{cfg}{expected}" in str(info.value)


def test_env_error_names_the_variable(monkeypatch):
    monkeypatch.setenv("SLOGUARD_INTERVAL", "soon")
    with pytest.raises(ConfigError, match="environment SLOGUARD_INTERVAL: interval: not a"):
        load_settings()


def test_missing_file_is_an_error(tmp_path):
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_settings(tmp_path / "absent.yaml")


def test_cli_exits_2_with_the_message(tmp_path, sloguard_bin):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("store:\n  max_size: lots\n")
    for command in (["config", "show"], ["run"]):
        result = subprocess.run([sloguard_bin, *command, "-c", str(cfg)], capture_output=True,
                                text=True, timeout=60)
        assert result.returncode == 2, result
        assert f"{cfg}:2: store.max_size: not a size" in result.stderr


def test_cli_config_show_and_version(tmp_path, sloguard_bin):
    cfg = tmp_path / "ok.yaml"
    cfg.write_text("interval: 5s\n")
    shown = subprocess.run([sloguard_bin, "config", "show", "-c", str(cfg), "--data-dir", "/x"],
                           capture_output=True, text=True, timeout=60, check=True).stdout
    assert f"5.0  # {cfg}:1" in shown
    assert '"/x"  # command line --data-dir' in shown
    cfg.write_text("forward:\n  url: https://agent:s3cret@server:8443/x?key=k3y\n  token: t\n")
    shown = subprocess.run([sloguard_bin, "config", "show", "-c", str(cfg)],
                           capture_output=True, text=True, timeout=60, check=True).stdout
    assert "s3cret" not in shown and "k3y" not in shown  # redacted, as in logs and /readyz
    assert '"https://***@server:8443/x?***"' in shown
    version = subprocess.run([sloguard_bin, "version"], capture_output=True, text=True,
                             timeout=60, check=True).stdout
    assert version.startswith("sloguard ")


def test_selectors():
    sel = parse_selector('container_cpu{class="LS", pod=~"web-.*", ns!="kube-system"}')
    assert sel.measurement == "container_cpu"
    assert sel.matches({"class": "LS", "pod": "web-1", "ns": "default"})
    assert not sel.matches({"class": "LS", "pod": "xweb-1"})  # anchored
    assert not sel.matches({"class": "LS", "pod": "web-1", "ns": "kube-system"})
    assert parse_selector('m{a!~"x|y"}').matches({})  # absent tag is ""
    assert parse_selector('m{a="q\\"uote"}').matchers[0].value == 'q"uote'
    for bad in ("{a=\"b\"}", 'm{a="b"', 'm{a=b}', 'm{a=~"("}', 'm{a=="b"}'):
        with pytest.raises(ValueError):
            parse_selector(bad)


def test_unusable_data_dir_is_a_clean_error(tmp_path, sloguard_bin):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "incidents.db").mkdir()  # where the incident database should be
    for data_dir, expected in ((blocker / "data", "cannot create it"),
                               (tmp_path / "d", "cannot open the incident store")):
        result = subprocess.run(
            [sloguard_bin, "run", "--data-dir", str(data_dir), "--listen", "127.0.0.1:1"],
            capture_output=True, text=True, timeout=60)
        assert result.returncode == 2, result.stderr
        assert expected in result.stderr and "Traceback" not in result.stderr


def test_rules_check_command(tmp_path, sloguard_bin):
    good = tmp_path / "good.yaml"
    good.write_text("groups:\n  - name: g\n    rules:\n      - alert: A\n        expr: m\n"
                    "        field: v\n        params: {above: 1}\n")
    bad = tmp_path / "bad.yaml"
    bad.write_text("groups:\n  - name: g\n    rules:\n      - alert: A\n        expr: m{x=y}\n"
                   "        field: v\n        window: soon\n"
                   "      - alert: B\n        expr: m\n        field: v\n"
                   "        params: {abve: 1}\n")
    ok = subprocess.run([sloguard_bin, "rules", "check", str(good)], capture_output=True,
                        text=True, timeout=60)
    assert ok.returncode == 0 and f"{good}: 1 rules ok" in ok.stdout
    shipped = subprocess.run([sloguard_bin, "rules", "check", "rules"], capture_output=True,
                             text=True, timeout=60, cwd=Path(__file__).parent.parent)
    assert shipped.returncode == 0, shipped.stderr
    result = subprocess.run([sloguard_bin, "rules", "check", str(good), str(bad),
                             str(tmp_path / "absent.yaml")], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 1
    err = result.stderr
    assert f"{bad}:5:9: groups.0.rules.0.expr:" in err  # every problem, with line and column
    assert f"{bad}:7:9: groups.0.rules.0.window: not a duration" in err
    assert "absent.yaml: does not exist" in err
    assert f"{good}: 1 rules ok" in result.stdout
    # the params check runs once the file's structure is valid
    bad.write_text("groups:\n  - name: g\n    rules:\n      - alert: B\n        expr: m\n"
                   "        field: v\n        params: {abve: 1}\n")
    again = subprocess.run([sloguard_bin, "rules", "check", str(bad)], capture_output=True,
                           text=True, timeout=60)
    assert again.returncode == 1
    assert f"{bad}:7:9: groups.0.rules.0.params: unknown threshold parameter(s): abve" in (
        again.stderr)
    dup = tmp_path / "dup.yaml"
    dup.write_text(good.read_text())
    twice = subprocess.run([sloguard_bin, "rules", "check", str(good), str(dup)],
                           capture_output=True, text=True, timeout=60)
    assert twice.returncode == 1 and "rule g/A is already defined at" in twice.stderr


def test_concurrent_loads_see_only_their_own_file(tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    files = []
    for i in range(6):
        path = tmp_path / f"c{i}.yaml"
        path.write_text(f"node_name: node-{i}\ninterval: {i + 1}s\n")
        files.append(path)

    def load(i: int) -> tuple[str, float]:
        settings = load_settings(files[i % 6]).settings
        return settings.node_name, settings.interval

    import sys

    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads switch as often as they can: races show up
    try:
        with ThreadPoolExecutor(6) as pool:
            got = list(pool.map(load, range(600)))
    finally:
        sys.setswitchinterval(switch)
    assert got == [(f"node-{i % 6}", float(i % 6 + 1)) for i in range(600)]
