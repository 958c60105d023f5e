# Sourced by the e2e scripts: which Ceph release (and so which rootfs) they
# use. RSM_CEPH=reef (default) or tentacle; RSM_CEPH_SUITE overrides the
# Debian suite (for tentacle, e.g. sid when forky lacks Ceph 20.2).
#
# Sets CEPH_RELEASE, SUITE, SUITES (the stamp's words), DEBOOTSTRAP_SCRIPT
# (empty: debootstrap's own), MIN_CEPH and MAX_CEPH (librbd1 >= MIN, < MAX),
# ROOTFS_DEFAULT and rootfs_for RELEASE (prints a release's default rootfs).
# RSM_ROOTFS_DIR: where both releases' rootfs and tarballs live (a second
# checkout's CI run beside another's that expects other packages).
CEPH_CACHE_DIR=${RSM_ROOTFS_DIR:-/var/cache/rbd-snapshot-metadata}

rootfs_for() {
  case "$1" in
    reef) echo "$CEPH_CACHE_DIR/rootfs" ;;
    tentacle) echo "$CEPH_CACHE_DIR/rootfs-tentacle" ;;
    *) echo "unknown Ceph release '$1' (RSM_CEPH: reef or tentacle)" >&2; return 2 ;;
  esac
}

CEPH_RELEASE=${RSM_CEPH:-reef}
case "$CEPH_RELEASE" in
  reef)
    SUITE=${RSM_CEPH_SUITE:-trixie} DEBOOTSTRAP_SCRIPT= MIN_CEPH=18.2.7 MAX_CEPH=19~ ;;
  tentacle)
    # Debian 12's debootstrap knows sid, not forky; forky uses sid's script.
    SUITE=${RSM_CEPH_SUITE:-forky} DEBOOTSTRAP_SCRIPT=/usr/share/debootstrap/scripts/sid
    MIN_CEPH=20.2.0 MAX_CEPH=21~ ;;
  *) echo "unknown Ceph release '$CEPH_RELEASE' (RSM_CEPH: reef or tentacle)" >&2; exit 2 ;;
esac
SUITES=$SUITE
ROOTFS_DEFAULT=$(rootfs_for "$CEPH_RELEASE")
