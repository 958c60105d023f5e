package rbd

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"runtime/debug"
	"sync"

	"github.com/ceph/go-ceph/rados"
	librbd "github.com/ceph/go-ceph/rbd"

	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/rbd/internal/cepherr"
	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/rbd/internal/conn"
	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/rbd/precise"
)

// Diff is one prepared diff: an image opened read-only at its target
// snapshot, and optionally a base snapshot of the same image. Iterate may
// run many times; calls are serialized. Close releases it.
type Diff struct {
	conns *conn.Cache
	cc    *conn.Conn

	target snapRef
	base   *snapRef // nil: allocated extents
	whole  bool
	refine *precise.Refiner // precise mode (package precise); nil when off
	// trustObjectMap: precise deltas take their candidates from the
	// object map's dirty bits (Options.TrustObjectMap).
	trustObjectMap bool
	// walk: how precise mode finds the candidates of an image without a
	// usable object map (Options.Walk).
	walk string

	mu       sync.Mutex // serializes Iterate and Close
	ioctx    *rados.IOContext
	image    *librbd.Image
	capacity int64 // as the user sees the volume: the image minus header
	header   int64 // LUKS header before the user's data; 0 unless encrypted
	closed   bool
	// settleUnit and settleWindow: the holdback of librbd's extents
	// (settle.go), in bytes of a unit and units. Like header, set by
	// open and never changed: read without mu.
	settleUnit, settleWindow int64
	// lineages of the target and the base, as they were at open; Iterate
	// succeeds only if they still hold at its end (lineage.go).
	lineages []lineage
}

// open opens the pool and the image, looks up the snapshot IDs, sets the
// image to the target snapshot and finds the LUKS header of a Ceph-CSI
// encrypted volume (see luksHeaderSize). On error the caller closes d.
//
// Implements (through go-ceph): rados_ioctx_create,
// rados_ioctx_set_namespace, rbd_open_read_only (or rbd_open_by_id_read_only),
// rbd_get_features, rbd_get_parent, rbd_snap_get_id, rbd_snap_set_by_id,
// rbd_get_size, rbd_metadata_get, rbd_read.
func (d *Diff) open() error {
	t := &d.target
	ioctx, err := d.cc.Rados().OpenIOContext(t.pool)
	if err != nil {
		return cepherr.Wrap("open pool "+t.pool, err)
	}
	d.ioctx = ioctx
	ioctx.SetNamespace(t.namespace)

	if t.imageID != "" {
		d.image, err = librbd.OpenImageByIdReadOnly(ioctx, t.imageID, librbd.NoSnapshot)
	} else {
		d.image, err = librbd.OpenImageReadOnly(ioctx, t.image, librbd.NoSnapshot)
	}
	if err != nil {
		err = cepherr.Wrap("open image "+t.imageSpec(), err)
		if errors.Is(err, fs.ErrPermission) {
			err = fmt.Errorf("%w (the Ceph user's OSD caps do not cover pool %s)", err, t.pool)
		}
		return err
	}

	if err := refuseMigrating(d.image, t.imageSpec()); err != nil {
		return err
	}
	if err := d.lookupSnap(t); err != nil {
		return err
	}
	if b := d.base; b != nil {
		if err := d.lookupSnap(b); err != nil {
			return err
		}
		// Snapshot IDs grow with time, across the whole pool.
		if b.snapID >= t.snapID {
			return fmt.Errorf("base snapshot %s is not older than target snapshot %s: %w", b, t, fs.ErrInvalid)
		}
	}
	if err := d.recordLineages(); err != nil {
		return err
	}

	// By ID, so that snapshots without a usable name (in the trash) work.
	if err := d.image.SetSnapByID(t.snapID); err != nil {
		return cepherr.Wrap("set image to snapshot "+t.String(), err)
	}
	size, err := d.image.GetSize()
	if err != nil {
		return cepherr.Wrap("get size of snapshot "+t.String(), err)
	}
	if size > math.MaxInt64 {
		return fmt.Errorf("snapshot %s: size %d out of range", t, size)
	}
	header, err := luksHeaderSize(d.image, size)
	if err != nil {
		return fmt.Errorf("encrypted snapshot %s: %w", t, err)
	}
	if header > int64(size) {
		return fmt.Errorf("encrypted snapshot %s: LUKS header of %d bytes is larger than the image (%d bytes)", t, header, size)
	}
	d.header, d.capacity = header, int64(size)-header
	d.settleUnit, d.settleWindow, err = d.readSettle()
	return err
}

