#!/usr/bin/env bash
# The browser the UI tests drive: Debian's chromium (Playwright's own browser downloads are not
# reachable here; the Python playwright package drives this one through executable_path).
set -euo pipefail
if command -v chromium >/dev/null 2>&1; then
    exit 0
fi
echo "installing Debian chromium for the UI tests..." >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -q >/dev/null
apt-get install -y -q --no-install-recommends chromium >/dev/null
command -v chromium >/dev/null
