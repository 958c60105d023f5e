//go:build e2e

package oracle

// The workload: images built by a seed's history, the modes it queries
// (rbd.Source in each precision), the byte oracle that judges their
// answers, and the totals and table TestPreciseOracle prints.

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ceph/go-ceph/rados"
	"github.com/ceph/go-ceph/rbd"

	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/e2e/harness"
	rsm "github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/rbd"
)

const Block = 4096 // the oracle's granularity for "truly changed"

// KiB is a kibibyte, untyped.
const KiB = 1 << 10

// Modes are the three --precision settings, and precise mode with
// --trust-object-map. unsafe names, for a mode that can miss changed
// bytes, the README passage (section Precision) that says when: its
// misses are logged and counted, not failed, in histories of the kinds
// listed in when (any history when when is nil); elsewhere they fail.
var Modes = []struct {
	Name   string
	opts   rsm.Options
	unsafe string
	when   []string
}{
	{"object", rsm.Options{WholeObject: true}, "README, Precision: --precision=object trusts the object map (rollback, copy-on-read, shrink-snapshot-grow)", nil},
	{"exact", rsm.Options{}, "", nil},
	{"precise", rsm.Options{Precise: true}, "", nil},
	{"precise-trusted", rsm.Options{Precise: true, TrustObjectMap: true}, "README, Precision: --trust-object-map (rollback, copy-on-read)", []string{"rollback", "copy-on-read"}},
	// Without an object map (TestPreciseOracleLayering) precise mode walks
	// every object itself; this is the walk left to librbd instead.
	{"precise-librbd-walk", rsm.Options{Precise: true, Walk: rsm.WalkLibrbd}, "", nil},
	// ... and precise mode's own walk, both ways: listing the pool's
	// objects, and probing every object number (the default chooses by
	// the pool's size).
	{"precise-list", rsm.Options{Precise: true, Walk: rsm.WalkList}, "", nil},
	{"precise-probe", rsm.Options{Precise: true, Walk: rsm.WalkProbe}, "", nil},
}

// Tally sums one mode over many queries.
type Tally struct {
	reported, missed int64
	dur              time.Duration
	// Reported bytes that did not change: zero on both sides (written
	// zeros, zeroed zeros), or the same data (rewritten unchanged).
	zeros, same int64
}

// Totals sums the queries of many histories: per mode, per kind of history,
// and from offsets inside objects, for the oracle's table.
type Totals struct {
	Truth     [2]int64 // 4 KiB-block changed bytes: allocated, delta
	exact     [2]int64 // byte-exact changed bytes
	Queries   [2]int
	Modes     map[string]*[2]Tally
	histories int // within a kind
	// checksummed counts precise mode's object queries answered by
	// checksums (a pool that refuses mapext: EC).
	Checksummed int64

	kinds   map[string]*Totals // per kind of history
	offsets map[string]*preciseOffsetTally
	// Images prepared for migration, and their queries per mode: refused
	// (FAILED_PRECONDITION) or answered, with the bytes missed.
	migrations, migRefused, migAnswered int
	migMissed                           int64
	// Concurrent removals: Deltas whose base or target went while they
	// ran, per mode, refused (NOT_FOUND) or answered, with the bytes
	// missed.
	removals, remRefused, remAnswered int
	remMissed                         int64
}

// preciseOffsetTally sums one mode's Iterate calls from an offset inside
// an object.
type preciseOffsetTally struct {
	queries                 int
	truth, reported, missed int64 // after the offset; truth in 4 KiB blocks
	startsBefore, differs   int
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

// Seeds returns the seeds to run: RSM_E2E_SEED alone, else
// RSM_E2E_SEEDS (default 12) consecutive ones from a random start.
func Seeds(t *testing.T) []uint64 { return SeedsOr(t, 12) }

// SeedsOr is Seeds with n seeds by default.
func SeedsOr(t *testing.T, n int) []uint64 {
	if s := os.Getenv("RSM_E2E_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("RSM_E2E_SEED=%q: %v", s, err)
		}
		return []uint64{v}
	}
	if s := os.Getenv("RSM_E2E_SEEDS"); s != "" {
		v, err := strconv.Atoi(s)
		if err != nil || v < 1 {
			t.Fatalf("RSM_E2E_SEEDS=%q: want a positive number", s)
		}
		n = v
	}
	start := rand.Uint64() % 1_000_000
	seeds := make([]uint64, n)
	for i := range seeds {
		seeds[i] = start + uint64(i)
	}
	return seeds
}

