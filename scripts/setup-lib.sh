# Sourced by the setup scripts (not run): non-interactive apt, logging under the script's name,
# and `as_root` (root, or passwordless sudo, else a clear error naming the command).
#   LOG_NAME=my-setup; source "$(dirname "${BASH_SOURCE[0]}")/setup-lib.sh"
export DEBIAN_FRONTEND=noninteractive
exec </dev/null

log() { printf '[%s] %s\n' "${LOG_NAME}" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

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

# Every apt-get of the setup scripts goes through `apt_get`: `make test` runs the Kubernetes build
# beside the other installs (make -j2), and a second apt-get fails at once on apt's own locks
# (and `apt-get update` may rewrite the lists another apt-get is reading). One lock of ours makes
# them take turns; apt's own DPkg::Lock::Timeout covers any other apt on the machine.
APT_LOCK="${SLOGUARD_APT_LOCK:-/run/lock/sloguard-apt.lock}"
apt_get() {
    as_root flock -w 1800 "${APT_LOCK}" apt-get -o DPkg::Lock::Timeout=600 "$@"
}
