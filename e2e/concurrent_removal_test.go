//go:build e2e

package e2e

// A snapshot removed while a stream reads it (issue 20). A backup tool
// reads a Delta page by page, slowly (it reads the data each page names);
// meanwhile a retention job, a user or Ceph-CSI's DeleteSnapshot removes
// the base or the target snapshot, and the OSDs trim it out of every
// object's snap set. Whatever the server then reads is judged against snap
// sets without the snapshot, and its answer may miss changed bytes; the
// stream must then end non-OK, never OK with bytes missing.
//
// Each scenario stalls one stream per mode (precise, exact, object) and
// block type (VARIABLE_LENGTH, FIXED_LENGTH 4 KiB) at once, each on a
// server of its own. A reader that takes no page makes the server's pager
// wait in the diff's callback once gRPC's window (64 KiB: a few thousand
// small tuples) and the sender's queue are full; the stall here is put at
// that very point, the callback, after a few extents (stallGate), so that
// the snapshot goes while nearly the whole volume is still to be read,
// whatever the mode and tuple size. The client also keeps gRPC's 64 KiB
// window (no BDP growth) and reads nothing until the snapshot is gone.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ceph/go-ceph/rados"
	"github.com/ceph/go-ceph/rbd"
	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/driver"
	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/e2e/harness"
	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/e2e/oracle"
	rsm "github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/rbd"
)

// removalObjects is how many objects a removal history writes, every
// other object of the image, so that whole objects never merge into one
// tuple: enough that a stalled stream has most of them still to read.
const removalObjects = 400

// removalRegion is the bytes of an object that a history writes and then
// discards: a discard of whole 64 KiB granules is carried out as a punch
// (librbd skips smaller partial discards).
const removalRegion = 64 << 10

// removalVolume is an image with a removal history, and the ranges it
// touched: nothing outside them ever changed.
type removalVolume struct {
	v       harness.RbdVolume
	img     *rbd.Image
	prefix  string // block name prefix, for object names
	objSize int64
	regions []harness.Span
	objnos  []int64 // the objects written, ascending
}

// removalHistory writes the base state: in each of removalObjects objects
// (every other one), 64 KiB of data at its start (even ones) or at its end
// (odd ones).
func removalHistory(t *testing.T, ioctx *rados.IOContext, img *rbd.Image, v harness.RbdVolume) *removalVolume {
	t.Helper()
	st, err := img.Stat()
	if err != nil {
		t.Fatal(err)
	}
	rv := &removalVolume{v: v, img: img, prefix: st.Block_name_prefix, objSize: int64(st.Obj_size)}
	for k := range removalObjects {
		objno := int64(2 * k)
		o := objno * rv.objSize
		rv.objnos = append(rv.objnos, objno)
		if k%2 == 0 {
			rv.regions = append(rv.regions, harness.Span{Offset: o, Length: removalRegion})
		} else {
			// The head byte that the change writes, and the tail.
			rv.regions = append(rv.regions, harness.Span{Offset: o, Length: 1}, harness.Span{Offset: o + rv.objSize - removalRegion, Length: removalRegion})
		}
	}
	rv.each(t, func(k int, o int64) error {
		if k%2 == 0 {
			return writeData(img, o, removalRegion, k)
		}
		return writeData(img, o+rv.objSize-removalRegion, removalRegion, k)
	})
	return rv
}

// change makes the base state's data go: the 64 KiB are discarded, then a
// few bytes written (at the start of an object whose tail went, so that
// the object shrinks but stays).
func (rv *removalVolume) change(t *testing.T) {
	t.Helper()
	rv.each(t, func(k int, o int64) error {
		if k%2 == 0 {
			if _, err := rv.img.Discard(uint64(o), removalRegion); err != nil {
				return err
			}
			for _, b := range []int64{100, 40000} {
				if err := writeData(rv.img, o+b, 1, k); err != nil {
					return err
				}
			}
			return nil
		}
		if _, err := rv.img.Discard(uint64(o+rv.objSize-removalRegion), removalRegion); err != nil {
			return err
		}
		return writeData(rv.img, o, 1, k)
	})
}

