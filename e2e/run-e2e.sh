#!/bin/bash
# One-shot e2e run (./dev.sh e2e): build (or find) the Kubernetes binaries,
# then run the e2e tests against a fresh throwaway cluster (with-cluster.sh).
#
#   e2e/run-e2e.sh [go test args...]     e.g. e2e/run-e2e.sh -run Harness -v
#
# The tests are built on the host (-tags pacific,e2e) and run inside the rootfs
# through e2e/exec.sh. GOFLAGS and extra arguments pass through to go test.
# go test -json's events go through e2e/testreport, which prints go test's
# usual output and then the ten slowest tests. The exit code is go
# test's. Needs root (see rootfs.sh and cluster.sh).
# RSM_E2E_BIG=1 (not set here) adds the slow variants: TestManyWrites writes
# 2^20 extents instead of 100k, which takes minutes.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
cd "$HERE/.."

# timed NAME CMD...: CMD, and its row in ./dev.sh's phase table when
# RSM_PHASES names one: "PHASE/NAME SECONDS RC", PHASE being dev.sh's step
# that runs this script (RSM_PHASE). Returns CMD's exit code.
timed() {
  local name=$1 start=$SECONDS rc=0
  shift
  "$@" || rc=$?
  [ -z "${RSM_PHASES:-}" ] || echo "${RSM_PHASE:+$RSM_PHASE/}$name $((SECONDS - start)) $rc" >>"$RSM_PHASES"
  return "$rc"
}

# RSM_K8S=0: a run of tests that need no Kubernetes tool (the matrix's
# legs, in a network namespace with no way to the module proxy, and the
# parts of ./dev.sh test's reef suite but its k8s list) neither builds nor
# looks for them; the tests that need them fail as on a failed build.
if [ "${RSM_K8S:-1}" = 0 ]; then
  export RSM_K8S_BUILD_ERROR="RSM_K8S=0: this run has no Kubernetes tools"
  export RSM_CSI_OPERATOR_BUILD_ERROR=$RSM_K8S_BUILD_ERROR RSM_HELM_BUILD_ERROR=$RSM_K8S_BUILD_ERROR
# The Kubernetes binaries of k8s_test.go: ~5 min to build once, then cached.
# A failed build (no module proxy) fails that test, not the run.
elif RSM_K8S_BIN=$(timed k8s "$HERE/k8s/k8s.sh" build); then
  export RSM_K8S_BIN
  export RSM_BIND="$RSM_K8S_BIN${RSM_BIND:+ $RSM_BIND}"
else
  rc=$?
  unset RSM_K8S_BIN
  export RSM_K8S_BUILD_ERROR="e2e/k8s/k8s.sh build failed (exit $rc; its output is above)"
  echo "run-e2e: $RSM_K8S_BUILD_ERROR" >&2
fi
# ceph-csi-operator's manager and the operator's and Rook's manifests for
# k8s_operator_test.go (e2e/k8s/k8s.sh csi-operator): minutes once (docs/development.md, CI), then
# cached. A failed build fails that test, not the run.
if [ "${RSM_K8S:-1}" = 0 ]; then
  :
elif RSM_CSI_OPERATOR_BIN=$(timed csi-operator "$HERE/k8s/k8s.sh" csi-operator); then
  export RSM_CSI_OPERATOR_BIN
  export RSM_BIND="$RSM_CSI_OPERATOR_BIN${RSM_BIND:+ $RSM_BIND}"
else
  rc=$?
  unset RSM_CSI_OPERATOR_BIN
  export RSM_CSI_OPERATOR_BUILD_ERROR="e2e/k8s/k8s.sh csi-operator failed (exit $rc; its output is above)"
  echo "run-e2e: $RSM_CSI_OPERATOR_BUILD_ERROR" >&2
fi
# helm, for the chart's test (k8s_helm_test.go): a build and cache of its own.
if [ "${RSM_K8S:-1}" = 0 ]; then
  :
elif RSM_HELM_BIN=$(timed helm "$HERE/k8s/k8s.sh" helm); then
  export RSM_HELM_BIN
  export RSM_BIND="$RSM_HELM_BIN${RSM_BIND:+ $RSM_BIND}"
else
  rc=$?
  unset RSM_HELM_BIN
  export RSM_HELM_BUILD_ERROR="e2e/k8s/k8s.sh helm failed (exit $rc; its output is above)"
  echo "run-e2e: $RSM_HELM_BUILD_ERROR" >&2
fi
# The deploy test (k8s_deploy_test.go) applies deploy/'s examples over
# Ceph-CSI's real manifests, reference data in shared/ next to the checkout.
export RSM_BIND="$PWD/deploy${RSM_BIND:+ $RSM_BIND}"
[ ! -d "$PWD/../shared/reference/upstream" ] || export RSM_BIND="$(cd "$PWD/../shared/reference/upstream" && pwd) $RSM_BIND"
# The suite (k8s, operator, helm, outages and 2^20-extent tests included)
# takes 30-40 min on a loaded 2-core machine, far past go test's 10 min
# default; a hang still ends. ./e2e/ alone (e2e/harness has no tests).
gotest=(go test -tags pacific,e2e -count=1 -timeout 60m -exec "$HERE/exec.sh" ./e2e/ "$@")

# go test -json through e2e/testreport, which prints what go test prints
# (every line with -v; else the failed tests' whole output and the package
# lines) and, at the end, the ten slowest tests and subtests, so that the
# log says where the time went. A -json of the caller's gets go test's own
# JSON; a testreport that does not build, go test's own output.
verbose=() json=0
for a in "$@"; do
  case "$a" in
  -v | -v=true | --v | --v=true | -test.v | -test.v=true) verbose=(-v) ;;
  -v=false | --v=false | -test.v=false) verbose=() ;;
  -json | -json=true | --json | --json=true) json=1 ;;
  esac
done
report_dir=$(mktemp -d -t rsm-testreport.XXXXXX)
trap 'rm -rf "$report_dir"' EXIT
if [ "$json" = 1 ] || ! go build -o "$report_dir/testreport" ./e2e/testreport; then
  [ "$json" = 1 ] || echo "run-e2e: e2e/testreport did not build; go test's own output follows" >&2
  rc=0
  "$HERE/with-cluster.sh" "${gotest[@]}" || rc=$?
  exit "$rc"
fi
# The exit code is go test's (with-cluster.sh's), not the report's.
set +e
"$HERE/with-cluster.sh" "${gotest[0]}" "${gotest[1]}" -json "${gotest[@]:2}" | "$report_dir/testreport" "${verbose[@]}"
rcs=("${PIPESTATUS[@]}")
set -e
[ "${rcs[1]}" = 0 ] || echo "run-e2e: e2e/testreport failed (exit ${rcs[1]}); go test exited ${rcs[0]}" >&2
exit "${rcs[0]}"
