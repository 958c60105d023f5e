// Package drivertest has an in-memory driver.Source for tests of the
// driver, the server and clients.
package drivertest

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"sync"

	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/driver"
)

var _ driver.Source = (*Source)(nil)

// Volume is a volume's snapshots as the fake sees them.
type Volume struct {
	Capacity int64
	// Allocated maps a snapshot ID to its allocated extents.
	Allocated map[string][]driver.Extent
	// Delta maps "base>target" to the changed extents.
	Delta map[string][]driver.Extent
	// ObjectSize, when positive, makes the volume's diffs report the rest
	// of an object, from the offset to the object's end, when an Iterate
	// starts inside an object that holds an extent there (as librbd may),
	// and say where to resume (driver.Resumer): at the object's start.
	ObjectSize int64
	// CheckObjects, with ObjectSize, makes the volume's diffs check the
	// seam of a resumed stream (driver.SeamChecker) from that many
	// objects before the object where it resumes.
	CheckObjects int64
}

// Source serves fixed extents. Hooks let a test fail or stall a diff.
type Source struct {
	mu      sync.Mutex
	volumes map[string]*Volume // by snapshot ID
	open    int
	opened  int
	calls   int

	// OpenErr, when set, fails Open.
	OpenErr error
	// BeforeExtent, when set, runs before the i-th extent of a diff is
	// delivered; an error from it fails the diff, but ErrSkip, which
	// leaves the extent out, as librbd leaves out those of a request that
	// failed while it delivers later ones.
	BeforeExtent func(ctx context.Context, i int) error
	// OpenHook, when set, runs before each Open, given how many Opens came
	// before; an error from it fails that Open.
	OpenHook func(ctx context.Context, n int) error
	// Lineage, when set, makes the n-th Open's diff a driver.Lineager
	// that names Lineage(n).
	Lineage func(n int) string
}

// ErrSkip, from Source.BeforeExtent, leaves an extent out.
var ErrSkip = errors.New("drivertest: leave this extent out")

// TemporaryError is an error that goes away by itself (see driver.Source).
type TemporaryError struct{ Why string }

func (e TemporaryError) Error() string { return "temporary: " + e.Why }

// Temporary marks the error as one that goes away by itself.
func (TemporaryError) Temporary() bool { return true }

// Reason is the error's label in the metric of resumes.
func (e TemporaryError) Reason() string { return e.Why }

// NewSource returns an empty fake.
func NewSource() *Source { return &Source{volumes: map[string]*Volume{}} }

// Add makes the snapshots of v known by the IDs in v's maps.
func (s *Source) Add(v *Volume) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for id := range v.Allocated {
		s.volumes[id] = v
	}
}

// Open implements driver.Source.
func (s *Source) Open(ctx context.Context, req driver.OpenRequest) (driver.Diff, error) {
	if s.OpenErr != nil {
		return nil, s.OpenErr
	}
	s.mu.Lock()
	n := s.calls
	s.calls++
	s.mu.Unlock()
	if s.OpenHook != nil {
		if err := s.OpenHook(ctx, n); err != nil {
			return nil, err
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	v, ok := s.volumes[req.Target]
	if !ok {
		return nil, fmt.Errorf("snapshot %q: %w", req.Target, fs.ErrNotExist)
	}
	ext := v.Allocated[req.Target]
	if req.Base != "" {
		if _, ok := s.volumes[req.Base]; !ok {
			return nil, fmt.Errorf("snapshot %q: %w", req.Base, fs.ErrNotExist)
		}
		if ext, ok = v.Delta[req.Base+">"+req.Target]; !ok {
			return nil, fmt.Errorf("no delta from %q to %q: %w", req.Base, req.Target, fs.ErrInvalid)
		}
	}
	s.open++
	s.opened++
	d := &diff{src: s, capacity: v.Capacity, extents: ext, obj: v.ObjectSize, check: v.CheckObjects}
	if s.Lineage != nil {
		return lineageDiff{d, s.Lineage(n)}, nil
	}
	if d.obj > 0 && d.check > 0 {
		return checkedDiff{objectDiff{d}}, nil
	}
	if d.obj > 0 {
		return objectDiff{d}, nil
	}
	return d, nil
}

type lineageDiff struct {
	*diff
	lineage string
}

func (d lineageDiff) Lineage() string { return d.lineage }

// OpenDiffs counts the diffs opened and not yet closed.
func (s *Source) OpenDiffs() int { s.mu.Lock(); defer s.mu.Unlock(); return s.open }

// OpenCalls counts the calls of Open, failed ones too.
func (s *Source) OpenCalls() int { s.mu.Lock(); defer s.mu.Unlock(); return s.calls }

// Opened counts the diffs ever opened.
func (s *Source) Opened() int { s.mu.Lock(); defer s.mu.Unlock(); return s.opened }

type diff struct {
	src      *Source
	capacity int64
	extents  []driver.Extent
	obj      int64 // Volume.ObjectSize
	check    int64 // Volume.CheckObjects
	closed   bool
}

// checkedDiff is an objectDiff that checks seams: a driver.SeamChecker.
type checkedDiff struct{ objectDiff }

// CheckFrom implements driver.SeamChecker: d.check objects before the
// object of offset.
func (d checkedDiff) CheckFrom(offset int64) int64 {
	return max(d.ResumeFrom(offset)-d.check*d.obj, 0)
}

// objectDiff is a diff of a volume with objects: a driver.Resumer.
type objectDiff struct{ *diff }

// ResumeFrom implements driver.Resumer: the start of the object.
func (d objectDiff) ResumeFrom(offset int64) int64 { return offset - offset%d.obj }

func (d *diff) Capacity() int64 { return d.capacity }

// Iterate delivers the extents that end after offset, clipped to it, as
// librbd does; with ObjectSize, started inside an object, the rest of that
// object first when it holds an extent there.
func (d *diff) Iterate(ctx context.Context, offset int64, emit func(driver.Extent) error) error {
	rest := int64(-1) // the end of the object reported whole
	for i, e := range d.extents {
		if e.Offset+e.Length <= offset || e.Offset+e.Length <= rest {
			continue
		}
		if e.Offset < offset {
			e.Length -= offset - e.Offset
			e.Offset = offset
		}
		if d.obj > 0 && offset%d.obj != 0 && rest < 0 && e.Offset < offset-offset%d.obj+d.obj {
			rest = offset - offset%d.obj + d.obj
			e = driver.Extent{Offset: offset, Length: min(rest, d.capacity) - offset}
		} else if e.Offset < rest {
			e.Length -= rest - e.Offset
			e.Offset = rest
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if h := d.src.BeforeExtent; h != nil {
			if err := h(ctx, i); errors.Is(err, ErrSkip) {
				continue
			} else if err != nil {
				return err
			}
		}
		if err := emit(e); err != nil {
			return err
		}
	}
	return nil
}

func (d *diff) Close() error {
	if d.closed {
		return fmt.Errorf("diff closed twice")
	}
	d.closed = true
	d.src.mu.Lock()
	d.src.open--
	d.src.mu.Unlock()
	return nil
}