// each runs fn on every written object, 8 at a time (librbd images are
// thread-safe), and fails the test on the first error.
func (rv *removalVolume) each(t *testing.T, fn func(k int, off int64) error) {
	t.Helper()
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
		next  = make(chan int)
	)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := range next {
				if err := fn(k, rv.objnos[k]*rv.objSize); err != nil {
					mu.Lock()
					if first == nil {
						first = fmt.Errorf("object %d: %w", rv.objnos[k], err)
					}
					mu.Unlock()
				}
			}
		}()
	}
	for k := range rv.objnos {
		next <- k
	}
	close(next)
	wg.Wait()
	if first != nil {
		t.Fatalf("write %s: %v", rv.v.Spec(), first)
	}
}

// writeData writes n bytes of non-zero data at off, different per seed.
func writeData(img *rbd.Image, off, n int64, seed int) error {
	data := make([]byte, n)
	for i := range data {
		data[i] = byte(seed*131+i*7) | 1
	}
	w, err := img.WriteAt(data, off)
	if err == nil && w != len(data) {
		err = fmt.Errorf("short write of %d bytes", w)
	}
	return err
}

// truth returns the bytes that differ between snapshots from and to,
// read within the touched regions (nothing else was ever written).
func (rv *removalVolume) truth(t *testing.T, from, to *harness.SnapReader) []harness.Span {
	t.Helper()
	var out []harness.Span
	for _, r := range rv.regions {
		x, y := make([]byte, r.Length), make([]byte, r.Length)
		from.ReadAt(t, x, r.Offset)
		to.ReadAt(t, y, r.Offset)
		harness.EachRun(x, y, r.Offset, func(off, n int64) { out = append(out, harness.Span{Offset: off, Length: n}) })
	}
	return harness.MergeSpans(out)
}

// snapByID opens the volume at a snapshot given by ID (Ceph-CSI's trash
// snapshots have no usable name).
func (rv *removalVolume) snapByID(t *testing.T, snap uint64) *harness.SnapReader {
	t.Helper()
	img, err := rbd.OpenImageReadOnly(rv.v.IOCtx, rv.v.Name, rbd.NoSnapshot)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = img.Close() })
	if err := img.SetSnapByID(snap); err != nil {
		t.Fatalf("set %s to snapshot %d: %v", rv.v.Name, snap, err)
	}
	size, err := img.GetSize()
	if err != nil {
		t.Fatal(err)
	}
	return &harness.SnapReader{Img: img, Size: int64(size)}
}

// object names object objno of the image.
func (rv *removalVolume) object(objno int64) string {
	return fmt.Sprintf("%s.%016x", rv.prefix, objno)
}

// stallGate wraps a driver.Source so that each diff stops in its callback
// at extent `at`, as the pager does when its reader takes no page, until
// released.
type stallGate struct {
	driver.Source
	at       int
	stalled  chan struct{} // closed when a diff reached extent `at`
	release  chan struct{} // closed by the test
	stallOne sync.Once
}

func newStallGate(at int) *stallGate {
	return &stallGate{at: at, stalled: make(chan struct{}), release: make(chan struct{})}
}

func (g *stallGate) Open(ctx context.Context, req driver.OpenRequest) (driver.Diff, error) {
	d, err := g.Source.Open(ctx, req)
	if err != nil {
		return nil, err
	}
	return gatedDiff{d, g}, nil
}

type gatedDiff struct {
	driver.Diff
	g *stallGate
}

