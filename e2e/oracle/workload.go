//go:build e2e

package oracle

// The workload: images built by a seed's history, the modes it queries
// (rbd.Source in each precision), and the queries themselves. judge.go
// holds the byte oracle that judges their answers, totals.go the totals
// and table TestPreciseOracle prints, cost.go TestPreciseCost's table.

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/ceph/go-ceph/rados"
	"github.com/ceph/go-ceph/rbd"

	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/e2e/harness"
	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/internal/report"
	rsm "github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/rbd"
)

const Block = 4096 // the oracle's granularity for "truly changed"

// KiB is a kibibyte, untyped.
const KiB = 1 << 10

// Mode is a way of answering that the oracle judges: one of Modes.
type Mode struct {
	Name   string
	opts   rsm.Options
	unsafe string
	when   []string
}

// Modes are the three --precision settings, and precise mode with
// --trust-object-map. unsafe names, for a mode that can miss changed
// bytes, the passage of docs/precision.md that says when: its
// misses are logged and counted, not failed, in histories of the kinds
// listed in when (any history when when is nil); elsewhere they fail.
var Modes = []Mode{
	{"object", rsm.Options{WholeObject: true}, "docs/precision.md#candidates-and-why-not-the-object-maps-dirty-bits: --precision=object trusts the object map (rollback, copy-on-read, shrink-snapshot-grow)", nil},
	{"exact", rsm.Options{}, "", nil},
	{"precise", rsm.Options{Precise: true}, "", nil},
	{"precise-trusted", rsm.Options{Precise: true, TrustObjectMap: true}, "docs/precision.md#candidates-and-why-not-the-object-maps-dirty-bits: --trust-object-map (rollback, copy-on-read)", []string{"rollback", "copy-on-read"}},
	// Without an object map (TestPreciseOracleLayering) precise mode walks
	// every object itself; this is the walk left to librbd instead.
	{"precise-librbd-walk", rsm.Options{Precise: true, Walk: rsm.WalkLibrbd}, "", nil},
	// ... and precise mode's own walk, both ways: listing the pool's
	// objects, and probing every object number (the default chooses by
	// the pool's size).
	{"precise-list", rsm.Options{Precise: true, Walk: rsm.WalkList}, "", nil},
	{"precise-probe", rsm.Options{Precise: true, Walk: rsm.WalkProbe}, "", nil},
}

// Sources opens one rbd.Source per mode on the test cluster.
func Sources(t *testing.T) map[string]*rsm.Source {
	t.Helper()
	return SourcesIn(t, harness.ClusterEnv(t, "RSM_CLUSTER_DIR"))
}

// SourcesIn opens one rbd.Source per mode on the cluster whose
// folder (cluster.sh's DIR) is dir.
func SourcesIn(t *testing.T, dir string) map[string]*rsm.Source {
	t.Helper()
	cfg := dir + "/csi-config.json"
	srcs := map[string]*rsm.Source{}
	for _, m := range Modes {
		o := m.opts
		o.ConfigPath = cfg
		s := rsm.NewSource(o)
		t.Cleanup(func() { s.Close() })
		srcs[m.Name] = s
	}
	return srcs
}

// Secrets are the request secrets of the test cluster's admin.
func Secrets(t *testing.T) map[string]string {
	return map[string]string{rsm.SecretUserID: harness.ClusterEnv(t, "CEPH_USER"), rsm.SecretUserKey: harness.ClusterEnv(t, "CEPH_KEY")}
}

// Image is one image of a workload and its snapshots, oldest first.
type Image struct {
	Name      string
	Img       *rbd.Image
	ObjSize   uint64
	Size      uint64
	Snaps     []string
	snapSizes []uint64 // the size at each snapshot
	// parentSize is the parent snapshot's size for a clone, else 0.
	parentSize uint64
	cor        bool // a clone read with rbd_clone_copy_on_read
}

