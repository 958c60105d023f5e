package precise

import (
	"errors"
	"fmt"
	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/rbd/internal/cepherr"
	"sync/atomic"
	"syscall"

	"github.com/ceph/go-ceph/rados"
	"github.com/cespare/xxhash/v2"
)

// Where an object's data lies, at one snapshot, without reading the data
// back. A replicated pool answers mapext: its allocated extents. An
// erasure-coded pool answers mapext with EOPNOTSUPP, and sparse_read with
// the whole object as one extent, data included (reef 18.2.7); but it does
// answer checksum, computed on the OSDs, which send back 8 bytes per 4 KiB
// chunk. A chunk whose hash is not that of 4 KiB of zeros may hold data;
// the others read as zeros. Zeros that were written count as data for
// mapext and not here; both are safe, since a byte that reads as zero at
// both ends of a delta did not change, and one that reads as zero holds no
// data for Allocated. The OSD still reads the chunks it hashes, so an
// object costs in proportion to its size (see docs/precision.md,
// "Erasure-coded data pools").

// dataChunk is the granularity of checksum refinement.
const dataChunk = 4096

// zeroSum is the xxhash64, seed 0, of dataChunk zero bytes.
var zeroSum = xxhash.Sum64(make([]byte, dataChunk))

// dataQuery is how one pool's objects are asked where their data lies;
// one is shared by every layer reading that pool, so that a pool that
// refuses mapext is asked mapext once per Diff, not once per object.
type dataQuery struct {
	noMapext atomic.Bool // the pool answered mapext with EOPNOTSUPP
	summed   *atomic.Int64
}

// extents returns the extents of object oid, within [off, off+length)
// (object offsets), that may hold data at ioctx's read snapshot: from
// mapext, or from checksums where the pool refuses mapext. size is the
// object's size at that snapshot when the caller knows it, else -1. A
// missing object is radosErr(-ENOENT).
func (q *dataQuery) extents(ioctx *rados.IOContext, oid string, off, length, size int64) ([]span, error) {
	if !q.noMapext.Load() {
		ext, err := mapext(ioctx, oid, off, length)
		if !cepherr.IsNotSupported(err) {
			if err != nil && !isNoEnt(err) {
				err = reasoned{ReasonMapext, fmt.Errorf("mapext %s: %w", oid, err)}
			}
			return ext, err
		}
		q.noMapext.Store(true)
	}
	ext, err := nonZero(ioctx, oid, off, length, size)
	if err == nil && q.summed != nil {
		q.summed.Add(1)
	}
	if err != nil && !isNoEnt(err) {
		err = reasoned{ReasonChecksum, fmt.Errorf("checksum %s: %w", oid, err)}
	}
	return ext, err
}

// nonZero returns the dataChunk-aligned chunks of object oid in
// [off, off+length) whose checksum is not that of zeros, clipped to that
// range, and the part of a last chunk that the object's end cuts short
// (the OSD refuses to hash a short chunk), whole. size < 0: stat first.
func nonZero(ioctx *rados.IOContext, oid string, off, length, size int64) ([]span, error) {
	if size < 0 {
		var err error
		if size, err = objectSize(ioctx, oid); err != nil {
			return nil, err
		}
	}
	lo, hi, end := chunkRange(off, length, size)
	var sums []uint64
	if lo < hi {
		var err error
		if sums, err = checksums(ioctx, oid, lo, hi-lo, dataChunk); err != nil {
			return nil, err
		}
	}
	return nonZeroSpans(off, lo, hi, end, sums), nil
}

// chunkRange returns what nonZero asks of an object of size bytes for
// [off, off+length): checksums of the whole chunks in [lo, hi), and the
// part [hi, end) of a chunk the object's end cuts short; end <= off when
// nothing is left.
func chunkRange(off, length, size int64) (lo, hi, end int64) {
	end = min(off+length, size)
	if off >= end {
		return off, off, end
	}
	lo = off - off%dataChunk
	hi = max(lo, end-end%dataChunk)
	return lo, hi, end
}

// objectSize returns the size of object oid at ioctx's read snapshot; a
// missing object is radosErr(-ENOENT), as radospp.cpp's calls answer.
func objectSize(ioctx *rados.IOContext, oid string) (int64, error) {
	st, err := ioctx.Stat(oid)
	if errors.Is(err, rados.ErrNotFound) {
		return 0, radosErr(-int(syscall.ENOENT))
	}
	if err != nil {
		return 0, err
	}
	return int64(st.Size), nil
}

// nonZeroSpans turns the checksums of the chunks in [lo, hi) into the
// extents that may hold data: the chunks that do not hash as zeros, and
// [hi, end) whole, clipped to [off, end).
func nonZeroSpans(off, lo, hi, end int64, sums []uint64) []span {
	if off >= end {
		return nil
	}
	var out []span
	for i, h := range sums {
		if h != zeroSum {
			out = append(out, span{lo + int64(i)*dataChunk, dataChunk})
		}
	}
	if hi < end {
		out = append(out, span{hi, end - hi})
	}
	return clip(normalize(out), off, end)
}
