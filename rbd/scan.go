package rbd

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"syscall"

	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/rbd/internal/cepherr"
	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/rbd/precise"

	librbd "github.com/ceph/go-ceph/rbd"
)

// errStop is what the diff callback returns to librbd to stop the
// iteration: a negative errno, since librbd ignores positive values.
const errStop = -int(syscall.ECANCELED)

// objectScanner is the Diff as precise mode's ObjectScanner: scans of its
// image in whole objects.
type objectScanner struct{ d *Diff }

func (o objectScanner) ScanObjects(ctx context.Context, q precise.Objects, emit func(off, length int64, exists bool) error) error {
	return o.d.scan(ctx, q, true, emit)
}

// scan runs one librbd diff-iterate of the Diff's image (a scan), as q
// asks, and calls emit for each extent librbd reports; whole: in whole
// objects. It is the one librbd callback of the package:
//
//   - emit returning an error, or ctx ending, stops librbd (a negative errno
//     from the callback) and scan returns that error unchanged, in
//     preference to librbd's; callbacks librbd still makes after the stop
//     are ignored;
//   - a panic of emit must not unwind through librbd, which would be left
//     holding its locks: it stops librbd too, and scan panics again once
//     librbd returned (with the callback's stack).
//
// librbd calls back on the calling thread: emit may block, which blocks
// librbd. emit gets an extent only once librbd can no longer fail before
// it (settle.go): when librbd fails, emit has had a complete prefix of the
// answer, and a resumed stream misses nothing.
func (d *Diff) scan(ctx context.Context, q precise.Objects, whole bool, emit func(off, length int64, exists bool) error) error {
	var (
		kept     error
		panicked *callbackPanic
		called   bool
		s        = newSettle(d.settleUnit, d.settleWindow, emit)
	)
	// librbdEmit is what librbd calls with each extent, on this thread.
	librbdEmit := func(off, length uint64, exists int, _ any) (ret int) {
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
		if kept = ctx.Err(); kept == nil {
			kept = s.add(int64(off), int64(length), exists != 0)
		}
		if kept != nil {
			return errStop
		}
		return 0
	}
	err := d.diffIterate(q, whole, librbdEmit, func() bool { return called })
	if err == nil && kept == nil && panicked == nil {
		// Only now is every held extent known to be complete.
		func() {
			defer func() {
				if r := recover(); r != nil {
					panicked = &callbackPanic{value: r, stack: debug.Stack()}
				}
			}()
			kept = s.flush()
		}()
	}
	if panicked != nil {
		panic(panicked)
	}
	if kept != nil {
		return kept
	}
	return err
}

// diffIterate runs librbd's diff-iterate of q, which calls emit back:
//
//   - at another snapshot than the target (precise mode's objects of the
//     base), from the beginning: the image is set to that snapshot, the
//     range clipped to its size, and the image set back to the target;
//   - from the beginning (allocated, or a precise delta by existence);
//   - from the base by snapshot ID (rbd_diff_iterate3), falling back to
//     the base's name when librbd refuses it before calling back (called).
//
// Implements (through go-ceph): rbd_diff_iterate3, rbd_diff_iterate2,
// rbd_snap_set_by_id, rbd_get_size.
func (d *Diff) diffIterate(q precise.Objects, whole bool, emit librbd.DiffIterateCallback, called func() bool) error {
	wholeObject, parent := librbd.DisableWholeObject, librbd.ExcludeParent
	if whole {
		wholeObject = librbd.EnableWholeObject
	}
	if q.Parent {
		parent = librbd.IncludeParent
	}
	off, length := uint64(q.Off), uint64(q.Len)
	switch {
	case q.At != d.target.snapID:
		if q.From != 0 {
			return fmt.Errorf("diff %s: from snapshot %d at snapshot %d: %w", d.target, q.From, q.At, errors.ErrUnsupported)
		}
		err := d.image.SetSnapByID(q.At)
		var size uint64
		if err == nil {
			size, err = d.image.GetSize()
		}
		if err == nil && off < size {
			err = d.image.DiffIterate(librbd.DiffIterateConfig{
				SnapName:      librbd.NoSnapshot,
				Offset:        off,
				Length:        min(length, size-off),
				IncludeParent: parent,
				WholeObject:   wholeObject,
				Callback:      emit,
			})
		}
		if serr := d.image.SetSnapByID(d.target.snapID); err == nil && serr != nil {
			err = serr
		}
		return cepherr.Wrap(fmt.Sprintf("list the objects of %s at snapshot %d", d.target.imageSpec(), q.At), err)
	case q.From == 0:
		err := d.image.DiffIterate(librbd.DiffIterateConfig{
			SnapName:      librbd.NoSnapshot,
			Offset:        off,
			Length:        length,
			IncludeParent: parent,
			WholeObject:   wholeObject,
			Callback:      emit,
		})
		return cepherr.Wrap("diff "+d.target.String(), err)
	}
	what := fmt.Sprintf("diff %s from %s", d.target, d.base)
	err := d.image.DiffIterateByID(librbd.DiffIterateByIDConfig{
		FromSnapID:    q.From,
		Offset:        off,
		Length:        length,
		IncludeParent: parent,
		WholeObject:   wholeObject,
		Callback:      emit,
	})
	if !errors.Is(err, librbd.ErrNotImplemented) || called() { // only from rbd_diff_iterate3
		return cepherr.Wrap(what, err)
	}
	// librbd without rbd_diff_iterate3 (before Ceph reef): rbd_diff_iterate2
	// names the base snapshot.
	if d.base == nil || q.From != d.base.snapID || d.base.snapName == "" {
		return fmt.Errorf("%s: the base snapshot has no name, and this librbd cannot diff by snapshot ID (needs Ceph reef 18.2 or later): %w",
			what, errors.ErrUnsupported)
	}
	err = d.image.DiffIterate(librbd.DiffIterateConfig{
		SnapName:      d.base.snapName,
		Offset:        off,
		Length:        length,
		IncludeParent: parent,
		WholeObject:   wholeObject,
		Callback:      emit,
	})
	return cepherr.Wrap(what, err)
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