// NewTotals returns empty totals, with a row for each of Modes.
func NewTotals() *Totals {
	tot := &Totals{Modes: map[string]*[2]Tally{}, offsets: map[string]*preciseOffsetTally{}}
	for _, m := range Modes {
		tot.Modes[m.Name] = &[2]Tally{}
		tot.offsets[m.Name] = &preciseOffsetTally{}
	}
	return tot
}

// kind returns the totals of one kind of history, made on first use.
func (tot *Totals) kind(k string) *Totals {
	if tot.kinds == nil {
		tot.kinds = map[string]*Totals{}
	}
	if tot.kinds[k] == nil {
		tot.kinds[k] = NewTotals()
	}
	return tot.kinds[k]
}

// Table prints the totals per mode, then per kind of history, then those
// of Iterate from an offset inside an object and of migrating images.
func (tot *Totals) Table() string {
	var b strings.Builder
	fmt.Fprintf(&b, "precision over %d allocated and %d delta queries (truly changed: %s allocated, %s delta in 4 KiB blocks; %s and %s byte-exact)\n",
		tot.Queries[0], tot.Queries[1], MiB(tot.Truth[0]), MiB(tot.Truth[1]), MiB(tot.exact[0]), MiB(tot.exact[1]))
	if tot.Checksummed > 0 {
		fmt.Fprintf(&b, "precise mode: %d object queries answered by checksums (the pool refuses mapext)\n", tot.Checksummed)
	}
	fmt.Fprintf(&b, "| mode | Allocated reported | ratio | Delta reported | ratio | missed bytes | time | reported unchanged, zeros / data (4 KiB blocks) |\n|---|---|---|---|---|---|---|---|\n")
	for _, m := range Modes {
		x := tot.Modes[m.Name]
		fmt.Fprintf(&b, "| %s | %s | %.2f× | %s | %.2f× | %d | %v | %s / %s |\n", m.Name,
			MiB(x[0].reported), float64(x[0].reported)/float64(max(tot.Truth[0], 1)),
			MiB(x[1].reported), float64(x[1].reported)/float64(max(tot.Truth[1], 1)),
			x[0].missed+x[1].missed, (x[0].dur + x[1].dur).Round(time.Millisecond),
			MiB(x[0].zeros+x[1].zeros), MiB(x[0].same+x[1].same))
	}
	if len(tot.kinds) > 0 {
		fmt.Fprintf(&b, "\nper kind of history (a history has several kinds): Allocated / Delta ratio, missed bytes\n| kind | histories | queries | truly changed |")
		for _, m := range Modes {
			fmt.Fprintf(&b, " %s |", m.Name)
		}
		fmt.Fprintf(&b, " precise: unchanged zeros / data |\n|---|---|---|---|%s---|\n", strings.Repeat("---|", len(Modes)))
		for _, k := range slices.Sorted(maps.Keys(tot.kinds)) {
			x := tot.kinds[k]
			fmt.Fprintf(&b, "| %s | %d | %d / %d | %s / %s |", k, x.histories, x.Queries[0], x.Queries[1], MiB(x.Truth[0]), MiB(x.Truth[1]))
			for _, m := range Modes {
				y := x.Modes[m.Name]
				fmt.Fprintf(&b, " %.2f× / %.2f×, %d |", float64(y[0].reported)/float64(max(x.Truth[0], 1)),
					float64(y[1].reported)/float64(max(x.Truth[1], 1)), y[0].missed+y[1].missed)
			}
			y := x.Modes["precise"]
			fmt.Fprintf(&b, " %s / %s |\n", MiB(y[0].zeros+y[1].zeros), MiB(y[0].same+y[1].same))
		}
	}
	if n := tot.offsets[Modes[0].Name].queries; n > 0 {
		fmt.Fprintf(&b, "\nIterate from a starting_offset inside an object: %d queries per mode (truly changed after the offsets: %s)\n", n, MiB(tot.offsets[Modes[0].Name].truth))
		fmt.Fprintf(&b, "| mode | reported after the offset | ratio | missed bytes | first extent starts before the offset | differs from the offset-0 answer clipped |\n|---|---|---|---|---|---|\n")
		for _, m := range Modes {
			x := tot.offsets[m.Name]
			fmt.Fprintf(&b, "| %s | %s | %.2f× | %d | %d | %d |\n", m.Name, MiB(x.reported), float64(x.reported)/float64(max(x.truth, 1)), x.missed, x.startsBefore, x.differs)
		}
	}
	if tot.migrations > 0 {
		fmt.Fprintf(&b, "\nimages prepared for migration: %d; queries refused with FAILED_PRECONDITION: %d, answered: %d (missed bytes %d)\n",
			tot.migrations, tot.migRefused, tot.migAnswered, tot.migMissed)
	}
	if tot.removals > 0 {
		fmt.Fprintf(&b, "\nsnapshots removed while a Delta of every mode ran: %d; Deltas that failed with NOT_FOUND: %d, answered: %d (missed bytes %d)\n",
			tot.removals, tot.remRefused, tot.remAnswered, tot.remMissed)
	}
	return b.String()
}

