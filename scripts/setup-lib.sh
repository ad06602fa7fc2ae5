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
