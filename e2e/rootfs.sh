#!/bin/bash
# Build, or restore from a cache tarball, a Debian root filesystem with the
# Ceph release that the e2e tests and the test cluster run in. Debian 12 ships
# Ceph pacific, whose librbd lacks rbd_diff_iterate3 (diff by snapshot ID);
# both releases here have it:
#
#   RSM_CEPH=reef      (default) Debian 13 trixie, Ceph reef 18.2.x (>= 18.2.7)
#   RSM_CEPH=tentacle  Debian forky (testing), Ceph tentacle 20.2.x; should
#                      forky lose Ceph, RSM_CEPH_SUITE=sid builds from sid.
#                      Debian 12's debootstrap has no forky script: sid's is
#                      used. The testing/unstable Release file may be past
#                      its Valid-Until on a mirror snapshot, so apt inside
#                      that rootfs does not check it.
#
# Each release has its own rootfs and tarball (e2e/ceph-release.sh names them).
# Idempotent and safe to run concurrently (flock): a ready rootfs returns at
# once; a missing one is restored from the tarball, else built with
# debootstrap (minbase) plus apt-get install in a chroot (~1 min on an idle
# machine, ~10 min on a busy one), after which the tarball is written.
#
# Environment:
#   RSM_CEPH          reef or tentacle (see above); RSM_CEPH_SUITE the Debian suite
#   RSM_ROOTFS        target folder (default $RSM_ROOTFS_DIR/rootfs or
#                     rootfs-tentacle; RSM_ROOTFS_DIR defaults to
#                     /var/cache/rbd-snapshot-metadata)
#   RSM_ROOTFS_CACHE  tarball (default the folder's name plus .tar.zst; "none" = no cache)
#   RSM_MIRROR        Debian mirror (default: the host's apt sources)
# Needs root; installs debootstrap and zstd on the host when missing.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=ceph-release.sh
. "$HERE/ceph-release.sh"   # RSM_CEPH -> CEPH_RELEASE, SUITE(S), MIN_CEPH, MAX_CEPH, ROOTFS_DEFAULT
ROOTFS=${RSM_ROOTFS:-$ROOTFS_DEFAULT}
CACHE=${RSM_ROOTFS_CACHE:-$ROOTFS.tar.zst}
PKGS="ceph-mon ceph-osd ceph-common librbd-dev librados-dev libradospp-dev gcc g++ libc6-dev ca-certificates python3 cryptsetup-bin"
# reef's rootfs also runs the one-node Kubernetes of e2e/k8s/node.sh: Debian's
# container runtime, its CNI plugins and the iptables that kubelet and
# kube-proxy call.
[ "$CEPH_RELEASE" != reef ] || PKGS="$PKGS containerd runc containernetworking-plugins iptables openssl"
# reef's stamp is unchanged, so that existing reef rootfs and tarballs stay valid.
STAMP="rsm-rootfs v1 suite=$SUITE packages=$(tr ' ' '\n' <<<"$PKGS" | sort | tr '\n' ' ')"
[ "$CEPH_RELEASE" = reef ] || STAMP="rsm-rootfs v1 ceph=$CEPH_RELEASE suites=$SUITES packages=$(tr ' ' '\n' <<<"$PKGS" | sort | tr '\n' ' ')"
STAMP_FILE=.rsm-rootfs-stamp

# How long to wait for a build that another run holds the lock of: a cold
# build on a loaded 2-core machine takes over an hour (k8s.io/kubernetes's
# binaries: 66 min at load 20), and a waiter that gave up first failed the
# run. CI's own limit bounds a hung one.
LOCK_WAIT=${RSM_LOCK_WAIT:-7200}
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1fs", b - a }'; }
log() { echo "rootfs: $*" >&2; }
ready() { [ -f "$1/$STAMP_FILE" ] && [ "$(head -n1 "$1/$STAMP_FILE")" = "$STAMP" ]; }

ready "$ROOTFS" && exit 0
[ "$(id -u)" = 0 ] || { log "must run as root"; exit 2; }

mkdir -p "$(dirname "$ROOTFS")"
exec 8>"$ROOTFS.lock"
flock -w "$LOCK_WAIT" 8 || { log "timed out waiting for $ROOTFS.lock"; exit 1; }
ready "$ROOTFS" && exit 0   # built by whoever held the lock

