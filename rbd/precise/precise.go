// Package precise is precise mode (rbd.Options.Precise): it reports the
// bytes that really changed, where librbd reports whole objects or ranges
// far larger than the change.
//
// It has one door. rbd hands Open the image as plain values (Image) and
// gets a Refiner, which opens read-only handles of its own; Open never
// fails: a Refiner that cannot refine says why (Refines, Refinement), and
// rbd runs librbd's exact diff instead. Refiner.Iterate asks librbd for
// what it needs only through the ObjectScanner it is given (librbd's
// whole-object diffs), and delivers the refined extents to one emit function. Refinement
// counts its work, in the type that the driver reports and metrics counts
// (internal/report); Close releases its handles. It imports nothing of
// rbd.
//
// It has three stages, within an Iterate call:
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
//     the range is a candidate instead (Refiner.unmapped, pipeline.every),
//     refined preciseWalkWindow at a time; one that exists at neither
//     snapshot costs one list_snaps (ENOENT) and yields nothing, unless
//     the target lost parent data there;
//  2. refinement: each candidate is refined with RADOS queries on its
//     data object (<block name prefix>.<object number>, in the image's
//     data pool when it has one, in the image's namespace): list_snaps
//     (existence, size and clone overlap per snapshot) and mapext
//     (allocated extents at a snapshot, without data), up to
//     preciseWindow objects at once, by the rules of rules.go; a
//     clone's object that does not exist takes its parent's extents at the
//     parent snapshot, within the overlap, up the chain. An erasure-coded
//     data pool refuses mapext: there the extents come from per-4 KiB
//     checksums instead (extents.go). Where a clone's object may
//     hold a copy of its parent's data, the same checksums tell the copy
//     from the change (copyup.go);
//  3. delivery: refined extents reach Iterate's callback in image order,
//     through a bounded window (pipeline.go), with the same
//     guarantees as the other modes.
//
// Refinement falls back to librbd's answer whenever it cannot be trusted:
// per object, on any error, to the candidate's whole-object extent; per
// image, to librbd's exact diff, when the image (or a parent) stripes
// objects in a non-default way or looks encrypted by librbd (a LUKS header
// without Ceph-CSI's encryption metadata). mapext returns no data, so a
// dense object costs no more than a sparse one; checksums cost the OSD a
// read of the object.
package precise

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"sync"
	"sync/atomic"

	"github.com/ceph/go-ceph/rados"
	librbd "github.com/ceph/go-ceph/rbd"

	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/internal/report"
	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/rbd/internal/cepherr"
)

const (
	// preciseWindow is how many objects are refined at once: each holds
	// an OS thread in a synchronous librados call for about 0.1-0.3 ms
	// (maxRefining bounds them across streams). 32 refined a 10 TiB
	// image's 52,000 candidates 1.29× faster than 16 in the same bench
	// run (medians of 5, noisy: CHANGELOG.md, 2026-12-01).
	preciseWindow = 32
	// preciseWalkWindow is the same when every object is a candidate
	// (Refiner.unmapped): most answer ENOENT or need one list_snaps, so more
	// in flight keep the OSD busy; maxRefining still bounds the process.
	preciseWalkWindow = 32
	// walkBatch is how many objects one candidate of a delta's walk
	// holds: their list_snaps go out together (rsm_list_snaps_batch, one
	// cgo call and one OS thread), and walkDeltaWindow candidates run at
	// once: walkBatch*walkDeltaWindow list_snaps in flight.
	walkBatch       = 16
	walkDeltaWindow = 2
)

// Reasons why precise mode fell back, short enough for a metric label:
// for a whole image (to librbd's exact diff: report.Refinement's
// ImageFallback) or for one object (to its whole-object extent: the keys
// of ObjectFallbacks).
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

// Refiner holds what a Diff needs to refine candidates: the image's layers
// at the target (and base) snapshot, each with an ioctx reading at its
// snapshot, and one reading the snap sets.
type Refiner struct {
	// imageFallback is why the image is not refined, one of the Reason
	// constants, imageFallbackDetail the whole error; when set, nothing
	// else is.
	imageFallback, imageFallbackDetail string

	// refineHook, when set, refines every candidate instead of the
	// RADOS queries of the mode: tests watch the candidates with it.
	refineHook func(context.Context, candidate) ([]span, error)

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
	// unmapped: the image has no usable object map (no fast-diff, or a map
	// flagged invalid), so librbd's whole-object diff would run
	// list_snaps on every object, one at a time. Every object is a
	// candidate instead, walked by the pipeline preciseWalkWindow at a
	// time (see pipeline.every).
	unmapped bool
	// walkMode is Options.Walk; walkUsed what the last walk did (WalkList
	// or WalkProbe).
	walkMode, walkUsed string
	listErr            string // why WalkList probed instead

	conn   *rados.Conn
	ioctxs []*rados.IOContext
	// queries has one dataQuery per data pool, by name.
	queries map[string]*dataQuery

	objects, summed    atomic.Int64
	mu                 sync.Mutex
	lastObjectFallback string
	objectFallbacks    map[string]int64 // by Reason
}

