#!/bin/bash
# Which per-object queries an erasure-coded data pool answers, next to a
# replicated pool, at a snapshot and at the head: list_snaps (read snapshot
# LIBRADOS_SNAP_DIR), stat, mapext, sparse_read, read and checksum, with
# their answers and times. docs/precision.md, "Erasure-coded data
# pools", records what reef and
# tentacle answered. Runs against a cluster with an EC pool rbd-ec:
#
#   RSM_CEPH_OSDS=3 RSM_CEPH_EC_POOL=rbd-ec e2e/with-cluster.sh e2e/ec-queries.sh
#   RSM_CEPH=tentacle RSM_CEPH_OSDS=3 RSM_CEPH_EC_POOL=rbd-ec e2e/with-cluster.sh e2e/ec-queries.sh
#
# Two images, one with its data in rbd-ec, one in rbd: 4 KiB in object 0
# and object 1, snapshot s1, 4 KiB more in object 0 (growing it), in new
# objects 2 and 3, 100 bytes at 5000 in new object 4, snapshot s2.
# ec-queries/probe.cpp then asks each object.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
if [ "${1:-}" != --inside ]; then
  exec "$HERE/in-rootfs.sh" -b "$RSM_CLUSTER_DIR" -b "$HERE" bash "$HERE/ec-queries.sh" --inside
fi
tmp=$(mktemp -d)
g++ -O1 -o "$tmp/probe" "$HERE/ec-queries/probe.cpp" -lrados
python3 - "$CEPH_CONF" <<'PY'
import os, sys, rados, rbd
c = rados.Rados(conffile=sys.argv[1]); c.connect(); io = c.open_ioctx('rbd')
for name, dp in (('q-ec', 'rbd-ec'), ('q-rep', None)):
    rbd.RBD().create(io, name, 64 << 20, old_format=False, data_pool=dp,
                     features=rbd.RBD_FEATURE_LAYERING | rbd.RBD_FEATURE_EXCLUSIVE_LOCK |
                     rbd.RBD_FEATURE_OBJECT_MAP | rbd.RBD_FEATURE_FAST_DIFF)
    with rbd.Image(io, name) as img:
        img.write(os.urandom(4096), 1 << 20)
        img.write(os.urandom(4096), (4 << 20) + (3 << 20))
        img.create_snap('s1')
        img.write(os.urandom(4096), 2 << 20)
        img.write(os.urandom(4096), (8 << 20) + (1 << 20))
        img.write(os.urandom(8192), 12 << 20)
        img.write(os.urandom(100), (16 << 20) + 5000)  # object 4: size 5100
        img.create_snap('s2')
        snaps = ' '.join(str(s['id']) for s in img.list_snaps())
        pool = dp or 'rbd'
        with open(f'/tmp/{name}', 'w') as f:
            f.write(f"{pool} {img.stat()['block_name_prefix']} {snaps}\n")
io.close(); c.shutdown()
PY
echo "ceph $(ceph-osd --version | awk '{ print $3 }')"
for name in q-ec q-rep; do
  read -r pool prefix snaps </tmp/$name
  echo "##### $name: data in pool $pool, snapshots $snaps (then head)"
  for o in 0 1 2 3 4; do
    obj=$(printf '%s.%016x' "$prefix" "$o")
    echo "--- object $o ($obj)"
    # shellcheck disable=SC2086
    "$tmp/probe" "$pool" "" "$obj" $snaps
  done
done
rm -rf "$tmp"
