#!/bin/bash
# Run a command inside the Debian root filesystem built by rootfs.sh:
# trixie with Ceph reef, or with RSM_CEPH=tentacle forky with Ceph tentacle.
#
#   e2e/in-rootfs.sh [-b HOSTDIR[:DIR]]... [-w WORKDIR] [--] CMD [ARG...]
#
#   -b HOSTDIR[:DIR]  bind HOSTDIR at DIR inside (default: the same path)
#   -w WORKDIR        working folder inside (default /)
#
# Everything runs in a new mount namespace with private propagation, so the
# mounts made here (/proc, /sys, /dev, a private /dev/shm, /run, /tmp and
# /var/tmp, the host Go toolchain read-only, the host module cache, the host CA
# bundle and resolv.conf, the -b folders) never reach the host and vanish by
# themselves when the last process in the namespace exits, daemons included.
#
# The environment is reset: PATH, HOME=/root, LANG, TERM, Go settings
# (GOCACHE/GOMODCACHE inside, GOTOOLCHAIN=local, CGO_ENABLED=1), plus the
# caller's CEPH_*, RSM_*, CI, GOFLAGS, GOPROXY, GOSUMDB, GOPRIVATE, GONO*,
# GOEXPERIMENT, GODEBUG, GOTRACEBACK, GOMAXPROCS, CGO_*, *_proxy.
#
# Environment: RSM_ROOTFS (default: RSM_CEPH's, see ceph-release.sh),
# RSM_GOROOT / RSM_GOMODCACHE (host folders to bind; "none" to skip).
# Needs root.
set -euo pipefail

# shellcheck source=ceph-release.sh
. "$(dirname "$0")/ceph-release.sh"
ROOTFS=$(readlink -f "${RSM_ROOTFS:-$ROOTFS_DEFAULT}")

if [ "${1:-}" != --in-namespace ]; then
  [ "$(id -u)" = 0 ] || { echo "in-rootfs: must run as root" >&2; exit 2; }
  # rootfs.sh sets RSM_ROOTFS_BUILDING while it installs packages.
  if [ -z "${RSM_ROOTFS_BUILDING:-}" ] && [ ! -f "$ROOTFS/.rsm-rootfs-stamp" ]; then
    echo "in-rootfs: no rootfs at $ROOTFS; run e2e/rootfs.sh first" >&2; exit 2
  fi
  exec unshare --mount --propagation private -- "$0" --in-namespace "$@"
fi
shift

binds=()
workdir=/
while [ $# -gt 0 ]; do
  case "$1" in
    -b) binds+=("$2"); shift 2 ;;
    -w) workdir=$2; shift 2 ;;
    --) shift; break ;;
    *) break ;;
  esac
done
[ $# -gt 0 ] || set -- /bin/bash

# bind SRC DST [OPTS]: bind a host file or folder at DST inside the rootfs.
bind() {
  local src=$1 dst=$ROOTFS$2 opts=${3:-}
  if [ -d "$src" ]; then mkdir -p "$dst"
  elif [ ! -e "$dst" ]; then mkdir -p "$(dirname "$dst")"; touch "$dst"; fi
  mount --bind "$src" "$dst"
  [ -z "$opts" ] || mount -o "remount,bind,$opts" "$dst"
}

# The rootfs on itself: a mount point, for pivot_root below (and "/" inside
# is then one, as runc needs: it makes / a slave mount).
mount --bind "$ROOTFS" "$ROOTFS"
mount -t proc proc "$ROOTFS/proc"
mount --rbind /sys "$ROOTFS/sys"
mount --rbind /dev "$ROOTFS/dev"
mount -t tmpfs -o mode=1777,size=1g tmpfs "$ROOTFS/dev/shm"
mount -t tmpfs -o mode=755 tmpfs "$ROOTFS/run"
mkdir -p "$ROOTFS/run/lock" "$ROOTFS/run/ceph"
# Private scratch: mount points for host folders under /tmp or /var/tmp (go
# test binaries, cluster folders) are made here, not left in the rootfs.
mount -t tmpfs -o mode=1777 tmpfs "$ROOTFS/tmp"
mkdir -p "$ROOTFS/var/tmp"
mount -t tmpfs -o mode=1777 tmpfs "$ROOTFS/var/tmp"

[ ! -f /etc/resolv.conf ] || bind "$(readlink -f /etc/resolv.conf)" /etc/resolv.conf ro
# The host's CA bundle may trust an egress proxy CA that the rootfs lacks.
# (Not while building: update-ca-certificates must write the rootfs' own.)
ca=${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}
[ -n "${RSM_ROOTFS_BUILDING:-}" ] || [ ! -f "$ca" ] || bind "$(readlink -f "$ca")" /etc/ssl/certs/ca-certificates.crt ro

goroot=${RSM_GOROOT:-} modcache=${RSM_GOMODCACHE:-}
if { [ -z "$goroot" ] || [ -z "$modcache" ]; } && command -v go >/dev/null; then
  { read -r g; read -r m; } < <(go env GOROOT GOMODCACHE)
  goroot=${goroot:-$g} modcache=${modcache:-$m}
fi
[ -z "$goroot" ] || [ "$goroot" = none ] || [ ! -d "$goroot" ] || bind "$goroot" /usr/local/go ro
if [ -n "$modcache" ] && [ "$modcache" != none ]; then
  mkdir -p "$modcache"; bind "$modcache" /root/go/pkg/mod
fi

# -b folders, parents before children so that nested binds stay visible.
if [ ${#binds[@]} -gt 0 ]; then
  while IFS= read -r b; do
    src=${b%%:*} dst=${b#*:}
    [ "$dst" != "$b" ] || dst=$src
    src=$(readlink -f "$src")
    [ -e "$src" ] || { echo "in-rootfs: $src does not exist" >&2; exit 2; }
    bind "$src" "$dst"
  done < <(for b in "${binds[@]}"; do d=${b#*:}; printf '%d\t%s\n' "$(tr -cd / <<<"$d" | wc -c)" "$b"; done | sort -n -s -k1,1 | cut -f2-)
fi

envv=(PATH=/usr/local/go/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
      HOME=/root LANG=C.UTF-8 "TERM=${TERM:-dumb}"
      GOPATH=/root/go GOMODCACHE=/root/go/pkg/mod GOCACHE=/root/.cache/go-build
      GOTOOLCHAIN=local CGO_ENABLED=1)
for v in $(compgen -e); do
  case "$v" in
    CEPH_*|RSM_*|CI|GOFLAGS|GOPROXY|GOSUMDB|GOPRIVATE|GONOPROXY|GONOSUMDB|GOINSECURE|GOEXPERIMENT|\
    GODEBUG|GOTRACEBACK|GOMAXPROCS|GOCOVERDIR|CGO_CFLAGS|CGO_LDFLAGS|CGO_CPPFLAGS|\
    http_proxy|https_proxy|no_proxy|HTTP_PROXY|HTTPS_PROXY|NO_PROXY) envv+=("$v=${!v}") ;;
  esac
done
# Into the rootfs with pivot_root, not chroot: the mount namespace's root
# is then the rootfs itself, so that a runtime's `runc exec` (setns into a
# container's mount namespace, which lands at that namespace's root) finds
# the container's files, as the kubelet's exec probes need (run-pods.sh).
# The machine's root is unmounted here; what stays is what was bound above.
cd "$ROOTFS"
mkdir -p .rsm-oldroot
pivot_root . .rsm-oldroot
umount -l /.rsm-oldroot
exec /usr/bin/env -i "${envv[@]}" /bin/sh -c 'cd "$0" && exec "$@"' "$workdir" "$@"
