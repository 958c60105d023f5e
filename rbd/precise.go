package rbd

// Precise mode (Options.Precise) reports the bytes that really changed,
// where librbd reports whole objects or ranges far larger than the change.
// It has three stages, all within the one librbd diff-iterate of an
// Iterate call:
//
//  1. candidates: librbd's whole-object diff-iterate, which with fast-diff
//     reads only the object maps, names the objects that hold data at the
//     target snapshot (allocated) or that may have changed (delta). For a
//     delta these are, by default, the objects that exist at the base or
//     at the target snapshot (two whole-object diffs from the beginning,
//     reading the maps' existence bits); with Options.TrustObjectMap, the
//     objects the maps mark dirty between the two. Dirty bits are cheaper,
//     since they follow the change, not the data, but librbd leaves them
//     clean on changed objects after `rbd snap rollback` (it copies the
//     snapshot's object map, clean bits included, over the head's) and
//     when a copy-on-read copy-up races a write; existence stays right in
//     both cases, and list_snaps then decides exactly. Objects whose
//     parent data the target lost (the parent overlap shrank) and those a
//     shrink between the snapshots cut off are refined in either case;
//     An image without a usable object map (no fast-diff, as Ceph-CSI's
//     and Rook's example StorageClasses make them, or a map flagged
//     invalid) has no cheap stage 1: librbd's whole-object diff would run
//     list_snaps on every object, one at a time. There every object of
//     the range is a candidate instead (refiner.walk, pipeline.walk),
//     refined preciseWalkWindow at a time; one that exists at neither
//     snapshot costs one list_snaps (ENOENT) and yields nothing, unless
//     the target lost parent data there;
//  2. refinement: each candidate is refined with RADOS queries on its
//     data object (<block name prefix>.<object number>, in the image's
//     data pool when it has one, in the image's namespace): list_snaps
//     (existence, size and clone overlap per snapshot) and mapext
//     (allocated extents at a snapshot, without data), up to
//     preciseWindow objects at once, by the rules of precise_rules.go; a
//     clone's object that does not exist takes its parent's extents at the
//     parent snapshot, within the overlap, up the chain. An erasure-coded
//     data pool refuses mapext: there the extents come from per-4 KiB
//     checksums instead (precise_extents.go). Where a clone's object may
//     hold a copy of its parent's data, the same checksums tell the copy
//     from the change (precise_copyup.go);
//  3. delivery: refined extents reach Iterate's callback in image order,
//     through a bounded window (precise_pipeline.go), with the same
//     guarantees as the other modes.
//
// Refinement falls back to librbd's answer whenever it cannot be trusted:
// per object, on any error, to the candidate's whole-object extent; per
// image, to librbd's exact diff, when the image (or a parent) stripes
// objects in a non-default way or looks encrypted by librbd (a LUKS header
// without Ceph-CSI's encryption metadata). mapext returns no data, so a
// dense object costs no more than a sparse one; checksums cost the OSD a
// read of the object.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/rbd/internal/cepherr"
	"maps"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/ceph/go-ceph/rados"
	librbd "github.com/ceph/go-ceph/rbd"
)

const (
	// preciseWindow is how many objects are refined at once: each holds
	// an OS thread in a synchronous librados call for about 0.1-0.3 ms
	// (maxRefining bounds them across streams). 32 refined a 10 TiB
	// image's 52,000 candidates 1.29× faster than 16 in the same bench
	// run (medians of 5, noisy: README, Performance).
	preciseWindow = 32
	// preciseWalkWindow is the same when every object is a candidate
	// (refiner.walk): most answer ENOENT or need one list_snaps, so more
	// in flight keep the OSD busy; maxRefining still bounds the process.
	preciseWalkWindow = 32
	// walkBatch is how many objects one candidate of a delta's walk
	// holds: their list_snaps go out together (rsm_list_snaps_batch, one
	// cgo call and one OS thread), and walkDeltaWindow candidates run at
	// once: walkBatch*walkDeltaWindow list_snaps in flight.
	walkBatch       = 16
	walkDeltaWindow = 2
	// maxParentDepth bounds the clone chain precise mode follows.
	maxParentDepth = 16
)

