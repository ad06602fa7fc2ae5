#!/usr/bin/env bash
# Make BCC (eBPF) usable by sloguard on a fresh Debian 12 machine whose kernel has no headers.
#
#   bash scripts/bcc-setup.sh [VENV]        # VENV defaults to .venv
#
# What it does, each step skipped when already done (a second run takes well under a second
# plus one compile check):
#   1. apt-get install python3-bpfcc libbpfcc linux-libc-dev linux-perf when missing (Debian's
#      BCC; the PyPI package called `bcc` is an unrelated project and is never installed;
#      linux-perf gives `perf bench sched pipe` for benchmarks/ebpf_overhead.py).
#   2. Builds a stand-in kernel header tree in ${SLOGUARD_BCC_KERNEL:-/var/cache/sloguard/bcc-kernel}
#      for BCC_KERNEL_SOURCE. Kernels without /lib/modules/$(uname -r)/build and without
#      CONFIG_IKHEADERS leave BCC nothing to compile against. The tree holds only the uapi
#      headers of linux-libc-dev and a few definitions BCC's own helpers need; it deliberately
#      holds no kernel structs, so a program that reads kernel memory through a struct layout
#      fails to compile instead of silently reading garbage (Debian's headers of another kernel
#      version compile, and give wrong values). sloguard's programs use only tracepoint
#      arguments (described by the running kernel's tracefs) and BPF helpers.
#   3. Mounts tracefs on /sys/kernel/tracing when it is not mounted (BCC attaches tracepoints
#      through it).
#   4. Links Debian's pure-Python `bcc` module into the venv's site-packages, so the venv's
#      interpreter imports it without seeing the rest of dist-packages.
#   5. As root, compiles and loads a one-tracepoint program to prove the whole chain works.
#
# SLOGUARD_BCC_IMAGE_BUILD=1 does steps 1 (without linux-perf), 2 and 4 only: for `docker build`
# (deploy/Dockerfile), where there is no tracefs to mount and no privilege to load a program;
# the node's tracefs is mounted into the agent's pod instead.
#
# Works without a terminal (CI). apt-get and mount need root (or passwordless sudo); without
# them the script says what is missing and exits non-zero, and sloguard's eBPF collector
# reports itself unavailable and falls back to procfs.
set -euo pipefail

VENV="${1:-.venv}"
KERNEL_TREE="${SLOGUARD_BCC_KERNEL:-/var/cache/sloguard/bcc-kernel}"
TREE_FORMAT="2"  # bump when the tree's content changes, to rebuild cached trees
PACKAGES=(python3-bpfcc libbpfcc linux-libc-dev linux-perf)
if [[ "${SLOGUARD_BCC_IMAGE_BUILD:-0}" == "1" ]]; then
    PACKAGES=(python3-bpfcc libbpfcc linux-libc-dev)  # no benchmarks in the image
fi
DIST_BCC="/usr/lib/python3/dist-packages/bcc"
TRACEFS="/sys/kernel/tracing"

LOG_NAME=bcc-setup
source "$(dirname "${BASH_SOURCE[0]}")/setup-lib.sh"

# ------------------------------------------------------------------------------ packages
installed() {
    dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'install ok installed'
}

