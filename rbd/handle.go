package rbd

import (
	"errors"
	"fmt"
	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/rbd/internal/cepherr"
	"io/fs"
	"strconv"
	"strings"

	"github.com/ceph/go-ceph/rados"
	librbd "github.com/ceph/go-ceph/rbd"
)

// Handle is a Ceph-CSI volume or snapshot handle, as Kubernetes keeps it in
// a VolumeSnapshotContent's status.snapshotHandle:
//
//	VVVV-LLLL-<clusterID>-<poolID>-<uuid>
//	0001-0002-c1-0000000000000001-87e86f14-231d-4ab2-aaeb-70608e7db6e6
//
// VVVV is the encoding version (0001), LLLL the length of the cluster ID,
// both 4 hex digits; the pool ID is 16 hex digits (big-endian int64); the
// uuid names the journal object csi.snap.<uuid> (csi.volume.<uuid> for a
// volume) in that pool, inside the RADOS namespace that the cluster ID's
// entry of the cluster config names. Volume and snapshot handles have the
// same shape: only the journal tells them apart.
type Handle struct {
	Cluster string
	PoolID  int64
	UUID    string
}

// Field sizes of a handle, as in Ceph-CSI's internal/util/volid.go.
const (
	handleVersion    = "0001"
	handleUUIDLen    = 36
	handleFixedLen   = 4 + 1 + 4 + 1 + 1 + 16 + 1 + handleUUIDLen // all but the cluster ID
	handlePoolHexLen = 16
)

// ParseHandle decodes a Ceph-CSI handle. It checks the shape only; whether
// the handle names a snapshot is known once its journal is read. A
// malformed handle is an fs.ErrInvalid error quoting it.
func ParseHandle(s string) (Handle, error) {
	bad := func(why string) (Handle, error) {
		return Handle{}, fmt.Errorf("snapshot handle %q: %s, want %s-LLLL-<clusterID>-<poolID: 16 hex digits>-<uuid>: %w",
			s, why, handleVersion, fs.ErrInvalid)
	}
	if len(s) < handleFixedLen+1 {
		return bad("too short")
	}
	if s[4] != '-' || s[9] != '-' {
		return bad("no '-' after the version or the cluster ID length")
	}
	if !isHex(s[:4]) {
		return bad("the version is not 4 hex digits")
	}
	if !strings.EqualFold(s[:4], handleVersion) {
		return bad(fmt.Sprintf("unknown encoding version %s", s[:4]))
	}
	if !isHex(s[5:9]) {
		return bad("the cluster ID length is not 4 hex digits")
	}
	n, _ := strconv.ParseUint(s[5:9], 16, 16) // 4 hex digits always fit
	l := int(n)
	if l == 0 {
		return bad("empty cluster ID")
	}
	if len(s) != handleFixedLen+l {
		return bad(fmt.Sprintf("length %d does not fit a cluster ID of %d bytes (want %d)", len(s), l, handleFixedLen+l))
	}
	cluster := s[10 : 10+l]
	if strings.IndexByte(cluster, 0) >= 0 {
		return bad("the cluster ID contains a NUL byte")
	}
	rest := s[10+l:] // -<poolID>-<uuid>
	if rest[0] != '-' || rest[1+handlePoolHexLen] != '-' {
		return bad("no '-' around the pool ID")
	}
	poolHex := rest[1 : 1+handlePoolHexLen]
	if !isHex(poolHex) {
		return bad("the pool ID is not 16 hex digits")
	}
	pool, _ := strconv.ParseUint(poolHex, 16, 64) // 16 hex digits always fit
	if pool > 1<<63-1 {
		return bad("negative pool ID")
	}
	uuid := rest[2+handlePoolHexLen:]
	if !isUUID(uuid) {
		return bad("the uuid is not of the form xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx")
	}
	return Handle{Cluster: cluster, PoolID: int64(pool), UUID: uuid}, nil
}

// String returns the handle in the form ParseHandle reads, as Ceph-CSI
// composes it (lower-case hex).
func (h Handle) String() string {
	return fmt.Sprintf("%s-%04x-%s-%016x-%s", handleVersion, len(h.Cluster), h.Cluster, uint64(h.PoolID), h.UUID)
}

func isHex(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F') {
			return false
		}
	}
	return true
}

// isUUID reports whether s has the textual form of a uuid.
func isUUID(s string) bool {
	if len(s) != handleUUIDLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		switch i {
		case 8, 13, 18, 23:
			if s[i] != '-' {
				return false
			}
		default:
			if !isHex(s[i : i+1]) {
				return false
			}
		}
	}
	return true
}

