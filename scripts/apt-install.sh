#!/usr/bin/env bash
# Install Debian packages whose binaries are missing, without ever starting their services:
#   bash scripts/apt-install.sh LOG_NAME PACKAGE:BINARY [PACKAGE:BINARY ...]
# The test environments start their own server processes (on loopback, in temp dirs or lab
# cgroups), so while apt installs, a policy-rc.d that refuses service starts is put in place
# when the machine has none, and removed afterwards.
#
# Idempotent (nothing to do when every binary exists). Works without a terminal (CI).
# Needs root (or passwordless sudo) when something must be installed.
set -euo pipefail

LOG_NAME="$1"
shift
source "$(dirname "${BASH_SOURCE[0]}")/setup-lib.sh"

missing=()
binaries=()
for pair in "$@"; do
    binaries+=("${pair#*:}")
    if ! command -v "${pair#*:}" >/dev/null 2>&1; then
        missing+=("${pair%%:*}")
    fi
done
if [[ ${#missing[@]} -eq 0 ]]; then
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
apt_get update -q >&2
log "apt-get install ${missing[*]}"
apt_get install -y -q --no-install-recommends "${missing[@]}" >&2

for binary in "${binaries[@]}"; do
    command -v "${binary}" >/dev/null 2>&1 || die "${binary} missing after installing ${missing[*]}"
done