// refuseMigrating fails with errors.ErrUnsupported when img takes part in
// a live migration (the migrating feature: set on both the source and the
// destination by `rbd migration prepare`, until commit or abort). While it
// is set the destination's data is partly still in the source, and
// librbd's diffs of either image leave it out (reef 18.2.7 reports nothing
// at all): no mode can answer. A parent that takes part in one is refused
// by the lineage of each snapshot (readLineage), whose chain holds every
// parent the head has, and more once the head was flattened.
//
// Implements (through go-ceph): rbd_get_features.
func refuseMigrating(img *librbd.Image, spec string) error {
	features, err := img.GetFeatures()
	if err != nil {
		return cepherr.Wrap("get features of "+spec, err)
	}
	if features&librbd.FeatureMigrating != 0 {
		return errMigrating(spec)
	}
	return nil
}

func errMigrating(spec string) error {
	return fmt.Errorf("image %s is being migrated (rbd migration prepare): its changes cannot be listed until the migration is committed or aborted: %w",
		spec, errors.ErrUnsupported)
}

// cutOff returns the raw range [lo, hi) that a snapshot between the base
// and the target cut off by a shrink, and that both the base and the
// target have: an image shrunk, snapshotted and grown again between them.
// reef 18.2.7's whole-object (fast-diff) diff can miss the objects there.
// lo == hi when there is none. It leaves the image at the target snapshot.
//
// Implements (through go-ceph): rbd_snap_set_by_id, rbd_get_size,
// rbd_snap_list.
func (d *Diff) cutOff() (lo, hi int64, err error) {
	err = d.image.SetSnapByID(d.base.snapID)
	var size1 uint64
	if err == nil {
		size1, err = d.image.GetSize()
	}
	if serr := d.image.SetSnapByID(d.target.snapID); err == nil && serr != nil {
		err = serr
	}
	if err != nil {
		return 0, 0, cepherr.Wrap("get size of snapshot "+d.base.String(), err)
	}
	snaps, err := d.image.GetSnapshotNames()
	if err != nil {
		return 0, 0, cepherr.Wrap("list snapshots of "+d.target.imageSpec(), err)
	}
	hi = int64(min(size1, uint64(d.capacity+d.header)))
	lo = hi
	for _, s := range snaps {
		if d.base.snapID < s.Id && s.Id < d.target.snapID {
			lo = min(lo, int64(s.Size))
		}
	}
	return lo, hi, nil
}

// lookupSnap fills r.snapID from r.snapName when it is not known yet.
func (d *Diff) lookupSnap(r *snapRef) error {
	if r.snapID != 0 {
		return nil
	}
	id, err := d.image.GetSnapID(r.snapName)
	if err != nil {
		return cepherr.Wrap("look up snapshot "+r.String(), err)
	}
	r.snapID = id
	return nil
}

// Capacity is the size of the target snapshot in bytes, as the user sees
// the volume: without the LUKS header of an encrypted volume.
func (d *Diff) Capacity() int64 { return d.capacity }

// Iterate calls emit for each extent of [offset, Capacity()), in ascending
// order and without overlap. Offsets are the user's: for an encrypted
// volume, offset 0 is the first byte after the LUKS header, and changes to
// the header itself are not reported:
//
//   - allocated (no base): every extent holding data, a clone's parent data
//     included; extents known to be zero are skipped;
//   - delta: every extent that changed since the base, including whole
//     objects discarded since (they read as zeros now).
//
// The extents come from one scan (one librbd diff-iterate, scan.go), or
// from precise mode (package precise), which asks for scans in whole
// objects through the same bridge, or walks the objects itself.
//
// When emit returns an error or ctx is done, Iterate stops at the next
// extent and returns that error unchanged. ctx is only checked between
// extents: a stretch without extents (up to about 80 µs per object without
// fast-diff) is not interrupted. A panic of emit is raised again once
// librbd and precise mode's queries have returned.
//
// Before it returns nil, Iterate reads the snapshots' lineages again
// (lineage.go): a snapshot removed meanwhile is fs.ErrNotExist, a parent
// link changed meanwhile (a flatten) an error whose Aborted method returns
// true, since the extents may then miss changes.
//
// An offset outside [0, Capacity()] is fs.ErrInvalid; Capacity() itself
// yields nothing (once the lineages are confirmed). A delta needs librbd's
// rbd_diff_iterate3 (Ceph reef 18.2+) unless the base snapshot has a name;
// without either it is errors.ErrUnsupported.
func (d *Diff) Iterate(ctx context.Context, offset int64, emit func(offset, length int64) error) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return fmt.Errorf("diff of %s: %w", d.target, fs.ErrClosed)
	}
	if offset < 0 || offset > d.capacity {
		return fmt.Errorf("offset %d outside snapshot %s of %d bytes: %w", offset, d.target, d.capacity, fs.ErrInvalid)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if offset == d.capacity {
		return d.confirmLineages()
	}

	var (
		kept     error          // why emitRaw stopped the iteration
		panicked *callbackPanic // a panic of emit, carried past librbd's frames and precise mode's goroutines
	)
	// emitRaw takes the raw extents (image offsets), in image order, from
	// librbd or precise mode, always on this goroutine, and emits the
	// user's.
	emitRaw := func(off, length int64) error {
		if kept != nil {
			return kept
		}
		if kept = ctx.Err(); kept != nil {
			return kept
		}
		// Shift out the LUKS header; the range starts at offset+header,
		// so the clip is only a safeguard.
		if off < d.header {
			length -= d.header - off
			off = d.header
		}
		if length <= 0 {
			return nil
		}
		kept = callEmit(emit, off-d.header, length, &panicked)
		return kept
	}
	rawOff, rawLen := offset+d.header, d.capacity-offset
	var err error
	if d.refine.Refines() {
		err = d.refine.Iterate(ctx, objectScanner{d}, rawOff, rawLen, emitRaw)
	} else {
		err = d.scan(ctx, d.query(rawOff, rawLen), d.whole, func(off, length int64, exists bool) error {
			if !exists && d.base == nil {
				return nil // allocated: known to be zero
			}
			return emitRaw(off, length)
		})
	}
	if panicked != nil {
		panic(panicked)
	}
	if kept != nil {
		return kept
	}
	if err == nil {
		// Every extent is out: only now may the answer be taken as
		// complete, if the snapshots it was read from outlived it.
		err = d.confirmLineages()
	}
	discardOnTimeout(d.conns, d.cc, err)
	return err
}

