#!/bin/bash
# The demo (./dev.sh demo): a throwaway Ceph reef cluster, an RBD image with
# two snapshots and real changed data, our server on a unix socket in front of
# it, and snapmeta printing what a backup tool would get: the allocated blocks
# of each snapshot and the blocks changed between them, next to `rbd diff`.
#
# RSM_DEMO_KEEP=1 leaves the cluster and the server running, and prints how to
# query and stop them. Needs bin/ built (./dev.sh build) and root.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
TOP=$(dirname "$HERE")
BIN=$TOP/bin

"$HERE/rootfs.sh"
DIR=$(mktemp -d /var/tmp/rsm-demo.XXXXXX)
SERVER_PID=
cleanup() {
	[ -z "$SERVER_PID" ] || { kill -TERM "$SERVER_PID" 2>/dev/null; wait "$SERVER_PID" 2>/dev/null || true; }
	"$HERE/cluster.sh" stop "$DIR" >/dev/null || "$HERE/cluster.sh" kill "$DIR" >/dev/null || true
	rm -rf --one-file-system "$DIR"
}
[ -n "${RSM_DEMO_KEEP:-}" ] || trap cleanup EXIT
"$HERE/cluster.sh" start "$DIR"
set -a
# shellcheck disable=SC1091
. "$DIR/env"
set +a
inside() { "$HERE/in-rootfs.sh" -b "$DIR" "$@"; }

echo
echo "== an image with fast-diff, 4 MiB objects; random 4 KiB writes, snapshot s1;"
echo "== more random writes, 1 MiB of 64 KiB sequential writes, snapshot s2"
inside sh -ec '
	rbd create --size 1G --image-feature layering,exclusive-lock,object-map,fast-diff,deep-flatten rbd/demo
	rbd bench --io-type write --io-pattern rand --io-size 4K --io-total 48K rbd/demo >/dev/null
	rbd snap create rbd/demo@s1 >/dev/null 2>&1
	rbd bench --io-type write --io-pattern rand --io-size 4K --io-total 24K rbd/demo >/dev/null
	rbd bench --io-type write --io-pattern seq --io-size 64K --io-total 1M rbd/demo >/dev/null
	rbd snap create rbd/demo@s2 >/dev/null 2>&1
'

SOCK=$DIR/csi-snapshot-metadata.sock
echo
echo "== starting the server on $SOCK"
"$HERE/in-rootfs.sh" -b "$DIR" -b "$BIN" "$BIN/rbd-snapshot-metadata" \
	--endpoint "unix://$SOCK" --clusterconfig "$DIR/csi-config.json" -v 2 >"$DIR/server.log" 2>&1 &
SERVER_PID=$!
for _ in $(seq 100); do [ -S "$SOCK" ] && break; sleep 0.1; done
[ -S "$SOCK" ] || { cat "$DIR/server.log" >&2; exit 1; }

# snapmeta runs on the host: the server's socket is all it needs. It uses the
# Ceph-CSI-like user "csi", not admin.
export SNAPMETA_USER=$CEPH_CSI_USER SNAPMETA_KEY=$CEPH_CSI_KEY
snap() { "$BIN/snapmeta" --endpoint "unix://$SOCK" "$@"; }
ID=rsm-e2e/rbd/demo

echo
echo "== snapmeta allocated $ID@s1"
snap allocated "$ID@s1"
echo
echo "== snapmeta delta $ID@s1 $ID@s2"
snap delta "$ID@s1" "$ID@s2"
echo
echo "== snapmeta --format json allocated $ID@s2 (the JSON form; totals on stderr)"
snap --format json allocated "$ID@s2" | cut -c1-160
echo
echo "== rbd diff, for comparison (librbd's extents: what a server that passes them on reports)"
for a in "rbd/demo@s1" "--from-snap s1 rbd/demo@s2" "rbd/demo@s2"; do
	# shellcheck disable=SC2086
	inside rbd diff --format json $a | grep -o '"length":[0-9]*' |
		awk -F: -v a="$a" '{ n++; b += $2 } END { printf "rbd diff %s: %d extents, %d bytes\n", a, n, b }'
done

if [ -n "${RSM_DEMO_KEEP:-}" ]; then
	cat <<EOT

The cluster and the server keep running. Try:
  SNAPMETA_USER=$CEPH_CSI_USER SNAPMETA_KEY=$CEPH_CSI_KEY $BIN/snapmeta --endpoint unix://$SOCK allocated $ID@s2
Stop them with:
  kill $SERVER_PID; $HERE/cluster.sh stop $DIR; rm -rf $DIR
EOT
fi
