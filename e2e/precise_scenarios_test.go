//go:build e2e

package e2e

// The scenarios of TestPreciseOracle's histories, by name: the shapes a
// seed picks (preciseShapes: object size, format 1, clones, copy-on-read,
// migration, concurrent removal), and the steps its random histories are
// made of (preciseSteps: writes, zeros, discards, resizes, recreated
// objects, reads, rollbacks, snapshots). The oracle's table has a row per
// kind a history went through; preciseShapes names them, with the steps'
// own kinds (write-zeroes, shrink-grow, clone past the overlap, recreate,
// rollback).
//
// A seed replays its history exactly: the steps draw from the workload's
// random source in a fixed order, and the table of steps picks one with a
// single draw in [0, 100).

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/ceph/go-ceph/rados"
	"github.com/ceph/go-ceph/rbd"

	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/e2e/harness"
	rsm "github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/rbd"
)

// preciseShape is a kind of history that the seed picks (run), in turn, so
// that a dozen consecutive seeds cover each.
type preciseShape struct {
	name string // the kind, as the oracle's table shows it
	doc  string
}

// preciseShapes are the kinds run picks by seed, and where they are made.
var preciseShapes = []preciseShape{
	{"order N", "objects of 2^N bytes: the first image's N by seed mod 4 (16, 20, 22 or 25: 64 KiB to 32 MiB), a clone's 2 or 4 more (at most 25) half the time"},
	{"plain", "one image, no clone"},
	{"clone", "a clone (format 2) of the first image, with a history of its own (half the seeds)"},
	{"clone of a clone", "a clone of that clone (a quarter of the seeds)"},
	{"copy-on-read", "a clone opened with rbd_clone_copy_on_read, whose reads copy up, some raced by a write into the same object (a third of the clones; copyOnRead)"},
	{"format 1", "the first image is of the old format, not cloned, walked by precise mode (seed mod 6 = 1; createFormat1)"},
	{"migration", "the checked image prepared for live migration, which every mode must refuse (FAILED_PRECONDITION) or answer without missing a byte (seed mod 6 = 4; migrate)"},
	{"concurrent removal", "a snapshot removed while Deltas to it run (seed mod 3 = 2, with two snapshots or more; removeDuring in precise_removal_test.go)"},
}

// preciseStep is one kind of step of a random history. A history draws
// one number in [0, 100) per step and takes the step whose band holds it;
// the bands follow one another in preciseSteps' order, each weight wide.
// A step that cannot run on the image gives way to the last (snapshot).
type preciseStep struct {
	name   string
	doc    string
	weight int                        // in 100
	can    func(p *preciseImage) bool // nil: always
	kinds  []string                   // the kinds of history it records
	// do runs the step on p; off and length are a random extent of p
	// (extent), drawn before the step is picked.
	do func(w *preciseWorkload, p *preciseImage, off, length uint64)
}

