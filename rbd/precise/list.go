package precise

import (
	"context"
	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/rbd/internal/cepherr"
	"slices"
	"strconv"
	"strings"
)

// How precise mode finds the candidates of an image without a usable
// object map (Options.Walk): every object of the range is a candidate
// unless it is known to be absent at both snapshots.
const (
	// WalkAuto lists the pool when that is likely cheaper than probing
	// every object number (listRatio), and probes otherwise. The default.
	WalkAuto = ""
	// WalkList lists the objects of the pool's namespace (RADOS object
	// listing, rados_nobjects_list) and keeps those of the image: only
	// objects that exist are refined. It costs the pool's object count,
	// not the image's.
	WalkList = "list"
	// WalkProbe asks list_snaps of every object number of the range,
	// walkBatch at a time: it costs the image's size.
	WalkProbe = "probe"
	// WalkLibrbd leaves the walk to librbd's whole-object diff, which runs
	// list_snaps on every object one at a time: for comparison, and as an
	// escape hatch.
	WalkLibrbd = "librbd"
)

// listRatio is how many objects the pool may hold per object number of
// the walked range for WalkAuto to list rather than probe. Listing returns
// about a thousand names per OSD round trip, so a listed object costs a
// small fraction of a probed one (a list_snaps each); measured in the
// bench (docs/performance.md, "Without an object map").
const listRatio = 16

// Why listing finds every object a delta or allocated walk needs: an
// object that has a version at a snapshot keeps a head entry in its PG as
// long as that version lives: a real head, or, once the head is removed
// (a whole-object discard, a shrink) while clones remain, a "whiteout"
// head, and RADOS' listing returns whiteouts too (TestPreciseListing
// proves it on the real cluster: objects discarded whole and cut off by a
// shrink after a snapshot are listed). Objects that the listing may miss,
// those created while it runs, have no version at any snapshot taken
// before, so at neither s1 nor s2. Names may repeat when a PG splits
// during the listing: they are merged.

// walkRanges returns the raw ranges whose objects the walk over [off, end)
// takes as candidates, ascending and merged: all of it (WalkProbe), or the
// objects that the listing of the image's layers found, plus those that
// precise mode refines whatever exists (a delta's r.lostParent).
func (r *Refiner) walkRanges(ctx context.Context, off, end int64) ([]span, error) {
	all := []span{{off, end - off}}
	mode := r.walkMode
	if mode == WalkAuto {
		var err error
		if mode, err = r.chooseWalk(off, end); err != nil {
			if cepherr.Unanswered(err) {
				return nil, err
			}
			mode = WalkProbe // the pool's statistics refused: probe, as for a big pool
		}
	}
	r.mu.Lock()
	r.walkUsed = mode
	r.mu.Unlock()
	if mode != WalkList {
		return all, nil
	}
	rs, err := r.listRanges(ctx, off, end)
	if err != nil && ctx.Err() == nil && !cepherr.Unanswered(err) {
		// Listing refused (say, OSD caps without it) or failed: probing
		// finds the same objects, object by object.
		r.mu.Lock()
		r.walkUsed, r.listErr = WalkProbe, err.Error()
		r.mu.Unlock()
		return all, nil
	}
	return rs, err
}

// listRanges is walkRanges' WalkList.
func (r *Refiner) listRanges(ctx context.Context, off, end int64) ([]span, error) {
	var rs []span
	if r.base == nil {
		// Allocated: what the image holds, or reads from its parents
		// within the overlap.
		limit := end
		for l := r.top; l != nil && limit > 0; l = l.parent {
			objs, err := r.list(ctx, l)
			if err != nil {
				return nil, err
			}
			rs = append(rs, objectSpans(objs, l.objSize, limit)...)
			limit = min(limit, l.overlap)
		}
	} else {
		objs, err := r.list(ctx, r.top)
		if err != nil {
			return nil, err
		}
		rs = append(objectSpans(objs, r.top.objSize, end), r.lostParent)
	}
	return forcedRanges(r.top.objSize, off, end, rs), nil
}

// chooseWalk is WalkAuto's choice for the raw range [off, end): WalkList
// unless the pool holds more than listRatio objects per object number of
// the range, by the pool's statistics (which may lag; a parent in another
// pool is listed too, whatever its size).
//
// Implements (through go-ceph): rados_ioctx_pool_stat.
func (r *Refiner) chooseWalk(off, end int64) (string, error) {
	io, err := r.conn.OpenIOContext(r.top.pool)
	if err != nil {
		return "", cepherr.Wrap("open pool "+r.top.pool, err)
	}
	defer io.Destroy()
	st, err := io.GetPoolStats()
	if err != nil {
		return "", cepherr.Wrap("get the statistics of pool "+r.top.pool, err)
	}
	objects := (end-off+r.top.objSize-1)/r.top.objSize + 1
	if st.Num_objects > uint64(objects)*listRatio {
		return WalkProbe, nil
	}
	return WalkList, nil
}

// list returns the numbers of the data objects of layer l that its pool's
// namespace holds (heads and whiteouts, see above), ascending, each once.
//
// Implements (through go-ceph): rados_ioctx_create, rados_ioctx_set_namespace,
// rados_nobjects_list_open, rados_nobjects_list_next2,
// rados_nobjects_list_close.
func (r *Refiner) list(ctx context.Context, l *layer) ([]int64, error) {
	io, err := r.conn.OpenIOContext(l.pool)
	if err != nil {
		return nil, cepherr.Wrap("open pool "+l.pool, err)
	}
	defer io.Destroy()
	io.SetNamespace(l.ns)
	it, err := io.Iter()
	if err != nil {
		return nil, cepherr.Wrap("list the objects of pool "+l.pool, err)
	}
	defer it.Close()
	var objs []int64
	for n := 0; it.Next(); n++ {
		if n%4096 == 0 {
			if err := ctx.Err(); err != nil {
				return nil, err
			}
		}
		if o, ok := objectNumber(it.Value(), l.prefix, l.oldFormat); ok {
			objs = append(objs, o)
		}
	}
	if err := it.Err(); err != nil {
		return nil, cepherr.Wrap("list the objects of pool "+l.pool, err)
	}
	slices.Sort(objs)
	return slices.Compact(objs), nil
}

// objectNumber is the inverse of dataObject: the object number of name, if
// it is a data object of the image with the block name prefix prefix.
func objectNumber(name, prefix string, oldFormat bool) (int64, bool) {
	rest, ok := strings.CutPrefix(name, prefix+".")
	digits := 16
	if oldFormat {
		digits = 12
	}
	if !ok || len(rest) != digits {
		return 0, false
	}
	n, err := strconv.ParseUint(rest, 16, 63)
	if err != nil || dataObject(prefix, oldFormat, int64(n)) != name {
		return 0, false
	}
	return int64(n), true
}

// objectSpans returns the raw ranges of the objects objs (ascending) of
// size objSize, below limit, adjacent ones merged.
func objectSpans(objs []int64, objSize, limit int64) []span {
	var out []span
	for _, o := range objs {
		s := span{o * objSize, objSize}
		if s.off >= limit {
			break
		}
		if n := len(out); n > 0 && out[n-1].end() == s.off {
			out[n-1].len += objSize
			continue
		}
		out = append(out, s)
	}
	return out
}