// Ratios gives each mode's Allocated and Delta ratios, on one line.
func (tot *Totals) Ratios() string {
	var b []string
	for _, m := range Modes {
		x := tot.Modes[m.Name]
		b = append(b, fmt.Sprintf("%s %.2f× / %.2f×", m.Name, float64(x[0].reported)/float64(max(tot.Truth[0], 1)), float64(x[1].reported)/float64(max(tot.Truth[1], 1))))
	}
	return strings.Join(b, ", ")
}

// MiB prints n bytes in MiB, two decimals.
func MiB(n int64) string { return fmt.Sprintf("%.2f MiB", float64(n)/float64(harness.MiB)) }

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
	// must walk its objects itself (PreciseStats.Candidates "walk").
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
func (w *Workload) Query(src *rsm.Source, p *Image, base, target string, mode string, offsets ...int64) ([][]Extent, time.Duration, rsm.PreciseStats) {
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
	return all, dur, d.PreciseStats()
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

// Check runs the queries of pairs on the last image, in each mode, against
// the oracle; half of them run again from an offset inside an object. The
// figures go to tot and to the totals of each of the history's kinds; it
// returns the history's own.
func (w *Workload) Check(srcs map[string]*rsm.Source, tot *Totals) *Totals {
	t := w.T
	p := w.Images[len(w.Images)-1]
	w.data = map[string][]byte{}
	for _, s := range p.Snaps {
		w.data[s] = w.readSnap(p, s)
	}
	h := NewTotals()
	tots := []*Totals{tot, h}
	for _, k := range w.KindList() {
		x := tot.kind(k)
		x.histories++
		tots = append(tots, x)
	}
	pairs := w.pairs(p.Snaps)
	differs := 0
	for _, q := range pairs {
		var before []byte // allocated: against zeros
		kind := 0
		if q[0] != "" {
			before, kind = w.data[q[0]], 1
		}
		after := w.data[q[1]]
		blocks, exact := preciseTruth(before, after, 0)
		for _, x := range tots {
			x.Truth[kind] += blocks
			x.exact[kind] += exact
			x.Queries[kind]++
		}
		// An offset inside an object, not on a 4 KiB block, for half the
		// queries.
		offsets := []int64{0}
		if size := uint64(len(after)); size > 1 && w.Rng.IntN(2) == 0 {
			from := w.Rng.Uint64N(size)
			if from%p.ObjSize == 0 {
				from++
			}
			offsets = append(offsets, int64(from))
		}
		var fromBlocks int64
		if len(offsets) > 1 {
			fromBlocks, _ = preciseTruth(before, after, int(offsets[1]))
		}
		for _, m := range Modes {
			all, dur, st := w.Query(srcs[m.Name], p, q[0], q[1], m.Name, offsets...)
			got := all[0]
			missed, first := Missed(before, after, got, 0)
			reported := preciseSum(got, 0)
			zeros, same := preciseUnchanged(before, after, got)
			for _, x := range tots {
				y := &x.Modes[m.Name][kind]
				y.reported += reported
				y.missed += missed
				y.dur += dur
				y.zeros += zeros
				y.same += same
			}
			what := fmt.Sprintf("%s %s..%s of %s", m.Name, q[0], q[1], p.Name)
			w.judge(m.unsafe, m.when, what, missed, first, fmt.Sprintf("(truth %d bytes in 4 KiB blocks); reported %v", blocks, got))
			if m.opts.Precise {
				if m.Name == "precise" {
					tot.Checksummed += st.Checksummed
				}
				if st.Unrefined != "" || st.Fallbacks != 0 {
					t.Errorf("%s: not refined: %+v", what, st)
				}
				walked := st.Candidates == "walk" || st.Candidates == "listing"
				if want := w.Walks && m.opts.Walk != rsm.WalkLibrbd; walked != want {
					t.Errorf("%s: candidates %q, want the walk: %v", what, st.Candidates, want)
				}
				if want := map[string]string{rsm.WalkList: "listing", rsm.WalkProbe: "walk"}[m.opts.Walk]; w.Walks && want != "" && st.Candidates != want {
					t.Errorf("%s: candidates %q, want %q", what, st.Candidates, want)
				}
				if reported > 0 && st.Objects == 0 {
					t.Errorf("%s: reported %d bytes but refined no object", what, reported)
				}
			}
			if len(all) > 1 {
				from := offsets[1]
				fromGot := all[1]
				missed, first := Missed(before, after, fromGot, int(from))
				o := tot.offsets[m.Name]
				o.queries++
				o.truth += fromBlocks
				o.reported += preciseSum(fromGot, from)
				o.missed += missed
				if len(fromGot) > 0 && fromGot[0].off < from {
					o.startsBefore++
				}
				if !slices.Equal(preciseClip(fromGot, from), preciseClip(got, from)) {
					o.differs++
					if differs++; differs <= 2 {
						t.Logf("%s from %d: %v, from 0 clipped: %v", what, from, preciseClip(fromGot, from), preciseClip(got, from))
					}
				}
				w.judge(m.unsafe, m.when, fmt.Sprintf("%s from offset %d", what, from), missed, first, fmt.Sprintf("; reported %v", fromGot))
			}
		}
	}
	return h
}

// pairs lists the queries of a history's checked image: Allocated of
// every snapshot, and the Deltas between consecutive snapshots, from the
// first, and six more at random (all of them when AllPairs is set). Every pair would grow with the
// square of the snapshots, which the shrink-grow histories make many of.
func (w *Workload) pairs(snaps []string) [][2]string {
	var pairs [][2]string
	seen := map[[2]string]bool{}
	add := func(q [2]string) {
		if !seen[q] {
			seen[q] = true
			pairs = append(pairs, q)
		}
	}
	for i, s := range snaps {
		add([2]string{"", s})
		if i > 0 {
			add([2]string{snaps[i-1], s})
			add([2]string{snaps[0], s})
		}
	}
	var rest [][2]string
	for j, s := range snaps {
		for _, b := range snaps[:j] {
			if !seen[[2]string{b, s}] {
				rest = append(rest, [2]string{b, s})
			}
		}
	}
	if w.AllPairs {
		return append(pairs, rest...)
	}
	w.Rng.Shuffle(len(rest), func(i, j int) { rest[i], rest[j] = rest[j], rest[i] })
	pairs = append(pairs, rest[:min(6, len(rest))]...)
	return pairs
}

// judge reports missed bytes: an error, or a log line for a mode whose
// misses unsafe documents in histories of the kinds when.
func (w *Workload) judge(unsafe string, when []string, what string, missed, first int64, detail string) {
	known := unsafe != "" && (when == nil || slices.ContainsFunc(when, func(k string) bool { return w.kinds[k] }))
	switch {
	case missed == 0:
	case known:
		// A mode that trusts the object map's dirty bits, which reef
		// 18.2.7 gets wrong after rollbacks, copy-on-read copy-ups and
		// shrink-snapshot-grow.
		w.T.Logf("%s: %d changed bytes not reported, the first at %d: known, documented in %s", what, missed, first, unsafe)
	default:
		w.T.Errorf("%s: %d changed bytes not reported, the first at %d %s", what, missed, first, detail)
	}
}

// preciseUnchanged counts the bytes of got that did not change between
// before and after: those zero on both sides, and the others.
func preciseUnchanged(before, after []byte, got []Extent) (zeros, same int64) {
	for _, e := range got {
		for off := int(e.off); off < int(e.off+e.len); {
			end := min(int(e.off+e.len), (off/Block+1)*Block)
			a, b := after[off:end], preciseAt(before, off, end)
			if bytes.Equal(a, b) {
				if bytes.Equal(a, preciseZeros[:end-off]) {
					zeros += int64(end - off)
				} else {
					same += int64(end - off)
				}
			}
			off = end
		}
	}
	return zeros, same
}

// preciseSum is the number of bytes of got at or after from.
func preciseSum(got []Extent, from int64) int64 {
	var n int64
	for _, e := range got {
		n += max(0, e.off+e.len-max(e.off, from))
	}
	return n
}

// preciseClip returns got cut to [from, ∞).
func preciseClip(got []Extent, from int64) []Extent {
	var out []Extent
	for _, e := range got {
		if end := e.off + e.len; end > from {
			o := max(e.off, from)
			out = append(out, Extent{o, end - o})
		}
	}
	return out
}

// preciseTruth counts the bytes of after from offset from on that differ
// from before (zeros where before is shorter or nil): in whole 4 KiB blocks
// (the first block counted from from), and exactly.
func preciseTruth(before, after []byte, from int) (blocks, exact int64) {
	for off := from; off < len(after); off = (off/Block + 1) * Block {
		end := min(len(after), (off/Block+1)*Block)
		a := after[off:end]
		b := preciseAt(before, off, end)
		if bytes.Equal(a, b) {
			continue
		}
		blocks += int64(end - off)
		for i := range a {
			if a[i] != b[i] {
				exact++
			}
		}
	}
	return blocks, exact
}

var preciseZeros = make([]byte, Block)

// preciseAt returns before[off:end], zero-extended.
func preciseAt(before []byte, off, end int) []byte {
	if end <= len(before) {
		return before[off:end]
	}
	b := slices.Clone(preciseZeros[:end-off])
	if off < len(before) {
		copy(b, before[off:])
	}
	return b
}

// Missed counts the bytes of after from offset from on that differ
// from before and lie outside every extent of got (ascending).
func Missed(before, after []byte, got []Extent, from int) (missed, firstMissed int64) {
	k := 0
	for off := from; off < len(after); off = (off/Block + 1) * Block {
		end := min(len(after), (off/Block+1)*Block)
		// A block inside one extent misses nothing: skip comparing it.
		for k < len(got) && got[k].off+got[k].len <= int64(off) {
			k++
		}
		if k < len(got) && got[k].off <= int64(off) && got[k].off+got[k].len >= int64(end) {
			continue
		}
		a, b := after[off:end], preciseAt(before, off, end)
		if bytes.Equal(a, b) {
			continue
		}
		for i := range a {
			if a[i] == b[i] {
				continue
			}
			at := int64(off + i)
			for k < len(got) && got[k].off+got[k].len <= at {
				k++
			}
			if k == len(got) || got[k].off > at {
				if missed == 0 {
					firstMissed = at
				}
				missed++
			}
		}
	}
	return missed, firstMissed
}

// Cost is TestPreciseCost on w's cluster, with w's data pool.
func Cost(t *testing.T, w *Workload, srcs map[string]*rsm.Source) {
	ioctx := w.IOCtx
	var b strings.Builder
	fmt.Fprintf(&b, "| image | query | truly changed | mode | reported | ratio | time |\n|---|---|---|---|---|---|---|\n")
	measure := func(label string, p *Image, base string, truth int64) {
		for _, m := range Modes {
			var durs []time.Duration
			var reported int64
			for i := 0; i < 5; i++ {
				got, dur, _ := w.Query(srcs[m.Name], p, base, "s2", m.Name)
				reported = preciseSum(got[0], 0)
				durs = append(durs, dur)
			}
			slices.Sort(durs)
			best := durs[len(durs)/2] // the median
			q := "Allocated(s2)"
			if base != "" {
				q = "Delta(s1, s2)"
			}
			fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %.1f× | %v |\n", label, q, MiB(truth), m.Name,
				MiB(reported), float64(reported)/float64(truth), best.Round(10*time.Microsecond))
		}
	}
	write := func(p *Image, off, length uint64) {
		data := make([]byte, length)
		for i := range data {
			data[i] = byte(w.Rng.UintN(255) + 1)
		}
		if _, err := p.Img.WriteAt(data, int64(off)); err != nil {
			t.Fatal(err)
		}
	}

	// 4 GiB, 1024 objects: 4 KiB in 64 objects, then in 64 others.
	p := NewCostImage(t, ioctx, "precise-cost", 4096*harness.MiB, w.DataPool)
	for i := uint64(0); i < 128; i++ {
		if i == 64 {
			w.Snap(p)
		}
		write(p, (i*8+3)*p.ObjSize+w.Rng.Uint64N(1023)*4096, 4096)
	}
	w.Snap(p)
	measure("4 GiB, 128 objects changed", p, "", 128*4096)
	measure("4 GiB, 128 objects changed", p, "s1", 64*4096)

	// 256 MiB written in full, then 4 KiB in each of its 64 objects.
	p = NewCostImage(t, ioctx, "precise-dense", 256*harness.MiB, w.DataPool)
	for off := uint64(0); off < p.Size; off += p.ObjSize {
		write(p, off, p.ObjSize)
	}
	w.Snap(p)
	for off := uint64(0); off < p.Size; off += p.ObjSize {
		write(p, off+w.Rng.Uint64N(1023)*4096, 4096)
	}
	w.Snap(p)
	measure("256 MiB dense", p, "", int64(p.Size))
	measure("256 MiB dense", p, "s1", 64*4096)

	// The worst case for candidates by existence: everything allocated,
	// one object changed.
	p = NewCostImage(t, ioctx, "precise-dense-one", 512*harness.MiB, w.DataPool)
	for off := uint64(0); off < p.Size; off += p.ObjSize {
		write(p, off, p.ObjSize)
	}
	w.Snap(p)
	write(p, 77*p.ObjSize+w.Rng.Uint64N(1023)*4096, 4096)
	w.Snap(p)
	measure("512 MiB dense, 1 object changed", p, "s1", 4096)
	t.Log("\n" + b.String())
}