ensure_packages() {
    local missing=() p
    for p in "${PACKAGES[@]}"; do
        installed "${p}" || missing+=("${p}")
    done
    if [[ ${#missing[@]} -eq 0 ]]; then
        log "ok packages ${PACKAGES[*]}"
        return 0
    fi
    log "apt-get update"
    apt_get -q update >&2
    log "apt-get install ${missing[*]}"
    apt_get -q install -y --no-install-recommends "${missing[@]}" >&2
}

# ---------------------------------------------------------------------- stand-in kernel tree
libc_dev_version() {
    dpkg-query -W -f='${Version}' linux-libc-dev 2>/dev/null || echo none
}

tree_stamp() {
    printf 'format=%s linux-libc-dev=%s\n' "${TREE_FORMAT}" "$(libc_dev_version)"
}

tree_ok() {
    [[ -f "${KERNEL_TREE}/.sloguard-stamp" ]] \
        && [[ "$(cat "${KERNEL_TREE}/.sloguard-stamp")" == "$(tree_stamp)" ]]
}

build_tree() {
    local parent tmp multiarch
    parent="$(dirname "${KERNEL_TREE}")"
    as_root mkdir -p "${parent}"
    tmp="$(as_root mktemp -d "${parent}/.bcc-kernel.XXXXXX")"
    multiarch="$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || echo x86_64-linux-gnu)"
    [[ -d "/usr/include/${multiarch}/asm" ]] || die "no /usr/include/${multiarch}/asm (linux-libc-dev)"
    as_root bash -s "${tmp}" "${multiarch}" <<'EOF'
set -euo pipefail
tree="$1" multiarch="$2"
mkdir -p "${tree}/include/uapi" "${tree}/include/linux" "${tree}/include/generated/uapi" \
         "${tree}/arch/x86/include/uapi" "${tree}/arch/x86/include/asm" \
         "${tree}/arch/x86/include/generated/uapi"
# The uapi headers of linux-libc-dev, one symlink per directory.
mkdir -p "${tree}/include/uapi/linux"
for entry in /usr/include/linux/*; do
    ln -s "${entry}" "${tree}/include/uapi/linux/$(basename "${entry}")"
done
ln -s /usr/include/asm-generic "${tree}/include/uapi/asm-generic"
ln -s "/usr/include/${multiarch}/asm" "${tree}/arch/x86/include/uapi/asm"
# BCC ships its own bpf.h (compat/linux/virtual_bpf.h); the uapi one would clash with it.
rm -f "${tree}/include/uapi/linux/bpf.h"
: >"${tree}/include/uapi/linux/bpf.h"
# Headers BCC's helpers.h includes from the kernel proper.
: >"${tree}/include/linux/log2.h"
cat >"${tree}/arch/x86/include/asm/page.h" <<'H'
#define PAGE_SHIFT 12
#define PAGE_SIZE (1UL << PAGE_SHIFT)
H
cat >"${tree}/include/linux/kconfig.h" <<'H'
/* sloguard stand-in: no kernel structs here on purpose (see scripts/bcc-setup.sh). */
#ifndef __SLOGUARD_KCONFIG_H
#define __SLOGUARD_KCONFIG_H
#define CONFIG_BPF_SYSCALL 1
#define CONFIG_BPF_EVENTS 1
#define __always_inline inline __attribute__((always_inline))
typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;
typedef signed char s8;
typedef short s16;
typedef int s32;
typedef long long s64;
typedef _Bool bool;
#define true 1
#define false 0
typedef int pid_t;
typedef u64 sector_t;
typedef u32 dev_t;
typedef unsigned long size_t;
typedef unsigned long uintptr_t;
typedef long long loff_t;
typedef unsigned int gfp_t;
#endif
H
EOF
    tree_stamp | as_root tee "${tmp}/.sloguard-stamp" >/dev/null
    as_root chmod -R a+rX "${tmp}"
    if [[ -e "${KERNEL_TREE}" ]]; then
        as_root rm -rf "${KERNEL_TREE}.old"
        as_root mv "${KERNEL_TREE}" "${KERNEL_TREE}.old"
    fi
    as_root mv "${tmp}" "${KERNEL_TREE}"
    as_root rm -rf "${KERNEL_TREE}.old"
    log "built the stand-in kernel header tree in ${KERNEL_TREE}"
}

# ----------------------------------------------------------------------------------- tracefs
ensure_tracefs() {
    if mountpoint -q "${TRACEFS}"; then
        log "ok tracefs on ${TRACEFS}"
        return 0
    fi
    as_root mount -t tracefs nodev "${TRACEFS}"
    log "mounted tracefs on ${TRACEFS}"
}

# -------------------------------------------------------------------------------------- venv
link_into_venv() {
    local purelib
    [[ -x "${VENV}/bin/python" ]] || { log "no venv at ${VENV}: skipped linking bcc"; return 0; }
    [[ -d "${DIST_BCC}" ]] || die "${DIST_BCC} missing although python3-bpfcc is installed"
    purelib="$("${VENV}/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
    if [[ "$(readlink "${purelib}/bcc" 2>/dev/null)" != "${DIST_BCC}" ]]; then
        rm -rf "${purelib}/bcc"
        ln -s "${DIST_BCC}" "${purelib}/bcc"
        log "linked ${DIST_BCC} into ${purelib}"
    else
        log "ok bcc linked into ${VENV}"
    fi
}

# ------------------------------------------------------------------------------------ check
check_compile() {
    local python="${VENV}/bin/python"
    [[ -x "${python}" ]] || python=python3
    if [[ "$(id -u)" -ne 0 ]]; then
        log "not root: skipped the load check (loading BPF programs needs root)"
        return 0
    fi
    BCC_KERNEL_SOURCE="${KERNEL_TREE}" "${python}" - <<'EOF' >&2
from bcc import BPF
b = BPF(text="""
BPF_HASH(seen, u64, u64);
TRACEPOINT_PROBE(sched, sched_switch) {
    u64 id = bpf_get_current_cgroup_id(), one = 1;
    seen.update(&id, &one);
    return 0;
}
""")
b.cleanup()
print("[bcc-setup] ok: compiled and attached a tracepoint program")
EOF
}

main() {
    local start
    start="$(date +%s)"
    ensure_packages
    if tree_ok; then
        log "ok stand-in kernel header tree ${KERNEL_TREE}"
    else
        build_tree
    fi
    if [[ "${SLOGUARD_BCC_IMAGE_BUILD:-0}" == "1" ]]; then
        link_into_venv
        log "image build: skipped tracefs and the load check (the pod mounts the node's tracefs)"
    else
        ensure_tracefs
        link_into_venv
        check_compile
    fi
    log "done in $(($(date +%s) - start)) s"
    echo "bcc ready: BCC_KERNEL_SOURCE=${KERNEL_TREE}"
}

main "$@"
