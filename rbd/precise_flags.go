package rbd

/*
#cgo LDFLAGS: -lrbd
#include <stdlib.h>
#include <rbd/librbd.h>

// rsm_map_invalid opens image id read-only and reports, in *invalid,
// whether its object map or fast-diff state is flagged invalid at any of
// the n snapshots snaps (RBD_FLAG_OBJECT_MAP_INVALID,
// RBD_FLAG_FAST_DIFF_INVALID); it returns 0 or a negative errno.
static int rsm_map_invalid(rados_ioctx_t io, const char *id, const uint64_t *snaps, size_t n, int *invalid) {
	rbd_image_t img;
	int r = rbd_open_by_id_read_only(io, id, &img, NULL);
	if (r < 0) {
		return r;
	}
	*invalid = 0;
	for (size_t i = 0; i < n && r == 0 && !*invalid; i++) {
		uint64_t flags = 0;
		r = rbd_snap_set_by_id(img, snaps[i]);
		if (r == 0) {
			r = rbd_get_flags(img, &flags);
		}
		if (r == 0 && (flags & (RBD_FLAG_OBJECT_MAP_INVALID | RBD_FLAG_FAST_DIFF_INVALID)) != 0) {
			*invalid = 1;
		}
	}
	int c = rbd_close(img);
	return r < 0 ? r : c;
}
*/
import "C"

import (
	"slices"
	"unsafe"

	librbd "github.com/ceph/go-ceph/rbd"
)

// noObjectMap reports whether librbd's whole-object diff of d cannot use
// the object map, and so runs list_snaps on every object itself, one at a
// time: the image lacks fast-diff (Ceph-CSI's and Rook's example
// StorageClasses ask for layering only), or the map is flagged invalid at
// the target snapshot or an older one (a diff from the beginning reads
// them all; `rbd object-map rebuild` clears the flag).
//
// Implements (through go-ceph): rbd_get_features, rbd_get_id,
// rbd_snap_list; (in cgo) rbd_open_by_id_read_only, rbd_snap_set_by_id,
// rbd_get_flags, rbd_close.
func (d *Diff) noObjectMap() (bool, error) {
	features, err := d.image.GetFeatures()
	if err != nil {
		return false, wrap("get features", err)
	}
	if features&librbd.FeatureFastDiff == 0 || features&librbd.FeatureObjectMap == 0 {
		return true, nil
	}
	id, err := d.image.GetId()
	if err != nil {
		return false, wrap("get image id", err)
	}
	snaps, err := d.image.GetSnapshotNames()
	if err != nil {
		return false, wrap("list snapshots of "+d.target.imageSpec(), err)
	}
	ids := []uint64{d.target.snapID}
	for _, s := range snaps {
		if s.Id < d.target.snapID {
			ids = append(ids, s.Id)
		}
	}
	slices.Sort(ids)
	cid := C.CString(id)
	defer C.free(unsafe.Pointer(cid))
	var invalid C.int
	if r := C.rsm_map_invalid(C.rados_ioctx_t(d.ioctx.Pointer()), cid, (*C.uint64_t)(unsafe.Pointer(&ids[0])), C.size_t(len(ids)), &invalid); r < 0 {
		return false, wrap("read the object map flags of "+d.target.imageSpec(), radosErr(r))
	}
	return invalid != 0, nil
}
