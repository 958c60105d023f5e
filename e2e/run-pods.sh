#!/bin/bash
# Our pods on a real kubelet (./dev.sh pods): the tests of e2e/pods_test.go
# and e2e/pods_cephcsi_test.go, each on a one-node Kubernetes of its own
# (e2e/k8s/node.sh, in RSM_NODE_DIR/<test>) and a throwaway reef cluster,
# both inside a network namespace made here, at the address RSM_NODE_IP
# (default 10.200.0.1) of a veth link there. Nothing leaves the namespace: the
# pods reach Ceph and the API server at that address.
#
#   e2e/run-pods.sh [go test args]        e.g. -run TestPodsCephCSI -v
#   e2e/run-pods.sh --hold                bring the node up with our image
#                                         and stay up until Ctrl-C; prints
#                                         how to enter the namespace
#
# Before entering the namespace (which has no way out), it builds or finds:
# the Kubernetes binaries and the node's images (e2e/k8s/k8s.sh build,
# images), helm, our image from the Dockerfile (e2e/buildah.sh, with the
# version stamp of `git describe`; the unchanged tree reuses buildah's
# layers, or ./dev.sh test's image, RSM_IMAGE_BUILT) and the test binary,
# whose output goes through e2e/testreport as run-e2e.sh's does.
# Its rows in ./dev.sh's phase table are PHASE/k8s, /helm, /images, /image
# and /test.
# Needs root (network namespace, rootfs, buildah, containerd).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
TOP=$(dirname "$HERE")
cd "$TOP"
IP=${RSM_NODE_IP:-10.200.0.1}

