#!/usr/bin/env bash
# Install the servers the InfluxDB tests start: Debian's `influxdb` (1.x) and `victoria-metrics`
# (not InfluxDB: a real server that accepts line protocol on /api/v2/write).
#
# The packages' own services are never started: the tests run their own server processes on
# loopback with temp dirs (tests/support/influxenv.py; scripts/apt-install.sh).
set -euo pipefail
bash "$(dirname "$0")/apt-install.sh" influx-testenv influxdb:influxd victoria-metrics:victoria-metrics
echo "influx test env ready: $(command -v influxd) ($(influxd version 2>/dev/null)), $(command -v victoria-metrics)"
