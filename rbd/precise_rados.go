package rbd

/*
#cgo LDFLAGS: -lrados -lstdc++
#include <stdlib.h>
#include "radospp.h"
*/
import "C"

import (
	"fmt"
	"syscall"
	"unsafe"

	"github.com/ceph/go-ceph/rados"
)

// radosErr is a failed call of radospp.cpp: a negative errno. It carries
// ErrorCode so that classify and errnoOf treat it like go-ceph's errors.
type radosErr int

func (e radosErr) Error() string  { return syscall.Errno(-e).Error() }
func (e radosErr) ErrorCode() int { return int(e) }

// words copies and frees the malloc'd answer of radospp.cpp.
func words(p *C.uint64_t, n C.size_t) []uint64 {
	if p == nil {
		return nil
	}
	defer C.free(unsafe.Pointer(p))
	return append([]uint64(nil), unsafe.Slice((*uint64)(unsafe.Pointer(p)), int(n))...)
}

// listSnaps returns the snap set of object oid. ioctx's read snapshot must
// be snapDir.
//
// Implements (radospp.cpp): librados::IoCtx::list_snaps.
func listSnaps(ioctx *rados.IOContext, oid string) (snapSet, error) {
	coid := C.CString(oid)
	defer C.free(unsafe.Pointer(coid))
	var (
		p *C.uint64_t
		n C.size_t
	)
	if r := C.rsm_list_snaps(C.rados_ioctx_t(ioctx.Pointer()), coid, &p, &n); r < 0 {
		return snapSet{}, radosErr(r)
	}
	return parseSnapSet(words(p, n))
}

// mapext returns the allocated extents of object oid within [off, off+len)
// at ioctx's read snapshot. A missing object is radosErr(-ENOENT).
//
// Implements (radospp.cpp): librados::IoCtx::mapext.
func mapext(ioctx *rados.IOContext, oid string, off, length int64) ([]span, error) {
	coid := C.CString(oid)
	defer C.free(unsafe.Pointer(coid))
	var (
		p *C.uint64_t
		n C.size_t
	)
	if r := C.rsm_mapext(C.rados_ioctx_t(ioctx.Pointer()), coid, C.uint64_t(off), C.uint64_t(length), &p, &n); r < 0 {
		return nil, radosErr(r)
	}
	return parseSpans(words(p, n))
}

// listSnapsBatch returns the snap sets of the objects oids, all asked for
// at once, and per object the error of its list_snaps (radosErr(-ENOENT):
// no such object); err is set when the queries could not be sent. ioctx's
// read snapshot must be snapDir.
//
// Implements (radospp.cpp): librados::ObjectReadOperation::list_snaps,
// librados::IoCtx::aio_operate.
func listSnapsBatch(ioctx *rados.IOContext, oids []string) (sss []snapSet, errs []error, err error) {
	coids := make([]*C.char, len(oids))
	for i, o := range oids {
		coids[i] = C.CString(o)
	}
	defer func() {
		for _, c := range coids {
			C.free(unsafe.Pointer(c))
		}
	}()
	// The array of C pointers lives in C memory: cgo forbids passing Go
	// memory that holds pointers.
	arr := (**C.char)(C.malloc(C.size_t(len(oids)) * C.size_t(unsafe.Sizeof(uintptr(0)))))
	defer C.free(unsafe.Pointer(arr))
	copy(unsafe.Slice(arr, len(oids)), coids)
	var (
		p *C.uint64_t
		n C.size_t
	)
	if r := C.rsm_list_snaps_batch(C.rados_ioctx_t(ioctx.Pointer()), arr, C.size_t(len(oids)), &p, &n); r < 0 {
		return nil, nil, radosErr(r)
	}
	return parseSnapSetBatch(words(p, n), len(oids))
}

// checksums returns the xxhash64 (seed 0) of each chunk-byte chunk of
// object oid in [off, off+length) at ioctx's read snapshot; length must be
// a multiple of chunk, and the range must end within the object.
//
// Implements (radospp.cpp): librados::ObjectReadOperation::checksum.
func checksums(ioctx *rados.IOContext, oid string, off, length, chunk int64) ([]uint64, error) {
	coid := C.CString(oid)
	defer C.free(unsafe.Pointer(coid))
	var (
		p *C.uint64_t
		n C.size_t
	)
	if r := C.rsm_checksum(C.rados_ioctx_t(ioctx.Pointer()), coid, C.uint64_t(off), C.uint64_t(length), C.uint64_t(chunk), &p, &n); r < 0 {
		return nil, radosErr(r)
	}
	if w := words(p, n); int64(len(w)) == length/chunk {
		return w, nil
	} else {
		return nil, fmt.Errorf("checksum: %d hashes for %d chunks", len(w), length/chunk)
	}
}
