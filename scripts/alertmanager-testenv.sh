#!/usr/bin/env bash
# Install what the Alertmanager receiver's tests start: Debian's `prometheus-alertmanager`
# (0.25 on bookworm). Its own service is never started: the tests run their own peers on
# loopback with temp dirs (tests/support/alertmanager.py; scripts/apt-install.sh keeps the
# service from starting while apt installs). On a machine that boots with systemd, the unit the
# package enabled is disabled too, so it does not start at the next boot (idempotent).
set -euo pipefail
LOG_NAME=alertmanager-testenv
source "$(dirname "$0")/setup-lib.sh"
bash "$(dirname "$0")/apt-install.sh" "${LOG_NAME}" prometheus-alertmanager:prometheus-alertmanager
if [[ -d /run/systemd/system ]] && command -v systemctl >/dev/null 2>&1; then
    if systemctl is-enabled --quiet prometheus-alertmanager 2>/dev/null \
            || systemctl is-active --quiet prometheus-alertmanager 2>/dev/null; then
        log "disabling the package's own prometheus-alertmanager service"
        as_root systemctl disable --now prometheus-alertmanager >&2
    fi
fi
echo "alertmanager test env ready: $(command -v prometheus-alertmanager) ($(prometheus-alertmanager --version 2>&1 | head -1))"
