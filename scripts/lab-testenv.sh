#!/usr/bin/env bash
# Install what `sloguard lab` runs: Debian's `stress-ng` (the BE antagonists) and `redis-server`
# (the LS service). The redis package's own service is never started: the lab starts its own
# redis-server in the LS cgroup on a free loopback port (scripts/apt-install.sh).
set -euo pipefail
bash "$(dirname "$0")/apt-install.sh" lab-testenv stress-ng:stress-ng redis-server:redis-server
echo "lab env ready: $(stress-ng --version 2>/dev/null | head -1), $(redis-server --version 2>/dev/null | cut -d" " -f1-3)"