// preciseSteps are the steps of a history, in the order of their bands.
var preciseSteps = []preciseStep{
	{name: "write", weight: 40, doc: "random bytes over the extent",
		do: func(w *preciseWorkload, p *preciseImage, off, length uint64) { w.write(p, off, length) }},
	{name: "write zeros", weight: 5, doc: "zeros written as data over the extent: changed bytes that read as zeros",
		do: func(w *preciseWorkload, p *preciseImage, off, length uint64) {
			w.logf("write zeros %d+%d", off, length)
			if _, err := p.img.WriteAt(make([]byte, length), int64(off)); err != nil {
				w.t.Fatalf("write zeros %d+%d: %v", off, length, err)
			}
		}},
	{name: "write-zeroes", kinds: []string{"write-zeroes"}, weight: 8, doc: "librbd's rbd_write_zeroes: a discard that zeroes the partial objects of its range and removes (or truncates) whole ones (writeZeroes)",
		do: func(w *preciseWorkload, p *preciseImage, _, _ uint64) { w.writeZeroes(p) }},
	{name: "discard", weight: 8, doc: "a discard of the extent, half the time on librbd's 64 KiB discard granularity, so that it punches holes inside objects",
		do: func(w *preciseWorkload, p *preciseImage, off, length uint64) {
			if w.rng.IntN(2) == 0 {
				// On librbd's 64 KiB discard granularity, so that it
				// punches holes inside objects instead of skipping.
				off &^= 64<<10 - 1
				length = min(p.size-off, (64<<10)*(1+w.rng.Uint64N(8)))
			}
			w.logf("discard %d+%d", off, length)
			if _, err := p.img.Discard(off, length); err != nil {
				w.t.Fatalf("discard %d+%d: %v", off, length, err)
			}
		}},
	{name: "resize", weight: 6, doc: "grown or shrunk by up to two objects, often not on an object boundary (resized)",
		do: func(w *preciseWorkload, p *preciseImage, _, _ uint64) { w.resize(p, w.resized(p)) }},
	{name: "shrink-grow", kinds: []string{"shrink-grow", "clone past the overlap"}, weight: 3, doc: "shrink, snapshot, grow, snapshot, ... several times; on a clone, half the time, grown past the parent's size, shrunk below the parent overlap and grown again (clone past the overlap; shrinkGrow)",
		do: func(w *preciseWorkload, p *preciseImage, _, _ uint64) { w.shrinkGrow(p) }},
	{name: "recreate", kinds: []string{"recreate"}, weight: 4, doc: "an object removed by a whole-object discard, then written again, with or without a snapshot in between (recreate)",
		do: func(w *preciseWorkload, p *preciseImage, _, _ uint64) { w.recreate(p) }},
	{name: "read", weight: 6, doc: "a read of up to 64 KiB, which copies up on a copy-on-read clone (read)",
		do: func(w *preciseWorkload, p *preciseImage, off, length uint64) {
			w.read(p, off, min(length, 64*preciseKiB))
		}},
	{name: "rollback", kinds: []string{"rollback"}, weight: 3, doc: "`rbd snap rollback` to any earlier snapshot (rollback)",
		can: func(p *preciseImage) bool { return len(p.snaps) > 0 },
		do: func(w *preciseWorkload, p *preciseImage, _, _ uint64) {
			i := w.rng.IntN(len(p.snaps))
			w.rollback(p, p.snaps[i])
			p.size = p.snapSizes[i]
		}},
	{name: "snapshot", weight: 17, doc: "a user snapshot s<n> (snap)",
		do: func(w *preciseWorkload, p *preciseImage, _, _ uint64) { w.snap(p) }},
}

// knownKinds are the kinds that preciseShapes and preciseSteps name, so
// that the oracle's table has no row they do not explain. (Made by init:
// the steps record kinds through preciseWorkload.kind, which checks here.)
var knownKinds = map[string]bool{}

func init() {
	for _, s := range preciseShapes {
		knownKinds[s.name] = true
	}
	for _, s := range preciseSteps {
		for _, k := range s.kinds {
			knownKinds[k] = true
		}
	}
}

// knownKind reports whether k is one of knownKinds, or an "order N".
func knownKind(k string) bool {
	if n, ok := strings.CutPrefix(k, "order "); ok {
		_, err := strconv.Atoi(n)
		return err == nil
	}
	return knownKinds[k]
}

// pickStep returns the step whose band holds op, in [0, 100).
func pickStep(op int, p *preciseImage) preciseStep {
	end := 0
	for _, s := range preciseSteps {
		end += s.weight
		if op < end {
			if s.can == nil || s.can(p) {
				return s
			}
			break
		}
	}
	return preciseSteps[len(preciseSteps)-1]
}

// history applies n random steps to p (preciseSteps), with a snapshot at
// the end.
func (w *preciseWorkload) history(p *preciseImage, n int) {
	for i := 0; i < n; i++ {
		off, length := w.extent(p)
		pickStep(w.rng.IntN(100), p).do(w, p, off, length)
	}
	w.snap(p)
}

