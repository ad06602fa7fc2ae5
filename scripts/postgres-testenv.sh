#!/usr/bin/env bash
# Install what the cluster server's PostgreSQL tests start: Debian's `postgresql` (15 on
# bookworm). Its binaries are not on PATH (/usr/lib/postgresql/VERSION/bin); the tests run
# their own server from them, with initdb in a temp dir, on loopback, as the package's
# `postgres` user (PostgreSQL refuses to run as root; tests/support/postgres.py).
#
# The package's own cluster ("main", made at install) and service are never left running:
# scripts/apt-install.sh keeps the service from starting while apt installs, any cluster that
# is online is stopped, every cluster is set to start manually (start.conf), and on a machine
# that boots with systemd the unit is disabled, so none starts at the next boot (idempotent).
set -euo pipefail
LOG_NAME=postgres-testenv
source "$(dirname "$0")/setup-lib.sh"
# initdb of whichever major version Debian ships, for apt-install.sh's check.
for version in 13 14 15 16 17 18 19 20; do
    PATH="${PATH}:/usr/lib/postgresql/${version}/bin"
done
export PATH
bash "$(dirname "$0")/apt-install.sh" "${LOG_NAME}" postgresql:initdb

if command -v pg_lsclusters >/dev/null 2>&1; then
    while read -r version cluster _port status _rest; do
        [[ -n "${version}" ]] || continue
        if [[ "${status}" == online* ]]; then
            log "stopping the package's own cluster ${version}/${cluster}"
            as_root pg_ctlcluster "${version}" "${cluster}" stop >&2
        fi
        conf="/etc/postgresql/${version}/${cluster}/start.conf"
        if [[ -f "${conf}" ]] && ! grep -qx manual "${conf}"; then
            log "cluster ${version}/${cluster}: start.conf set to manual (not started at boot)"
            as_root sh -c "printf 'manual\n' > '${conf}'"
        fi
    done < <(pg_lsclusters -h 2>/dev/null)
fi
if [[ -d /run/systemd/system ]] && command -v systemctl >/dev/null 2>&1; then
    if systemctl is-enabled --quiet postgresql 2>/dev/null \
            || systemctl is-active --quiet postgresql 2>/dev/null; then
        log "disabling the package's own postgresql service"
        as_root systemctl disable --now postgresql >&2
    fi
fi
echo "postgres test env ready: $(command -v initdb) ($(initdb --version))"