// PreciseStats describes the precise refinement of a Diff's iterations.
type PreciseStats struct {
	// On is set when precise mode was asked for.
	On bool
	// Candidates says where a delta's candidates come from: "existence"
	// or "object map" (see the package comment); for an image without a
	// usable object map (allocated too), "listing" when the walk took the
	// objects that RADOS' listing found, "walk" when it probed every
	// object number (see precise_list.go); empty otherwise.
	Candidates string
	// Unrefined says why the Diff runs librbd's exact diff instead of
	// precise mode, UnrefinedReason the same as one of the Reason
	// constants; both empty when it refines (or precise mode is off).
	Unrefined, UnrefinedReason string
	// Objects counts the candidate objects refined, Fallbacks those
	// reported whole because refining failed, FallbackReasons those by
	// Reason; LastFallback is the error of the last of these.
	Objects, Fallbacks int64
	// Checksummed counts the object queries answered by checksums
	// because the pool refused mapext (an erasure-coded data pool).
	Checksummed     int64
	FallbackReasons map[string]int64
	LastFallback    string
}

// Reasons why precise mode fell back, short enough for a metric label:
// for a whole image (to librbd's exact diff) or for one object (to its
// whole-object extent).
const (
	ReasonStriping   = "striping"    // image: non-default striping
	ReasonEncrypted  = "encrypted"   // image: librbd-level encryption
	ReasonCloneDepth = "clone-depth" // image: a clone chain too deep
	ReasonError      = "error"       // image or object: a query failed
	ReasonListSnaps  = "list-snaps"  // object: list_snaps failed
	ReasonMapext     = "mapext"      // object: mapext failed
	ReasonChecksum   = "checksum"    // object: hashing its chunks failed
	ReasonSnapSet    = "snap-set"    // object: a snap set precise mode cannot read
	ReasonPanic      = "panic"       // object: refining panicked
)

// reasoned is an error with its Reason.
type reasoned struct {
	reason string
	err    error
}

func (r reasoned) Error() string { return r.err.Error() }
func (r reasoned) Unwrap() error { return r.err }

// reasonOf returns err's Reason, ReasonError when it has none.
func reasonOf(err error) string {
	if r, ok := errors.AsType[reasoned](err); ok {
		return r.reason
	}
	var u unrefinable
	if errors.As(err, &u) {
		return u.reason
	}
	return ReasonError
}

// refiner holds what a Diff needs to refine candidates: the image's layers
// at the target (and base) snapshot, each with an ioctx reading at its
// snapshot, and one reading the snap sets.
type refiner struct {
	unrefined, reason string // why not; when set, nothing else is

	top  *layer           // the image at the target snapshot
	base *layer           // the image at the base snapshot; nil: allocated
	dir  *rados.IOContext // the image's pool at snapDir; nil: allocated
	s1   uint64
	s2   uint64
	// shrunk is the raw range [lo, hi) that a snapshot between s1 and s2
	// cut off and both s1 and s2 have: librbd's object map diff (reef
	// 18.2.7) can miss the objects there, so they are always refined.
	shrunk span
	// lostParent is the raw range where s1 read parent data and s2, whose
	// parent overlap is smaller, reads zeros (or its own objects): the
	// object maps say nothing of it, so it is always refined.
	lostParent span
	// existence: a delta's candidates are the objects that exist at s1
	// or s2 (see the package comment), not the object map's dirty ones.
	existence bool
	// walk: the image has no usable object map (no fast-diff, or a map
	// flagged invalid), so librbd's whole-object diff would run
	// list_snaps on every object, one at a time. Every object is a
	// candidate instead, walked by the pipeline preciseWalkWindow at a
	// time (see pipeline.walk).
	walk bool
	// walkMode is Options.Walk; walked what the last walk did (WalkList
	// or WalkProbe).
	walkMode, walked string
	listErr          string // why WalkList probed instead

	conn   *rados.Conn
	ioctxs []*rados.IOContext
	// queries has one dataQuery per data pool, by name.
	queries map[string]*dataQuery
	// dataPools has the data pool of each image with one, by pool,
	// namespace and image ID: the base and target layers share it.
	dataPools map[[3]string]string

	objects, fallbacks, summed atomic.Int64
	mu                         sync.Mutex
	lastFallback               string
	reasons                    map[string]int64
}