// run builds the history: a plain image, or a clone (sometimes of a
// clone) whose parent has a history of its own (history). The first
// image's objects are 64 KiB, 1, 4 or 32 MiB; some are of format 1 (and
// not cloned); some clones copy up on read.
//
// The seed picks these structural kinds (preciseShapes) in turn, so that a
// dozen consecutive seeds cover each: the order by seed mod 4, format 1
// for seed mod 6 = 1, a migration for seed mod 6 = 4.
func (w *preciseWorkload) run() {
	r := w.rng
	order := []uint64{16, 20, 22, 25}[w.seed%4]
	w.kind(fmt.Sprintf("order %d", order))
	switch order {
	case 16:
		w.maxSize = 8 * harness.MiB
	case 25:
		w.maxSize = 72 * harness.MiB
	}
	var p *preciseImage
	// Format 1 images and migrations go through the rbd CLI, on the main
	// test cluster; neither takes a data pool.
	cli := w.dataPool == ""
	if cli && w.seed%6 == 1 {
		p = w.createFormat1(order)
	} else {
		p = w.create(nil, order)
	}
	w.history(p, 10+r.IntN(20))
	for depth := 0; depth < 2 && !w.format1 && r.IntN(2) == 0; depth++ {
		// librbd refuses clones with smaller objects than the parent's.
		if r.IntN(2) == 0 {
			order = min(order+2+uint64(r.IntN(2))*2, 25)
			w.kind(fmt.Sprintf("order %d", order))
		}
		p = w.create(p, order)
		w.kind([]string{"clone", "clone of a clone"}[depth])
		if r.IntN(3) == 0 {
			w.copyOnRead(p)
		}
		w.history(p, 10+r.IntN(20))
	}
	if len(w.images) == 1 && !w.format1 {
		w.kind("plain")
	}
	if w.migrating = cli && w.seed%6 == 4; w.migrating {
		w.kind("migration")
	} else if w.removing = w.seed%3 == 2 && len(p.snaps) >= 2; w.removing {
		w.kind("concurrent removal")
	}
}

// writeZeroes zeroes part of an object (unaligned, or on 512 bytes) or
// whole objects of p, as rbd_write_zeroes does, through the workload's
// zeroing ioctx; without one, it discards. The first one checks that the
// range reads as zeros, so that the history does what it says.
func (w *preciseWorkload) writeZeroes(p *preciseImage) {
	t, r := w.t, w.rng
	if w.zero == nil {
		off, length := w.extent(p)
		w.logf("discard %d+%d", off, length)
		if _, err := p.img.Discard(off, length); err != nil {
			t.Fatalf("discard %d+%d: %v", off, length, err)
		}
		return
	}
	w.kind("write-zeroes")
	off := r.Uint64N(p.size)
	var length uint64
	switch r.IntN(3) {
	case 0: // part of an object, unaligned
		length = 1 + r.Uint64N(p.objSize/2)
	case 1: // part of an object, on 512 bytes
		off &^= 511
		length = 512 * (1 + r.Uint64N(p.objSize/1024))
	default: // all of one or two objects
		off -= off % p.objSize
		length = p.objSize * (1 + r.Uint64N(2))
	}
	length = min(length, p.size-off)
	w.logf("write-zeroes %d+%d", off, length)
	img, err := rbd.OpenImage(w.zero, p.name, rbd.NoSnapshot)
	if err != nil {
		t.Fatalf("open %s to zero: %v", p.name, err)
	}
	defer img.Close()
	if _, err := img.Discard(off, length); err != nil {
		t.Fatalf("write-zeroes %d+%d: %v", off, length, err)
	}
	if !w.zeroed {
		w.zeroed = true
		buf := make([]byte, length)
		if _, err := img.ReadAt(buf, int64(off)); err != nil {
			t.Fatal(err)
		}
		if i := slices.IndexFunc(buf, func(b byte) bool { return b != 0 }); i >= 0 {
			t.Fatalf("write-zeroes %d+%d left byte %d non-zero: rbd_skip_partial_discard=false did not take", off, length, off+uint64(i))
		}
	}
}

// recreate removes one object of p with a whole-object discard (or
// write-zeroes), sometimes snapshots, then writes into it again.
func (w *preciseWorkload) recreate(p *preciseImage) {
	t, r := w.t, w.rng
	w.kind("recreate")
	obj := r.Uint64N((p.size + p.objSize - 1) / p.objSize)
	off := obj * p.objSize
	length := min(p.objSize, p.size-off)
	w.logf("remove object %d: discard %d+%d", obj, off, length)
	if _, err := p.img.Discard(off, length); err != nil {
		t.Fatalf("discard %d+%d: %v", off, length, err)
	}
	if r.IntN(2) == 0 {
		w.snap(p)
	}
	o := off + r.Uint64N(length)
	w.write(p, o, min(1+r.Uint64N(p.objSize/2), p.size-o))
}

