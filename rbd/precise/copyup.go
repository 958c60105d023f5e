package precise

// Copied-up objects. When a clone first writes to an object that it reads
// from its parent, librbd copies the parent's data into the clone's object
// (copy-up) before the write. Through one level of parent the copy keeps
// the parent's holes; through two or more (a Ceph-CSI restored volume is a
// clone of the csi-snap clone of the source), reef 18.2.7 writes the whole
// object densely, zeros included (measured: a 4 KiB write next to 4 KiB of
// grandparent data makes a 4 MiB object with one 4 MiB extent; tentacle
// 20.2.4's librbd keeps the holes). Neither the
// object's extents nor its snap set then tell the copied bytes from the
// written ones: both look allocated, and new since the base snapshot.
//
// The OSD can: precise mode asks it for a hash of each 4 KiB chunk
// (xxhash64, computed where the data lies; no data travels) and compares
// chunks instead of extents:
//   - Allocated, an object of a clone within its parent overlap: chunks that
//     hash like zeros are left out (they read as zeros either way);
//   - Delta, an object that exists at only one of the two snapshots (or at
//     neither) where a parent is involved: a chunk counts only where the
//     image's content at the two snapshots hashes differently, the content
//     read as the image reads it (its own object where it exists, else the
//     parent chain within the overlap, else zeros).
// A chunk whose hash cannot be had (it straddles an object's end or the
// parent overlap) counts as changed. Two different 4 KiB chunks with equal
// 64-bit hashes would hide a change: about one chance in 2^64 per chunk.

import (
	"context"
	"fmt"

	"github.com/ceph/go-ceph/rados"
)

const (
	// copyUpDense is the allocated size above which an Allocated object of
	// a clone is hashed to find copied-up zeros: sparse copy-ups and small
	// writes are already exact.
	copyUpDense = 64 << 10
)

// chunkSum is the hash of one chunk of an image's content; ok is false
// where it cannot be had.
type chunkSum struct {
	v  uint64
	ok bool
}

// sums returns the hash of each chunk of the layer's content in [off, end),
// image offsets that are multiples of dataChunk within one of the
// layer's objects or across several: its own object where it exists (zeros
// beyond the object's size), else the parent's content within the overlap.
func (l *layer) sums(ctx context.Context, off, end int64) ([]chunkSum, error) {
	out := make([]chunkSum, 0, (end-off)/dataChunk)
	err := l.eachObject(ctx, off, end, func(o, oe, base int64, name string) error {
		size, s, err := chunkSums(l.ioctx, name, o-base, oe-o)
		if isNoEnt(err) {
			return err
		}
		if err != nil {
			return reasoned{ReasonChecksum, fmt.Errorf("checksum %s: %w", name, err)}
		}
		for i, c := 0, o; c < oe; i, c = i+1, c+dataChunk {
			switch {
			case i < len(s):
				out = append(out, chunkSum{s[i], true})
			case c-base >= size: // past the object's end: zeros
				out = append(out, chunkSum{zeroSum, true})
			default: // the chunk the object ends in
				out = append(out, chunkSum{})
			}
		}
		return nil
	}, func(o, oe int64) error {
		p, err := l.parentSums(ctx, o, oe)
		out = append(out, p...)
		return err
	})
	return out, err
}

// parentSums returns the hashes of what the layer reads from its parent
// chain in [off, end): zeros beyond the overlap.
func (l *layer) parentSums(ctx context.Context, off, end int64) ([]chunkSum, error) {
	out := make([]chunkSum, 0, (end-off)/dataChunk)
	under := off // the whole chunks below the overlap end here
	if l.parent != nil && l.overlap > off {
		under = min(end, l.overlap-(l.overlap-off)%dataChunk)
		if under > off {
			p, err := l.parent.sums(ctx, off, under)
			if err != nil {
				return nil, err
			}
			out = append(out, p...)
		}
	}
	for c := under; c < end; c += dataChunk {
		if l.parent != nil && c < l.overlap { // the chunk the overlap ends in
			out = append(out, chunkSum{})
		} else {
			out = append(out, chunkSum{zeroSum, true})
		}
	}
	return out, nil
}

// chunkSums returns the size of object oid at ioctx's read snapshot and
// the hash of each dataChunk of its data in [off, off+length), multiples
// of dataChunk, that lies whole within that size, in order. A missing
// object is radosErr(-ENOENT).
func chunkSums(ioctx *rados.IOContext, oid string, off, length int64) (int64, []uint64, error) {
	size, err := objectSize(ioctx, oid)
	if err != nil {
		return 0, nil, err
	}
	lo, hi, _ := chunkRange(off, length, size)
	if lo >= hi {
		return size, nil, nil
	}
	s, err := checksums(ioctx, oid, lo, hi-lo, dataChunk)
	return size, s, err
}

// chunkEnvelope returns the chunk-aligned range that holds every span of
// s (normalized, not empty).
func chunkEnvelope(s []span) (lo, hi int64) {
	lo = s[0].off - s[0].off%dataChunk
	hi = (s[len(s)-1].end() + dataChunk - 1) / dataChunk * dataChunk
	return lo, hi
}

// withoutZeros returns the parts of ext (image offsets, normalized, within
// one object of l) whose chunks do not hash like zeros in l.
func (l *layer) withoutZeros(ctx context.Context, ext []span) ([]span, error) {
	lo, hi := chunkEnvelope(ext)
	s, err := l.sums(ctx, lo, hi)
	if err != nil {
		return nil, err
	}
	return keepChunks(ext, lo, func(i int) bool { return !s[i].ok || s[i].v != zeroSum }), nil
}

// keepChunks returns the parts of s (normalized) in the chunks from lo on
// for which keep(chunk index) is true.
func keepChunks(s []span, lo int64, keep func(int) bool) []span {
	var out []span
	for _, e := range s {
		for c := e.off - (e.off-lo)%dataChunk; c < e.end(); c += dataChunk {
			if keep(int((c - lo) / dataChunk)) {
				out = append(out, clip([]span{e}, c, c+dataChunk)...)
			}
		}
	}
	return normalize(out)
}

// changedChunks returns the parts of cand (image offsets, normalized, not
// empty) in chunks whose content differs between the image at s1 and at s2.
func (r *Refiner) changedChunks(ctx context.Context, cand []span) ([]span, error) {
	lo, hi := chunkEnvelope(cand)
	sums1, err := r.base.sums(ctx, lo, hi)
	if err != nil {
		return nil, err
	}
	sums2, err := r.top.sums(ctx, lo, hi)
	if err != nil {
		return nil, err
	}
	return keepChunks(cand, lo, func(i int) bool {
		return !sums1[i].ok || !sums2[i].ok || sums1[i].v != sums2[i].v
	}), nil
}

// underParent reports whether the layer's object that starts at image
// offset off lies, in part at least, within the parent overlap: whether it
// can have been copied up.
func (l *layer) underParent(off int64) bool { return l.parent != nil && off < l.overlap }

// spanBytes returns the bytes in s.
func spanBytes(s []span) int64 {
	var n int64
	for _, e := range s {
		n += e.len
	}
	return n
}
