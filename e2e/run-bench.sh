#!/bin/bash
# The performance benchmark (./dev.sh bench): ensure the reef rootfs, start a
# fresh throwaway cluster in a temp folder, run TestBench (e2e/bench_test.go)
# against it with the server binary, print its tables, and always stop the
# cluster.
#
#   e2e/run-bench.sh [go test args...]
#
# RSM_BENCH_SCALE=ci (the default: 2^16 extents, a 64 GiB sparse image, about
# two minutes) or full (2^20 extents, a 1 TiB sparse image, several minutes).
# RSM_BENCH_RUNS=N overrides the timed runs per mode. RSM_BENCH_OUT=FILE also
# writes the tables there (Markdown). The benchmark fails only on errors
# (RPC errors, answers that differ from librbd's), never on time.
# Needs root (see rootfs.sh and cluster.sh) and bin/rbd-snapshot-metadata
# (./dev.sh build), or RSM_SERVER_BIN.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
cd "$HERE/.."

"$HERE/rootfs.sh"
CLUSTER=$(mktemp -d /var/tmp/rsm-bench.XXXXXX)
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
export RSM_BENCH=1
export RSM_SERVER_BIN="${RSM_SERVER_BIN:-$PWD/bin/rbd-snapshot-metadata}"
export RSM_BIND="$CLUSTER $(dirname "$RSM_SERVER_BIN")${RSM_BIND:+ $RSM_BIND}"
if [ -n "${RSM_BENCH_OUT:-}" ]; then
  touch "$RSM_BENCH_OUT"
  RSM_BENCH_OUT=$(readlink -f "$RSM_BENCH_OUT")
  export RSM_BIND="$RSM_BIND $(dirname "$RSM_BENCH_OUT")"
fi
timeout=15m
[ "${RSM_BENCH_SCALE:-ci}" = ci ] || timeout=90m
rc=0
go test -tags pacific,e2e -count=1 -timeout "$timeout" -exec "$HERE/exec.sh" \
  -run '^TestBench$' -v ./e2e/ "$@" || rc=$?
exit $rc
