#!/usr/bin/env bash
# Install the servers the InfluxDB tests start: Debian's `influxdb` (1.x) and `victoria-metrics`
# (not InfluxDB: a real server that accepts line protocol on /api/v2/write).
#
# The packages' own services are never started: the tests run their own server processes on
# loopback with temp dirs (tests/support/influxenv.py). While apt installs, a policy-rc.d that
# refuses service starts is put in place when the machine has none, and removed afterwards.
#
# Idempotent (nothing to do when both binaries exist). Works without a terminal (CI).
# Needs root (or passwordless sudo) when something must be installed.
set -euo pipefail

export DEBIAN_FRONTEND=noninteractive
exec </dev/null

log() { printf '[influx-testenv] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

PACKAGES=(influxdb victoria-metrics)
BINARIES=(influxd victoria-metrics)

SUDO=()
if [[ "$(id -u)" -ne 0 ]] && command -v sudo >/dev/null 2>&1; then
    SUDO=(sudo -n)
fi
as_root() {
    if [[ "$(id -u)" -ne 0 && ${#SUDO[@]} -eq 0 ]]; then
        die "need root (or passwordless sudo) to run: $*"
    fi
    "${SUDO[@]}" "$@"
}

missing=()
for i in "${!PACKAGES[@]}"; do
    if ! command -v "${BINARIES[$i]}" >/dev/null 2>&1; then
        missing+=("${PACKAGES[$i]}")
    fi
done
if [[ ${#missing[@]} -eq 0 ]]; then
    echo "influx test env ready: $(command -v influxd) ($(influxd version 2>/dev/null)), $(command -v victoria-metrics)"
    exit 0
fi

POLICY=/usr/sbin/policy-rc.d
placed=0
if [[ ! -e "${POLICY}" ]]; then
    log "refusing service starts while installing (temporary ${POLICY})"
    as_root sh -c "printf '#!/bin/sh\nexit 101\n' > '${POLICY}' && chmod 0755 '${POLICY}'"
    placed=1
fi
cleanup() {
    if [[ "${placed}" -eq 1 ]]; then
        as_root rm -f "${POLICY}"
    fi
}
trap cleanup EXIT

log "apt-get update"
as_root apt-get update -q >&2
log "apt-get install ${missing[*]}"
as_root apt-get install -y -q --no-install-recommends "${missing[@]}" >&2

for binary in "${BINARIES[@]}"; do
    command -v "${binary}" >/dev/null 2>&1 || die "${binary} missing after installing ${missing[*]}"
done
echo "influx test env ready: $(command -v influxd) ($(influxd version 2>/dev/null)), $(command -v victoria-metrics)"
