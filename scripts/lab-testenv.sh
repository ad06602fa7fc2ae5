#!/usr/bin/env bash
# Install what `sloguard lab` runs: Debian's `stress-ng` (the BE antagonists) and `redis-server`
# (the LS service).
#
# The redis package's own service is never started (the lab starts its own redis-server in the
# LS cgroup on a free loopback port): while apt installs, a policy-rc.d that refuses service
# starts is put in place when the machine has none, and removed afterwards.
#
# Idempotent (nothing to do when both binaries exist). Works without a terminal (CI).
# Needs root (or passwordless sudo) when something must be installed.
set -euo pipefail

export DEBIAN_FRONTEND=noninteractive
exec </dev/null

log() { printf '[lab-testenv] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

PACKAGES=(stress-ng redis-server)
BINARIES=(stress-ng redis-server)

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
    echo "lab env ready: $(stress-ng --version 2>/dev/null | head -1), $(redis-server --version 2>/dev/null | cut -d" " -f1-3)"
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
echo "lab env ready: $(stress-ng --version 2>/dev/null | head -1), $(redis-server --version 2>/dev/null | cut -d" " -f1-3)"