// layer is an image at one snapshot, as precise mode reads it: an object
// that does not exist there reads from the parent layer within overlap.
type layer struct {
	ioctx     *rados.IOContext // the data pool, reading at the layer's snapshot
	pool, ns  string           // where the image's data objects are: its pool or its data pool
	data      *dataQuery       // how the data pool says where data lies
	prefix    string           // the image's block name prefix
	oldFormat bool             // a format 1 image
	objSize   int64
	overlap   int64 // bytes backed by parent
	parent    *layer
}

func (l *layer) object(objno int64) string { return dataObject(l.prefix, l.oldFormat, objno) }

// dataObject is the name of data object objno of an image with the block
// name prefix prefix (rbd_data.<image id> in format 2, rb.0.<...> in
// format 1), as librbd's util::data_object_name forms it: 12 hex digits in
// format 1, 16 in format 2.
func dataObject(prefix string, oldFormat bool, objno int64) string {
	if oldFormat {
		return fmt.Sprintf("%s.%012x", prefix, objno)
	}
	return fmt.Sprintf("%s.%016x", prefix, objno)
}

// unrefinable is a reason to run librbd's exact diff instead.
type unrefinable struct{ reason, msg string }

func (u unrefinable) Error() string { return u.msg }

// usable reports whether Iterate refines; false for a nil refiner.
func (r *refiner) usable() bool { return r != nil && r.unrefined == "" }

// walks reports whether Iterate walks every object (refiner.walk).
func (r *refiner) walks() bool { return r.usable() && r.walk }

// byExistence reports whether Iterate takes a delta's candidates from
// object existence.
func (r *refiner) byExistence() bool { return r.usable() && r.existence }

// openPrecise prepares precise mode after open: the image at its target
// snapshot, and at the base snapshot for a delta. When the image cannot be
// refined, or preparing fails, the Diff runs librbd's exact diff and
// PreciseStats says why. d.image is left at the target snapshot; failing
// to put it back there is the only error.
//
// Implements (through go-ceph): rbd_stat, rbd_get_stripe_unit,
// rbd_get_stripe_count, rbd_get_features, rbd_get_old_format, rbd_get_parent,
// rbd_get_overlap, rbd_open_by_id_read_only, rbd_snap_set_by_id, rbd_read,
// rados_ioctx_create, rados_ioctx_snap_set_read.
func (d *Diff) openPrecise() error {
	r := &refiner{s2: d.target.snapID, conn: d.cc.Rados(), walkMode: d.walk}
	d.refine = r
	err := r.open(d)
	if err != nil {
		r.close()
		d.refine = &refiner{unrefined: err.Error(), reason: reasonOf(err)}
		d.whole = false
	} else {
		d.whole = true // stage 1 is the whole-object diff
	}
	if d.base != nil {
		if err := d.image.SetSnapByID(d.target.snapID); err != nil {
			return cepherr.Wrap("set image to snapshot "+d.target.String(), err)
		}
	}
	return nil
}