// Ceph-CSI's journal: the per-snapshot and per-volume omap objects, and the
// keys read here (internal/journal/voljournal.go).
const (
	journalSnapPrefix   = "csi.snap."   // + uuid: one snapshot
	journalVolumePrefix = "csi.volume." // + uuid: one volume
	journalKeyPrefix    = "csi."
	journalImageName    = "csi.imagename" // the snapshot's clone image, csi-snap-<uuid>
	journalImageID      = "csi.imageid"
	journalSource       = "csi.source" // the source volume's image name
	snapNamePrefix      = "csi-snap-"  // Ceph-CSI's default, when csi.imagename is missing
)

func (h Handle) clusterID() string { return h.Cluster }

// resolve reads the snapshot's journal object and its clone image:
//
//   - normally the clone csi-snap-<uuid> has a parent: the snapshot of the
//     source volume that Ceph-CSI took, cloned and then deleted, so that it
//     lives on in the source's trash snapshot namespace. That snapshot,
//     named by ID on the source image, holds what the snapshot captured.
//   - once Ceph-CSI has flattened the clone, the parent is gone and the
//     clone's own snapshot csi-snap-<uuid>@csi-snap-<uuid> holds the data;
//     the snapRef is marked flattened, since it can no longer be diffed
//     against other snapshots of the source.
//
// A handle whose journal object is missing, or that names a volume, is
// fs.ErrNotExist.
//
// Implements (through go-ceph): rados_pool_reverse_lookup,
// rados_ioctx_create, rados_read_op_omap_get_vals2, rados_stat,
// rbd_open_read_only (or rbd_open_by_id_read_only), rbd_get_parent,
// rbd_get_id.
func (h Handle) resolve(cl Cluster, conn func() (*rados.Conn, error)) (snapRef, error) {
	c, err := conn()
	if err != nil {
		return snapRef{}, err
	}
	pool, err := c.GetPoolByID(h.PoolID)
	if err != nil {
		return snapRef{}, cepherr.Wrap(fmt.Sprintf("look up pool ID %d", h.PoolID), err)
	}
	ioctx, err := c.OpenIOContext(pool)
	if err != nil {
		return snapRef{}, cepherr.Wrap("open pool "+pool, err)
	}
	defer ioctx.Destroy()
	ioctx.SetNamespace(cl.RadosNamespace)
	where := pool
	if cl.RadosNamespace != "" {
		where += "/" + cl.RadosNamespace
	}

	obj := journalSnapPrefix + h.UUID
	vals, err := ioctx.GetOmapValues(obj, "", journalKeyPrefix, 64)
	if errors.Is(err, rados.ErrNotFound) {
		return snapRef{}, h.notSnapshot(ioctx, where)
	}
	if err != nil {
		return snapRef{}, cepherr.Wrap(fmt.Sprintf("read Ceph-CSI journal object %s/%s", where, obj), err)
	}
	clone := string(vals[journalImageName])
	if clone == "" {
		clone = snapNamePrefix + h.UUID
	}
	img, err := librbd.OpenImageReadOnly(ioctx, clone, librbd.NoSnapshot)
	if err != nil {
		return snapRef{}, cepherr.Wrap(fmt.Sprintf("open the snapshot's image %s/%s", where, clone), err)
	}
	defer img.Close()

	parent, err := img.GetParent()
	if errors.Is(err, librbd.ErrNotFound) {
		// Flattened: the clone's own snapshot has the data.
		id, err := img.GetId()
		if err != nil {
			return snapRef{}, cepherr.Wrap(fmt.Sprintf("get the ID of image %s/%s", where, clone), err)
		}
		return snapRef{pool: pool, namespace: cl.RadosNamespace, image: clone, imageID: id,
			snapName: clone, flattened: true}, nil
	}
	if err != nil {
		return snapRef{}, cepherr.Wrap(fmt.Sprintf("get the parent of image %s/%s", where, clone), err)
	}
	return snapRef{
		pool:      parent.Image.PoolName,
		namespace: parent.Image.PoolNamespace,
		image:     parent.Image.ImageName,
		imageID:   parent.Image.ImageID,
		snapID:    parent.Snap.ID,
	}, nil
}

// notSnapshot explains a handle without a snapshot journal object: it is a
// volume handle, or it names nothing in this pool and namespace.
func (h Handle) notSnapshot(ioctx *rados.IOContext, where string) error {
	if _, err := ioctx.Stat(journalVolumePrefix + h.UUID); err == nil {
		return fmt.Errorf("handle %s names a volume (%s/%s%s exists), not a snapshot: %w",
			h, where, journalVolumePrefix, h.UUID, fs.ErrNotExist)
	}
	return fmt.Errorf("no Ceph-CSI snapshot %s in the journal of %s (no object %s%s): %w",
		h.UUID, where, journalSnapPrefix, h.UUID, fs.ErrNotExist)
}
