#!/bin/bash
# CI check of the container image: build the unchanged Dockerfile with
# Debian's buildah (e2e/buildah.sh: `buildah bud --isolation chroot`, base
# images seeded locally since no registry is reachable), then run what was
# built, from the image's own root filesystem (e2e/in-image.sh):
#
# 1. the image's config: ENTRYPOINT the server, USER 65532:65532; the
#    entrypoint prints the version stamp (the Dockerfile's --build-arg VERSION);
# 2. as in the pod: the entrypoint runs as the image's USER and a client with
#    another uid but the same group (the sidecar's, in deploy/) gets the
#    allocated blocks of a snapshot over the 0660 socket (the image's
#    snapmeta); the pod's liveness probe command (snapmeta health) passes;
# 3. the e2e tests that run the server binary, the real-sidecar test
#    included, run the image's entrypoint (RSM_SERVER_BIN is a wrapper that
#    runs it in the image's rootfs, as root there, since the tests' folders
#    are root's), through e2e/run-e2e.sh.
#
#   e2e/image-build-test.sh [go test args]   default: -run 'TestServer|TestCSI|TestK8sSidecar$'
#
# The Dockerfile's build stage runs build/build.sh, which checks the librbd
# headers and that the binary needs no shared library outside librbd1,
# librados2, libc6 and their dependencies (what the runtime stage installs).
# Needs root (buildah, rootfs, cluster).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
TOP=$(dirname "$HERE")
cd "$TOP"
[ $# -gt 0 ] || set -- -run 'TestServer|TestCSI|TestK8sSidecar$'

now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1fs", b - a }'; }
log() { echo "image-build-test: $*" >&2; }
die() { log "FAIL: $*"; exit 1; }

T0=$(now)
"$HERE/rootfs.sh"
OUT=$(mktemp -d /var/tmp/rsm-image-build.XXXXXX)
CLUSTER=$OUT/cluster
TAG=localhost/rbd-snapshot-metadata:image-build-test
SERVER_PID= CTR=
cleanup() {
	[ -z "$SERVER_PID" ] || { kill -TERM "$SERVER_PID" 2>/dev/null; wait "$SERVER_PID" 2>/dev/null || true; }
	[ ! -d "$CLUSTER" ] || "$HERE/cluster.sh" stop "$CLUSTER" >/dev/null 2>&1 || "$HERE/cluster.sh" kill "$CLUSTER" >/dev/null 2>&1 || true
	[ -z "$CTR" ] || { buildah umount "$CTR" >/dev/null 2>&1; buildah rm "$CTR" >/dev/null 2>&1; } || true
	rm -rf --one-file-system "$OUT"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
chmod 755 "$OUT"
VERSION=image-build-test-$$

t=$(now)
"$HERE/buildah.sh" build "$TAG" "$VERSION"
log "the Dockerfile built with buildah: $(since "$t")"
CTR=$(buildah from --pull=never "$TAG")
IMG=$(buildah mount "$CTR")

# 1. The image's config and version stamp.
cfg=$(buildah inspect --type image --format '{{.OCIv1.Config.Entrypoint}} {{.OCIv1.Config.User}}' "$TAG")
[ "$cfg" = '[/usr/local/bin/rbd-snapshot-metadata] 65532:65532' ] || die "image config: $cfg"
ENTRYPOINT=/usr/local/bin/rbd-snapshot-metadata
image() { "$HERE/in-image.sh" "$IMG" "$@"; }
v=$(image -u 65532:65532 "$ENTRYPOINT" --version)
[ "$v" = "$VERSION" ] || die "--version printed '$v', want '$VERSION'"
log "PASS: ENTRYPOINT $ENTRYPOINT, USER 65532:65532, --version is $VERSION ($(du -sh "$IMG" | cut -f1) unpacked)"

# 2. Non-root, as in the pod: server 65532:65532, client 65533 in group 65532.
"$HERE/cluster.sh" start "$CLUSTER" >/dev/null
set -a
# shellcheck disable=SC1091
. "$CLUSTER/env"
set +a
"$HERE/in-rootfs.sh" -b "$OUT" sh -ec '
	rbd create --size 64M rbd/image-build-test
	rbd bench --io-type write --io-pattern seq --io-size 64K --io-total 1M rbd/image-build-test >/dev/null
	rbd snap create rbd/image-build-test@s1 >/dev/null 2>&1'
mkdir -m 755 "$OUT/etc"
install -m 644 "$CLUSTER/csi-config.json" "$OUT/etc/config.json"
mkdir -m 1777 "$OUT/csi" # like an emptyDir
SOCK=$OUT/csi/csi-snapshot-metadata.sock
# in-image.sh execs its way to the server: $! is the server itself.
"$HERE/in-image.sh" "$IMG" -u 65532:65532 -b "$OUT" "$ENTRYPOINT" --endpoint "unix://$SOCK" \
	--clusterconfig "$OUT/etc/config.json" >"$OUT/server.log" 2>&1 &
SERVER_PID=$!
for _ in $(seq 100); do [ -S "$SOCK" ] && break; sleep 0.1; done
[ -S "$SOCK" ] || { cat "$OUT/server.log" >&2; die "the image's server (uid 65532) made no socket"; }
got=$(image -u 65533:65532 -b "$OUT" /usr/bin/env SNAPMETA_USER="$CEPH_CSI_USER" SNAPMETA_KEY="$CEPH_CSI_KEY" \
	snapmeta --endpoint "unix://$SOCK" --format json allocated rsm-e2e/rbd/image-build-test@s1 2>"$OUT/snapmeta.log") ||
	{ cat "$OUT/server.log" "$OUT/snapmeta.log" >&2; die "snapmeta (uid 65533, gid 65532) failed"; }
want=$("$HERE/in-rootfs.sh" -b "$OUT" rbd diff --format json rbd/image-build-test@s1)
# Both are JSON arrays of {offset, length, ...}: compare the (offset, length) pairs.
pairs() { tr -d ' \n' | grep -o '"offset":[0-9]*,"length":[0-9]*' | sort; }
[ -n "$(pairs <<<"$got")" ] && [ "$(pairs <<<"$got")" = "$(pairs <<<"$want")" ] ||
	die "snapmeta allocated: $got; rbd diff: $want"
log "PASS: the image's server as 65532:65532, client as 65533:65532, allocated blocks equal rbd diff's"
# The liveness probe of deploy/components/containers, as the kubelet runs it.
probe=$(image -u 65532:65532 -b "$OUT" /usr/local/bin/snapmeta --endpoint="unix://$SOCK" --timeout=5s health) ||
	die "liveness probe: $probe"
log "PASS: liveness probe (snapmeta health): $probe"
kill -TERM "$SERVER_PID"; wait "$SERVER_PID" 2>/dev/null || true; SERVER_PID=
"$HERE/cluster.sh" stop "$CLUSTER" >/dev/null

# 3. The e2e tests of the server binary, with the image's entrypoint. The
# wrapper runs inside the e2e rootfs (the tests run there), which gets the
# image's root and this folder bound.
cat >"$OUT/entrypoint" <<EOF
#!/bin/sh
exec "$HERE/in-image.sh" "$IMG" -b /tmp -b /var/tmp -- "$ENTRYPOINT" "\$@"
EOF
chmod 755 "$OUT/entrypoint"
t=$(now)
rc=0
RSM_SERVER_BIN=$OUT/entrypoint RSM_BIND="$OUT $IMG${RSM_BIND:+ $RSM_BIND}" "$HERE/run-e2e.sh" "$@" || rc=$?
log "e2e with the image's entrypoint ($*): exit $rc in $(since "$t"); total $(since "$T0")"
exit $rc
