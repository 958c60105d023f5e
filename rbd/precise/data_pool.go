package precise

/*
#cgo LDFLAGS: -lrbd
#include <stdlib.h>
#include <rbd/librbd.h>
*/
import "C"

import (
	"fmt"
	"unsafe"

	"github.com/ceph/go-ceph/rados"
)

// dataPoolID returns the ID of the data pool of image imageID in ioctx's
// pool and namespace (the pool itself when the image has none). go-ceph
// wraps rbd_get_data_pool_id only under its ceph_preview tag, and its
// Image hides the handle, so the image is opened here once more.
//
// Implements: int rbd_open_by_id_read_only(rados_ioctx_t io, const char *id,
// rbd_image_t *image, const char *snap_name), int64_t
// rbd_get_data_pool_id(rbd_image_t image), int rbd_close(rbd_image_t image).
func dataPoolID(ioctx *rados.IOContext, imageID string) (int64, error) {
	cid := C.CString(imageID)
	defer C.free(unsafe.Pointer(cid))
	var img C.rbd_image_t
	if r := C.rbd_open_by_id_read_only(C.rados_ioctx_t(ioctx.Pointer()), cid, &img, nil); r < 0 {
		return 0, radosErr(r)
	}
	id := int64(C.rbd_get_data_pool_id(img))
	C.rbd_close(img)
	if id < 0 {
		return 0, fmt.Errorf("rbd_get_data_pool_id: %w", radosErr(id))
	}
	return id, nil
}