func (d gatedDiff) Iterate(ctx context.Context, offset int64, emit func(driver.Extent) error) error {
	n := 0
	return d.Diff.Iterate(ctx, offset, func(e driver.Extent) error {
		if n++; n == d.g.at {
			d.g.stallOne.Do(func() { close(d.g.stalled) })
			select {
			case <-d.g.release:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return emit(e)
	})
}

// removalRun is one stalled stream: a server of its own in one mode and
// block type, and a client with a small flow-control window.
type removalRun struct {
	name  string
	p     *harness.InProc
	gate  *stallGate
	recv  func() (harness.MetaResponse, error)
	pages []harness.Page
	err   error // how the stream ended; nil: OK
}

// removalModes are the server configurations each scenario stalls.
var removalModes = []struct {
	mode string
	opts rsm.Options
}{
	{"precise", rsm.Options{Precise: true}},
	{"exact", rsm.Options{}},
	{"object", rsm.Options{WholeObject: true}},
}

var removalTypes = []struct {
	name  string
	typ   csi.BlockMetadataType
	fixed int64
}{
	{"variable", csi.BlockMetadataType_VARIABLE_LENGTH, 0},
	{"fixed-4k", csi.BlockMetadataType_FIXED_LENGTH, 4096},
}

// stallStreams starts r on a server per mode and block type, each of
// which stops at its stallAt-th extent, and waits until all have stopped
// (none may end before: the history would be too small to test anything).
func stallStreams(t *testing.T, r harness.MetaReq) []*removalRun {
	t.Helper()
	const stallAt = 4
	var runs []*removalRun
	for _, m := range removalModes {
		for _, bt := range removalTypes {
			run := &removalRun{name: m.mode + "/" + bt.name, gate: newStallGate(stallAt)}
			run.p = harness.StartInProc(t, m.opts, func(s driver.Source) driver.Source {
				run.gate.Source = s
				return run.gate
			}, driver.Options{BlockMetadataType: bt.typ, FixedBlockSize: bt.fixed})
			t.Cleanup(func() {
				select {
				case <-run.gate.release:
				default:
					close(run.gate.release)
				}
			})
			// A reader that does not read: the window stays at 64 KiB.
			s := harness.SlowReader(t, run.p.Sock)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			t.Cleanup(cancel)
			var err error
			if run.recv, err = s.Open(ctx, r); err != nil {
				t.Fatalf("%s: %v: %v", run.name, r, err)
			}
			runs = append(runs, run)
		}
	}
	for _, run := range runs {
		select {
		case <-run.gate.stalled:
		case h := <-run.p.Svc.Done:
			t.Fatalf("%s: the stream ended (%v, %d tuples) before its %dth extent: the history is too small to stall it",
				run.name, h.Err, h.Tuples, stallAt)
		case <-time.After(2 * time.Minute):
			t.Fatalf("%s: no extent %d within 2 minutes", run.name, stallAt)
		}
	}
	return runs
}

// finish lets every run go on, and reads it to its end.
func finish(runs []*removalRun) {
	var wg sync.WaitGroup
	for _, run := range runs {
		close(run.gate.release)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				resp, err := run.recv()
				if err == io.EOF {
					return
				}
				if err != nil {
					run.err = err
					return
				}
				run.pages = append(run.pages, harness.ToPage(resp))
			}
		}()
	}
	wg.Wait()
}

// checkRemoval checks how each run ended: with code want and a message
// naming which snapshot went (when want is not OK), or, when it ended OK,
// complete (no byte of truth missed) and within the spec's rules. Every
// server then holds no image and no connection reference.
func checkRemoval(t *testing.T, r harness.MetaReq, runs []*removalRun, truth []harness.Span, want codes.Code, which string) {
	t.Helper()
	for _, run := range runs {
		m := harness.MetaStream{Pages: run.pages, Err: run.err}
		tuples := m.Tuples()
		missed := harness.TotalBytes(harness.OracleMisses(truth, tuples))
		t.Logf("%s: %s after %d tuples (%d bytes); they miss %d of the %d changed bytes (in 4 KiB blocks)",
			run.name, status.Code(run.err), len(tuples), harness.TotalBytes(tuples), missed, harness.TotalBytes(harness.RoundOut(truth, harness.OracleBlock)))
		switch got := status.Code(run.err); {
		case got != want:
			t.Errorf("%s: %v ended %v (%v), want %v", run.name, r, got, run.err, want)
		case want == codes.OK:
			typ, fixed := csi.BlockMetadataType_VARIABLE_LENGTH, int64(0)
			if strings.HasSuffix(run.name, "fixed-4k") {
				typ, fixed = csi.BlockMetadataType_FIXED_LENGTH, 4096
			}
			harness.CheckStream(t, r, m, typ, fixed)
			if missed != 0 {
				t.Errorf("%s: %v ended OK but missed %d changed bytes: %v", run.name, r, missed, harness.OracleMisses(truth, tuples))
			}
		case !strings.Contains(status.Convert(run.err).Message(), which):
			t.Errorf("%s: the status does not say that the %s went: %v", run.name, which, run.err)
		}
		run.p.WaitRefs(t)
	}
}