// unrefinable is a reason to run librbd's exact diff instead.
type unrefinable struct{ reason, msg string }

func (u unrefinable) Error() string { return u.msg }

// Refines reports whether Iterate may be called: false when the image
// cannot be refined (Refinement says why) and for a nil Refiner.
func (r *Refiner) Refines() bool { return r != nil && r.imageFallbackDetail == "" }

// Image is the image that precise mode refines, as plain values: Open
// opens read-only handles of its own.
type Image struct {
	Conn            *rados.Conn
	Pool, Namespace string
	// ID is the image's ID; a format 1 image has none and is opened by
	// Name.
	ID, Name string
	// Spec names the image in messages: pool[/namespace]/image.
	Spec string
	// Target and Base are snapshot IDs; Base is 0 for allocated extents.
	Target, Base uint64
	// Size is the size of the target snapshot in bytes, LUKS header
	// included.
	Size int64
	// Header is the LUKS header before the user's data of a Ceph-CSI
	// encrypted volume; 0 when there is none.
	Header int64
	// LibrbdEncrypted: the image starts with a LUKS or librbd encryption
	// header without Ceph-CSI's encryption metadata.
	LibrbdEncrypted bool
	// Shrunk is the range [Shrunk[0], Shrunk[1]) that a snapshot between
	// the base and the target cut off, and that both have (an image
	// shrunk, snapshotted and grown again between them): librbd's object
	// map diff (reef 18.2.7) can miss the objects there.
	Shrunk [2]int64
}

// Options configure precise mode: Options.TrustObjectMap and
// Options.Walk of the package rbd.
type Options struct {
	TrustObjectMap bool
	Walk           string
}

// Open prepares precise mode for img; it never fails. When the image
// cannot be refined (non-default striping, encrypted by librbd, a clone
// chain too deep), or preparing fails, the Refiner does not refine
// (Refines reports false) and Refinement says why: the caller then runs
// librbd's exact diff. The caller must Close it.
func Open(img Image, o Options) *Refiner {
	r := &Refiner{s2: img.Target, conn: img.Conn, walkMode: o.Walk}
	if err := r.open(img, o); err != nil {
		r.Close()
		return &Refiner{imageFallback: reasonOf(err), imageFallbackDetail: err.Error()}
	}
	return r
}

// imageLayer describes the image at snapshot snap, where its handle h
// is set: a format 1 image from h, a format 2 one from its header.
func (r *Refiner) imageLayer(img Image, h *librbd.Image, snap uint64) (*layer, error) {
	if img.ID == "" {
		return r.format1Layer(img.Conn, img.Pool, img.Namespace, h, snap)
	}
	return r.layer(img.Conn, img.Pool, img.Namespace, img.ID, snap, 0)
}

