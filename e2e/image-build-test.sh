#!/bin/bash
# CI check of the container image: build the unchanged Dockerfile with
# Debian's buildah (e2e/buildah.sh: `buildah bud --isolation chroot`, base
# images seeded locally since no registry is reachable), then run what was
# built, from the image's own root filesystem (e2e/in-image.sh):
#
# 1. the image's config: ENTRYPOINT the server, USER 65532:65532; the
#    entrypoint prints the version stamp (the Dockerfile's --build-arg VERSION);
# 2. as in the pod, against a new tentacle 20.2.4 cluster and a reef 18.2.7
#    one, each with the user its admin makes (`ceph auth get-or-create
#    client.rsm-image mon 'profile rbd' osd 'profile rbd'`): an aes256k key
#    on tentacle, an aes key on reef (the test checks each key's type). The
#    entrypoint runs as the image's USER, and a client with another uid but
#    the same group (the sidecar's, in deploy/) gets the allocated blocks of
#    a snapshot (equal to rbd diff's) and the changed blocks between two
#    (what was written) over the 0660 socket (the image's snapmeta); the
#    pod's liveness probe command (snapmeta health) passes;
# 3. e2e tests of the server binary, the real-sidecar test included, run
#    the image's entrypoint (RSM_SERVER_BIN is a wrapper that runs it in the
#    image's rootfs, as root there, since the tests' folders are root's),
#    through e2e/run-e2e.sh, on a tentacle cluster (whose client.csi key,
#    the tests' secret, is aes256k): its identity and flags, Ceph-CSI's
#    handles, a snapshot deleted mid-stream and the sidecar.
#    TestServerMatchesRbdDiff (3.7 min here) runs the host's build in the
#    tentacle leg of ./dev.sh matrix instead: the image's own answers are
#    checked against rbd diff in 2 and against the byte oracle in its pods
#    (e2e/run-pods.sh).
#
#   e2e/image-build-test.sh [go test args]
#       default: -run 'TestServerIdentity|TestServerRejectsBadFlags|TestCSI|TestK8sSidecar$'
#
# The Dockerfile's build stage runs build/build.sh, which checks the librbd
# headers, that librados reads aes256k keys, and that the binary needs no
# shared library outside librbd1, librados2, libc6 and their dependencies
# (what the runtime stage installs).
# RSM_IMAGE_BUILT (./dev.sh test's image of this tree): see e2e/buildah.sh.
# Needs root (buildah, both rootfs, clusters).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
TOP=$(dirname "$HERE")
cd "$TOP"
[ $# -gt 0 ] || set -- -run 'TestServerIdentity|TestServerRejectsBadFlags|TestCSI|TestK8sSidecar$'

now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1fs", b - a }'; }
log() { echo "image-build-test: $*" >&2; }
die() { log "FAIL: $*"; exit 1; }

T0=$(now)
RSM_CEPH=reef "$HERE/rootfs.sh"
RSM_CEPH=tentacle "$HERE/rootfs.sh"
OUT=$(mktemp -d /var/tmp/rsm-image-build.XXXXXX)
CLUSTER=
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
# The version stamp a user's build gets (git describe): the same as
# run-pods.sh's, whose build of the same tree then reuses these layers.
VERSION=$(git describe --tags --always --dirty 2>/dev/null || echo dev)

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

# 2. Non-root, as in the pod: server 65532:65532, client 65533 in group
# 65532, against a cluster of each release, with the key its admin hands out
# (`ceph auth get-or-create`): a new tentacle cluster makes an aes256k key
# (type 2), which reef's librados cannot read; reef makes an aes key (type 1),
# which tentacle's librados must still read.
cluster_check() {
	local release=$1 want_type=$2 user=rsm-image key typ t
	t=$(now)
	CLUSTER=$OUT/cluster-$release
	RSM_CEPH=$release "$HERE/cluster.sh" start "$CLUSTER" >/dev/null
	ceph_cli() { RSM_CEPH=$release "$HERE/in-rootfs.sh" -b "$OUT" env CEPH_CONF="$CLUSTER/ceph.conf" "$@"; }
	# As a user does: a Ceph-CSI style user with the rbd profiles.
	ceph_cli ceph auth get-or-create "client.$user" mon 'profile rbd' osd 'profile rbd' >/dev/null
	key=$(ceph_cli ceph auth print-key "client.$user")
	typ=$(base64 -d <<<"$key" | od -An -tu2 -N2 | tr -d ' ')
	[ "$typ" = "$want_type" ] || die "$release: ceph auth get-or-create made a key of type $typ, want $want_type"
	# s1: 1 MiB from 0; s2: 64 KiB overwritten inside it and 64 KiB at the
	# start of a new object (objects are 4 MiB), written by rbd import-diff
	# from a stream that also creates s2.
	ceph_cli sh -ec '
		rbd create --size 64M rbd/image-build-test
		rbd bench --io-type write --io-pattern seq --io-size 64K --io-total 1M rbd/image-build-test >/dev/null
		rbd snap create rbd/image-build-test@s1 >/dev/null 2>&1
		python3 -c "
import os, struct, sys
o = sys.stdout.buffer
o.write(b\"rbd diff v1\\n\")
o.write(b\"f\" + struct.pack(\"<I\", 2) + b\"s1\" + b\"t\" + struct.pack(\"<I\", 2) + b\"s2\")
o.write(b\"s\" + struct.pack(\"<Q\", 64 << 20))
for off in (512 << 10, 8 << 20):
    o.write(b\"w\" + struct.pack(\"<QQ\", off, 65536) + os.urandom(65536))
o.write(b\"e\")
" | rbd import-diff --no-progress - rbd/image-build-test'
	install -m 644 "$CLUSTER/csi-config.json" "$OUT/etc/config.json"
	rm -f "$SOCK"
	# in-image.sh execs its way to the server: $! is the server itself.
	"$HERE/in-image.sh" "$IMG" -u 65532:65532 -b "$OUT" "$ENTRYPOINT" --endpoint "unix://$SOCK" \
		--clusterconfig "$OUT/etc/config.json" >"$OUT/server.log" 2>&1 &
	SERVER_PID=$!
	for _ in $(seq 100); do [ -S "$SOCK" ] && break; sleep 0.1; done
	[ -S "$SOCK" ] || { cat "$OUT/server.log" >&2; die "$release: the image's server (uid 65532) made no socket"; }
	snapmeta() {
		image -u 65533:65532 -b "$OUT" /usr/bin/env SNAPMETA_USER="$user" SNAPMETA_KEY="$key" \
			snapmeta --endpoint "unix://$SOCK" --format json "$@" 2>"$OUT/snapmeta.log" ||
			{ cat "$OUT/server.log" "$OUT/snapmeta.log" >&2; die "$release: snapmeta $* (uid 65533, gid 65532, key type $typ) failed"; }
	}
	# Both are JSON arrays of {offset, length, ...}: compare the (offset, length) pairs.
	pairs() { tr -d ' \n' | grep -o '"offset":[0-9]*,"length":[0-9]*' | sort; }
	same() {
		[ -n "$(pairs <<<"$1")" ] && [ "$(pairs <<<"$1")" = "$(pairs <<<"$2")" ] ||
			die "$release: snapmeta $3: $1; want: $2"
	}
	same "$(snapmeta allocated rsm-e2e/rbd/image-build-test@s1)" \
		"$(ceph_cli rbd diff --format json rbd/image-build-test@s1)" allocated
	# For the overwritten object rbd diff reports more than the write
	# (librbd over-reports: docs/precision.md); the server's precise answer
	# is what was written.
	same "$(snapmeta delta rsm-e2e/rbd/image-build-test@s1 rsm-e2e/rbd/image-build-test@s2)" \
		'[{"offset":524288,"length":65536},{"offset":8388608,"length":65536}]' delta
	# The liveness probe of deploy/components/containers, as the kubelet runs it.
	probe=$(image -u 65532:65532 -b "$OUT" /usr/local/bin/snapmeta --endpoint="unix://$SOCK" --timeout=5s health) ||
		die "$release: liveness probe: $probe"
	kill -TERM "$SERVER_PID"; wait "$SERVER_PID" 2>/dev/null || true; SERVER_PID=
	RSM_CEPH=$release "$HERE/cluster.sh" stop "$CLUSTER" >/dev/null
	log "PASS: $(sed -n 's/^RSM_CLUSTER_CEPH_VERSION=//p' "$CLUSTER/env") cluster, user made by ceph auth get-or-create" \
		"(key type $typ): the image's server (librados $(image dpkg-query -W -f '${Version}' librados2)) as 65532:65532," \
		"snapmeta as 65533:65532: allocated equals rbd diff's, delta what was written; liveness probe passes ($(since "$t"))"
	CLUSTER=
}
mkdir -m 755 "$OUT/etc"
mkdir -m 1777 "$OUT/csi" # like an emptyDir
SOCK=$OUT/csi/csi-snapshot-metadata.sock
cluster_check tentacle 2
cluster_check reef 1

# 3. The e2e tests of the server binary, with the image's entrypoint, on
# tentacle. The wrapper runs inside the e2e rootfs (the tests run there),
# which gets the image's root and this folder bound. They run in a network
# namespace of their own (e2e/netns.sh), so that their Kubernetes test
# cannot meet another run's ports when ./dev.sh test runs this beside the
# reef suite; the Kubernetes tools are built before, outside it.
cat >"$OUT/entrypoint" <<EOF
#!/bin/sh
exec "$HERE/in-image.sh" "$IMG" -b /tmp -b /var/tmp -- "$ENTRYPOINT" "\$@"
EOF
chmod 755 "$OUT/entrypoint"
t=$(now)
rc=0
"$HERE/k8s/k8s.sh" tools
RSM_CEPH=tentacle RSM_CLIENT_CEPH=tentacle RSM_SERVER_BIN=$OUT/entrypoint RSM_BIND="$OUT $IMG${RSM_BIND:+ $RSM_BIND}" \
	"$HERE/netns.sh" "$HERE/run-e2e.sh" "$@" || rc=$?
log "e2e with the image's entrypoint on tentacle ($*): exit $rc in $(since "$t"); total $(since "$T0")"
exit $rc