// TestSnapshotRemovedMidStream removes the base, and separately the target,
// of stalled Deltas in every mode and block type, lets the OSDs trim it,
// then reads on: every stream must end NOT_FOUND naming the snapshot that
// went. A control run without removal (but with the image renamed and
// shrunk meanwhile) must end OK and byte-complete.
func TestSnapshotRemovedMidStream(t *testing.T) {
	harness.FastSnapTrim(t)
	conn := harness.ConnectAdmin(t)
	size := uint64(2*removalObjects) << 22
	secrets := oracle.Secrets(t)

	setup := func(t *testing.T) (*removalVolume, uint64, uint64) {
		v, img := harness.CreateVolume(t, conn, "", "removal", size, harness.ImageFeatures)
		rv := removalHistory(t, v.IOCtx, img, v)
		a := harness.Snapshot(t, img, "A")
		rv.change(t)
		b := harness.Snapshot(t, img, "B")
		return rv, a, b
	}
	// The objects whose snap sets show the trim: the last ones a stream
	// reads, and one in the middle.
	late := func(rv *removalVolume) []string {
		n := len(rv.objnos)
		return []string{rv.object(rv.objnos[n/2]), rv.object(rv.objnos[n-2]), rv.object(rv.objnos[n-1])}
	}

	t.Run("control", func(t *testing.T) {
		// The image renamed and its head shrunk while the streams stall:
		// neither changes what the snapshots hold, and the server reads
		// by image and snapshot ID, so the streams must end OK and
		// complete.
		rv, _, _ := setup(t)
		r := harness.MetaReq{Base: rv.v.ID("A"), Target: rv.v.ID("B"), Secrets: secrets}
		truth := rv.truth(t, harness.OpenSnap(t, rv.v, "A"), harness.OpenSnap(t, rv.v, "B"))
		runs := stallStreams(t, r)
		renamed := rv.v.Name + "-renamed"
		harness.RbdCLI(t, "rename", rv.v.Spec(), harness.Pool+"/"+renamed)
		t.Cleanup(func() { harness.RbdCLI(t, "rename", harness.Pool+"/"+renamed, rv.v.Spec()) })
		harness.ResizeImage(t, rv.img, size/2)
		finish(runs)
		checkRemoval(t, r, runs, truth, codes.OK, "")
	})

	t.Run("base", func(t *testing.T) {
		rv, a, _ := setup(t)
		r := harness.MetaReq{Base: rv.v.ID("A"), Target: rv.v.ID("B"), Secrets: secrets}
		truth := rv.truth(t, harness.OpenSnap(t, rv.v, "A"), harness.OpenSnap(t, rv.v, "B"))
		runs := stallStreams(t, r)
		if err := rv.img.GetSnapshot("A").Remove(); err != nil {
			t.Fatalf("remove %s@A: %v", rv.v.Spec(), err)
		}
		t.Logf("base snapshot %d trimmed in %v", a, harness.WaitTrimmed(t, "", a, late(rv)...))
		finish(runs)
		checkRemoval(t, r, runs, truth, codes.NotFound, "base snapshot")
	})

	t.Run("target", func(t *testing.T) {
		// A twin of the target, then writes to every object: the objects
		// keep clones that hold both B and B2, and once B goes and is
		// trimmed from them, B's objects no longer have a version at B.
		rv, _, b := setup(t)
		harness.Snapshot(t, rv.img, "B2")
		rv.change(t)
		r := harness.MetaReq{Base: rv.v.ID("A"), Target: rv.v.ID("B"), Secrets: secrets}
		truth := rv.truth(t, harness.OpenSnap(t, rv.v, "A"), harness.OpenSnap(t, rv.v, "B"))
		runs := stallStreams(t, r)
		if err := rv.img.GetSnapshot("B").Remove(); err != nil {
			t.Fatalf("remove %s@B: %v", rv.v.Spec(), err)
		}
		t.Logf("target snapshot %d trimmed in %v", b, harness.WaitTrimmed(t, "", b, late(rv)...))
		finish(runs)
		checkRemoval(t, r, runs, truth, codes.NotFound, "target snapshot")
	})
}