// Workload builds one seed's random history on real images (Run, from the
// scenarios of scenarios.go), reads every snapshot back, and checks each
// mode's answers against those bytes (Check), summing into Totals.
type Workload struct {
	T     *testing.T
	IOCtx *rados.IOContext
	// DataPool, when set, is the data pool of every image made (Ceph-CSI's
	// dataPool); Secrets, when set, the secrets of queries (default: the
	// test cluster's admin, Secrets); ClusterID, when set, the
	// cluster ID of queries (default rsm-e2e; rsm-e2e-ns1 for an ioctx in
	// namespace ns1).
	DataPool  string
	Secrets   map[string]string
	ClusterID string
	Rng       *rand.Rand
	Log       []string
	Images    []*Image // parents first; the last is the one checked
	Header    uint64   // the last image's LUKS header: not user data
	// Features of the images it creates; harness.ImageFeatures when zero.
	Features uint64
	// NS is ioctx's namespace, for the snapshot IDs (empty: none, or the
	// one ClusterID names).
	NS string
	// Walks: the checked image has no usable object map, so precise mode
	// must walk its objects itself (Refinement.Candidates "walk").
	Walks bool
	Zero  *rados.IOContext // nil: write-zeroes become plain discards
	seed  uint64
	// maxSize bounds the images' growth; 0: 64 MiB.
	maxSize   uint64
	kinds     map[string]bool   // what the history did, for the table
	data      map[string][]byte // the last image's snapshots, read back
	zeroed    bool              // a write-zeroes was checked to zero
	format1   bool              // the first image is of format 1
	migrating bool              // migrate prepares a migration once checked
	removing  bool              // RemoveDuring removes a snapshot under running Deltas
	AllPairs  bool              // check every Delta, not a sample
}

// NewWorkload returns the workload of seed on ioctx: its random source is
// seeded by seed alone, so that a seed replays its history.
func NewWorkload(t *testing.T, ioctx *rados.IOContext, seed uint64) *Workload {
	watchSeed(t, seed) // a seed of Seeds: logged, and named if t fails
	return &Workload{T: t, IOCtx: ioctx, seed: seed, Rng: rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15)), kinds: map[string]bool{}}
}

// Logf adds a line to the history's log, printed when the test fails.
func (w *Workload) Logf(format string, args ...any) {
	w.Log = append(w.Log, fmt.Sprintf(format, args...))
}

// kind records that the history is of kind k, one that Shapes or
// Steps name.
func (w *Workload) kind(k string) {
	if !knownKind(k) {
		w.T.Fatalf("history kind %q is named neither in Shapes nor in Steps' kinds", k)
	}
	w.kinds[k] = true
}

// KindList is the kinds of history it went through, sorted.
func (w *Workload) KindList() []string { return slices.Sorted(maps.Keys(w.kinds)) }

// imageOptions are the options of an image the workload makes (a clone
// when clone is set): Ceph-CSI's, with w's features and data pool, and
// objects of 1<<order bytes.
func (w *Workload) imageOptions(clone bool, order uint64) *rbd.ImageOptions {
	t := w.T
	t.Helper()
	opts := harness.ImageOptions(t, clone)
	if err := opts.SetUint64(rbd.ImageOptionOrder, order); err != nil {
		t.Fatal(err)
	}
	w.SetDataPool(opts)
	if w.Features != 0 {
		if err := opts.SetUint64(rbd.ImageOptionFeatures, w.Features); err != nil {
			t.Fatal(err)
		}
	}
	return opts
}

// SetDataPool puts the images' data in w.DataPool, when set.
func (w *Workload) SetDataPool(opts *rbd.ImageOptions) {
	if w.DataPool == "" {
		return
	}
	if err := opts.SetString(rbd.ImageOptionDataPool, w.DataPool); err != nil {
		w.T.Fatal(err)
	}
}