if [ "${1:-}" = --in-netns ]; then
  shift
  ip link set lo up
  # A veth pair (this kernel has no dummy links): the node's address on
  # one end, the other end up so that the link has a carrier.
  ip link add rsm-node0 type veth peer name rsm-node1
  ip link set rsm-node1 up
  ip addr add "$IP/24" dev rsm-node0
  ip link set rsm-node0 up
  ip route add default dev rsm-node0
  export RSM_CEPH_ADDR=$IP RSM_NODE_IP=$IP
  rc=0
  "$HERE/with-cluster.sh" "$@" || rc=$?
  # A test binary killed before its cleanups (a timeout, a signal) leaves
  # the node up: its processes, cgroups and the sysctls it changed. Each
  # test's node has a folder of its own in RSM_NODE_DIR.
  for d in "$RSM_NODE_DIR"/*/; do
    d=${d%/}
    [ -s "$d/pids/order" ] || continue
    echo "run-pods: the node in $d is still up: bringing it down" >&2
    "$HERE/in-rootfs.sh" -b "$(dirname "$RSM_NODE_DIR")" -b "$TOP" -w "$TOP" e2e/k8s/node.sh down "$d" || true
  done
  exit $rc
fi

timed() { # as in run-e2e.sh
  local name=$1 start=$SECONDS rc=0
  shift
  "$@" || rc=$?
  [ -z "${RSM_PHASES:-}" ] || echo "${RSM_PHASE:+$RSM_PHASE/}$name $((SECONDS - start)) $rc" >>"$RSM_PHASES"
  return "$rc"
}
log() { echo "run-pods: $*" >&2; }

export RSM_CEPH=reef RSM_CLIENT_CEPH=reef
"$HERE/rootfs.sh"
RSM_K8S_BIN=$(timed k8s "$HERE/k8s/k8s.sh" build)
RSM_HELM_BIN=$(timed helm "$HERE/k8s/k8s.sh" helm)
RSM_NODE_IMAGES=$(timed images "$HERE/k8s/k8s.sh" images)
OUT=$(mktemp -d /var/tmp/rsm-pods.XXXXXX)
trap 'rm -rf --one-file-system "$OUT"' EXIT
mkdir -p "$OUT/images"

# Our image, as a user builds it, under the name the chart's values name,
# and a second tag of it for the rolling upgrade.
VERSION=${RSM_POD_TAG:-$(git describe --tags --always --dirty 2>/dev/null || echo dev)}
IMAGE=registry.example.com/rbd-snapshot-metadata
build_image() {
  "$HERE/buildah.sh" build "localhost/rbd-snapshot-metadata:$VERSION" "$VERSION"
  buildah push -q "localhost/rbd-snapshot-metadata:$VERSION" \
    "oci-archive:$OUT/images/rbd-snapshot-metadata.tar:$IMAGE:$VERSION" >/dev/null
  buildah push -q "localhost/rbd-snapshot-metadata:$VERSION" \
    "oci-archive:$OUT/images/rbd-snapshot-metadata-next.tar:$IMAGE:$VERSION-next" >/dev/null
}
timed image build_image
timed test go test -c -tags pacific,e2e -o "$OUT/e2e.test" ./e2e/
# go test's JSON through e2e/testreport, as in run-e2e.sh: the usual
# output, then the ten slowest tests and subtests.
report=1
go build -o "$OUT/testreport" ./e2e/testreport || { report=0; log "e2e/testreport did not build; the test binary's own output follows"; }

export RSM_K8S_BIN RSM_HELM_BIN RSM_NODE_IMAGES="$RSM_NODE_IMAGES $OUT/images"
export RSM_POD_IMAGE=$IMAGE RSM_POD_TAG=$VERSION RSM_NODE_DIR=$OUT/node
export RSM_BIND="$RSM_K8S_BIN $RSM_HELM_BIN ${RSM_NODE_IMAGES% *} $OUT $PWD/deploy${RSM_BIND:+ $RSM_BIND}"
# Ceph-CSI's reference manifest (TestPodsCephCSI), at its physical path:
# ../shared may be a symbolic link, which the rootfs does not have.
if [ -d "$TOP/../shared/reference/upstream" ]; then
  RSM_UPSTREAM=$(cd "$TOP/../shared/reference/upstream" && pwd -P)
  export RSM_UPSTREAM RSM_BIND="$RSM_UPSTREAM $RSM_BIND"
fi

if [ "${1:-}" = --hold ]; then
  export RSM_NODE_HOLD=1
  set -- -test.run '^TestPodsHold$' -test.v -test.timeout 24h
else
  # -v and the like, as go test takes them, for the binary; -v goes to
  # testreport, which prints every line then.
  args=() verbose=()
  for a in "$@"; do
    case "$a" in
    -v | -v=true | -test.v | -test.v=true) verbose=(-v) ;;
    -run | -timeout | -count | -failfast | -run=* | -timeout=* | -count=*) args+=("-test.${a#-}") ;;
    *) args+=("$a") ;;
    esac
  done
  set -- -test.timeout 40m "${args[@]}"
  case " $* " in *" -test.run"*) ;; *) set -- -test.run '^TestPods' "$@" ;; esac
  if [ "$report" = 1 ]; then
    set -- -test.v=test2json "$@"
  elif [ ${#verbose[@]} -gt 0 ]; then
    set -- -test.v "$@" # no testreport to print every line: the binary does
  fi
fi
log "entering a network namespace of its own (node at $IP)"
if [ "$report" = 0 ] || [ -n "${RSM_NODE_HOLD:-}" ]; then
  rc=0
  unshare --net -- "$0" --in-netns "$HERE/exec.sh" "$OUT/e2e.test" "$@" || rc=$?
  exit $rc
fi
# The exit code is the test binary's, not the report's.
set +e
unshare --net -- "$0" --in-netns "$HERE/exec.sh" "$OUT/e2e.test" "$@" |
  go tool test2json -t -p "$(go list -m)/e2e" | "$OUT/testreport" "${verbose[@]}"
rcs=("${PIPESTATUS[@]}")
set -e
[ "${rcs[2]}" = 0 ] || log "e2e/testreport failed (exit ${rcs[2]}); the test binary exited ${rcs[0]}"
exit "${rcs[0]}"