// NewCostImage creates an open image of 4 MiB objects for TestPreciseCost,
// with its data in dataPool when set, closed and removed when the test
// ends.
func NewCostImage(t *testing.T, ioctx *rados.IOContext, prefix string, size uint64, dataPool string) *Image {
	t.Helper()
	p := &Image{Name: harness.UniqueName(t, prefix), ObjSize: 4 * harness.MiB, Size: size}
	opts := harness.ImageOptions(t, false)
	if dataPool != "" {
		if err := opts.SetString(rbd.ImageOptionDataPool, dataPool); err != nil {
			t.Fatal(err)
		}
	}
	if err := rbd.CreateImage(ioctx, p.Name, p.Size, opts); err != nil {
		t.Fatal(err)
	}
	harness.RemoveImageOnCleanup(t, ioctx, p.Name)
	img, err := rbd.OpenImage(ioctx, p.Name, rbd.NoSnapshot)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { img.Close() })
	p.Img = img
	return p
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

// Ratio is tally's reported bytes over the truth of query kind (0:
// Allocated, 1: Delta); per, its mean time per query.
func (tot *Totals) Ratio(x Tally, kind int) float64 {
	return float64(x.reported) / float64(max(tot.Truth[kind], 1))
}

// Per is x's mean time per query of kind (0: Allocated, 1: Delta).
func (tot *Totals) Per(x Tally, kind int) time.Duration {
	return (x.dur / time.Duration(max(tot.Queries[kind], 1))).Round(time.Millisecond)
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