// Create makes an image (a clone of parent@snap when parent is set) with
// Ceph-CSI's features and objects of 1<<order bytes; a parent of size 0
// picks the size from the order.
func (w *Workload) Create(parent *Image, order uint64) *Image {
	t := w.T
	p := &Image{Name: harness.UniqueName(t, "precise"), ObjSize: 1 << order}
	opts := w.imageOptions(parent != nil, order)
	if parent == nil {
		p.Size = w.initialSize(order)
		if err := rbd.CreateImage(w.IOCtx, p.Name, p.Size, opts); err != nil {
			t.Fatalf("create %s: %v", p.Name, err)
		}
		w.Logf("create %s size %d order %d", p.Name, p.Size, order)
	} else {
		snap := parent.Snaps[len(parent.Snaps)-1]
		if err := rbd.CloneImage(w.IOCtx, parent.Name, snap, w.IOCtx, p.Name, opts); err != nil {
			t.Fatalf("clone %s@%s: %v", parent.Name, snap, err)
		}
		p.Size = parent.Size
		p.parentSize = parent.Size
		w.Logf("clone %s@%s to %s order %d", parent.Name, snap, p.Name, order)
	}
	harness.RemoveImageOnCleanup(t, w.IOCtx, p.Name)
	w.Open(p)
	w.Images = append(w.Images, p)
	return p
}

// initialSize is a new image's size for objects of 1<<order bytes: 32 to
// 80 objects of 64 KiB, 24 to 44 MiB of 1 or 4 MiB objects, 33 to 48 MiB
// (over one object) of 32 MiB.
func (w *Workload) initialSize(order uint64) uint64 {
	switch {
	case order <= 16:
		return uint64(32+w.Rng.IntN(49)) << order
	case order >= 25:
		return uint64(33+w.Rng.IntN(16)) * harness.MiB
	}
	return uint64(6+w.Rng.IntN(6)) * 4 * harness.MiB
}

// fill fills data with random non-zero bytes, one draw per byte, so that
// a seed replays the histories it made before fill was shared.
func (w *Workload) fill(data []byte) {
	for i := range data {
		data[i] = byte(w.Rng.UintN(255) + 1)
	}
}

// extent picks a random extent of p: small and unaligned, 4 KiB aligned,
// up to an object anywhere, or whole objects.
func (w *Workload) extent(p *Image) (off, length uint64) {
	r := w.Rng
	off = r.Uint64N(p.Size)
	switch r.IntN(4) {
	case 0:
		length = 1 + r.Uint64N(10000)
	case 1:
		off &^= Block - 1
		length = Block * (1 + r.Uint64N(16))
	case 2:
		length = 1 + r.Uint64N(p.ObjSize)
	default:
		off -= off % p.ObjSize
		length = p.ObjSize * (1 + r.Uint64N(2))
	}
	return off, min(length, p.Size-off)
}

// resized is a random new size for p: grown or shrunk by up to two
// objects, often not on an object boundary.
func (w *Workload) resized(p *Image) uint64 {
	r := w.Rng
	size := p.Size
	if r.IntN(2) == 0 {
		size += 1 + r.Uint64N(2*p.ObjSize)
	} else {
		size -= min(p.Size-p.ObjSize, 1+r.Uint64N(2*p.ObjSize))
	}
	return size
}

// resize resizes p to size, bounded by one object and the workload's
// maximum, and rounded down to 512 bytes.
func (w *Workload) resize(p *Image, size uint64) {
	limit := w.maxSize
	if limit == 0 {
		limit = 64 * harness.MiB
	}
	size = min(max(size, p.ObjSize), limit) &^ 511
	w.Logf("resize %d -> %d", p.Size, size)
	if err := p.Img.Resize(size); err != nil {
		w.T.Fatalf("resize to %d: %v", size, err)
	}
	p.Size = size
}

// Snap takes the next user snapshot of p, s<n>, and records its size.
func (w *Workload) Snap(p *Image) {
	name := fmt.Sprintf("s%d", len(p.Snaps)+1)
	w.Logf("snapshot %s@%s (size %d)", p.Name, name, p.Size)
	harness.Snapshot(w.T, p.Img, name)
	p.Snaps = append(p.Snaps, name)
	p.snapSizes = append(p.snapSizes, p.Size)
}

