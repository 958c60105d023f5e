package conn

/*
#cgo LDFLAGS: -lrados
#include <rados/librados.h>
*/
import "C"

import (
	"runtime"
	"unsafe"

	"github.com/ceph/go-ceph/rados"
)

// shutdownUnconnected frees the librados handle of conn, which never
// connected, with its threads (a failed rados_connect leaves them
// running). go-ceph's Shutdown does nothing for such a handle, and its
// finalizer runs only at some later garbage collection: a burst of
// requests with wrong keys would pile up a few threads each until then.
// conn must not be used afterwards.
//
// Implements: void rados_shutdown(rados_t cluster).
func shutdownUnconnected(conn *rados.Conn) {
	// go-ceph's finalizer would shut the handle down a second time.
	runtime.SetFinalizer(conn, nil)
	C.rados_shutdown(C.rados_t(unsafe.Pointer(conn.Cluster())))
}
