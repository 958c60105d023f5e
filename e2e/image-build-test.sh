#!/bin/bash
# CI check of the container image's recipe, without a Docker engine: build the
# binaries with build/build.sh, the very script the Dockerfile's build stage
# runs, inside the Debian 13 rootfs (the same Debian release, Ceph reef
# headers, no build tags, Go at /usr/local/go as in the golang image); then
#
# 1. the version stamp (the Dockerfile's --build-arg VERSION) is in the binary;
# 2. as in the pod: the server runs as 65532:65532 (the image's USER) and a
#    client with another uid but the same group (the sidecar's, in deploy/)
#    gets the allocated blocks of a snapshot over the 0660 socket (snapmeta,
#    the image's other binary);
# 3. the e2e tests that run the server binary run with this binary
#    (RSM_SERVER_BIN), through e2e/run-e2e.sh.
#
#   e2e/image-build-test.sh [go test args]   default: -run 'TestServer|TestCSI'
#
# build/build.sh itself checks the librbd headers and that the binary needs no
# shared library outside librbd1, librados2, libc6 and their dependencies,
# which is what the runtime stage installs. Needs root (rootfs, cluster).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
TOP=$(dirname "$HERE")
cd "$TOP"
[ $# -gt 0 ] || set -- -run 'TestServer|TestCSI'

now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1fs", b - a }'; }
log() { echo "image-build-test: $*" >&2; }
die() { log "FAIL: $*"; exit 1; }


T0=$(now)
"$HERE/rootfs.sh"
OUT=$(mktemp -d /var/tmp/rsm-image-build.XXXXXX)
CLUSTER=$OUT/cluster
SERVER_PID=
cleanup() {
	[ -z "$SERVER_PID" ] || { kill -TERM "$SERVER_PID" 2>/dev/null; wait "$SERVER_PID" 2>/dev/null || true; }
	[ ! -d "$CLUSTER" ] || "$HERE/cluster.sh" stop "$CLUSTER" >/dev/null 2>&1 || "$HERE/cluster.sh" kill "$CLUSTER" >/dev/null 2>&1 || true
	rm -rf --one-file-system "$OUT"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
chmod 755 "$OUT"
BIN=$OUT/bin
VERSION=image-build-test-$$

t=$(now)
"$HERE/in-rootfs.sh" -b "$TOP" -b "$OUT" -w "$TOP" env VERSION="$VERSION" build/build.sh "$BIN"
log "build/build.sh in the Debian 13 rootfs: $(since "$t")"

# 1. The version stamp.
v=$("$HERE/in-rootfs.sh" -b "$OUT" "$BIN/rbd-snapshot-metadata" --version)
[ "$v" = "$VERSION" ] || die "--version printed '$v', want '$VERSION'"
log "PASS: --version is $VERSION"

# 2. Non-root, as in the pod: server 65532:65532, client 65533 in group 65532.
"$HERE/cluster.sh" start "$CLUSTER" >/dev/null
set -a
# shellcheck disable=SC1091
. "$CLUSTER/env"
set +a
inside() { "$HERE/in-rootfs.sh" -b "$OUT" "$@"; }
inside sh -ec '
	rbd create --size 64M rbd/image-build-test
	rbd bench --io-type write --io-pattern seq --io-size 64K --io-total 1M rbd/image-build-test >/dev/null
	rbd snap create rbd/image-build-test@s1 >/dev/null 2>&1'
mkdir -m 755 "$OUT/etc"
install -m 644 "$CLUSTER/csi-config.json" "$OUT/etc/config.json"
mkdir -m 1777 "$OUT/csi" # like an emptyDir
SOCK=$OUT/csi/csi-snapshot-metadata.sock
# Not through the inside function: in the background, a function runs in a
# subshell, and $! would name the subshell, not the server. in-rootfs.sh
# execs its way to the server, so $! is the server itself.
"$HERE/in-rootfs.sh" -b "$OUT" setpriv --reuid 65532 --regid 65532 --clear-groups \
	"$BIN/rbd-snapshot-metadata" --endpoint "unix://$SOCK" --clusterconfig "$OUT/etc/config.json" \
	>"$OUT/server.log" 2>&1 &
SERVER_PID=$!
for _ in $(seq 100); do [ -S "$SOCK" ] && break; sleep 0.1; done
[ -S "$SOCK" ] || { cat "$OUT/server.log" >&2; die "the server (uid 65532) made no socket"; }
got=$(inside setpriv --reuid 65533 --regid 65532 --clear-groups \
	env SNAPMETA_USER="$CEPH_CSI_USER" SNAPMETA_KEY="$CEPH_CSI_KEY" \
	"$BIN/snapmeta" --endpoint "unix://$SOCK" --format json allocated rsm-e2e/rbd/image-build-test@s1 2>"$OUT/snapmeta.log") ||
	{ cat "$OUT/server.log" "$OUT/snapmeta.log" >&2; die "snapmeta (uid 65533, gid 65532) failed"; }
want=$(inside rbd diff --format json rbd/image-build-test@s1)
# Both are JSON arrays of {offset, length, ...}: compare the (offset, length) pairs.
pairs() { tr -d ' \n' | grep -o '"offset":[0-9]*,"length":[0-9]*' | sort; }
[ -n "$(pairs <<<"$got")" ] && [ "$(pairs <<<"$got")" = "$(pairs <<<"$want")" ] ||
	die "snapmeta allocated: $got; rbd diff: $want"
log "PASS: server as 65532:65532, client as 65533:65532, allocated blocks equal rbd diff's"
kill -TERM "$SERVER_PID"; wait "$SERVER_PID" 2>/dev/null || true; SERVER_PID=
"$HERE/cluster.sh" stop "$CLUSTER" >/dev/null

# 3. The e2e tests of the server binary, with this binary.
t=$(now)
rc=0
RSM_SERVER_BIN=$BIN/rbd-snapshot-metadata RSM_BIND="$OUT${RSM_BIND:+ $RSM_BIND}" "$HERE/run-e2e.sh" "$@" || rc=$?
log "e2e with the rootfs-built binary ($*): exit $rc in $(since "$t"); total $(since "$T0")"
exit $rc
