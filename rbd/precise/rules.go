package precise

import (
	"fmt"
	"slices"
)

// The per-object rules of precise mode, as pure functions of what RADOS
// answered (list_snaps, mapext), so that they can be tested against
// hand-made answers. delta.go runs the queries and applies these rules.
//
// All offsets here are relative to the start of one RADOS object.

// span is a byte range [off, off+len).
type span struct{ off, len int64 }

func (s span) end() int64 { return s.off + s.len }

// overlaps reports whether s and t share a byte.
func (s span) overlaps(t span) bool {
	return s.len > 0 && t.len > 0 && s.off < t.end() && t.off < s.end()
}

// normalize sorts spans, drops empty ones and merges overlapping or
// adjacent ones, in place.
func normalize(s []span) []span {
	s = slices.DeleteFunc(s, func(x span) bool { return x.len <= 0 })
	slices.SortFunc(s, func(a, b span) int {
		switch {
		case a.off < b.off:
			return -1
		case a.off > b.off:
			return 1
		}
		return 0
	})
	out := s[:0]
	for _, x := range s {
		if n := len(out); n > 0 && x.off <= out[n-1].end() {
			out[n-1].len = max(out[n-1].end(), x.end()) - out[n-1].off
			continue
		}
		out = append(out, x)
	}
	return out
}

// clip returns the parts of s within [lo, hi), in a new slice.
func clip(s []span, lo, hi int64) []span {
	var out []span
	for _, x := range s {
		o, e := max(x.off, lo), min(x.end(), hi)
		if o < e {
			out = append(out, span{o, e - o})
		}
	}
	return out
}

// shift adds d to every offset, in place.
func shift(s []span, d int64) []span {
	for i := range s {
		s[i].off += d
	}
	return s
}

// subtract removes the spans of b from a (both normalized).
func subtract(a, b []span) []span {
	var out []span
	for _, x := range a {
		o, e := x.off, x.end()
		for _, y := range b {
			if y.end() <= o || y.off >= e {
				continue
			}
			if y.off > o {
				out = append(out, span{o, y.off - o})
			}
			o = max(o, y.end())
		}
		if o < e {
			out = append(out, span{o, e - o})
		}
	}
	return out
}

// RADOS snapshot IDs with a special meaning (librados.h).
const (
	snapHead = ^uint64(1) // LIBRADOS_SNAP_HEAD: the live object
	snapDir  = ^uint64(0) // LIBRADOS_SNAP_DIR: read the snap set itself
)

// cloneInfo and snapSet mirror librados' clone_info_t and snap_set_t.
type cloneInfo struct {
	id      uint64   // the clone's ID; snapHead for the head
	snaps   []uint64 // the snapshots this clone holds, ascending
	overlap []span   // ranges identical in the next newer clone (or the head)
	size    int64
}

type snapSet struct {
	clones []cloneInfo // ascending, the head last when it exists
	seq    uint64      // the newest snapshot the object has seen
}

// parseSnapSet decodes rsm_list_snaps' flat answer (see radospp.h).
func parseSnapSet(w []uint64) (snapSet, error) {
	bad := func() (snapSet, error) {
		return snapSet{}, fmt.Errorf("list_snaps: malformed answer of %d words", len(w))
	}
	next := func(n uint64) ([]uint64, bool) {
		if n > uint64(len(w)) {
			return nil, false
		}
		v := w[:n]
		w = w[n:]
		return v, true
	}
	h, ok := next(2)
	if !ok {
		return bad()
	}
	ss := snapSet{seq: h[0]}
	for range h[1] {
		c, ok := next(3)
		if !ok {
			return bad()
		}
		ci := cloneInfo{id: c[0], size: int64(c[1])}
		snaps, ok := next(c[2])
		if !ok {
			return bad()
		}
		ci.snaps = slices.Clone(snaps)
		no, ok := next(1)
		if !ok {
			return bad()
		}
		ov, ok := next(2 * no[0])
		if !ok {
			return bad()
		}
		for i := 0; i < len(ov); i += 2 {
			ci.overlap = append(ci.overlap, span{int64(ov[i]), int64(ov[i+1])})
		}
		ss.clones = append(ss.clones, ci)
	}
	if len(w) != 0 {
		return bad()
	}
	return ss, nil
}

// parseSnapSetBatch decodes rsm_list_snaps_batch's flat answer for n
// objects: per object its snap set, or the error of its list_snaps.
func parseSnapSetBatch(w []uint64, n int) ([]snapSet, []error, error) {
	sss, errs := make([]snapSet, n), make([]error, n)
	for i := range n {
		if len(w) < 2 || uint64(len(w)-2) < w[1] {
			return nil, nil, fmt.Errorf("list_snaps: malformed batch answer at object %d", i)
		}
		rc, k := int64(w[0]), w[1]
		body := w[2 : 2+k]
		w = w[2+k:]
		if rc < 0 {
			errs[i] = radosErr(rc)
			continue
		}
		sss[i], errs[i] = parseSnapSet(body)
	}
	if len(w) != 0 {
		return nil, nil, fmt.Errorf("list_snaps: %d words left over in a batch answer", len(w))
	}
	return sss, errs, nil
}

// parseSpans decodes rsm_mapext's flat answer: (offset, length) pairs.
func parseSpans(w []uint64) ([]span, error) {
	if len(w)%2 != 0 {
		return nil, fmt.Errorf("mapext: malformed answer of %d words", len(w))
	}
	s := make([]span, 0, len(w)/2)
	for i := 0; i < len(w); i += 2 {
		s = append(s, span{int64(w[i]), int64(w[i+1])})
	}
	return s, nil
}

