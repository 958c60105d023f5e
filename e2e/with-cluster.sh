#!/bin/bash
# Run a command against a fresh throwaway cluster: ensure the rootfs,
# start a cluster in a temp folder, export its env (DIR/env) and the server
# binary's path, run the command, and always stop the cluster. The exit code
# is the command's. run-e2e.sh and run-bench.sh run go test through it.
#
#   e2e/with-cluster.sh CMD [ARG...]
#
# Exported for CMD: CEPH_*, RSM_CLUSTER_* (see cluster.sh), RSM_CEPH and
# RSM_CLIENT_CEPH (see below), RSM_SERVER_BIN
# (default bin/rbd-snapshot-metadata, from ./dev.sh build), and RSM_BIND with
# the cluster folder and the binary's folder added, so that e2e/exec.sh binds
# them inside the rootfs. Needs root (see rootfs.sh and cluster.sh).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
cd "$HERE/.."

# RSM_CEPH (reef or tentacle) is the cluster's release; RSM_CLIENT_CEPH, the
# release whose librbd the tests and the server run with (exec.sh), defaults
# to it. Both rootfs are made ready first.
export RSM_CEPH=${RSM_CEPH:-reef}
export RSM_CLIENT_CEPH=${RSM_CLIENT_CEPH:-$RSM_CEPH}
"$HERE/rootfs.sh"
[ "$RSM_CLIENT_CEPH" = "$RSM_CEPH" ] || RSM_CEPH=$RSM_CLIENT_CEPH "$HERE/rootfs.sh"
# reef's librados reads only aes keys; tentacle makes aes256k ones by default.
if [ "$RSM_CEPH" = tentacle ] && [ "$RSM_CLIENT_CEPH" = reef ]; then
  export RSM_CEPH_KEY_TYPE=${RSM_CEPH_KEY_TYPE:-aes}
fi
CLUSTER=$(mktemp -d /var/tmp/rsm-e2e.XXXXXX)
cleanup() {
  "$HERE/cluster.sh" stop "$CLUSTER" || "$HERE/cluster.sh" kill "$CLUSTER" || true
  rm -rf --one-file-system "$CLUSTER"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
"$HERE/cluster.sh" start "$CLUSTER"

set -a
# shellcheck disable=SC1091
. "$CLUSTER/env"
set +a
export RSM_SERVER_BIN="${RSM_SERVER_BIN:-$PWD/bin/rbd-snapshot-metadata}"
export RSM_BIND="$CLUSTER $(dirname "$RSM_SERVER_BIN")${RSM_BIND:+ $RSM_BIND}"
rc=0
"$@" || rc=$?
exit $rc