// read reads from p, which copies up on a clone that copies up on read;
// then, half the time on such a clone, writes into the same object right
// away, racing the copy-up.
func (w *Workload) read(p *Image, off, length uint64) {
	w.Logf("read %d+%d", off, length)
	if n, err := p.Img.ReadAt(make([]byte, length), int64(off)); err != nil || n != int(length) {
		w.T.Fatalf("read %d+%d of %s: %d, %v", off, length, p.Name, n, err)
	}
	if p.cor && w.Rng.IntN(2) == 0 {
		o := min(off-off%p.ObjSize+w.Rng.Uint64N(p.ObjSize), p.Size-1)
		w.Write(p, o, min(4*KiB, p.Size-o))
	}
}

// readSnap returns the whole snapshot as librbd reads it, parents
// included, after the LUKS header of the last image.
func (w *Workload) readSnap(p *Image, snap string) []byte {
	t := w.T
	img, err := rbd.OpenImageReadOnly(w.IOCtx, p.Name, snap)
	if err != nil {
		t.Fatalf("open %s@%s: %v", p.Name, snap, err)
	}
	defer img.Close()
	size, err := img.GetSize()
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, size)
	for off := 0; off < len(buf); off += int(4 * harness.MiB) {
		end := min(len(buf), off+int(4*harness.MiB))
		if n, err := img.ReadAt(buf[off:end], int64(off)); err != nil || n != end-off {
			t.Fatalf("read %s@%s %d: n=%d %v", p.Name, snap, off, n, err)
		}
	}
	return buf[w.Header:]
}

// Extent is one reported extent.
type Extent struct{ off, len int64 }

// Query opens one Diff in a mode and runs Iterate from each offset; it
// checks the extents are ascending, non-overlapping, within the capacity
// and that the first ends after its offset. The time is that of Open and
// the first Iterate.
func (w *Workload) Query(src *rsm.Source, p *Image, base, target string, mode string, offsets ...int64) ([][]Extent, time.Duration, report.Refinement) {
	t := w.T
	t.Helper()
	req := w.request(p, base, target)
	if len(offsets) == 0 {
		offsets = []int64{0}
	}
	start := time.Now()
	d, err := src.Open(context.Background(), req)
	if err != nil {
		t.Fatalf("%s: open %s..%s: %v", mode, base, target, err)
	}
	defer d.Close()
	var all [][]Extent
	var dur time.Duration
	for i, from := range offsets {
		var got []Extent
		err = d.Iterate(context.Background(), from, func(off, length int64) error {
			n := len(got)
			if length <= 0 || off < 0 || off+length > d.Capacity() || (n > 0 && off < got[n-1].off+got[n-1].len) {
				return fmt.Errorf("extent %d+%d after %v (capacity %d)", off, length, got[max(n-1, 0):], d.Capacity())
			}
			if n == 0 && off+length <= from {
				return fmt.Errorf("the first extent %d+%d ends at or before the offset %d", off, length, from)
			}
			got = append(got, Extent{off, length})
			return nil
		})
		if i == 0 {
			dur = time.Since(start)
		}
		if err != nil {
			t.Fatalf("%s: iterate %s..%s from %d: %v", mode, base, target, from, err)
		}
		all = append(all, got)
	}
	return all, dur, d.Refinement()
}

// request is the request of a query of p: base empty for Allocated.
func (w *Workload) request(p *Image, base, target string) rsm.Request {
	cid := w.ClusterID
	if cid == "" {
		cid = "rsm-e2e"
	}
	img := harness.Pool + "/" + p.Name
	if w.NS != "" {
		img = harness.Pool + "/" + w.NS + "/" + p.Name
	}
	id := func(s string) string { return cid + "/" + img + "@" + s }
	secrets := w.Secrets
	if secrets == nil {
		secrets = Secrets(w.T)
	}
	req := rsm.Request{Target: id(target), Secrets: secrets}
	if base != "" {
		req.Base = id(base)
	}
	return req
}

