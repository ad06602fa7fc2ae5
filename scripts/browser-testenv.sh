#!/usr/bin/env bash
# The browser the UI tests drive: Debian's chromium (Playwright's own browser downloads are not
# reachable here; the Python playwright package drives this one through executable_path).
set -euo pipefail
if command -v chromium >/dev/null 2>&1; then
    exit 0
fi
LOG_NAME=browser-testenv
source "$(dirname "${BASH_SOURCE[0]}")/setup-lib.sh"
log "installing Debian chromium for the UI tests..."
apt_get update -q >/dev/null
apt_get install -y -q --no-install-recommends chromium >/dev/null
command -v chromium >/dev/null