// TestCSIDeleteSnapshotMidStream deletes the base of a stalled Delta
// between two Ceph-CSI snapshot handles as Ceph-CSI's DeleteSnapshot does:
// the csi-snap clone's own snapshot and the clone image go, and with the
// clone, its parent, the source volume's trash snapshot, which holds the
// base's data. Every stream must end NOT_FOUND.
func TestCSIDeleteSnapshotMidStream(t *testing.T) {
	harness.FastSnapTrim(t)
	conn := harness.ConnectAdmin(t)
	c := harness.NewCSICluster(t, conn, harness.ClusterID, "")
	vol := c.CreateVolume(t, uint64(2*removalObjects)<<22, nil)
	rv := removalHistory(t, c.IOCtx, vol.Img, harness.RbdVolume{IOCtx: c.IOCtx, Name: vol.Name})
	sa := vol.Snapshot(t)
	rv.change(t)
	sb := vol.Snapshot(t)

	r := harness.MetaReq{Base: sa.Handle(), Target: sb.Handle(), Secrets: oracle.Secrets(t)}
	truth := rv.truth(t, rv.snapByID(t, sa.TrashID), rv.snapByID(t, sb.TrashID))
	runs := stallStreams(t, r)

	csiDeleteSnapshot(t, sa)
	if _, err := vol.Img.GetSnapNamespaceType(sa.TrashID); !errors.Is(err, rbd.ErrNotFound) {
		t.Fatalf("the source's trash snapshot %d of the deleted snapshot is still there (%v): DeleteSnapshot did not remove the data", sa.TrashID, err)
	}
	n := len(rv.objnos)
	t.Logf("base trash snapshot %d trimmed in %v", sa.TrashID,
		harness.WaitTrimmed(t, "", sa.TrashID, rv.object(rv.objnos[n/2]), rv.object(rv.objnos[n-1])))
	finish(runs)
	checkRemoval(t, r, runs, truth, codes.NotFound, "base snapshot")
}

// csiDeleteSnapshot deletes a snapshot as Ceph-CSI's DeleteSnapshot does:
// the clone's snapshot, then the clone (its removal detaches it from the
// source's trash snapshot, which librbd then removes), then the journal.
func csiDeleteSnapshot(t *testing.T, s *harness.CSISnap) {
	t.Helper()
	c := s.Vol.C
	if err := s.CloneImg.GetSnapshot(s.Clone).Remove(); err != nil {
		t.Fatalf("remove %s@%s: %v", s.Clone, s.Clone, err)
	}
	// Nobody holds the clone open in Ceph-CSI: it would be a watcher.
	if err := s.CloneImg.Close(); err != nil {
		t.Fatal(err)
	}
	if err := rbd.RemoveImage(c.IOCtx, s.Clone); err != nil {
		t.Fatalf("remove %s: %v", s.Clone, err)
	}
	if err := c.IOCtx.Delete("csi.snap." + s.UUID); err != nil {
		t.Fatalf("remove the journal of %s: %v", s.Clone, err)
	}
}
