#!/usr/bin/env bash
# What the image test needs: Debian's Docker engine running, and a debian:bookworm-slim base
# image. No container registry is reachable here, so the base image is made from Debian's own
# mirror with debootstrap (minbase) and imported; a machine that can pull images skips that.
# Idempotent: a second run only checks (a second or two).
set -euo pipefail
LOG_NAME=docker-testenv
source "$(dirname "${BASH_SOURCE[0]}")/setup-lib.sh"
missing=()
command -v dockerd >/dev/null 2>&1 || missing+=(docker.io)
command -v debootstrap >/dev/null 2>&1 || missing+=(debootstrap)
if ((${#missing[@]})); then
    log "installing ${missing[*]} for the image test..."
    apt_get update -q >/dev/null
    apt_get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
fi
if ! docker info >/dev/null 2>&1; then
    # a dockerd killed without its cleanup leaves its pid file, and a new one refuses to start
    # ("pid file found") until it is gone
    pid=$(cat /var/run/docker.pid 2>/dev/null || true)
    if [[ -n $pid ]] && ! grep -qs dockerd "/proc/$pid/comm"; then
        log "removing a stale /var/run/docker.pid (pid $pid is not a running dockerd)"
        rm -f /var/run/docker.pid
    fi
    log "starting dockerd..."
    nohup dockerd >/var/log/sloguard-dockerd.log 2>&1 &
    for _ in $(seq 1 60); do
        docker info >/dev/null 2>&1 && break
        sleep 0.5
    done
    docker info >/dev/null 2>&1 || { tail -20 /var/log/sloguard-dockerd.log >&2; exit 1; }
fi
if ! docker image inspect debian:bookworm-slim >/dev/null 2>&1; then
    if ! docker pull -q debian:bookworm-slim >/dev/null 2>&1; then
        echo "no registry: building debian:bookworm-slim with debootstrap..." >&2
        rootfs=$(mktemp -d /tmp/sloguard-bookworm-XXXXXX)
        debootstrap --variant=minbase bookworm "$rootfs" http://deb.debian.org/debian >/dev/null
        rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
        tar -C "$rootfs" -c . | docker import - debian:bookworm-slim >/dev/null
        rm -rf "$rootfs"
    fi
fi
echo "docker test env ready: $(docker version --format '{{.Server.Version}}'), debian:bookworm-slim" >&2