// shrinkGrow shrinks and grows p in turn, 3 to 5 times, with a snapshot
// after each; on a clone, half the time, it grows past the parent's size,
// shrinks below the parent overlap and grows again, writing past the
// parent's end.
func (w *preciseWorkload) shrinkGrow(p *preciseImage) {
	r := w.rng
	if p.parentSize > 0 && r.IntN(2) == 0 {
		w.kind("clone past the overlap")
		w.resize(p, p.parentSize+1+r.Uint64N(2*p.objSize))
		if p.size > p.parentSize {
			o := p.parentSize + r.Uint64N(p.size-p.parentSize)
			w.write(p, o, min(1+r.Uint64N(p.objSize), p.size-o))
		}
		w.snap(p)
		w.resize(p, p.parentSize-min(p.parentSize, 1+r.Uint64N(2*p.objSize)))
		w.snap(p)
		w.resize(p, p.parentSize+1+r.Uint64N(2*p.objSize))
		o := r.Uint64N(p.size)
		w.write(p, o, min(1+r.Uint64N(p.objSize), p.size-o))
		w.snap(p)
		return
	}
	w.kind("shrink-grow")
	for i, n := 0, 3+r.IntN(3); i < n; i++ {
		step := 1 + r.Uint64N(2*p.objSize)
		if i%2 == 0 {
			w.resize(p, p.size-min(p.size, step))
		} else {
			w.resize(p, p.size+step)
		}
		w.snap(p)
	}
}

// copyOnRead makes the clone p copy up on read, from now on.
func (w *preciseWorkload) copyOnRead(p *preciseImage) {
	w.kind("copy-on-read")
	w.logf("copy-on-read on %s", p.name)
	if err := p.img.SetMetadata("conf_rbd_clone_copy_on_read", "true"); err != nil {
		w.t.Fatal(err)
	}
	w.open(p)
	p.cor = true
}

// createFormat1 makes a format 1 image with objects of 1<<order bytes.
func (w *preciseWorkload) createFormat1(order uint64) *preciseImage {
	t := w.t
	w.kind("format 1")
	w.format1 = true
	w.walks = true // format 1 has no object map: precise mode walks
	size := (w.initialSize(order) + harness.MiB - 1) &^ (harness.MiB - 1)
	p := &preciseImage{name: harness.UniqueName(t, "precise-format1"), objSize: 1 << order, size: size}
	t.Setenv("RBD_FORCE_ALLOW_V1", "1") // reef creates format 1 images only so
	harness.RbdCLI(t, "create", "--image-format", "1", "--object-size", fmt.Sprintf("%dK", p.objSize>>10), "--size", fmt.Sprintf("%dM", size/harness.MiB), harness.Pool+"/"+p.name)
	harness.RemoveImageOnCleanup(t, w.ioctx, p.name)
	w.logf("create %s size %d order %d format 1", p.name, p.size, order)
	w.open(p)
	if old, err := p.img.IsOldFormat(); err != nil || !old {
		t.Fatalf("%s: old format %v, %v; want a format 1 image", p.name, old, err)
	}
	w.images = append(w.images, p)
	return p
}

