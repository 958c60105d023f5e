package rbd

import (
	"context"
	"errors"
	"fmt"
	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/rbd/internal/cepherr"
	"io/fs"
	"math"
	"runtime/debug"
	"sync"
	"syscall"

	"github.com/ceph/go-ceph/rados"
	librbd "github.com/ceph/go-ceph/rbd"

	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/rbd/internal/conn"
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
	refine *refiner // precise mode (precise.go); nil when off
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

	if err := refuseMigrating(d.cc.Rados(), d.image, t.imageSpec(), 0); err != nil {
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
	return nil
}

// maxCheckedDepth bounds the clone chain refuseMigrating walks: far
// deeper than any real one (Ceph-CSI flattens at 16 by default).
const maxCheckedDepth = 64

// refuseMigrating fails with errors.ErrUnsupported when img, or an image
// of its parent chain, takes part in a live migration (the migrating
// feature: set on both the source and the destination by `rbd migration
// prepare`, until commit or abort). While it is set the destination's data
// is partly still in the source, and librbd's diffs of either image leave
// it out (reef 18.2.7 reports nothing at all): no mode can answer.
//
// Implements (through go-ceph): rbd_get_features, rbd_get_parent,
// rbd_open_by_id_read_only.
func refuseMigrating(conn *rados.Conn, img *librbd.Image, spec string, depth int) error {
	features, err := img.GetFeatures()
	if err != nil {
		return cepherr.Wrap("get features of "+spec, err)
	}
	if features&librbd.FeatureMigrating != 0 {
		return fmt.Errorf("image %s is being migrated (rbd migration prepare): its changes cannot be listed until the migration is committed or aborted: %w",
			spec, errors.ErrUnsupported)
	}
	parent, err := img.GetParent()
	if errors.Is(err, librbd.ErrNotFound) {
		return nil
	}
	if err != nil {
		return cepherr.Wrap("get parent of "+spec, err)
	}
	if depth >= maxCheckedDepth {
		return fmt.Errorf("image %s: a clone chain deeper than %d: %w", spec, maxCheckedDepth, errors.ErrUnsupported)
	}
	pi := parent.Image
	pspec := pi.PoolName + "/" + pi.ImageName
	if pi.PoolNamespace != "" {
		pspec = pi.PoolName + "/" + pi.PoolNamespace + "/" + pi.ImageName
	}
	pio, err := conn.OpenIOContext(pi.PoolName)
	if err != nil {
		return cepherr.Wrap("open parent pool "+pi.PoolName, err)
	}
	defer pio.Destroy()
	pio.SetNamespace(pi.PoolNamespace)
	pimg, err := librbd.OpenImageByIdReadOnly(pio, pi.ImageID, librbd.NoSnapshot)
	if err != nil {
		return cepherr.Wrap("open parent image "+pspec, err)
	}
	defer pimg.Close()
	return refuseMigrating(conn, pimg, pspec, depth+1)
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
	if err := d.image.SetSnapByID(d.base.snapID); err != nil {
		return 0, 0, cepherr.Wrap("set image to snapshot "+d.base.String(), err)
	}
	size1, err := d.image.GetSize()
	if err == nil {
		err = d.image.SetSnapByID(d.target.snapID)
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

// errStop is what a diff callback returns to librbd to stop the iteration:
// a negative errno, since librbd ignores positive values.
const errStop = -int(syscall.ECANCELED)

// Iterate runs one librbd diff-iterate over [offset, Capacity()) and calls
// fn for each extent, in ascending order and without overlap. Offsets are
// the user's: for an encrypted volume, offset 0 is the first byte after
// the LUKS header, and changes to the header itself are not reported:
//
//   - allocated (no base): every extent holding data, a clone's parent data
//     included; extents known to be zero are skipped;
//   - delta: every extent that changed since the base, including whole
//     objects discarded since (they read as zeros now).
//
// When fn returns an error or ctx is done, Iterate stops librbd at its next
// callback and returns that error unchanged; callbacks librbd still makes
// after the stop are ignored. ctx is only checked between extents: a
// stretch without extents (up to about 80 µs per object without fast-diff)
// is not interrupted.
//
// Before it returns nil, Iterate reads the snapshots' lineages again
// (lineage.go): a snapshot removed meanwhile is fs.ErrNotExist, a parent
// link changed meanwhile (a flatten) an error whose Aborted method returns
// true, since the extents may then miss changes.
//
// An offset outside [0, Capacity()] is fs.ErrInvalid; Capacity() itself
// yields nothing (once the lineages are confirmed). A delta needs librbd's rbd_diff_iterate3 (Ceph reef
// 18.2+) unless the base snapshot has a name; without either it is
// errors.ErrUnsupported.
//
// Implements (through go-ceph): rbd_diff_iterate3 for deltas, falling back
// to rbd_diff_iterate2 with the base's name; rbd_diff_iterate2 for
// allocated extents.
func (d *Diff) Iterate(ctx context.Context, offset int64, fn func(offset, length int64) error) error {
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
		mu          sync.Mutex      // librbd calls back on the calling thread; cheap insurance
		kept        error           // why the callback stopped librbd
		called      bool            // whether librbd called back at all
		reportZeros = d.base != nil // deltas report discards
	)
	var panicked *callbackPanic // a panic of fn, carried past librbd's frames
	cb := func(off, length uint64, exists int, _ any) (ret int) {
		mu.Lock()
		defer mu.Unlock()
		// A panic must not unwind through librbd, which would be left
		// holding its locks: stop librbd, and panic again once it returned.
		defer func() {
			if r := recover(); r != nil {
				panicked = &callbackPanic{value: r, stack: debug.Stack()}
				kept = fmt.Errorf("diff callback panicked: %v", r)
				ret = errStop
			}
		}()
		called = true
		if kept != nil {
			return errStop
		}
		if exists == 0 && !reportZeros {
			return 0
		}
		if err := ctx.Err(); err != nil {
			kept = err
			return errStop
		}
		// Shift out the LUKS header; librbd starts at offset+header, so
		// the clip is only a safeguard.
		o, l := int64(off), int64(length)
		if o < d.header {
			l -= d.header - o
			o = d.header
		}
		if l <= 0 {
			return 0
		}
		if err := fn(o-d.header, l); err != nil {
			kept = err
			return errStop
		}
		return 0
	}

	// end ends the call once librbd (or the walk) has returned err: a
	// panic of fn goes on, and the callback's own reason wins.
	end := func(err error) error {
		mu.Lock()
		defer mu.Unlock()
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
		d.discardConnOnTimeout(err)
		return err
	}
	rawOff, rawLen := uint64(offset+d.header), uint64(d.capacity-offset)
	if d.refine.walks() {
		// No usable object map: precise mode lists the objects itself.
		pipe := d.refine.pipeline(ctx, rawOff, rawLen, nil, cb)
		rs, err := d.refine.walkRanges(ctx, int64(rawOff), int64(rawOff+rawLen))
		if err == nil {
			pipe.walk(rs)
		}
		return end(pipe.finish(err))
	}
	run := librbd.DiffIterateCallback(cb)
	var pipe *pipeline // precise mode: refines librbd's whole objects for cb
	if d.refine.usable() {
		var existing []span
		if d.refine.byExistence() {
			var err error
			if existing, err = d.existing(ctx, d.base.snapID, rawOff, rawLen); err != nil {
				d.discardConnOnTimeout(err)
				return err
			}
		}
		pipe = d.refine.pipeline(ctx, rawOff, rawLen, existing, cb)
		run = pipe.feed
	}
	err := d.diffIterate(rawOff, rawLen, run)
	mu.Lock()
	calledBack := called
	mu.Unlock()
	if errors.Is(err, librbd.ErrNotImplemented) { // only from rbd_diff_iterate3
		if calledBack {
			err = cepherr.Wrap(fmt.Sprintf("diff %s from %s", d.target, d.base), err)
		} else {
			err = d.diffIterateByName(rawOff, rawLen, run)
		}
	}
	return end(pipe.finish(err))
}

// discardConnOnTimeout stops caching the Diff's connection when err says
// the cluster did not answer in time, or any error that goes away by
// itself (temporary: a reset or shut down connection...): later requests,
// and the driver's re-open of a resumed stream, then connect anew rather
// than reuse a connection that an outage may have left broken.
func (d *Diff) discardConnOnTimeout(err error) {
	if d.cc != nil && cepherr.Temporary(err) {
		d.conns.Discard(d.cc)
	}
}

// ResumeFrom returns where a stream resumed at offset must Iterate from to
// get the extents of [offset, Capacity) exactly as one Iterate from
// before offset did (driver.Resumer): the start of the object holding
// offset, or of its object set when the image is striped (librbd may
// report the rest of an object from an offset inside it, and precise mode
// refines whole objects). LUKS offsets are shifted as Iterate's. When the
// layout cannot be read it returns 0: correct too, only slower.
//
// Implements (through go-ceph): rbd_stat, rbd_get_stripe_count.
func (d *Diff) ResumeFrom(offset int64) int64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed || d.image == nil {
		return 0
	}
	st, err := d.image.Stat()
	if err != nil || st.Obj_size == 0 {
		return 0
	}
	sc, err := d.image.GetStripeCount()
	if err != nil || sc == 0 {
		return 0
	}
	unit := int64(st.Obj_size) * int64(sc)
	raw := offset + d.header
	return max(raw-raw%unit-d.header, 0)
}

// existing returns the raw ranges, in whole objects and ascending, of the
// objects that the image itself (not its parent) holds at snapshot snap
// within [off, off+length). They come from librbd's whole-object diff from
// the beginning, which with fast-diff reads the existence bits of the
// object maps; unlike the maps' dirty bits, existence stays right after a
// rollback or a copy-up. It leaves the image at the target snapshot.
//
// Implements (through go-ceph): rbd_snap_set_by_id, rbd_get_size,
// rbd_diff_iterate2.
func (d *Diff) existing(ctx context.Context, snap uint64, off, length uint64) ([]span, error) {
	var out []span
	err := d.image.SetSnapByID(snap)
	var size uint64
	if err == nil {
		size, err = d.image.GetSize()
	}
	if err == nil && off < size {
		var kept error
		err = d.image.DiffIterate(librbd.DiffIterateConfig{
			SnapName:      librbd.NoSnapshot,
			Offset:        off,
			Length:        min(length, size-off),
			IncludeParent: librbd.ExcludeParent,
			WholeObject:   librbd.EnableWholeObject,
			Callback: func(o, l uint64, exists int, _ any) int {
				if kept != nil {
					return errStop
				}
				if kept = ctx.Err(); kept != nil {
					return errStop
				}
				if exists != 0 {
					if n := len(out); n > 0 && out[n-1].end() == int64(o) {
						out[n-1].len += int64(l)
					} else {
						out = append(out, span{int64(o), int64(l)})
					}
				}
				return 0
			},
		})
		if kept != nil {
			err = kept
		}
	}
	if serr := d.image.SetSnapByID(d.target.snapID); err == nil && serr != nil {
		err = serr
	}
	if err != nil {
		if ctx.Err() != nil {
			return nil, err
		}
		return nil, cepherr.Wrap(fmt.Sprintf("list the objects of %s at snapshot %d", d.target.imageSpec(), snap), err)
	}
	return out, nil
}

// callbackPanic is a panic of a diff callback, raised again after librbd
// returned, with the stack of the callback.
type callbackPanic struct {
	value any
	stack []byte
}

func (p *callbackPanic) String() string {
	return fmt.Sprintf("%v\n\ncallback stack:\n%s", p.value, p.stack)
}

// wholeObject is go-ceph's form of d.whole.
func (d *Diff) wholeObject() librbd.DiffWholeObject {
	if d.whole {
		return librbd.EnableWholeObject
	}
	return librbd.DisableWholeObject
}

// diffIterate runs the one librbd diff-iterate of a call to Iterate.
//
// A precise delta that takes its candidates from object existence
// (refiner.existence) runs the whole-object diff from the beginning at the
// target snapshot, without the parent: the objects the image itself holds
// there.
func (d *Diff) diffIterate(offset, length uint64, cb librbd.DiffIterateCallback) error {
	if d.base == nil || d.refine.byExistence() {
		parent := librbd.IncludeParent
		if d.base != nil {
			parent = librbd.ExcludeParent
		}
		err := d.image.DiffIterate(librbd.DiffIterateConfig{
			SnapName:      librbd.NoSnapshot,
			Offset:        offset,
			Length:        length,
			IncludeParent: parent,
			WholeObject:   d.wholeObject(),
			Callback:      cb,
		})
		return cepherr.Wrap("diff "+d.target.String(), err)
	}
	err := d.image.DiffIterateByID(librbd.DiffIterateByIDConfig{
		FromSnapID:    d.base.snapID,
		Offset:        offset,
		Length:        length,
		IncludeParent: librbd.IncludeParent,
		WholeObject:   d.wholeObject(),
		Callback:      cb,
	})
	if errors.Is(err, librbd.ErrNotImplemented) {
		return err // Iterate falls back to diffIterateByName
	}
	return cepherr.Wrap(fmt.Sprintf("diff %s from %s", d.target, d.base), err)
}

// diffIterateByName is the delta for librbd without rbd_diff_iterate3
// (before Ceph reef): rbd_diff_iterate2 names the base snapshot.
func (d *Diff) diffIterateByName(offset, length uint64, cb librbd.DiffIterateCallback) error {
	if d.base.snapName == "" {
		return fmt.Errorf("diff %s from %s: the base snapshot has no name, and this librbd cannot diff by snapshot ID (needs Ceph reef 18.2 or later): %w",
			d.target, d.base, errors.ErrUnsupported)
	}
	err := d.image.DiffIterate(librbd.DiffIterateConfig{
		SnapName:      d.base.snapName,
		Offset:        offset,
		Length:        length,
		IncludeParent: librbd.IncludeParent,
		WholeObject:   d.wholeObject(),
		Callback:      cb,
	})
	return cepherr.Wrap(fmt.Sprintf("diff %s from %s", d.target, d.base), err)
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
	d.refine.close()
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
