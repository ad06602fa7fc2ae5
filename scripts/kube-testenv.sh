#!/usr/bin/env bash
# Build and cache a real Kubernetes control plane for the integration tests.
#
# Produces, in ${SLOGUARD_KUBE_CACHE:-/var/cache/sloguard/kube}/bin/:
#   kube-apiserver, kube-controller-manager, built from Debian bookworm's source package
#   kube-scheduler, kubelet                  `kubernetes` (upstream v1.20.2 with vendor/)
#   pause                                    the pod sandbox's program, compiled (static) from
#                                            the same tree's build/pause/linux/pause.c
#   etcd, etcdctl                            from Debian's etcd-server / etcd-client (dpkg -x)
#   kubectl                                  from Debian's kubernetes-client (dpkg -x)
# and installs the node's runtime from Debian (tests/support/kubenode.py starts it, with its own
# config and state; the packages' services are not used): containerd, runc,
# containernetworking-plugins (CNI bridge, host-local, loopback in /usr/lib/cni), iproute2.
#
# kubectl is extracted rather than installed with apt: on machines where another package
# already owns /usr/bin/kubectl (e.g. the Google Cloud SDK's `kubectl`), installing
# kubernetes-client aborts with a dpkg file conflict.
#
# Idempotent: a second run only verifies the cached binaries (checksums and versions).
# Works without a terminal (CI). Needs root (or sudo) for apt-get install.
#
#   bash scripts/kube-testenv.sh               build (or verify) now, in the foreground
#   bash scripts/kube-testenv.sh --background  return at once; the build goes on behind, its
#                                              compile at idle CPU priority (SCHED_IDLE), its
#                                              log in ${CACHE_DIR}/background-build.log
# `make test` uses --background: the other installs and the tests that need no Kubernetes run
# meanwhile, and the Kubernetes tests wait for the cache's lock (tests/support/kubeenv.py,
# wait_for_background_build) rather than find the binaries missing.
# The apt mirror is read from this machine's own apt sources; the system's apt configuration
# is never modified (deb-src lines live in a private apt config inside the build dir).
set -euo pipefail

KUBE_VERSION="v1.20.2"
KUBE_MAJOR="1"
KUBE_MINOR="20"
ETCD_MAJOR_MINOR="3.4"
SUITE="bookworm"
CACHE_DIR="${SLOGUARD_KUBE_CACHE:-/var/cache/sloguard/kube}"
BIN_DIR="${CACHE_DIR}/bin"
SUMS_FILE="${BIN_DIR}/SHA256SUMS"
LOCK_FILE="${CACHE_DIR}/.lock"
BACKGROUND_LOG="${CACHE_DIR}/background-build.log"
BINARIES=(kube-apiserver kube-controller-manager kube-scheduler kubelet pause etcd etcdctl kubectl)

LOG_NAME=kube-testenv
source "$(dirname "${BASH_SOURCE[0]}")/setup-lib.sh"

# --------------------------------------------------------------------------- verification
# Prints the version check result for one binary; returns non-zero when it does not match.
check_version() {
    local name="$1" path="${BIN_DIR}/$1" out
    [[ -x "${path}" ]] || return 1
    case "${name}" in
        kube-apiserver | kube-controller-manager | kube-scheduler | kubelet)
            out="$("${path}" --version 2>&1)" || return 1
            [[ "${out}" == "Kubernetes ${KUBE_VERSION}" ]] || return 1
            ;;
        kubectl)
            out="$("${path}" version --client --short 2>&1)" || return 1
            [[ "${out}" == *"${KUBE_VERSION}"* ]] || return 1
            ;;
        pause)
            out="$("${path}" -v 2>&1)" || return 1
            [[ "${out}" == "pause.c "* ]] || return 1
            ;;
        etcd)
            out="$("${path}" --version 2>&1)" || return 1
            [[ "${out}" == *"etcd Version: ${ETCD_MAJOR_MINOR}."* ]] || return 1
            ;;
        etcdctl)
            out="$(ETCDCTL_API=3 "${path}" version 2>&1)" || return 1
            [[ "${out}" == *"etcdctl version: ${ETCD_MAJOR_MINOR}."* ]] || return 1
            ;;
    esac
}

# Returns 0 when the binary exists, its checksum is recorded and matches, and it runs.
binary_ok() {
    local name="$1" want have
    [[ -f "${SUMS_FILE}" ]] || return 1
    want="$(awk -v n="${name}" '$2 == n { print $1 }' "${SUMS_FILE}")"
    [[ -n "${want}" && -x "${BIN_DIR}/${name}" ]] || return 1
    have="$(sha256sum "${BIN_DIR}/${name}" | awk '{ print $1 }')"
    [[ "${want}" == "${have}" ]] || return 1
    check_version "${name}"
}

