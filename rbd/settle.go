package rbd

import (
	"errors"
	"io/fs"
	"math"
	"strconv"

	librbd "github.com/ceph/go-ceph/rbd"

	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/rbd/internal/cepherr"
)

// What a failed librbd diff-iterate can have delivered, and the holdback
// that keeps a resumed stream from skipping what it did not.
//
// librbd lists an image's changes with one list-snaps request per object
// (per object set when striped), at most rbd_concurrent_management_ops of
// them in flight (an OrderedThrottle), and calls back in request order, on
// the thread that called diff-iterate. A request that fails (an OSD silent
// past the op timeout: ETIMEDOUT) delivers nothing, but the requests behind
// it still complete, and deliver, before diff-iterate returns the error:
// those that were in flight, and the one librbd sent before it looked at
// the error. So the extents a failed diff delivered are not a complete
// prefix of the answer: up to rbd_concurrent_management_ops units before
// the last extent delivered may be missing. Seen with an OSD stopped for
// 40 s under a 30 s op timeout: every change of the ten objects before the
// last one delivered was missing, and a stream resumed after the last
// extent ended OK without them (issue 27).
//
// So the one librbd callback (Diff.scan) passes an extent on only once an
// extent of a unit at least settleWindow units further has come: by then
// every unit before the extent's has completed, since a unit's extents can
// only come after every earlier request's outcome, and a failure at most
// rbd_concurrent_management_ops requests back. When librbd returns nil,
// the rest is passed on; when it fails, the rest is dropped, and what was
// passed on is a complete prefix: the driver resumes at its end
// (Diff.ResumeFrom) and misses nothing. This holds for every path through
// the callback: exact and whole-object diffs, with or without fast-diff
// (whose object-map path makes no request, and so only waits), precise
// mode's candidates, allocated and delta, striped images (the unit is the
// object set), LUKS (raw offsets) and clones (a parent's extents come in
// the child's requests).

// settle holds back the extents of the last units of a librbd diff.
type settle struct {
	unit   int64 // bytes of a unit: an object set
	window int64 // units held back; 0: none
	emit   func(off, length int64, exists bool) error
	held   []heldExtent
}

type heldExtent struct {
	off, length int64
	exists      bool
}

func newSettle(unit, window int64, emit func(off, length int64, exists bool) error) *settle {
	if unit <= 0 {
		window = 0
	}
	return &settle{unit: unit, window: window, emit: emit}
}

// add takes the next extent from librbd: it passes on the held extents of
// the units settled by this one, and holds this one.
func (s *settle) add(off, length int64, exists bool) error {
	if s.window <= 0 {
		return s.emit(off, length, exists)
	}
	if err := s.release(off/s.unit - s.window); err != nil {
		return err
	}
	s.held = append(s.held, heldExtent{off, length, exists})
	return nil
}

// flush passes on every held extent: librbd returned without error.
func (s *settle) flush() error { return s.release(math.MaxInt64) }

// release passes on the held extents of the units before unit u, in order.
func (s *settle) release(u int64) error {
	n := 0
	for n < len(s.held) && s.held[n].off/s.unit < u {
		h := s.held[n]
		n++
		if err := s.emit(h.off, h.length, h.exists); err != nil {
			s.held = s.held[:0]
			return err
		}
	}
	if n > 0 {
		s.held = append(s.held[:0], s.held[n:]...)
	}
	return nil
}

// concurrentOpsKey is librbd's bound on the requests of one diff in flight.
const concurrentOpsKey = "rbd_concurrent_management_ops"

// unknownConcurrentOps is the window taken when a level's setting cannot
// be read: larger than any sane setting, so only slower, never wrong.
const unknownConcurrentOps = 1024

// readSettle returns the holdback of the Diff's librbd diffs: the object
// set's size, and the number of object sets held back, one more than the
// largest rbd_concurrent_management_ops that librbd can be using for the
// image: the client's (ceph.conf, the monitors' config database), the
// pool's or the image's (rbd config pool|image set), whichever is largest.
//
// Implements (through go-ceph): rbd_stat, rbd_get_stripe_count,
// rbd_metadata_get, rbd_pool_metadata_get, rados_conf_get.
func (d *Diff) readSettle() (unit, window int64, err error) {
	st, err := d.image.Stat()
	if err != nil {
		return 0, 0, cepherr.Wrap("stat "+d.target.imageSpec(), err)
	}
	sc, err := d.image.GetStripeCount()
	if err != nil {
		return 0, 0, cepherr.Wrap("get stripe count of "+d.target.imageSpec(), err)
	}
	unit = int64(st.Obj_size) * int64(max(sc, 1))
	ops := setting(d.cc.Rados().GetConfigOption(concurrentOpsKey))
	ops = max(ops, setting(d.image.GetMetadata("conf_"+concurrentOpsKey)))
	// Pool settings live in the pool's default namespace.
	pool, err := d.cc.Rados().OpenIOContext(d.target.pool)
	if err != nil {
		ops = unknownConcurrentOps
	} else {
		ops = max(ops, setting(librbd.GetPoolMetadata(pool, "conf_"+concurrentOpsKey)))
		pool.Destroy()
	}
	return unit, ops + 1, nil
}

// setting parses one level's rbd_concurrent_management_ops: 0 when that
// level does not set it (or hides it: librbd cannot read it either),
// unknownConcurrentOps when it cannot be read or parsed.
func setting(v string, err error) int64 {
	if err != nil {
		if err := cepherr.Classify(err); errors.Is(err, fs.ErrNotExist) || errors.Is(err, fs.ErrPermission) {
			return 0
		}
		return unknownConcurrentOps
	}
	n, perr := strconv.ParseInt(v, 10, 64)
	if perr != nil || n < 0 {
		return unknownConcurrentOps
	}
	return min(n, unknownConcurrentOps)
}