// migrate, when run chose it (one history in six), prepares the checked
// image for live migration (not executed) and asks every mode for the last snapshot's
// Allocated and the Delta from the first: each must be refused with
// errors.ErrUnsupported (FAILED_PRECONDITION) or answered without missing
// a byte of the oracle's answer. The migration is aborted when the test
// ends.
func (w *preciseWorkload) migrate(srcs map[string]*rsm.Source, tot *preciseTotals) {
	t := w.t
	p := w.images[len(w.images)-1]
	if !w.migrating {
		return
	}
	parent, err := p.img.GetParent()
	if errors.Is(err, rbd.ErrNotFound) {
		parent = nil
	} else if err != nil {
		t.Fatalf("parent of %s: %v", p.name, err)
	}
	if err := p.img.Close(); err != nil {
		t.Fatalf("close %s: %v", p.name, err)
	}
	dst := &preciseImage{name: p.name + "-migrated", objSize: p.objSize, snaps: p.snaps}
	w.logf("migration prepare %s to %s", p.name, dst.name)
	harness.RbdCLI(t, "migration", "prepare", harness.Pool+"/"+p.name, harness.Pool+"/"+dst.name)
	dstImg, err := rbd.OpenImageReadOnly(w.ioctx, dst.name, rbd.NoSnapshot)
	if err != nil {
		t.Fatalf("open %s: %v", dst.name, err)
	}
	dstID := harness.CSIImageID(t, dstImg)
	if err := dstImg.Close(); err != nil {
		t.Fatalf("close %s: %v", dst.name, err)
	}
	t.Cleanup(func() {
		harness.RbdCLI(t, "migration", "abort", harness.Pool+"/"+dst.name)
		if parent != nil {
			detachAbortedTarget(t, w.ioctx, parent, dstID)
		}
	})
	tot.migrations++
	last := p.snaps[len(p.snaps)-1]
	for _, q := range [][2]string{{"", last}, {p.snaps[0], last}} {
		for _, m := range preciseModes {
			id := func(s string) string { return "rsm-e2e/" + harness.Pool + "/" + dst.name + "@" + s }
			req := rsm.Request{Target: id(q[1]), Secrets: preciseSecrets(t)}
			if q[0] != "" {
				req.Base = id(q[0])
			}
			what := fmt.Sprintf("migrating %s: %s %s..%s", dst.name, m.name, q[0], q[1])
			d, err := srcs[m.name].Open(context.Background(), req)
			if errors.Is(err, errors.ErrUnsupported) {
				tot.migRefused++
				continue
			}
			if err != nil {
				t.Errorf("%s: %v, want errors.ErrUnsupported (FAILED_PRECONDITION) or an answer", what, err)
				continue
			}
			var got []preciseExtent
			err = d.Iterate(context.Background(), 0, func(off, length int64) error {
				got = append(got, preciseExtent{off, length})
				return nil
			})
			d.Close()
			if err != nil {
				t.Errorf("%s: iterate: %v", what, err)
				continue
			}
			tot.migAnswered++
			var before []byte
			if q[0] != "" {
				before = w.data[q[0]]
			}
			missed, first := preciseMissed(before, w.data[q[1]], got, 0)
			tot.migMissed += missed
			w.judge(m.unsafe, m.when, what, missed, first, fmt.Sprintf("; reported %v", got))
		}
	}
}

// detachAbortedTarget undoes what `rbd migration abort` leaves behind on
// reef 18.2.7 and tentacle 20.2.4 when the migrated image is a clone whose
// parent overlap is smaller than its size (a shrink, then a rollback or a
// grow): prepare gives the target an overlap of the whole size, and abort
// removes the target but leaves it in the parent snapshot's children. That
// parent snapshot then can never be removed, nor its image (ENOTEMPTY), and
// `rbd children` fails with ENOENT. It calls cls_rbd's child_detach for the
// target as librbd's image removal should have, and logs when it had to.
func detachAbortedTarget(t testing.TB, ioctx *rados.IOContext, parent *rbd.ParentInfo, targetID string) {
	t.Helper()
	// child_detach's input: the parent snapshot's ID (u64), then a
	// cls::rbd::ChildImageSpec v2 (pool ID i64, image ID, namespace),
	// little-endian, strings as u32 length and bytes.
	str := func(b []byte, s string) []byte {
		return append(binary.LittleEndian.AppendUint32(b, uint32(len(s))), s...)
	}
	spec := binary.LittleEndian.AppendUint64(nil, uint64(ioctx.GetPoolID()))
	spec = str(spec, targetID)
	spec = str(spec, parent.Image.PoolNamespace)
	in := binary.LittleEndian.AppendUint64(nil, parent.Snap.ID)
	in = append(in, 2, 1) // struct version, compatible version
	in = binary.LittleEndian.AppendUint32(in, uint32(len(spec)))
	in = append(in, spec...)
	if parent.Image.PoolID != uint64(ioctx.GetPoolID()) || parent.Image.PoolNamespace != "" {
		t.Errorf("cleanup: parent %s is in another pool or namespace than the workload", parent.Image.ImageName)
		return
	}
	op := rados.CreateWriteOp()
	defer op.Release()
	op.Exec("rbd", "child_detach", in)
	err := op.Operate(ioctx, "rbd_header."+parent.Image.ImageID, rados.OperationNoFlag)
	var oe rados.OperationError
	if errors.As(err, &oe) && oe.OpError != nil {
		err = oe.OpError
	}
	switch {
	case errors.Is(err, rados.ErrNotFound):
		// abort detached it, as it should.
	case err != nil:
		t.Errorf("cleanup: detach the aborted migration target %s from %s@%s: %v", targetID, parent.Image.ImageName, parent.Snap.SnapName, err)
	default:
		t.Logf("cleanup: rbd migration abort left target %s a child of %s@%s (Ceph's bug for a clone with overlap < size); detached it", targetID, parent.Image.ImageName, parent.Snap.SnapName)
	}
}
