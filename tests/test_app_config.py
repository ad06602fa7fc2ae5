"""The app_latency and slos settings: what they accept, errors naming file, line and field, and
a receive token that never shows."""

from __future__ import annotations

import subprocess

import pytest

from sloguard.collectors.app_latency import app_latency_wanted
from sloguard.core.config import ConfigError
from sloguard.core.percentiles import parse_percentile
from sloguard.settings import load_settings

GOOD = """\
app_latency:
  scrape_interval: 5s
  targets:
    - {service: web, url: "http://127.0.0.1:9100/metrics", labels: {handler: /api}}
  probes:
    - {service: web, kind: http, url: "https://web.shop.svc/healthz", expect_status: [200]}
    - {service: redis, kind: tcp, address: "127.0.0.1:6379", interval: 2s}
  receive: {enabled: true, token: s3cret-value}
slos:
  - {service: web, percentile: p99.9, latency_ms: 250, error_rate: 0.001, window: 5m}
  - {service: web, namespace: staging, latency_ms: 900}
"""


def test_accepts_targets_probes_slos(tmp_path):
    cfg = tmp_path / "ok.yaml"
    cfg.write_text(GOOD)
    s = load_settings(cfg).settings
    assert s.app_latency.targets[0].labels == {"handler": "/api"}
    assert s.app_latency.targets[0].class_ == "LS"
    assert s.app_latency.probes[1].address == "127.0.0.1:6379"
    assert s.slos[0].quantile == pytest.approx(0.999) and s.slos[0].window == 300
    assert s.slos[1].percentile == "p99" and s.slos[1].error_rate is None
    assert app_latency_wanted(s)
    assert not app_latency_wanted(load_settings(None).settings)  # nothing to do: no thread
    assert [parse_percentile(p) for p in ("p50", "p90", "p95", "p99", "p999", "P99.99")] \
        == pytest.approx([0.5, 0.9, 0.95, 0.99, 0.999, 0.9999])


@pytest.mark.parametrize(("text", "expected"), [
    ("slos:\n  - {service: web, latency_ms: 100}\n  - {service: web, latency_ms: 200}\n",
     ":1: slos: slos.0 and slos.1 are both for service 'web' (namespace any)"),
    ("slos:\n  - {service: web, percentile: 99th, latency_ms: 100}\n",
     ":2: slos.0.percentile: not a percentile: '99th'"),
    ("slos:\n  - service: web\n    latency_ms: 0\n", ":3: slos.0.latency_ms: Input should be"),
    ("app_latency:\n  receive:\n    enabled: true\n",
     ":2: app_latency.receive: enabled without a token"),
    ("app_latency:\n  probes:\n    - {service: r, kind: tcp}\n",
     ":3: app_latency.probes.0: a tcp probe needs `address`"),
    ("app_latency:\n  targets:\n    - service: w\n      url: ftp://x/metrics\n",
     ":4: app_latency.targets.0.url: must be an http:// or https:// URL"),
    ("app_latency:\n  targets:\n    - {service: w, url: 'http://x/m', errors: {match: '5(('}}\n",
     ":3: app_latency.targets.0.errors.match: not a regular expression"),
])
def test_errors_name_file_line_and_field(tmp_path, text, expected):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_settings(cfg)
    assert f"{cfg}{expected}" in str(info.value)


def test_token_from_environment_never_shown(tmp_path, sloguard_bin, monkeypatch):
    cfg = tmp_path / "ok.yaml"
    cfg.write_text(GOOD)
    env = {"SLOGUARD_APP_LATENCY__RECEIVE__TOKEN": "from-the-env-xyz", "PATH": "/usr/bin:/bin"}
    monkeypatch.setenv("SLOGUARD_APP_LATENCY__RECEIVE__TOKEN", "from-the-env-xyz")
    s = load_settings(cfg).settings
    assert s.app_latency.receive.token.get_secret_value() == "from-the-env-xyz"
    for flags in ([], ["--json"]):
        shown = subprocess.run([sloguard_bin, "config", "show", "-c", str(cfg), *flags],
                               capture_output=True, text=True, timeout=60, env=env, check=True)
        assert "from-the-env-xyz" not in shown.stdout and "s3cret" not in shown.stdout
        assert "app_latency.receive.token" in shown.stdout
