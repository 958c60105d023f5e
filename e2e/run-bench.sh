#!/bin/bash
# The performance benchmark (./dev.sh bench): TestBench, TestBenchNoFastDiff and
# TestBenchBigFastDiff
# (e2e/bench_test.go)
# against a fresh throwaway cluster (with-cluster.sh), with the server
# binary; it prints its tables.
#
#   e2e/run-bench.sh [go test args...]
#
# RSM_BENCH_SCALE=ci (the default: 2^16 extents, 64 GiB sparse images, about
# three minutes) or full (2^20 extents, a 1 TiB sparse image and two 10 TiB
# ones, about half an hour). RSM_BENCH_BASELINE_BIN=PATH: see docs/performance.md, "The benchmark".
# RSM_BENCH_RUNS=N overrides the timed runs per mode. RSM_BENCH_OUT=FILE also
# writes the tables there (Markdown). The benchmark fails only on errors
# (RPC errors, answers that differ from librbd's), never on time.
# Needs root (see rootfs.sh and cluster.sh) and bin/rbd-snapshot-metadata
# (./dev.sh build), or RSM_SERVER_BIN.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
cd "$HERE/.."

export RSM_BENCH=1
if [ -n "${RSM_BENCH_OUT:-}" ]; then
  touch "$RSM_BENCH_OUT"
  RSM_BENCH_OUT=$(readlink -f "$RSM_BENCH_OUT")
  export RSM_BIND="$(dirname "$RSM_BENCH_OUT")${RSM_BIND:+ $RSM_BIND}"
fi
timeout=15m
[ "${RSM_BENCH_SCALE:-ci}" = ci ] || timeout=90m
exec "$HERE/with-cluster.sh" go test -tags pacific,e2e -count=1 -timeout "$timeout" -exec "$HERE/exec.sh" \
  -run '^TestBench' -v ./e2e/ "$@"