apt_host() {
  local a="apt-get -y -q -o DPkg::Lock::Timeout=600"
  DEBIAN_FRONTEND=noninteractive $a install "$@" >/dev/null 2>&1 ||
    { $a update >/dev/null && DEBIAN_FRONTEND=noninteractive $a install "$@" >/dev/null; }
}
need=()
command -v zstd >/dev/null || need+=(zstd)
[ -f "$CACHE" ] || command -v debootstrap >/dev/null || need+=(debootstrap)
if [ ${#need[@]} -gt 0 ]; then log "installing ${need[*]} on the host"; apt_host "${need[@]}"; fi

TMP=$ROOTFS.tmp.$$
LOG=$ROOTFS.build.log   # kept for post-mortems
trap 'rm -rf --one-file-system "$TMP" "$CACHE.tmp.$$"' EXIT

install_tmp() {   # move the finished $TMP into place
  rm -rf --one-file-system "$ROOTFS"
  mv "$TMP" "$ROOTFS"
}

if [ "$CACHE" != none ] && [ -f "$CACHE" ]; then
  t=$(now)
  mkdir -p "$TMP"
  if tar -C "$TMP" --zstd -xf "$CACHE" && ready "$TMP"; then
    install_tmp
    log "restored $ROOTFS from $CACHE in $(since "$t")"
    exit 0
  fi
  log "$CACHE is stale or broken; rebuilding"
  rm -rf --one-file-system "$TMP"
fi

MIRROR=${RSM_MIRROR:-}
if [ -z "$MIRROR" ] && [ -f /etc/apt/sources.list.d/debian.sources ]; then
  MIRROR=$(awk '$1 == "URIs:" && $2 !~ /security/ { print $2; exit }' /etc/apt/sources.list.d/debian.sources)
fi
if [ -z "$MIRROR" ] && [ -f /etc/apt/sources.list ]; then
  MIRROR=$(sed -e 's/\[[^]]*\]//' /etc/apt/sources.list | awk '$1 == "deb" && $2 !~ /security/ { print $2; exit }')
fi
[ -n "$MIRROR" ] || { log "no Debian mirror in the host's apt sources; set RSM_MIRROR"; exit 2; }

t=$(now)
log "debootstrap $SUITE (Ceph $CEPH_RELEASE) from $MIRROR"
debootstrap --variant=minbase "$SUITE" "$TMP" "$MIRROR" ${DEBOOTSTRAP_SCRIPT:+"$DEBOOTSTRAP_SCRIPT"} >"$LOG" 2>&1 ||
  { tail -n 20 "$LOG" >&2; exit 1; }
log "debootstrap done in $(since "$t")"

printf '#!/bin/sh\nexit 101\n' >"$TMP/usr/sbin/policy-rc.d"
chmod 755 "$TMP/usr/sbin/policy-rc.d"
cat >"$TMP/etc/apt/apt.conf.d/90rsm" <<'EOF'
APT::Install-Recommends "false";
APT::Install-Suggests "false";
Acquire::Languages "none";
EOF
# testing and unstable Release files expire within a week; a mirror snapshot
# serves them past their Valid-Until (signatures are still checked).
[ "$CEPH_RELEASE" = reef ] || echo 'Acquire::Check-Valid-Until "false";' >>"$TMP/etc/apt/apt.conf.d/90rsm"
cat >"$TMP/etc/dpkg/dpkg.cfg.d/90rsm-nodoc" <<'EOF'
path-exclude /usr/share/doc/*
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
path-include /usr/share/locale/locale.alias
EOF
echo "deb $MIRROR $SUITE main" >"$TMP/etc/apt/sources.list"

t=$(now)
in_tmp() { RSM_ROOTFS=$TMP RSM_ROOTFS_BUILDING=1 RSM_GOROOT=none RSM_GOMODCACHE=none "$HERE/in-rootfs.sh" "$@"; }
in_tmp sh -c "apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q $PKGS &&
              apt-get clean && rm -rf /var/lib/apt/lists/* /usr/share/doc/* /usr/share/man/*" \
  >"$LOG" 2>&1 || { tail -n 30 "$LOG" >&2; exit 1; }
log "apt-get install done in $(since "$t")"

# Check what the tests rely on: the release asked for (reef >= 18.2.7,
# tentacle 20.2.x) and rbd_diff_iterate3.
versions=$(in_tmp dpkg-query -W -f '${Package}=${Version}\n' librbd1 ceph-mon ceph-osd)
librbd_version=$(sed -n 's/^librbd1=//p' <<<"$versions")
in_tmp dpkg --compare-versions "$librbd_version" ge "$MIN_CEPH" ||
  { log "librbd1 $librbd_version is older than $MIN_CEPH ($CEPH_RELEASE); try another RSM_CEPH_SUITE"; exit 1; }
in_tmp dpkg --compare-versions "$librbd_version" lt "$MAX_CEPH" ||
  { log "librbd1 $librbd_version is not $CEPH_RELEASE (< $MAX_CEPH)"; exit 1; }
libs=("$TMP"/usr/lib/*-linux-gnu/librbd.so.1)
librbd=${libs[0]}
in_tmp python3 -c 'import ctypes, sys; ctypes.CDLL(sys.argv[1]).rbd_diff_iterate3' "${librbd#"$TMP"}" ||
  { log "$librbd does not export rbd_diff_iterate3"; exit 1; }

{ echo "$STAMP"; echo "$versions"; } >"$TMP/$STAMP_FILE"
install_tmp
log "$ROOTFS ready ($(du -sh "$ROOTFS" | cut -f1)): $(tr '\n' ' ' <<<"$versions")"

if [ "$CACHE" != none ]; then
  t=$(now)
  mkdir -p "$(dirname "$CACHE")"
  tar -C "$ROOTFS" -I 'zstd -T0 -3' -cf "$CACHE.tmp.$$" . && mv "$CACHE.tmp.$$" "$CACHE"
  log "wrote $CACHE ($(du -h "$CACHE" | cut -f1)) in $(since "$t")"
fi