// open reads the image's layers at the target (and base) snapshot, on a
// handle of its own.
//
// Implements (through go-ceph): rados_ioctx_create, rbd_open_by_id_read_only
// (rbd_open_read_only for format 1), rbd_snap_set_by_id, rbd_get_features,
// rbd_close; the layers' reads (see layer, format1Layer).
func (r *Refiner) open(img Image, o Options) error {
	if img.Header == 0 && img.LibrbdEncrypted {
		return unrefinable{ReasonEncrypted, "the image looks encrypted by librbd (a LUKS header without Ceph-CSI's encryption metadata)"}
	}
	hio, err := img.Conn.OpenIOContext(img.Pool)
	if err != nil {
		return cepherr.Wrap("open pool "+img.Pool, err)
	}
	defer hio.Destroy()
	hio.SetNamespace(img.Namespace)
	var h *librbd.Image
	if img.ID != "" {
		h, err = librbd.OpenImageByIdReadOnly(hio, img.ID, librbd.NoSnapshot)
	} else {
		h, err = librbd.OpenImageReadOnly(hio, img.Name, librbd.NoSnapshot)
	}
	if err != nil {
		return cepherr.Wrap("open image "+img.Spec, err)
	}
	defer h.Close()
	if err := h.SetSnapByID(img.Target); err != nil {
		return cepherr.Wrap(fmt.Sprintf("set image %s to snapshot %d", img.Spec, img.Target), err)
	}
	if r.top, err = r.imageLayer(img, h, img.Target); err != nil {
		return err
	}
	if o.Walk != WalkLibrbd {
		snaps := []uint64{img.Target}
		if img.Base != 0 {
			snaps = append(snaps, img.Base)
		}
		if r.unmapped, err = noObjectMap(h, hio, img.Spec, snaps); err != nil {
			return err
		}
	}
	if img.Base == 0 {
		return nil
	}
	r.s1 = img.Base
	if err := h.SetSnapByID(r.s1); err != nil {
		return cepherr.Wrap(fmt.Sprintf("set image %s to snapshot %d", img.Spec, img.Base), err)
	}
	if r.base, err = r.imageLayer(img, h, r.s1); err != nil {
		return err
	}
	r.shrunk = span{img.Shrunk[0], img.Shrunk[1] - img.Shrunk[0]}
	if ov1, ov2 := r.base.overlap, r.top.overlap; ov2 < ov1 {
		r.lostParent = span{ov2, min(ov1, img.Size) - ov2}
	}
	if !o.TrustObjectMap && !r.unmapped {
		// Without fast-diff, librbd's whole-object diff runs list_snaps on
		// every object: exact already, and existence would only cost more.
		features, err := h.GetFeatures()
		if err != nil {
			return cepherr.Wrap("get features", err)
		}
		r.existence = features&librbd.FeatureFastDiff != 0
	}
	if r.dir, err = r.ioctx(img.Conn, r.top.pool, img.Namespace, snapDir); err != nil {
		return err
	}
	return nil
}

// Close releases the Refiner's ioctxs; nil and unrefining Refiners too.
// It must not run with Iterate: every query has returned by the time
// Iterate does.
func (r *Refiner) Close() {
	if r == nil {
		return
	}
	for _, io := range r.ioctxs {
		io.Destroy()
	}
	r.ioctxs = nil
}

// Objects is one object scan (a whole-object diff) that precise mode asks
// of its ObjectScanner:
// the objects of the raw range [Off, Off+Len) at snapshot At, those that
// changed since snapshot From (0: from the beginning, so the objects that
// hold data), with the parent's objects when Parent is set.
type Objects struct {
	At, From uint64
	Parent   bool
	Off, Len int64
}

// ObjectScanner is what precise mode needs from librbd: scans in whole
// objects (librbd's whole-object diff-iterate), which with fast-diff read
// only the object maps. rbd implements it on its Diff's image; tests
// implement it with a table.
//
// ScanObjects runs the scan q and calls emit for what it names. Its
// contract:
//
//  1. Order: emit gets each object (or run of adjacent whole objects) at
//     most once, in ascending order, without overlap, within
//     [q.Off, q.Off+q.Len); exists is false for an object that does not
//     exist at q.At (a discard or removal, in a diff from a snapshot; in
//     a diff from the beginning such objects hold no data).
//  2. Snapshots: q.At is the image's target snapshot, or, with From 0,
//     another snapshot of the same image, whose size then clips the
//     range. From is 0 or a snapshot older than At.
//  3. Threads: emit runs on the goroutine that called ScanObjects, and may
//     block (which blocks librbd); ScanObjects returns only after emit
//     returned for the last time.
//  4. Stopping: when emit returns an error, or ctx ends, ScanObjects stops
//     at once and returns that error unchanged, whatever librbd answers
//     afterwards; emit is not called again.
//  5. Panics: a panic of emit never unwinds through librbd: ScanObjects
//     raises it again once librbd has returned.
//  6. Errors: any other error is librbd's, classified as the package
//     rbd documents (internal/cepherr), and names the scan.
type ObjectScanner interface {
	ScanObjects(ctx context.Context, q Objects, emit func(off, length int64, exists bool) error) error
}