record_sum() {
    local name="$1" tmp
    tmp="$(mktemp "${BIN_DIR}/.sums.XXXXXX")"
    { [[ -f "${SUMS_FILE}" ]] && awk -v n="${name}" '$2 != n' "${SUMS_FILE}"; \
      (cd "${BIN_DIR}" && sha256sum "${name}"); } >"${tmp}" || true
    chmod 0644 "${tmp}"
    mv -f "${tmp}" "${SUMS_FILE}"
}

# Atomically move a freshly produced binary into the cache.
install_binary() {
    local src="$1" name="$2"
    install -m 0755 "${src}" "${BIN_DIR}/.${name}.new"
    mv -f "${BIN_DIR}/.${name}.new" "${BIN_DIR}/${name}"
    check_version "${name}" || die "${name} was installed but its version check failed"
    record_sum "${name}"
    log "cached ${BIN_DIR}/${name}"
}

# ------------------------------------------------------------------------- apt mirror URIs
# Prints "suite uri" pairs for every Debian `deb` source configured on this machine
# (deb822 .sources files and one-line .list files).
apt_source_pairs() {
    local f
    if [[ -f /etc/apt/sources.list ]]; then
        awk '
            /^[[:space:]]*deb[[:space:]]/ {
                sub(/^[[:space:]]*deb[[:space:]]+/, "")
                if ($0 ~ /^\[/) { sub(/^\[[^]]*\][[:space:]]*/, "") }
                print $2, $1
            }' /etc/apt/sources.list
    fi
    for f in /etc/apt/sources.list.d/*.list; do
        [[ -f "${f}" ]] || continue
        awk '
            /^[[:space:]]*deb[[:space:]]/ {
                sub(/^[[:space:]]*deb[[:space:]]+/, "")
                if ($0 ~ /^\[/) { sub(/^\[[^]]*\][[:space:]]*/, "") }
                print $2, $1
            }' "${f}"
    done
    for f in /etc/apt/sources.list.d/*.sources; do
        [[ -f "${f}" ]] || continue
        awk '
            function flush(   i, j, nu, ns, u, s) {
                if (types ~ /(^|[[:space:]])deb([[:space:]]|$)/ && enabled != "no") {
                    nu = split(uris, u, /[[:space:]]+/)
                    ns = split(suites, s, /[[:space:]]+/)
                    for (i = 1; i <= nu; i++) for (j = 1; j <= ns; j++)
                        if (u[i] != "" && s[j] != "") print s[j], u[i]
                }
                types = ""; uris = ""; suites = ""; enabled = ""
            }
            /^[[:space:]]*#/ { next }
            /^[[:space:]]*$/ { flush(); next }
            {
                key = tolower($1); sub(/:$/, "", key)
                val = $0; sub(/^[^:]*:[[:space:]]*/, "", val)
                if (key == "types") types = val
                else if (key == "uris") uris = val
                else if (key == "suites") suites = val
                else if (key == "enabled") enabled = tolower(val)
            }
            END { flush() }' "${f}"
    done
}

# Prints the mirror URI used for the given suite (exact match), or nothing.
mirror_for_suite() {
    apt_source_pairs | awk -v s="$1" '$1 == s { print $2; exit }'
}

# --------------------------------------------------------------------------- installation
APT_UPDATED=0
apt_update_once() {
    if [[ "${APT_UPDATED}" -eq 0 ]]; then
        log "apt-get update"
        apt_get update -q >&2 9>&-
        APT_UPDATED=1
    fi
}