func (r *refiner) open(d *Diff) error {
	conn := d.cc.Rados()
	if d.header == 0 {
		magic := make([]byte, 6)
		if n, _ := d.image.ReadAt(magic, 0); n == len(magic) &&
			(bytes.Equal(magic, []byte("LUKS\xba\xbe")) || bytes.HasPrefix(magic, []byte("RBDL"))) {
			return unrefinable{ReasonEncrypted, "the image looks encrypted by librbd (a LUKS header without Ceph-CSI's encryption metadata)"}
		}
	}
	t := d.target
	var err error
	if r.top, err = r.layer(conn, t.pool, t.namespace, d.image, t.snapID, 0); err != nil {
		return err
	}
	if d.walk != WalkLibrbd {
		if r.walk, err = d.noObjectMap(); err != nil {
			return err
		}
	}
	if d.base == nil {
		return nil
	}
	r.s1 = d.base.snapID
	if err := d.image.SetSnapByID(r.s1); err != nil {
		return cepherr.Wrap("set image to snapshot "+d.base.String(), err)
	}
	if r.base, err = r.layer(conn, t.pool, t.namespace, d.image, r.s1, 0); err != nil {
		return err
	}
	lo, hi, err := d.cutOff()
	if err != nil {
		return err
	}
	r.shrunk = span{lo, hi - lo}
	if ov1, ov2 := r.base.overlap, r.top.overlap; ov2 < ov1 {
		r.lostParent = span{ov2, min(ov1, d.capacity+d.header) - ov2}
	}
	if !d.trustObjectMap && !r.walk {
		// Without fast-diff, librbd's whole-object diff runs list_snaps on
		// every object: exact already, and existence would only cost more.
		features, err := d.image.GetFeatures()
		if err != nil {
			return cepherr.Wrap("get features", err)
		}
		r.existence = features&librbd.FeatureFastDiff != 0
	}
	if r.dir, err = r.ioctx(conn, r.top.pool, t.namespace, snapDir); err != nil {
		return err
	}
	return nil
}

// ioctx opens an ioctx reading at snap, closed with the refiner.
func (r *refiner) ioctx(conn *rados.Conn, pool, ns string, snap uint64) (*rados.IOContext, error) {
	ioctx, err := conn.OpenIOContext(pool)
	if err != nil {
		return nil, cepherr.Wrap("open pool "+pool, err)
	}
	r.ioctxs = append(r.ioctxs, ioctx)
	ioctx.SetNamespace(ns)
	if err := ioctx.SetReadSnap(rados.SnapID(snap)); err != nil {
		return nil, cepherr.Wrap("set read snapshot", err)
	}
	return ioctx, nil
}

