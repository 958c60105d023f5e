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

// chunkSums returns the size of object oid at ioctx's read snapshot and
// the xxhash64 (seed 0) of each preciseChunk of its data in
// [off, off+length), both multiples of preciseChunk, computed by the OSD:
// one sum per whole chunk within the object's size, in order (fewer than
// length/preciseChunk when the object ends first). A missing object is
// radosErr(-ENOENT).
//
// Implements (radospp.cpp): librados::IoCtx::stat, librados::IoCtx::checksum.
func chunkSums(ioctx *rados.IOContext, oid string, off, length int64) (int64, []uint64, error) {
	coid := C.CString(oid)
	defer C.free(unsafe.Pointer(coid))
	var (
		p *C.uint64_t
		n C.size_t
	)
	if r := C.rsm_chunk_sums(C.rados_ioctx_t(ioctx.Pointer()), coid, C.uint64_t(off), C.uint64_t(length), preciseChunk, &p, &n); r < 0 {
		return 0, nil, radosErr(r)
	}
	w := words(p, n)
	if len(w) == 0 || int64(len(w)-1) > length/preciseChunk {
		return 0, nil, fmt.Errorf("checksum %s: %d words for %d bytes", oid, len(w), length)
	}
	return int64(w[0]), w[1:], nil
}

// librados writes its log to C++'s std::cerr until a connection's
// configuration reaches it, and before that it quotes there a cephx key it
// cannot decode (reef, given tentacle's aes256k key). Secrets never reach
// a log: the process's std::cerr writes nothing. klog and the Go runtime
// write to the stderr file itself, not through it.
func init() { C.rsm_silence_cerr() }