// objDiff is what an object's snap set says about it between snapshots s1
// and s2 (s1 < s2).
type objDiff struct {
	exists1, exists2 bool
	size1, size2     int64
	// changed is a superset of the bytes that differ between the object's
	// versions at s1 and s2, from the clone overlaps; exact within
	// [0, min(size1, size2)) when the object exists at both.
	changed []span
}

// diffSnapSet is librados' calc_snap_set_diff (src/librados/snap_set_diff.cc),
// which librbd's exact diff uses, restated: the object's existence and size
// at s1 and s2, and the union of the clone-to-next differences between the
// two versions. It fails, so that the caller falls back to librbd's extent,
// where calc_snap_set_diff answers "whole object" (a clone without
// snapshots).
func diffSnapSet(ss snapSet, s1, s2 uint64) (objDiff, error) {
	var d objDiff
	sawStart := false
	for i := 0; i < len(ss.clones); {
		r := ss.clones[i]
		// The clone stands for the snapshots [a, b]; the head for those
		// after the last the object saw.
		var a, b uint64
		switch {
		case r.id == snapHead:
			a, b = ss.seq+1, snapHead
		case len(r.snaps) == 0:
			return objDiff{}, fmt.Errorf("clone %d has no snapshots", r.id)
		default:
			a, b = r.snaps[0], r.snaps[len(r.snaps)-1]
		}
		if b < s1 {
			i++
			continue
		}
		if !sawStart {
			sawStart = true
			if s1 >= a {
				d.exists1, d.size1 = true, r.size
			}
		}
		if s2 < a { // the object did not exist at s2
			break
		}
		if s2 <= b {
			d.exists2, d.size2 = true, r.size
			break
		}
		// To the next version: everything up to the larger size, except
		// what the overlap says is unchanged.
		limit := r.size
		i++
		if i < len(ss.clones) {
			limit = max(limit, ss.clones[i].size)
		}
		d.changed = append(d.changed, subtract([]span{{0, limit}}, normalize(slices.Clone(r.overlap)))...)
	}
	d.changed = normalize(d.changed)
	return d, nil
}

// deltaInputs says which extent maps the delta of one object needs, given
// its objDiff: the object's own allocated extents at s1 and s2 (mapext),
// and what the image read from its parent at s1 and s2 where the object did
// not exist.
type deltaInputs struct{ own1, own2, parent1, parent2 bool }

func (d objDiff) needs() deltaInputs {
	var n deltaInputs
	switch {
	case d.exists1 && d.exists2:
		n.own1 = d.size1 > d.size2 // shrunk or truncated
		n.own2 = d.size2 > d.size1 // grown
	case d.exists2: // new since s1
		n.own2, n.parent1 = true, true
	case d.exists1: // gone since s1
		n.own1, n.parent2 = true, true
	default:
		n.parent1, n.parent2 = true, true
	}
	return n
}

// deltaSpans applies precise mode's rules for the bytes of one object that
// changed from s1 to s2. own1 and own2 are the object's allocated extents at
// s1 and s2, parent1 and parent2 what the image had from its parent chain
// in the object's range at s1 and s2 (nil where the image has no parent
// there); only those d.needs() asks for are used. Every argument is
// relative to the object. The result is normalized.
//
//   - exists at both: the clone-overlap difference within
//     [0, min(size1, size2)), exact there and the only way to see a discard
//     (it punches holes that allocated extents cannot show); plus the
//     allocated extents at s2 in [size1, size2) when the object grew, and
//     at s1 in [size2, size1) when it shrank or was truncated;
//   - new since s1: its allocated extents at s2, plus what the parent chain
//     had at s1 (the bytes the object now hides);
//   - gone since s1: its allocated extents at s1, plus what the parent
//     chain shows at s2;
//   - neither: whatever the parent chain had at either snapshot.
func deltaSpans(d objDiff, own1, own2, parent1, parent2 []span) []span {
	n := d.needs()
	var out []span
	if d.exists1 && d.exists2 {
		lo, hi := min(d.size1, d.size2), max(d.size1, d.size2)
		out = append(out, clip(d.changed, 0, lo)...)
		if n.own2 {
			out = append(out, clip(own2, lo, hi)...)
		}
		if n.own1 {
			out = append(out, clip(own1, lo, hi)...)
		}
		return normalize(out)
	}
	if n.own1 {
		out = append(out, clip(own1, 0, max(d.size1, 0))...)
	}
	if n.own2 {
		out = append(out, clip(own2, 0, max(d.size2, 0))...)
	}
	if n.parent1 {
		out = append(out, parent1...)
	}
	if n.parent2 {
		out = append(out, parent2...)
	}
	return normalize(out)
}

// withoutHoles returns changed (normalized, relative to an object that
// exists at both snapshots) without what lies below lo, the smaller of its
// two sizes, outside both own1 and own2, its allocated extents at s1 and
// s2: a hole at both reads as zeros at both, so it did not change. Clone
// overlaps count a discard of never-written bytes as a change.
func withoutHoles(changed, own1, own2 []span, lo int64) []span {
	data := normalize(append(clip(own1, 0, lo), clip(own2, 0, lo)...))
	holes := subtract([]span{{0, lo}}, data)
	return subtract(changed, holes)
}