// layer describes img, set to snapshot snap, and its parents.
func (r *refiner) layer(conn *rados.Conn, pool, ns string, img *librbd.Image, snap uint64, depth int) (*layer, error) {
	st, err := img.Stat()
	if err != nil {
		return nil, cepherr.Wrap("stat image", err)
	}
	su, err := img.GetStripeUnit()
	if err != nil {
		return nil, cepherr.Wrap("get stripe unit", err)
	}
	sc, err := img.GetStripeCount()
	if err != nil {
		return nil, cepherr.Wrap("get stripe count", err)
	}
	// With one object per stripe, the stripe unit does not matter: byte b
	// of the image is in object b / object size (a clone inherits its
	// parent's stripe unit, which can be smaller than its objects).
	if st.Obj_size == 0 || su == 0 || st.Obj_size%su != 0 || sc != 1 {
		return nil, unrefinable{ReasonStriping, fmt.Sprintf("non-default striping (object size %d, stripe unit %d, stripe count %d)", st.Obj_size, su, sc)}
	}
	features, err := img.GetFeatures()
	if err != nil {
		return nil, cepherr.Wrap("get features", err)
	}
	dataPool := pool
	if features&librbd.FeatureDataPool != 0 {
		// Ceph-CSI's dataPool: the header here, the data objects in
		// the data pool (nearly always erasure-coded), same namespace.
		if dataPool, err = r.dataPool(conn, pool, ns, img); err != nil {
			return nil, err
		}
	}
	ioctx, err := r.ioctx(conn, dataPool, ns, snap)
	if err != nil {
		return nil, err
	}
	old, err := img.IsOldFormat()
	if err != nil {
		return nil, cepherr.Wrap("get image format", err)
	}
	l := &layer{ioctx: ioctx, pool: dataPool, ns: ns, data: r.query(dataPool), prefix: st.Block_name_prefix, oldFormat: old, objSize: int64(st.Obj_size)}

	parent, err := img.GetParent()
	if errors.Is(err, librbd.ErrNotFound) {
		return l, nil
	}
	if err != nil {
		return nil, cepherr.Wrap("get parent", err)
	}
	overlap, err := img.GetOverlap()
	if err != nil {
		return nil, cepherr.Wrap("get parent overlap", err)
	}
	if overlap == 0 {
		return l, nil
	}
	if depth >= maxParentDepth {
		return nil, unrefinable{ReasonCloneDepth, fmt.Sprintf("a clone chain deeper than %d", maxParentDepth)}
	}
	pi := parent.Image
	pio, err := conn.OpenIOContext(pi.PoolName)
	if err != nil {
		return nil, cepherr.Wrap("open parent pool "+pi.PoolName, err)
	}
	defer pio.Destroy()
	pio.SetNamespace(pi.PoolNamespace)
	pimg, err := librbd.OpenImageByIdReadOnly(pio, pi.ImageID, librbd.NoSnapshot)
	if err != nil {
		return nil, cepherr.Wrap("open parent image "+pi.ImageName, err)
	}
	defer pimg.Close()
	if err := pimg.SetSnapByID(parent.Snap.ID); err != nil {
		return nil, cepherr.Wrap(fmt.Sprintf("set parent image %s to snapshot %d", pi.ImageName, parent.Snap.ID), err)
	}
	if l.parent, err = r.layer(conn, pi.PoolName, pi.PoolNamespace, pimg, parent.Snap.ID, depth+1); err != nil {
		return nil, err
	}
	l.overlap = int64(overlap)
	return l, nil
}

// dataPool returns the name of the data pool of img, in pool and ns.
func (r *refiner) dataPool(conn *rados.Conn, pool, ns string, img *librbd.Image) (string, error) {
	imageID, err := img.GetId()
	if err != nil {
		return "", cepherr.Wrap("get image id", err)
	}
	key := [3]string{pool, ns, imageID}
	if name, ok := r.dataPools[key]; ok {
		return name, nil
	}
	hio, err := conn.OpenIOContext(pool)
	if err != nil {
		return "", cepherr.Wrap("open pool "+pool, err)
	}
	hio.SetNamespace(ns)
	id, err := dataPoolID(hio, imageID)
	hio.Destroy()
	if err != nil {
		return "", cepherr.Wrap("get data pool", err)
	}
	name, err := conn.GetPoolByID(id)
	if err != nil {
		return "", cepherr.Wrap(fmt.Sprintf("look up data pool %d", id), err)
	}
	if r.dataPools == nil {
		r.dataPools = map[[3]string]string{}
	}
	r.dataPools[key] = name
	return name, nil
}

// query returns the dataQuery of pool, made on first use.
func (r *refiner) query(pool string) *dataQuery {
	if r.queries == nil {
		r.queries = map[string]*dataQuery{}
	}
	q := r.queries[pool]
	if q == nil {
		q = &dataQuery{summed: &r.summed}
		r.queries[pool] = q
	}
	return q
}

// close destroys the refiner's ioctxs. Iterate, which holds the Diff's
// lock, has waited for every query by then.
func (r *refiner) close() {
	if r == nil {
		return
	}
	for _, io := range r.ioctxs {
		io.Destroy()
	}
	r.ioctxs = nil
}

