#!/bin/bash
# `go test -exec` / `go run -exec` wrapper: runs a binary built on the host
# (against Debian 12's pacific headers, with -tags pacific) inside the reef
# rootfs, where go-ceph finds reef's rbd_diff_iterate3 with dlsym; with
# RSM_CLIENT_CEPH=tentacle (default RSM_CEPH, else reef) inside the tentacle
# rootfs, so that it runs with that release's librbd whatever release the
# cluster's daemons run (with-cluster.sh sets both).
#
#   go test -tags pacific,e2e -exec "$PWD/e2e/exec.sh" ./e2e/
#
# The binary's folder, the current folder and each folder in RSM_BIND (a space
# separated list of host folders without colons, e.g. the cluster folder) are
# bound at their own paths; the binary runs in the current folder.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
[ $# -gt 0 ] || { echo "usage: $0 BINARY [ARG...]" >&2; exit 2; }
bin=$(readlink -f "$1"); shift

binds=() seen=" "
add() {
  local d
  d=$(readlink -f "$1") || { echo "exec.sh: no such folder: $1" >&2; exit 2; }
  case "$d" in *:*) echo "exec.sh: folder names must not contain ':': $d" >&2; exit 2 ;; esac
  case "$seen" in *" $d "*) return ;; esac
  seen+="$d "; binds+=(-b "$d")
}
add "$(dirname "$bin")"
add "$PWD"
for d in ${RSM_BIND:-}; do add "$d"; done
[ -z "${GOCOVERDIR:-}" ] || add "$GOCOVERDIR"   # go test -cover writes there
if [ -n "${RSM_CLIENT_CEPH:-}" ] && [ "$RSM_CLIENT_CEPH" != "${RSM_CEPH:-reef}" ]; then
  # Cross-version: the client's release picks the rootfs; RSM_CEPH stays the
  # cluster's (tests read it).
  RSM_ROOTFS=$(. "$HERE/ceph-release.sh"; rootfs_for "$RSM_CLIENT_CEPH")
  export RSM_ROOTFS
fi
exec "$HERE/in-rootfs.sh" "${binds[@]}" -w "$PWD" "$bin" "$@"