// HazardImage creates an image of size bytes and objects of 1<<order bytes
// (a clone of parent's last snapshot when parent is set), with Ceph-CSI's
// features and w's data pool, open, as the workload's last image.
func (w *Workload) HazardImage(parent *Image, size uint64, order uint64) *Image {
	t := w.T
	t.Helper()
	p := &Image{Name: harness.UniqueName(t, "hazard"), ObjSize: 1 << order, Size: size}
	opts := harness.ImageOptions(t, parent != nil)
	if err := opts.SetUint64(rbd.ImageOptionOrder, order); err != nil {
		t.Fatal(err)
	}
	w.SetDataPool(opts)
	if parent == nil {
		if err := rbd.CreateImage(w.IOCtx, p.Name, size, opts); err != nil {
			t.Fatalf("create %s: %v", p.Name, err)
		}
		w.Logf("create %s size %d order %d", p.Name, size, order)
	} else {
		snap := parent.Snaps[len(parent.Snaps)-1]
		if err := rbd.CloneImage(w.IOCtx, parent.Name, snap, w.IOCtx, p.Name, opts); err != nil {
			t.Fatalf("clone %s@%s: %v", parent.Name, snap, err)
		}
		p.Size = parent.Size
		w.Logf("clone %s@%s to %s order %d", parent.Name, snap, p.Name, order)
	}
	harness.RemoveImageOnCleanup(t, w.IOCtx, p.Name)
	w.Open(p)
	w.Images = append(w.Images, p)
	return p
}

// Open (re)opens p's handle, closed when the test ends.
func (w *Workload) Open(p *Image) {
	t := w.T
	t.Helper()
	if p.Img != nil {
		if err := p.Img.Close(); err != nil {
			t.Fatalf("close %s: %v", p.Name, err)
		}
	}
	img, err := rbd.OpenImage(w.IOCtx, p.Name, rbd.NoSnapshot)
	if err != nil {
		t.Fatalf("open %s: %v", p.Name, err)
	}
	t.Cleanup(func() { _ = img.Close() })
	p.Img = img
}

// Write writes random non-zero bytes.
func (w *Workload) Write(p *Image, off, length uint64) {
	w.T.Helper()
	data := make([]byte, length)
	w.fill(data)
	w.Logf("write %d+%d", off, length)
	if n, err := p.Img.WriteAt(data, int64(off)); err != nil || n != len(data) {
		w.T.Fatalf("write %d+%d to %s: %d, %v", off, length, p.Name, n, err)
	}
}

// Rollback rolls p back to its snapshot snap, as `rbd snap rollback` does.
func (w *Workload) Rollback(p *Image, snap string) {
	w.T.Helper()
	w.kind("rollback")
	w.Logf("rollback %s to %s", p.Name, snap)
	if err := p.Img.GetSnapshot(snap).Rollback(); err != nil {
		w.T.Fatalf("rollback %s to %s: %v", p.Name, snap, err)
	}
}

// HazardImageWith is HazardImage(nil, size, order) with the given features
// (0: Ceph-CSI's usual ones).
func (w *Workload) HazardImageWith(size, order, features uint64) *Image {
	t := w.T
	t.Helper()
	if features == 0 {
		return w.HazardImage(nil, size, order)
	}
	p := &Image{Name: harness.UniqueName(t, "kind"), ObjSize: 1 << order, Size: size}
	opts := harness.ImageOptions(t, false)
	if err := opts.SetUint64(rbd.ImageOptionOrder, order); err != nil {
		t.Fatal(err)
	}
	w.SetDataPool(opts)
	if err := opts.SetUint64(rbd.ImageOptionFeatures, features); err != nil {
		t.Fatal(err)
	}
	if err := rbd.CreateImage(w.IOCtx, p.Name, size, opts); err != nil {
		t.Fatalf("create %s: %v", p.Name, err)
	}
	harness.RemoveImageOnCleanup(t, w.IOCtx, p.Name)
	w.Logf("create %s size %d order %d features %#x", p.Name, size, order, features)
	w.Open(p)
	w.Images = append(w.Images, p)
	return p
}