// pipeline returns the pipeline of one Iterate call over the raw range
// [off, off+length), delivering to emit. existing are the raw ranges of
// the objects that exist at s1, when candidates come from existence.
func (r *refiner) pipeline(ctx context.Context, off, length uint64, existing []span, emit librbd.DiffIterateCallback) *pipeline {
	refine := r.allocated
	if r.base != nil {
		refine = r.delta
	}
	skipGone := r.base == nil || r.existence // gone at s2: a candidate only if it existed at s1
	if r.walk {
		// Every object is a candidate: nothing to force.
		p := newPipeline(ctx, r.top.objSize, preciseWalkWindow, skipGone, refine, emit, r.fellBack)
		if r.base != nil {
			p.refine, p.batch, p.width = r.walkDelta, walkBatch, walkDeltaWindow
		}
		return p
	}
	p := newPipeline(ctx, r.top.objSize, preciseWindow, skipGone, refine, emit, r.fellBack)
	p.forced = forcedRanges(r.top.objSize, int64(off), int64(off+length), append([]span{r.shrunk, r.lostParent}, existing...))
	if r.existence && r.base != nil {
		p.before, p.hasBefore = forcedRanges(r.top.objSize, int64(off), int64(off+length), existing), true
	}
	return p
}

// forcedRanges returns the ranges in which every object is refined,
// whether librbd names it or not: rs rounded out to whole objects of size
// objSize, clipped to [lo, hi), merged and ascending.
func forcedRanges(objSize, lo, hi int64, rs []span) []span {
	var out []span
	for _, s := range rs {
		if s.len <= 0 {
			continue
		}
		o := max(lo, s.off-s.off%objSize)
		e := min(hi, (s.end()+objSize-1)/objSize*objSize)
		if o < e {
			out = append(out, span{o, e - o})
		}
	}
	return normalize(out)
}

func (r *refiner) fellBack(err error) {
	r.fallbacks.Add(1)
	r.mu.Lock()
	r.lastFallback = err.Error()
	if r.reasons == nil {
		r.reasons = map[string]int64{}
	}
	r.reasons[reasonOf(err)]++
	r.mu.Unlock()
}