// callEmit calls emit, turning a panic into an error and *p.
func callEmit(emit func(offset, length int64) error, off, length int64, p **callbackPanic) (err error) {
	defer func() {
		if r := recover(); r != nil {
			*p = &callbackPanic{value: r, stack: debug.Stack()}
			err = fmt.Errorf("diff callback panicked: %v", r)
		}
	}()
	return emit(off, length)
}

// query is the scan of the raw range [off, off+length) that Iterate runs
// without precise mode: from the beginning or the base, at the
// target, with the parent.
func (d *Diff) query(off, length int64) precise.Objects {
	q := precise.Objects{At: d.target.snapID, Parent: true, Off: off, Len: length}
	if d.base != nil {
		q.From = d.base.snapID
	}
	return q
}

// discardOnTimeout stops caching cc when err says the cluster did not
// answer in time, or any error that goes away by itself (temporary: a
// reset or shut down connection...): later requests, and the driver's
// re-open of a resumed stream or a retried first open, then connect anew
// rather than reuse a connection that an outage may have left broken.
func discardOnTimeout(conns *conn.Cache, cc *conn.Conn, err error) {
	if cc != nil && cepherr.Temporary(err) {
		conns.Discard(cc)
	}
}

// ResumeFrom returns where a stream resumed at offset must Iterate from to
// get the extents of [offset, Capacity) exactly as one Iterate from
// before offset did (driver.Resumer): the start of the object holding
// offset, or of its object set when the image is striped (librbd may
// report the rest of an object from an offset inside it, and precise mode
// refines whole objects). LUKS offsets are shifted as Iterate's. The
// driver resumes at the end of what a failed Iterate delivered, which is a
// complete prefix of the answer (settle.go).
//
// It takes no lock: the driver calls it and CheckFrom while Iterate runs
// (from the callback), and both read only what open set.
func (d *Diff) ResumeFrom(offset int64) int64 {
	unit := d.settleUnit
	if unit <= 0 {
		return 0
	}
	raw := offset + d.header
	return max(raw-raw%unit-d.header, 0)
}

// CheckFrom returns where a stream resumed at offset re-reads from to
// check its seam (driver.SeamChecker): twice the holdback's window of
// object sets before ResumeFrom(offset), so that the check reaches back
// past any hole that a holdback too short would have let through.
func (d *Diff) CheckFrom(offset int64) int64 {
	return max(d.ResumeFrom(offset)-2*d.settleWindow*d.settleUnit, 0)
}

// Close closes the image and the pool and releases the cluster connection.
// It may be called more than once; only the first call does anything.
//
// Implements (through go-ceph): rbd_close, rados_ioctx_destroy.
func (d *Diff) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil
	}
	d.closed = true
	d.refine.Close()
	var err error
	if d.image != nil {
		err = cepherr.Wrap("close image "+d.target.imageSpec(), d.image.Close())
		d.image = nil
	}
	if d.ioctx != nil {
		d.ioctx.Destroy()
		d.ioctx = nil
	}
	d.conns.Release(d.cc)
	return err
}