// Iterate refines the raw range [off, off+length) (image offsets, LUKS
// header included) and delivers the refined extents to emit, in image
// order, without overlap, on the calling goroutine. Call it only when
// Refines reports true, one call at a time. It asks scanner for the
// candidates: the objects that hold data at the target (allocated); for a
// delta by existence the objects the image itself holds at the base, then
// at the target; for a delta by object map (Options.TrustObjectMap) the
// objects that changed since the base. Walking (no usable object map), it
// asks scanner nothing. An error of emit, of scanner or of ctx is returned
// unchanged; a query the cluster does not answer (cepherr.Unanswered)
// ends it with that error; other failed queries fall back to the
// candidate's whole extent. No goroutine outlives it.
func (r *Refiner) Iterate(ctx context.Context, scanner ObjectScanner, off, length int64, emit func(off, length int64) error) error {
	if r.unmapped {
		// No usable object map: precise mode lists the objects itself.
		pipe := r.pipeline(ctx, off, length, nil, emit)
		defer pipe.release()
		rs, err := r.walkRanges(ctx, off, off+length)
		if err == nil {
			pipe.every(rs)
		}
		return pipe.finish(err)
	}
	q := Objects{At: r.s2, Parent: true, Off: off, Len: length}
	var existing []span
	if r.base != nil {
		q.From = r.s1
		if r.existence {
			var err error
			if existing, err = r.existing(ctx, scanner, off, length); err != nil {
				return err
			}
			// The objects the image itself holds at the target.
			q.From, q.Parent = 0, false
		}
	}
	pipe := r.pipeline(ctx, off, length, existing, emit)
	defer pipe.release()
	return pipe.finish(scanner.ScanObjects(ctx, q, pipe.feed))
}

// existing returns the raw ranges, in whole objects and ascending, of the
// objects that the image itself (not its parent) holds at the base
// snapshot within [off, off+length). They come from librbd's whole-object
// diff from the beginning, which with fast-diff reads the existence bits
// of the object maps; unlike the maps' dirty bits, existence stays right
// after a rollback or a copy-up.
func (r *Refiner) existing(ctx context.Context, scanner ObjectScanner, off, length int64) ([]span, error) {
	var out []span
	err := scanner.ScanObjects(ctx, Objects{At: r.s1, Off: off, Len: length}, func(o, l int64, exists bool) error {
		if exists {
			if n := len(out); n > 0 && out[n-1].end() == o {
				out[n-1].len += l
			} else {
				out = append(out, span{o, l})
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// pipeline returns the pipeline of one Iterate call over the raw range
// [off, off+length), delivering to emit. existing are the raw ranges of
// the objects that exist at s1, when candidates come from existence.
func (r *Refiner) pipeline(ctx context.Context, off, length int64, existing []span, emit func(off, length int64) error) *pipeline {
	refine := r.allocated
	if r.base != nil {
		refine = r.delta
	}
	skipGone := r.base == nil || r.existence // gone at s2: a candidate only if it existed at s1
	var p *pipeline
	if r.unmapped {
		// Every object is a candidate: nothing to force.
		p = newPipeline(ctx, r.top.objSize, preciseWalkWindow, skipGone, refine, emit, r.fellBack)
		if r.base != nil {
			p.refine, p.batch, p.width = r.batchDelta, walkBatch, walkDeltaWindow
		}
	} else {
		p = newPipeline(ctx, r.top.objSize, preciseWindow, skipGone, refine, emit, r.fellBack)
		p.forced = forcedRanges(r.top.objSize, off, off+length, append([]span{r.shrunk, r.lostParent}, existing...))
		if r.existence && r.base != nil {
			p.before, p.hasBefore = forcedRanges(r.top.objSize, off, off+length, existing), true
		}
	}
	if r.refineHook != nil {
		p.refine = r.refineHook
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

func (r *Refiner) fellBack(err error) {
	r.mu.Lock()
	r.lastObjectFallback = err.Error()
	if r.objectFallbacks == nil {
		r.objectFallbacks = map[string]int64{}
	}
	r.objectFallbacks[reasonOf(err)]++
	r.mu.Unlock()
}

// Refinement describes the Refiner's work so far: safe to call at any
// time. A nil Refiner (precise mode off) did nothing, and says so (On
// false).
func (r *Refiner) Refinement() report.Refinement {
	if r == nil {
		return report.Refinement{}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	st := report.Refinement{On: true, ImageFallback: r.imageFallback, ImageFallbackDetail: r.imageFallbackDetail,
		Objects: r.objects.Load(), Checksummed: r.summed.Load(),
		ObjectFallbacks: maps.Clone(r.objectFallbacks), LastObjectFallback: r.lastObjectFallback}
	if r.Refines() && r.base != nil {
		st.Candidates = "object map"
		if r.existence {
			st.Candidates = "existence"
		}
	}
	if r.Refines() && r.unmapped {
		st.Candidates = "walk"
		if r.walkUsed == WalkList {
			st.Candidates = "listing"
		}
		if r.listErr != "" {
			st.LastObjectFallback = "listing the pool's objects: " + r.listErr
		}
	}
	return st
}