func (r *refiner) stats() PreciseStats {
	if r == nil {
		return PreciseStats{}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	st := PreciseStats{On: true, Unrefined: r.unrefined, UnrefinedReason: r.reason,
		Objects: r.objects.Load(), Fallbacks: r.fallbacks.Load(), Checksummed: r.summed.Load(), LastFallback: r.lastFallback,
		FallbackReasons: maps.Clone(r.reasons)}
	if r.usable() && r.base != nil {
		st.Candidates = "object map"
		if r.existence {
			st.Candidates = "existence"
		}
	}
	if r.usable() && r.walk {
		st.Candidates = "walk"
		if r.walked == WalkList {
			st.Candidates = "listing"
		}
		if r.listErr != "" {
			st.LastFallback = "listing the pool's objects: " + r.listErr
		}
	}
	return st
}

// PreciseStats describes precise mode's work on this Diff so far.
func (d *Diff) PreciseStats() PreciseStats {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.refine.stats()
}

// isNoEnt reports whether a radospp call found no such object.
func isNoEnt(err error) bool {
	var e radosErr
	return errors.As(err, &e) && e == -radosErr(syscall.ENOENT)
}

// allocated refines an allocated candidate: the data the image holds in
// it at the target snapshot, from its parents where its object is missing.
func (r *refiner) allocated(ctx context.Context, c candidate) ([]span, error) {
	r.objects.Add(1)
	return r.top.view(ctx, c.off, c.off+c.len)
}

// view returns the allocated extents of the layer in [off, end), image
// offsets.
func (l *layer) view(ctx context.Context, off, end int64) ([]span, error) {
	var out []span
	err := l.eachObject(ctx, off, end, func(o, oe, base int64, name string) error {
		ext, err := l.data.extents(l.ioctx, name, o-base, oe-o, -1)
		switch {
		case isNoEnt(err):
			p, err := l.parentView(ctx, o, oe)
			if err != nil {
				return err
			}
			out = append(out, p...)
		case err != nil:
			return err
		default:
			ext = clip(shift(ext, base), o, oe)
			if l.underParent(base) && !l.data.noMapext.Load() && spanBytes(ext) > copyUpDense {
				// Maybe copied up densely: leave its zeros out (checksums
				// already did, where the pool refuses mapext).
				if ext, err = l.withoutZeros(ctx, ext); err != nil {
					return err
				}
			}
			out = append(out, ext...)
		}
		return nil
	})
	return out, err
}

// eachObject calls fn for each of the layer's objects that [off, end)
// (image offsets) meets: the part [o, oe) of the range in it, where it
// starts, and its name.
func (l *layer) eachObject(ctx context.Context, off, end int64, fn func(o, oe, base int64, name string) error) error {
	for o := off; o < end; {
		if err := ctx.Err(); err != nil {
			return err
		}
		base := o - o%l.objSize
		oe := min(end, base+l.objSize)
		if err := fn(o, oe, base, l.object(base/l.objSize)); err != nil {
			return err
		}
		o = oe
	}
	return nil
}

// parentView returns what the layer reads from its parent chain in
// [off, end), image offsets: nothing beyond the overlap.
func (l *layer) parentView(ctx context.Context, off, end int64) ([]span, error) {
	if l.parent == nil || off >= l.overlap {
		return nil, nil
	}
	return l.parent.view(ctx, off, min(end, l.overlap))
}

// delta refines a delta candidate by the rules of deltaSpans.
func (r *refiner) delta(ctx context.Context, c candidate) ([]span, error) {
	r.objects.Add(1)
	objno := c.off / r.top.objSize
	name := r.top.object(objno)
	if c.fresh {
		out, err := r.freshDelta(ctx, objno, name)
		if !isNoEnt(err) {
			return out, err
		}
	}
	ss, err := listSnaps(r.dir, name)
	return r.deltaOf(ctx, objno, name, ss, err, false)
}

// freshDelta is the delta of an object that the object maps say is new
// since the base snapshot (candidate.fresh), with one query instead of
// two: its allocated extents at the target (deltaSpans' rule for an
// object new since s1 without parent data, which list_snaps would only
// confirm). The maps' existence bits are what the candidates come from
// anyway; an object in a range where they may be wrong (r.shrunk,
// r.lostParent) takes the full path, and so does one that mapext does not
// find at the target (it returns that ENOENT), and one within the base's
// parent overlap, whose parent data the full path weighs.
func (r *refiner) freshDelta(ctx context.Context, objno int64, name string) ([]span, error) {
	size := r.top.objSize
	base := objno * size
	obj := span{base, size}
	if r.shrunk.overlaps(obj) || r.lostParent.overlaps(obj) || (r.base.parent != nil && base < r.base.overlap) {
		return nil, radosErr(-int(syscall.ENOENT))
	}
	own2, err := r.top.data.extents(r.top.ioctx, name, 0, size, -1)
	if isNoEnt(err) {
		return nil, err
	}
	if err != nil {
		return nil, fmt.Errorf("at snapshot %d: %w", r.s2, err)
	}
	return normalize(shift(own2, base)), nil
}

// walkDelta refines a delta candidate of the walk: up to walkBatch whole
// objects, whose snap sets one rsm_list_snaps_batch call asks for all at
// once. An object that the image itself has at neither snapshot (most
// answer ENOENT) changed nowhere, since where it is absent the image reads
// its parent's snapshot, which does not change, except where the target
// lost parent data (r.lostParent). An object whose refinement fails falls
// back to its whole extent, alone; a timeout fails the candidate.
func (r *refiner) walkDelta(ctx context.Context, c candidate) ([]span, error) {
	size := r.top.objSize
	objs := c.objs
	if objs == nil {
		for o := c.off / size; o <= (c.off+c.len-1)/size; o++ {
			objs = append(objs, o)
		}
	}
	names := make([]string, 0, len(objs))
	for _, o := range objs {
		names = append(names, r.top.object(o))
	}
	sss, errs, err := listSnapsBatch(r.dir, names)
	if err != nil {
		return nil, reasoned{ReasonListSnaps, fmt.Errorf("list_snaps %s and %d more: %w", names[0], len(names)-1, err)}
	}
	r.objects.Add(int64(len(names)))
	var out []span
	for i, name := range names {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		objno := objs[i]
		s, err := r.deltaOf(ctx, objno, name, sss[i], errs[i], true)
		if err != nil {
			if cepherr.Unanswered(err) || ctx.Err() != nil {
				return nil, err
			}
			r.fellBack(cepherr.Classify(err))
			s = []span{{objno * size, size}}
		}
		out = append(out, s...)
	}
	return out, nil
}

// deltaOf refines object objno, named name, from its snap set ss (or the
// error of list_snaps); walk: as walkDelta says.
func (r *refiner) deltaOf(ctx context.Context, objno int64, name string, ss snapSet, err error, walk bool) ([]span, error) {
	size := r.top.objSize
	base := objno * size
	switch {
	case isNoEnt(err):
		// No version at all, so none at s1 or s2 (one that existed at a
		// snapshot lives on as a clone): nothing changed in the object,
		// as librbd's exact diff also concludes. The object map can
		// still list it, when it lived only between two snapshots.
		ss = snapSet{}
	case err != nil:
		return nil, reasoned{ReasonListSnaps, fmt.Errorf("list_snaps %s: %w", name, err)}
	}
	od, err := diffSnapSet(ss, r.s1, r.s2)
	if err != nil {
		return nil, reasoned{ReasonSnapSet, fmt.Errorf("object %s: %w", name, err)}
	}
	if walk && !od.exists1 && !od.exists2 && !r.lostParent.overlaps(span{base, size}) {
		return nil, nil
	}
	n := od.needs()
	// A large change inside an object that exists at both snapshots is
	// most often a discard: keep only what is data at one of them.
	holes := od.exists1 && od.exists2 && spanBytes(clip(od.changed, 0, min(od.size1, od.size2))) > copyUpDense
	if holes {
		n.own1, n.own2 = true, true
	}
	var own1, own2, parent1, parent2 []span
	// Where the object grew or shrank, only [min, max) of its two sizes
	// is read: the overlap diff answers below.
	lo := int64(0)
	if od.exists1 && od.exists2 && !holes {
		lo = min(od.size1, od.size2)
	}
	if n.own1 {
		if own1, err = r.base.data.extents(r.base.ioctx, name, lo, size-lo, od.size1); err != nil {
			return nil, fmt.Errorf("at snapshot %d: %w", r.s1, err)
		}
	}
	if n.own2 {
		if own2, err = r.top.data.extents(r.top.ioctx, name, lo, size-lo, od.size2); err != nil {
			return nil, fmt.Errorf("at snapshot %d: %w", r.s2, err)
		}
	}
	if n.parent1 {
		if parent1, err = r.base.parentView(ctx, base, base+size); err != nil {
			return nil, err
		}
	}
	if n.parent2 {
		if parent2, err = r.top.parentView(ctx, base, base+size); err != nil {
			return nil, err
		}
	}
	changed := deltaSpans(od, own1, own2, shift(parent1, -base), shift(parent2, -base))
	if holes {
		changed = withoutHoles(changed, own1, own2, min(od.size1, od.size2))
	}
	changed = shift(changed, base)
	if len(changed) > 0 && (!(od.exists1 && od.exists2) || holes) && (r.base.underParent(base) || r.top.underParent(base)) {
		// The object hides parent data at one snapshot, maybe a copy of
		// it, or a large change hit one that a copy-up filled with zeros
		// (precise_copyup.go): compare the content.
		return r.changedChunks(ctx, changed)
	}
	return changed, nil
}
