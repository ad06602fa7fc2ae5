#!/usr/bin/env bash
# Install what the agent's self-monitoring test starts: Debian's `prometheus` (2.42 on
# bookworm), with promtool. Its own service is never started: the test runs its own server on
# loopback with a temp dir (tests/support/prometheus.py; scripts/apt-install.sh keeps the
# service from starting while apt installs: Debian's would scrape this machine with its
# default config and listen on :9090). The unit the package enabled is disabled too
# (idempotent).
set -euo pipefail
LOG_NAME=prometheus-testenv
source "$(dirname "$0")/setup-lib.sh"
bash "$(dirname "$0")/apt-install.sh" "${LOG_NAME}" prometheus:prometheus prometheus:promtool
# The unit is disabled whether or not systemd runs now: a container image built with this script
# and booted later would otherwise start it (`systemctl disable` works on the files offline).
if command -v systemctl >/dev/null 2>&1 && systemctl is-enabled --quiet prometheus 2>/dev/null; then
    log "disabling the package's own prometheus service"
    as_root systemctl disable prometheus >&2
fi
if [[ -d /run/systemd/system ]] && command -v systemctl >/dev/null 2>&1 \
        && systemctl is-active --quiet prometheus 2>/dev/null; then
    log "stopping the package's own prometheus service"
    as_root systemctl stop prometheus >&2
fi
echo "prometheus test env ready: $(command -v prometheus) ($(prometheus --version 2>&1 | head -1))"