ensure_packages() {
    local missing=() p
    for p in "$@"; do
        if ! dpkg-query -W -f='${Status}' "${p}" 2>/dev/null | grep -q 'install ok installed'; then
            missing+=("${p}")
        fi
    done
    if [[ ${#missing[@]} -gt 0 ]]; then
        apt_update_once
        log "apt-get install ${missing[*]}"
        # fd 9 (the cache's lock) closed: a daemon a package's postinst started would hold
        # the lock for as long as it lives
        apt_get install -y -q --no-install-recommends "${missing[@]}" >&2 9>&-
    fi
}

# Downloads Debian binary packages and extracts the named files into the cache.
# Usage: extract_from_debs "<pkg> <pkg>..." "<name>=<path-in-deb>"...
extract_from_debs() {
    local pkgs="$1" spec name rel deb
    shift
    local dir="${WORK}/debs"
    mkdir -p "${dir}/root"
    apt_update_once
    # As root apt drops to the _apt user, which cannot write into the private build dir; and
    # as root the download waits for the other setup scripts' apt (apt_get). A download needs
    # no root.
    local get=(apt-get)
    [[ "$(id -u)" -ne 0 ]] || get=(apt_get -o "APT::Sandbox::User=root")
    # shellcheck disable=SC2086
    (cd "${dir}" && "${get[@]}" download -q ${pkgs} >&2 9>&-)
    for deb in "${dir}"/*.deb; do
        dpkg -x "${deb}" "${dir}/root"
    done
    for spec in "$@"; do
        name="${spec%%=*}"
        rel="${spec#*=}"
        [[ -x "${dir}/root/${rel}" ]] || die "${rel} not found in ${pkgs}"
        install_binary "${dir}/root/${rel}" "${name}"
    done
    rm -rf "${dir}"
}

build_kube() {
    local targets=("$@") main_uri sec_uri apt_dir src t
    ensure_packages golang-go rsync make dpkg-dev

    main_uri="$(mirror_for_suite "${SUITE}")"
    [[ -n "${main_uri}" ]] || die "no apt source for suite '${SUITE}' in /etc/apt"
    sec_uri="$(mirror_for_suite "${SUITE}-security")"
    if [[ -z "${sec_uri}" ]]; then
        log "no ${SUITE}-security source configured; using only ${SUITE}"
    fi

    apt_dir="${WORK}/apt"
    mkdir -p "${apt_dir}/lists/partial" "${apt_dir}/archives/partial" "${apt_dir}/parts"
    {
        printf 'deb-src %s %s main\n' "${main_uri}" "${SUITE}"
        [[ -z "${sec_uri}" ]] || printf 'deb-src %s %s main\n' "${sec_uri}" "${SUITE}-security"
    } >"${apt_dir}/sources.list"
    local apt_opts=(
        -o "Dir::Etc::SourceList=${apt_dir}/sources.list"
        -o "Dir::Etc::SourceParts=${apt_dir}/parts"
        -o "Dir::State::Lists=${apt_dir}/lists"
        -o "Dir::Cache=${apt_dir}/cache"
        -o "Dir::Cache::Archives=${apt_dir}/archives"
    )
    [[ "$(id -u)" -ne 0 ]] || apt_opts+=(-o "APT::Sandbox::User=root")
    log "fetching deb-src indexes (private apt config in ${apt_dir})"
    apt-get "${apt_opts[@]}" update -q >&2
    log "downloading source package kubernetes"
    mkdir -p "${WORK}/src"
    (cd "${WORK}/src" && apt-get "${apt_opts[@]}" source --download-only -q kubernetes >&2)
    (cd "${WORK}/src" && dpkg-source --no-check -x ./kubernetes_*.dsc tree >&2)
    src="${WORK}/src/tree"
    [[ -f "${src}/Makefile" && -d "${src}/vendor" ]] || die "unexpected source tree in ${src}"

    local go_targets=() want_pause=0
    for t in "${targets[@]}"; do
        if [[ "${t}" == pause ]]; then want_pause=1; else go_targets+=("cmd/${t}"); fi
    done
    if [[ ${#go_targets[@]} -gt 0 ]]; then
        log "building ${go_targets[*]} ${KUBE_VERSION} (one Go build, shared cache; about 7 min alone on 2 cores, 8-11 beside the other installs)"
        (
            cd "${src}"
            export CGO_ENABLED=0 GOPROXY=off GOFLAGS=-mod=vendor GO111MODULE=on
            export GOPATH="${WORK}/gopath" GOCACHE="${WORK}/gocache" HOME="${WORK}/home"
            export KUBE_GIT_VERSION="${KUBE_VERSION}" KUBE_GIT_TREE_STATE=clean
            export KUBE_GIT_MAJOR="${KUBE_MAJOR}" KUBE_GIT_MINOR="${KUBE_MINOR}"
            mkdir -p "${HOME}"
            # A build of its own, not a job of `make -j2 test-deps`: Go compiles in parallel by
            # itself, and the parent's jobserver would only make this make warn.
            unset MAKEFLAGS MFLAGS MAKELEVEL
            # `make WHAT=...` first regenerates every generated file. The tree ships all but
            # the main OpenAPI spec (zz_generated deepcopy, conversion, defaults and
            # prerelease-lifecycle; kubectl's bindata), so only that one is made: the step
            # before the compile went from ~70 s to 34 s here (2026-12-03).
            local idle=()
            [[ "${SLOGUARD_KUBE_BACKGROUND:-0}" != 1 ]] || idle=(chrt --idle 0)
            "${idle[@]}" make gen_openapi >&2
            "${idle[@]}" hack/make-rules/build.sh ${go_targets[*]} >&2
        )
    fi
    for t in "${targets[@]}"; do
        [[ "${t}" != pause ]] || continue
        local out="${src}/_output/local/bin/linux/amd64/${t}"
        [[ -x "${out}" ]] || out="${src}/_output/bin/${t}"
        [[ -x "${out}" ]] || die "make finished but ${t} was not found under ${src}/_output"
        install_binary "${out}" "${t}"
    done
    if [[ "${want_pause}" -eq 1 ]]; then
        # The sandbox image's program, as build/pause/Makefile compiles it (static, so the image
        # needs nothing else); its version is the Makefile's TAG.
        local pause_dir="${src}/build/pause" tag
        [[ -f "${pause_dir}/linux/pause.c" ]] || die "no build/pause/linux/pause.c in ${src}"
        tag="$(awk -F' *[?:]?= *' '$1 == "TAG" { print $2; exit }' "${pause_dir}/Makefile")"
        [[ -n "${tag}" ]] || tag=unknown
        ensure_packages gcc libc6-dev
        log "compiling pause ${tag}"
        gcc -Os -Wall -Werror -static -DVERSION="v${tag#v}" -o "${WORK}/pause" "${pause_dir}/linux/pause.c"
        strip "${WORK}/pause"
        install_binary "${WORK}/pause" pause
    fi
}

# Prints the names of the binaries that are not cached and verified, on one line.
missing_binaries() {
    local name missing=()
    for name in "${BINARIES[@]}"; do
        if binary_ok "${name}"; then log "ok ${name}"; else missing+=("${name}"); fi
    done
    echo "${missing[*]}"
}

# ------------------------------------------------------------------------------------ main
main() {
    local start missing=() name
    start="$(date +%s)"
    mkdir -p "${BIN_DIR}"
    if [[ "${SLOGUARD_KUBE_BACKGROUND:-0}" == 1 ]]; then
        : # started by --background, which took the lock and handed it down as fd 9
    else
        exec 9>"${LOCK_FILE}"
        if ! flock -n 9; then
            log "waiting for the build already running (its log: ${BACKGROUND_LOG})"
            flock 9
        fi
    fi
    ensure_packages containerd runc containernetworking-plugins iproute2

    read -ra missing <<<"$(missing_binaries)"
    if [[ ${#missing[@]} -eq 0 ]]; then
        log "all binaries verified in $(($(date +%s) - start)) s"
        echo "kube test env ready: ${BIN_DIR}"
        return 0
    fi
    log "to produce: ${missing[*]}"

    ensure_packages openssl
    mkdir -p /var/tmp
    WORK="$(mktemp -d /var/tmp/sloguard-kube-build.XXXXXX)"
    # Go's module cache is read-only; make it removable before deleting the build dir.
    trap 'chmod -R u+w "${WORK}" 2>/dev/null || true; rm -rf "${WORK}"' EXIT

    local kube=() etcd=0 kubectl=0
    for name in "${missing[@]}"; do
        case "${name}" in
            kube-apiserver | kube-controller-manager | kube-scheduler | kubelet | pause) kube+=("${name}") ;;
            etcd | etcdctl) etcd=1 ;;
            kubectl) kubectl=1 ;;
        esac
    done
    if [[ "${etcd}" -eq 1 ]]; then
        log "fetching etcd-server and etcd-client"
        extract_from_debs "etcd-server etcd-client" \
            "etcd=usr/bin/etcd" "etcdctl=usr/bin/etcdctl"
    fi
    if [[ "${kubectl}" -eq 1 ]]; then
        log "fetching kubernetes-client"
        extract_from_debs "kubernetes-client" "kubectl=usr/bin/kubectl"
    fi
    if [[ ${#kube[@]} -gt 0 ]]; then
        build_kube "${kube[@]}"
    fi

    for name in "${BINARIES[@]}"; do
        binary_ok "${name}" || die "${name} failed verification after the build"
    done
    log "done in $(($(date +%s) - start)) s"
    echo "kube test env ready: ${BIN_DIR}"
}

# Takes the lock here, so that the moment this returns the build counts as running (a test that
# looks for it then waits), and hands it to a detached copy of this script, which holds it
# (inherited fd 9) until the binaries are cached.
background() {
    mkdir -p "${BIN_DIR}"
    exec 9>"${LOCK_FILE}"
    if ! flock -n 9; then
        log "a build is already running (its log: ${BACKGROUND_LOG}); the tests will wait for it"
        return 0
    fi
    if [[ -z "$(missing_binaries)" ]]; then
        echo "kube test env ready: ${BIN_DIR}"
        return 0
    fi
    log "building in the background, the compile at idle CPU priority; log: ${BACKGROUND_LOG}"
    SLOGUARD_KUBE_BACKGROUND=1 setsid bash "${BASH_SOURCE[0]}" \
        >"${BACKGROUND_LOG}" 2>&1 </dev/null &
}

case "${1:-}" in
    "") main ;;
    --background) background ;;
    *) die "usage: $0 [--background]" ;;
esac
