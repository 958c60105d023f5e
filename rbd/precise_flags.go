package rbd

/*
#include <errno.h>
#include <stdlib.h>
#include <stdint.h>
#include <rados/librados.h>

// rsm_rbd_flags reads the flags of snapshot snap (CEPH_NOSNAP: the head)
// of the format 2 image whose header object is header, with cls_rbd's
// get_flags: a uint64 snapshot ID in, uint64 flags out, little-endian.
// It returns 0 or a negative errno.
static int rsm_rbd_flags(rados_ioctx_t io, const char *header, uint64_t snap, uint64_t *flags) {
	char in[8], out[8];
	for (int i = 0; i < 8; i++) {
		in[i] = (char)(snap >> (8 * i));
	}
	int r = rados_exec(io, header, "rbd", "get_flags", in, sizeof in, out, sizeof out);
	if (r < 0) {
		return r;
	}
	if (r < (int)sizeof out) {
		return -EIO;
	}
	*flags = 0;
	for (int i = 0; i < 8; i++) {
		*flags |= (uint64_t)(unsigned char)out[i] << (8 * i);
	}
	return 0;
}
*/
import "C"

import (
	"fmt"
	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/rbd/internal/cepherr"
	"unsafe"

	librbd "github.com/ceph/go-ceph/rbd"
)

// librbd's image flags (RBD_FLAG_* in librbd.h).
const (
	flagObjectMapInvalid = 1 << 0
	flagFastDiffInvalid  = 1 << 1
)

// noObjectMap reports whether librbd's whole-object diff of d cannot use
// the object map, and so runs list_snaps on every object itself, one at a
// time: the image lacks fast-diff (Ceph-CSI's and Rook's example
// StorageClasses ask for layering only), or the map is flagged invalid at
// the target or the base snapshot (`rbd object-map rebuild` clears the
// flag). Getting it wrong costs only time: librbd walks every object
// itself when a map it needs is invalid.
//
// Implements (through go-ceph): rbd_get_features, rbd_get_id; (in cgo)
// rados_exec of cls_rbd's get_flags on the image's header object, one
// OSD query per snapshot (opening the image again would cost several).
func (d *Diff) noObjectMap() (bool, error) {
	features, err := d.image.GetFeatures()
	if err != nil {
		return false, cepherr.Wrap("get features", err)
	}
	if features&librbd.FeatureFastDiff == 0 || features&librbd.FeatureObjectMap == 0 {
		return true, nil
	}
	id, err := d.image.GetId()
	if err != nil {
		return false, cepherr.Wrap("get image id", err)
	}
	header := C.CString("rbd_header." + id)
	defer C.free(unsafe.Pointer(header))
	snaps := []uint64{d.target.snapID}
	if d.base != nil {
		snaps = append(snaps, d.base.snapID)
	}
	for _, s := range snaps {
		var flags C.uint64_t
		if r := C.rsm_rbd_flags(C.rados_ioctx_t(d.ioctx.Pointer()), header, C.uint64_t(s), &flags); r < 0 {
			return false, cepherr.Wrap(fmt.Sprintf("read the flags of %s at snapshot %d", d.target.imageSpec(), s), radosErr(r))
		}
		if flags&(flagObjectMapInvalid|flagFastDiffInvalid) != 0 {
			return true, nil
		}
	}
	return false, nil
}
