//go:build e2e

package e2e

// Precise mode against a byte-level oracle. Each seed builds a random
// history on a real image (writes into new, existing and parent-only
// objects, zero writes, whole and partial discards, growth and shrink,
// clones of clones, snapshots in between, and the kinds of
// precise_histories_test.go: write-zeroes, re-created objects,
// shrink-grow across snapshots, clones grown past their parent, copy-on-read,
// rollbacks, format 1, migration, objects of 64 KiB to 32 MiB), reads every
// snapshot back in full through librbd, and checks that each mode reports
// every byte that is non-zero (Allocated) or differs (Delta): 0 missed
// bytes, also when Iterate starts at an offset inside an object. It also
// sums the reported bytes and time per mode, against the truly changed
// bytes counted in 4 KiB blocks (a block counts whole when any byte in it
// changed), and prints the precision table, per mode and per kind of
// history.
//
//	./dev.sh e2e -run TestPrecise -v                  # default seeds
//	RSM_E2E_SEEDS=200 ./dev.sh e2e -run TestPrecise   # more
//	RSM_E2E_SEED=1234 ./dev.sh e2e -run TestPrecise   # one seed again

import (
	"bytes"
	"context"
	"errors"
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

const preciseBlock = 4096 // the oracle's granularity for "truly changed"

const preciseKiB = 1 << 10

// preciseModes are the three --precision settings, and precise mode with
// --trust-object-map. unsafe names, for a mode that can miss changed
// bytes, the README passage (section Precision) that says when: its
// misses are logged and counted, not failed, in histories of the kinds
// listed in when (any history when when is nil); elsewhere they fail.
var preciseModes = []struct {
	name   string
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

// preciseTally sums one mode over many queries.
type preciseTally struct {
	reported, missed int64
	dur              time.Duration
	// Reported bytes that did not change: zero on both sides (written
	// zeros, zeroed zeros), or the same data (rewritten unchanged).
	zeros, same int64
}

type preciseTotals struct {
	truth     [2]int64 // 4 KiB-block changed bytes: allocated, delta
	exact     [2]int64 // byte-exact changed bytes
	queries   [2]int
	modes     map[string]*[2]preciseTally
	histories int // within a kind
	// checksummed counts precise mode's object queries answered by
	// checksums (a pool that refuses mapext: EC).
	checksummed int64

	kinds   map[string]*preciseTotals // per kind of history
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

// preciseSources opens one rbd.Source per mode on the test cluster.
func preciseSources(t *testing.T) map[string]*rsm.Source {
	t.Helper()
	return preciseSourcesIn(t, harness.ClusterEnv(t, "RSM_CLUSTER_DIR"))
}

// preciseSourcesIn opens one rbd.Source per mode on the cluster whose
// folder (cluster.sh's DIR) is dir.
func preciseSourcesIn(t *testing.T, dir string) map[string]*rsm.Source {
	t.Helper()
	cfg := dir + "/csi-config.json"
	srcs := map[string]*rsm.Source{}
	for _, m := range preciseModes {
		o := m.opts
		o.ConfigPath = cfg
		s := rsm.NewSource(o)
		t.Cleanup(func() { s.Close() })
		srcs[m.name] = s
	}
	return srcs
}

func preciseSecrets(t *testing.T) map[string]string {
	return map[string]string{rsm.SecretUserID: harness.ClusterEnv(t, "CEPH_USER"), rsm.SecretUserKey: harness.ClusterEnv(t, "CEPH_KEY")}
}

// preciseSeeds returns the seeds to run: RSM_E2E_SEED alone, else
// RSM_E2E_SEEDS (default 12) consecutive ones from a random start.
func preciseSeeds(t *testing.T) []uint64 { return preciseSeedsOr(t, 12) }

// preciseSeedsOr is preciseSeeds with n seeds by default.
func preciseSeedsOr(t *testing.T, n int) []uint64 {
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

// TestPreciseOracle runs random histories and checks every mode against
// the byte oracle; precise mode must miss nothing and fall back nowhere.
// Each history is of one or more kinds (see preciseWorkload.run), and the
// table reports the precision of each kind, and of Iterate from an offset
// inside an object.
func TestPreciseOracle(t *testing.T) { testPreciseOracle(t, harness.ImageFeatures) }

// TestPreciseOracleLayering is TestPreciseOracle on images with layering
// only, as Ceph-CSI's and Rook's example StorageClasses make them: no object
// map, so precise mode walks every object itself (Candidates "walk").
func TestPreciseOracleLayering(t *testing.T) { testPreciseOracle(t, rbd.FeatureLayering) }

func testPreciseOracle(t *testing.T, features uint64) {
	harness.FastSnapTrim(t) // for the concurrent removals
	conn := harness.ConnectAdmin(t)
	ioctx := harness.OpenIOContext(t, conn, harness.Pool, "")
	zero := preciseZeroer(t)
	srcs := preciseSources(t)
	tot := newPreciseTotals()
	for _, seed := range preciseSeeds(t) {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			w := newPreciseWorkload(t, ioctx, seed)
			// Registered first, so it runs after the images' cleanups,
			// whose failures it explains too.
			t.Cleanup(func() {
				if t.Failed() {
					t.Logf("replay with RSM_E2E_SEED=%d; kinds %v; history:\n%s", seed, w.kindList(), strings.Join(w.log, "\n"))
				}
			})
			w.features = features
			w.walks = features&rbd.FeatureFastDiff == 0
			w.zero = zero
			start := time.Now()
			w.run()
			built := time.Now()
			h := w.check(srcs, tot)
			w.migrate(srcs, tot)
			w.removeDuring(srcs, tot)
			p := w.images[len(w.images)-1]
			t.Logf("%v: %d images, the last of %d objects of %d KiB, %d snapshots, %d queries per mode; history %v, checks %v; Allocated / Delta ratio: %s",
				w.kindList(), len(w.images), (p.size+p.objSize-1)/p.objSize, p.objSize>>10, len(p.snaps), h.queries[0]+h.queries[1],
				built.Sub(start).Round(time.Millisecond), time.Since(built).Round(time.Millisecond), h.ratios())
		})
	}
	t.Log("\n" + tot.table())
}

// preciseZeroer opens an ioctx on the test pool whose images discard with
// rbd_skip_partial_discard=false, that is with a discard granularity of 0
// (librbd's ImageCtx): librbd's rbd_write_zeroes (without the
// thick-provision flag), which go-ceph does not wrap, is exactly such a
// discard. It zeroes the partial objects of the range instead of skipping
// them, and removes (or, with parent data, truncates) the whole ones.
func preciseZeroer(t *testing.T) *rados.IOContext {
	t.Helper()
	conn := harness.ConnectTo(t, harness.ClusterEnv(t, "CEPH_MON_HOST"), harness.ClusterEnv(t, "CEPH_USER"), harness.ClusterEnv(t, "CEPH_KEY"),
		[2]string{"rbd_skip_partial_discard", "false"})
	return harness.OpenIOContext(t, conn, harness.Pool, "")
}

func newPreciseTotals() *preciseTotals {
	tot := &preciseTotals{modes: map[string]*[2]preciseTally{}, offsets: map[string]*preciseOffsetTally{}}
	for _, m := range preciseModes {
		tot.modes[m.name] = &[2]preciseTally{}
		tot.offsets[m.name] = &preciseOffsetTally{}
	}
	return tot
}

// kind returns the totals of one kind of history, made on first use.
func (tot *preciseTotals) kind(k string) *preciseTotals {
	if tot.kinds == nil {
		tot.kinds = map[string]*preciseTotals{}
	}
	if tot.kinds[k] == nil {
		tot.kinds[k] = newPreciseTotals()
	}
	return tot.kinds[k]
}

// table prints the totals per mode, then per kind of history, then those
// of Iterate from an offset inside an object and of migrating images.
func (tot *preciseTotals) table() string {
	var b strings.Builder
	fmt.Fprintf(&b, "precision over %d allocated and %d delta queries (truly changed: %s allocated, %s delta in 4 KiB blocks; %s and %s byte-exact)\n",
		tot.queries[0], tot.queries[1], preciseMiB(tot.truth[0]), preciseMiB(tot.truth[1]), preciseMiB(tot.exact[0]), preciseMiB(tot.exact[1]))
	if tot.checksummed > 0 {
		fmt.Fprintf(&b, "precise mode: %d object queries answered by checksums (the pool refuses mapext)\n", tot.checksummed)
	}
	fmt.Fprintf(&b, "| mode | Allocated reported | ratio | Delta reported | ratio | missed bytes | time | reported unchanged, zeros / data (4 KiB blocks) |\n|---|---|---|---|---|---|---|---|\n")
	for _, m := range preciseModes {
		x := tot.modes[m.name]
		fmt.Fprintf(&b, "| %s | %s | %.2f× | %s | %.2f× | %d | %v | %s / %s |\n", m.name,
			preciseMiB(x[0].reported), float64(x[0].reported)/float64(max(tot.truth[0], 1)),
			preciseMiB(x[1].reported), float64(x[1].reported)/float64(max(tot.truth[1], 1)),
			x[0].missed+x[1].missed, (x[0].dur + x[1].dur).Round(time.Millisecond),
			preciseMiB(x[0].zeros+x[1].zeros), preciseMiB(x[0].same+x[1].same))
	}
	if len(tot.kinds) > 0 {
		fmt.Fprintf(&b, "\nper kind of history (a history has several kinds): Allocated / Delta ratio, missed bytes\n| kind | histories | queries | truly changed |")
		for _, m := range preciseModes {
			fmt.Fprintf(&b, " %s |", m.name)
		}
		fmt.Fprintf(&b, " precise: unchanged zeros / data |\n|---|---|---|---|%s---|\n", strings.Repeat("---|", len(preciseModes)))
		for _, k := range slices.Sorted(maps.Keys(tot.kinds)) {
			x := tot.kinds[k]
			fmt.Fprintf(&b, "| %s | %d | %d / %d | %s / %s |", k, x.histories, x.queries[0], x.queries[1], preciseMiB(x.truth[0]), preciseMiB(x.truth[1]))
			for _, m := range preciseModes {
				y := x.modes[m.name]
				fmt.Fprintf(&b, " %.2f× / %.2f×, %d |", float64(y[0].reported)/float64(max(x.truth[0], 1)),
					float64(y[1].reported)/float64(max(x.truth[1], 1)), y[0].missed+y[1].missed)
			}
			y := x.modes["precise"]
			fmt.Fprintf(&b, " %s / %s |\n", preciseMiB(y[0].zeros+y[1].zeros), preciseMiB(y[0].same+y[1].same))
		}
	}
	if n := tot.offsets[preciseModes[0].name].queries; n > 0 {
		fmt.Fprintf(&b, "\nIterate from a starting_offset inside an object: %d queries per mode (truly changed after the offsets: %s)\n", n, preciseMiB(tot.offsets[preciseModes[0].name].truth))
		fmt.Fprintf(&b, "| mode | reported after the offset | ratio | missed bytes | first extent starts before the offset | differs from the offset-0 answer clipped |\n|---|---|---|---|---|---|\n")
		for _, m := range preciseModes {
			x := tot.offsets[m.name]
			fmt.Fprintf(&b, "| %s | %s | %.2f× | %d | %d | %d |\n", m.name, preciseMiB(x.reported), float64(x.reported)/float64(max(x.truth, 1)), x.missed, x.startsBefore, x.differs)
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

// ratios gives each mode's Allocated and Delta ratios, on one line.
func (tot *preciseTotals) ratios() string {
	var b []string
	for _, m := range preciseModes {
		x := tot.modes[m.name]
		b = append(b, fmt.Sprintf("%s %.2f× / %.2f×", m.name, float64(x[0].reported)/float64(max(tot.truth[0], 1)), float64(x[1].reported)/float64(max(tot.truth[1], 1))))
	}
	return strings.Join(b, ", ")
}

func preciseMiB(n int64) string { return fmt.Sprintf("%.2f MiB", float64(n)/float64(harness.MiB)) }

// preciseImage is one image of a workload and its snapshots, oldest first.
type preciseImage struct {
	name      string
	img       *rbd.Image
	objSize   uint64
	size      uint64
	snaps     []string
	snapSizes []uint64 // the size at each snapshot
	// parentSize is the parent snapshot's size for a clone, else 0.
	parentSize uint64
	cor        bool // a clone read with rbd_clone_copy_on_read
}

type preciseWorkload struct {
	t     *testing.T
	ioctx *rados.IOContext
	// dataPool, when set, is the data pool of every image made (Ceph-CSI's
	// dataPool); secrets, when set, the secrets of queries (default: the
	// test cluster's admin, preciseSecrets); clusterID, when set, the
	// cluster ID of queries (default rsm-e2e; rsm-e2e-ns1 for an ioctx in
	// namespace ns1).
	dataPool  string
	secrets   map[string]string
	clusterID string
	rng       *rand.Rand
	log       []string
	images    []*preciseImage // parents first; the last is the one checked
	header    uint64          // the last image's LUKS header: not user data
	// features of the images it creates; harness.ImageFeatures when zero.
	features uint64
	// ns is ioctx's namespace, for the snapshot IDs (empty: none, or the
	// one clusterID names).
	ns string
	// walks: the checked image has no usable object map, so precise mode
	// must walk its objects itself (PreciseStats.Candidates "walk").
	walks bool
	zero  *rados.IOContext // nil: write-zeroes become plain discards
	seed  uint64
	// maxSize bounds the images' growth; 0: 64 MiB.
	maxSize   uint64
	kinds     map[string]bool   // what the history did, for the table
	data      map[string][]byte // the last image's snapshots, read back
	zeroed    bool              // a write-zeroes was checked to zero
	format1   bool              // the first image is of format 1
	migrating bool              // migrate prepares a migration once checked
	removing  bool              // removeDuring removes a snapshot under running Deltas
	allPairs  bool              // check every Delta, not a sample
}

func newPreciseWorkload(t *testing.T, ioctx *rados.IOContext, seed uint64) *preciseWorkload {
	return &preciseWorkload{t: t, ioctx: ioctx, seed: seed, rng: rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15)), kinds: map[string]bool{}}
}

func (w *preciseWorkload) logf(format string, args ...any) {
	w.log = append(w.log, fmt.Sprintf(format, args...))
}

// kind records that the history is of kind k, one that preciseShapes or
// preciseSteps name.
func (w *preciseWorkload) kind(k string) {
	if !knownKind(k) {
		w.t.Fatalf("history kind %q is named neither in preciseShapes nor in preciseSteps' kinds", k)
	}
	w.kinds[k] = true
}

func (w *preciseWorkload) kindList() []string { return slices.Sorted(maps.Keys(w.kinds)) }

// imageOptions are the options of an image the workload makes (a clone
// when clone is set): Ceph-CSI's, with w's features and data pool, and
// objects of 1<<order bytes.
func (w *preciseWorkload) imageOptions(clone bool, order uint64) *rbd.ImageOptions {
	t := w.t
	t.Helper()
	opts := harness.ImageOptions(t, clone)
	if err := opts.SetUint64(rbd.ImageOptionOrder, order); err != nil {
		t.Fatal(err)
	}
	w.setDataPool(opts)
	if w.features != 0 {
		if err := opts.SetUint64(rbd.ImageOptionFeatures, w.features); err != nil {
			t.Fatal(err)
		}
	}
	return opts
}

// setDataPool puts the images' data in w.dataPool, when set.
func (w *preciseWorkload) setDataPool(opts *rbd.ImageOptions) {
	if w.dataPool == "" {
		return
	}
	if err := opts.SetString(rbd.ImageOptionDataPool, w.dataPool); err != nil {
		w.t.Fatal(err)
	}
}

// create makes an image (a clone of parent@snap when parent is set) with
// Ceph-CSI's features and objects of 1<<order bytes; a parent of size 0
// picks the size from the order.
func (w *preciseWorkload) create(parent *preciseImage, order uint64) *preciseImage {
	t := w.t
	p := &preciseImage{name: harness.UniqueName(t, "precise"), objSize: 1 << order}
	opts := w.imageOptions(parent != nil, order)
	if parent == nil {
		p.size = w.initialSize(order)
		if err := rbd.CreateImage(w.ioctx, p.name, p.size, opts); err != nil {
			t.Fatalf("create %s: %v", p.name, err)
		}
		w.logf("create %s size %d order %d", p.name, p.size, order)
	} else {
		snap := parent.snaps[len(parent.snaps)-1]
		if err := rbd.CloneImage(w.ioctx, parent.name, snap, w.ioctx, p.name, opts); err != nil {
			t.Fatalf("clone %s@%s: %v", parent.name, snap, err)
		}
		p.size = parent.size
		p.parentSize = parent.size
		w.logf("clone %s@%s to %s order %d", parent.name, snap, p.name, order)
	}
	harness.RemoveImageOnCleanup(t, w.ioctx, p.name)
	w.open(p)
	w.images = append(w.images, p)
	return p
}

// initialSize is a new image's size for objects of 1<<order bytes: 32 to
// 80 objects of 64 KiB, 24 to 44 MiB of 1 or 4 MiB objects, 33 to 48 MiB
// (over one object) of 32 MiB.
func (w *preciseWorkload) initialSize(order uint64) uint64 {
	switch {
	case order <= 16:
		return uint64(32+w.rng.IntN(49)) << order
	case order >= 25:
		return uint64(33+w.rng.IntN(16)) * harness.MiB
	}
	return uint64(6+w.rng.IntN(6)) * 4 * harness.MiB
}

// fill fills data with random non-zero bytes, one draw per byte, so that
// a seed replays the histories it made before fill was shared.
func (w *preciseWorkload) fill(data []byte) {
	for i := range data {
		data[i] = byte(w.rng.UintN(255) + 1)
	}
}

// extent picks a random extent of p: small and unaligned, 4 KiB aligned,
// up to an object anywhere, or whole objects.
func (w *preciseWorkload) extent(p *preciseImage) (off, length uint64) {
	r := w.rng
	off = r.Uint64N(p.size)
	switch r.IntN(4) {
	case 0:
		length = 1 + r.Uint64N(10000)
	case 1:
		off &^= preciseBlock - 1
		length = preciseBlock * (1 + r.Uint64N(16))
	case 2:
		length = 1 + r.Uint64N(p.objSize)
	default:
		off -= off % p.objSize
		length = p.objSize * (1 + r.Uint64N(2))
	}
	return off, min(length, p.size-off)
}

// resized is a random new size for p: grown or shrunk by up to two
// objects, often not on an object boundary.
func (w *preciseWorkload) resized(p *preciseImage) uint64 {
	r := w.rng
	size := p.size
	if r.IntN(2) == 0 {
		size += 1 + r.Uint64N(2*p.objSize)
	} else {
		size -= min(p.size-p.objSize, 1+r.Uint64N(2*p.objSize))
	}
	return size
}

// resize resizes p to size, bounded by one object and the workload's
// maximum, and rounded down to 512 bytes.
func (w *preciseWorkload) resize(p *preciseImage, size uint64) {
	limit := w.maxSize
	if limit == 0 {
		limit = 64 * harness.MiB
	}
	size = min(max(size, p.objSize), limit) &^ 511
	w.logf("resize %d -> %d", p.size, size)
	if err := p.img.Resize(size); err != nil {
		w.t.Fatalf("resize to %d: %v", size, err)
	}
	p.size = size
}

func (w *preciseWorkload) snap(p *preciseImage) {
	name := fmt.Sprintf("s%d", len(p.snaps)+1)
	w.logf("snapshot %s@%s (size %d)", p.name, name, p.size)
	harness.Snapshot(w.t, p.img, name)
	p.snaps = append(p.snaps, name)
	p.snapSizes = append(p.snapSizes, p.size)
}

// read reads from p, which copies up on a clone that copies up on read;
// then, half the time on such a clone, writes into the same object right
// away, racing the copy-up.
func (w *preciseWorkload) read(p *preciseImage, off, length uint64) {
	w.logf("read %d+%d", off, length)
	if n, err := p.img.ReadAt(make([]byte, length), int64(off)); err != nil || n != int(length) {
		w.t.Fatalf("read %d+%d of %s: %d, %v", off, length, p.name, n, err)
	}
	if p.cor && w.rng.IntN(2) == 0 {
		o := min(off-off%p.objSize+w.rng.Uint64N(p.objSize), p.size-1)
		w.write(p, o, min(4*preciseKiB, p.size-o))
	}
}

// readSnap returns the whole snapshot as librbd reads it, parents
// included, after the LUKS header of the last image.
func (w *preciseWorkload) readSnap(p *preciseImage, snap string) []byte {
	t := w.t
	img, err := rbd.OpenImageReadOnly(w.ioctx, p.name, snap)
	if err != nil {
		t.Fatalf("open %s@%s: %v", p.name, snap, err)
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
			t.Fatalf("read %s@%s %d: n=%d %v", p.name, snap, off, n, err)
		}
	}
	return buf[w.header:]
}

// preciseExtent is one reported extent.
type preciseExtent struct{ off, len int64 }

// query opens one Diff in a mode and runs Iterate from each offset; it
// checks the extents are ascending, non-overlapping, within the capacity
// and that the first ends after its offset. The time is that of Open and
// the first Iterate.
func (w *preciseWorkload) query(src *rsm.Source, p *preciseImage, base, target string, mode string, offsets ...int64) ([][]preciseExtent, time.Duration, rsm.PreciseStats) {
	t := w.t
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
	var all [][]preciseExtent
	var dur time.Duration
	for i, from := range offsets {
		var got []preciseExtent
		err = d.Iterate(context.Background(), from, func(off, length int64) error {
			n := len(got)
			if length <= 0 || off < 0 || off+length > d.Capacity() || (n > 0 && off < got[n-1].off+got[n-1].len) {
				return fmt.Errorf("extent %d+%d after %v (capacity %d)", off, length, got[max(n-1, 0):], d.Capacity())
			}
			if n == 0 && off+length <= from {
				return fmt.Errorf("the first extent %d+%d ends at or before the offset %d", off, length, from)
			}
			got = append(got, preciseExtent{off, length})
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
func (w *preciseWorkload) request(p *preciseImage, base, target string) rsm.Request {
	cid := w.clusterID
	if cid == "" {
		cid = "rsm-e2e"
	}
	img := harness.Pool + "/" + p.name
	if w.ns != "" {
		img = harness.Pool + "/" + w.ns + "/" + p.name
	}
	id := func(s string) string { return cid + "/" + img + "@" + s }
	secrets := w.secrets
	if secrets == nil {
		secrets = preciseSecrets(w.t)
	}
	req := rsm.Request{Target: id(target), Secrets: secrets}
	if base != "" {
		req.Base = id(base)
	}
	return req
}

// check runs the queries of pairs on the last image, in each mode, against
// the oracle; half of them run again from an offset inside an object. The
// figures go to tot and to the totals of each of the history's kinds; it
// returns the history's own.
func (w *preciseWorkload) check(srcs map[string]*rsm.Source, tot *preciseTotals) *preciseTotals {
	t := w.t
	p := w.images[len(w.images)-1]
	w.data = map[string][]byte{}
	for _, s := range p.snaps {
		w.data[s] = w.readSnap(p, s)
	}
	h := newPreciseTotals()
	tots := []*preciseTotals{tot, h}
	for _, k := range w.kindList() {
		x := tot.kind(k)
		x.histories++
		tots = append(tots, x)
	}
	pairs := w.pairs(p.snaps)
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
			x.truth[kind] += blocks
			x.exact[kind] += exact
			x.queries[kind]++
		}
		// An offset inside an object, not on a 4 KiB block, for half the
		// queries.
		offsets := []int64{0}
		if size := uint64(len(after)); size > 1 && w.rng.IntN(2) == 0 {
			from := w.rng.Uint64N(size)
			if from%p.objSize == 0 {
				from++
			}
			offsets = append(offsets, int64(from))
		}
		var fromBlocks int64
		if len(offsets) > 1 {
			fromBlocks, _ = preciseTruth(before, after, int(offsets[1]))
		}
		for _, m := range preciseModes {
			all, dur, st := w.query(srcs[m.name], p, q[0], q[1], m.name, offsets...)
			got := all[0]
			missed, first := preciseMissed(before, after, got, 0)
			reported := preciseSum(got, 0)
			zeros, same := preciseUnchanged(before, after, got)
			for _, x := range tots {
				y := &x.modes[m.name][kind]
				y.reported += reported
				y.missed += missed
				y.dur += dur
				y.zeros += zeros
				y.same += same
			}
			what := fmt.Sprintf("%s %s..%s of %s", m.name, q[0], q[1], p.name)
			w.judge(m.unsafe, m.when, what, missed, first, fmt.Sprintf("(truth %d bytes in 4 KiB blocks); reported %v", blocks, got))
			if m.opts.Precise {
				if m.name == "precise" {
					tot.checksummed += st.Checksummed
				}
				if st.Unrefined != "" || st.Fallbacks != 0 {
					t.Errorf("%s: not refined: %+v", what, st)
				}
				walked := st.Candidates == "walk" || st.Candidates == "listing"
				if want := w.walks && m.opts.Walk != rsm.WalkLibrbd; walked != want {
					t.Errorf("%s: candidates %q, want the walk: %v", what, st.Candidates, want)
				}
				if want := map[string]string{rsm.WalkList: "listing", rsm.WalkProbe: "walk"}[m.opts.Walk]; w.walks && want != "" && st.Candidates != want {
					t.Errorf("%s: candidates %q, want %q", what, st.Candidates, want)
				}
				if reported > 0 && st.Objects == 0 {
					t.Errorf("%s: reported %d bytes but refined no object", what, reported)
				}
			}
			if len(all) > 1 {
				from := offsets[1]
				fromGot := all[1]
				missed, first := preciseMissed(before, after, fromGot, int(from))
				o := tot.offsets[m.name]
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
// first, and six more at random (all of them when allPairs is set). Every pair would grow with the square of
// the snapshots, which the shrink-grow histories make many of.
func (w *preciseWorkload) pairs(snaps []string) [][2]string {
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
	if w.allPairs {
		return append(pairs, rest...)
	}
	w.rng.Shuffle(len(rest), func(i, j int) { rest[i], rest[j] = rest[j], rest[i] })
	pairs = append(pairs, rest[:min(6, len(rest))]...)
	return pairs
}

// judge reports missed bytes: an error, or a log line for a mode whose
// misses unsafe documents in histories of the kinds when.
func (w *preciseWorkload) judge(unsafe string, when []string, what string, missed, first int64, detail string) {
	known := unsafe != "" && (when == nil || slices.ContainsFunc(when, func(k string) bool { return w.kinds[k] }))
	switch {
	case missed == 0:
	case known:
		// A mode that trusts the object map's dirty bits, which reef
		// 18.2.7 gets wrong after rollbacks, copy-on-read copy-ups and
		// shrink-snapshot-grow.
		w.t.Logf("%s: %d changed bytes not reported, the first at %d: known, documented in %s", what, missed, first, unsafe)
	default:
		w.t.Errorf("%s: %d changed bytes not reported, the first at %d %s", what, missed, first, detail)
	}
}

// preciseUnchanged counts the bytes of got that did not change between
// before and after: those zero on both sides, and the others.
func preciseUnchanged(before, after []byte, got []preciseExtent) (zeros, same int64) {
	for _, e := range got {
		for off := int(e.off); off < int(e.off+e.len); {
			end := min(int(e.off+e.len), (off/preciseBlock+1)*preciseBlock)
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
func preciseSum(got []preciseExtent, from int64) int64 {
	var n int64
	for _, e := range got {
		n += max(0, e.off+e.len-max(e.off, from))
	}
	return n
}

// preciseClip returns got cut to [from, ∞).
func preciseClip(got []preciseExtent, from int64) []preciseExtent {
	var out []preciseExtent
	for _, e := range got {
		if end := e.off + e.len; end > from {
			o := max(e.off, from)
			out = append(out, preciseExtent{o, end - o})
		}
	}
	return out
}

// preciseTruth counts the bytes of after from offset from on that differ
// from before (zeros where before is shorter or nil): in whole 4 KiB blocks
// (the first block counted from from), and exactly.
func preciseTruth(before, after []byte, from int) (blocks, exact int64) {
	for off := from; off < len(after); off = (off/preciseBlock + 1) * preciseBlock {
		end := min(len(after), (off/preciseBlock+1)*preciseBlock)
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

var preciseZeros = make([]byte, preciseBlock)

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

// preciseMissed counts the bytes of after from offset from on that differ
// from before and lie outside every extent of got (ascending).
func preciseMissed(before, after []byte, got []preciseExtent, from int) (missed, firstMissed int64) {
	k := 0
	for off := from; off < len(after); off = (off/preciseBlock + 1) * preciseBlock {
		end := min(len(after), (off/preciseBlock+1)*preciseBlock)
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

// TestPreciseFallsBackAndStops covers what the random histories do not:
// an image precise mode must not refine (non-default striping) answers
// exactly as librbd's exact diff; a cancelled or failing callback stops
// the refinement with its error.
func TestPreciseFallsBackAndStops(t *testing.T) {
	conn := harness.ConnectAdmin(t)
	ioctx := harness.OpenIOContext(t, conn, harness.Pool, "")
	srcs := preciseSources(t)
	w := newPreciseWorkload(t, ioctx, 1)

	t.Run("striping", func(t *testing.T) {
		w.t = t
		p := &preciseImage{name: harness.UniqueName(t, "precise-striped"), objSize: 4 * harness.MiB, size: 32 * harness.MiB}
		opts := harness.ImageOptions(t, false)
		for _, o := range []struct {
			opt rbd.ImageOption
			v   uint64
		}{{rbd.ImageOptionFeatures, harness.ImageFeatures | rbd.FeatureStripingV2}, {rbd.ImageOptionStripeUnit, 64 * preciseKiB}, {rbd.ImageOptionStripeCount, 4}} {
			if err := opts.SetUint64(o.opt, o.v); err != nil {
				t.Fatal(err)
			}
		}
		if err := rbd.CreateImage(ioctx, p.name, p.size, opts); err != nil {
			t.Fatalf("create striped image: %v", err)
		}
		harness.RemoveImageOnCleanup(t, ioctx, p.name)
		img, err := rbd.OpenImage(ioctx, p.name, rbd.NoSnapshot)
		if err != nil {
			t.Fatal(err)
		}
		defer img.Close()
		p.img = img
		harness.WriteAt(t, img, 5*harness.MiB+100, 70*preciseKiB)
		w.snap(p)
		harness.WriteAt(t, img, 20*harness.MiB, 4*preciseKiB)
		w.snap(p)
		for _, base := range []string{"", "s1"} {
			want, _, _ := w.query(srcs["exact"], p, base, "s2", "exact")
			got, _, st := w.query(srcs["precise"], p, base, "s2", "precise")
			if !strings.Contains(st.Unrefined, "striping") {
				t.Errorf("base %q: precise stats %+v, want unrefined for striping", base, st)
			}
			if !slices.Equal(got[0], want[0]) {
				t.Errorf("base %q: precise gave %v, exact %v", base, got, want)
			}
		}
	})

	t.Run("stop", func(t *testing.T) {
		w.t = t
		p := w.create(nil, 22)
		for i := uint64(0); i < p.size; i += p.objSize {
			harness.WriteAt(t, p.img, i+p.objSize/2, 4*preciseKiB)
		}
		w.snap(p)
		id := "rsm-e2e/" + harness.Pool + "/" + p.name + "@s1"
		d, err := srcs["precise"].Open(context.Background(), rsm.Request{Target: id, Secrets: preciseSecrets(t)})
		if err != nil {
			t.Fatal(err)
		}
		defer d.Close()
		boom := errors.New("boom")
		n := 0
		err = d.Iterate(context.Background(), 0, func(off, length int64) error {
			if n++; n == 2 {
				return boom
			}
			return nil
		})
		if !errors.Is(err, boom) || n != 2 {
			t.Errorf("callback error: Iterate returned %v after %d calls, want boom after 2", err, n)
		}
		ctx, cancel := context.WithCancel(context.Background())
		n = 0
		err = d.Iterate(ctx, 0, func(off, length int64) error {
			if n++; n == 3 {
				cancel()
			}
			return nil
		})
		if !errors.Is(err, context.Canceled) || n != 3 {
			t.Errorf("cancel: Iterate returned %v after %d calls, want context.Canceled after 3", err, n)
		}
		// And the Diff still works: one extent per object.
		n = 0
		if err := d.Iterate(context.Background(), 0, func(off, length int64) error { n++; return nil }); err != nil || uint64(n) != p.size/p.objSize {
			t.Errorf("after the stops: %d extents, %v; want %d", n, err, p.size/p.objSize)
		}
	})
}

// TestPreciseCost measures the three modes on a large, sparsely changed
// image and on a dense one: the time of one Open plus Iterate (median of
// five) and the bytes reported, against the bytes written.
func TestPreciseCost(t *testing.T) {
	conn := harness.ConnectAdmin(t)
	ioctx := harness.OpenIOContext(t, conn, harness.Pool, "")
	preciseCost(t, newPreciseWorkload(t, ioctx, 7), preciseSources(t))
}

// preciseCost is TestPreciseCost on w's cluster, with w's data pool.
func preciseCost(t *testing.T, w *preciseWorkload, srcs map[string]*rsm.Source) {
	ioctx := w.ioctx
	var b strings.Builder
	fmt.Fprintf(&b, "| image | query | truly changed | mode | reported | ratio | time |\n|---|---|---|---|---|---|---|\n")
	measure := func(label string, p *preciseImage, base string, truth int64) {
		for _, m := range preciseModes {
			var durs []time.Duration
			var reported int64
			for i := 0; i < 5; i++ {
				got, dur, _ := w.query(srcs[m.name], p, base, "s2", m.name)
				reported = preciseSum(got[0], 0)
				durs = append(durs, dur)
			}
			slices.Sort(durs)
			best := durs[len(durs)/2] // the median
			q := "Allocated(s2)"
			if base != "" {
				q = "Delta(s1, s2)"
			}
			fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %.1f× | %v |\n", label, q, preciseMiB(truth), m.name,
				preciseMiB(reported), float64(reported)/float64(truth), best.Round(10*time.Microsecond))
		}
	}
	write := func(p *preciseImage, off, length uint64) {
		data := make([]byte, length)
		for i := range data {
			data[i] = byte(w.rng.UintN(255) + 1)
		}
		if _, err := p.img.WriteAt(data, int64(off)); err != nil {
			t.Fatal(err)
		}
	}

	// 4 GiB, 1024 objects: 4 KiB in 64 objects, then in 64 others.
	p := newCostImage(t, ioctx, "precise-cost", 4096*harness.MiB, w.dataPool)
	for i := uint64(0); i < 128; i++ {
		if i == 64 {
			w.snap(p)
		}
		write(p, (i*8+3)*p.objSize+w.rng.Uint64N(1023)*4096, 4096)
	}
	w.snap(p)
	measure("4 GiB, 128 objects changed", p, "", 128*4096)
	measure("4 GiB, 128 objects changed", p, "s1", 64*4096)

	// 256 MiB written in full, then 4 KiB in each of its 64 objects.
	p = newCostImage(t, ioctx, "precise-dense", 256*harness.MiB, w.dataPool)
	for off := uint64(0); off < p.size; off += p.objSize {
		write(p, off, p.objSize)
	}
	w.snap(p)
	for off := uint64(0); off < p.size; off += p.objSize {
		write(p, off+w.rng.Uint64N(1023)*4096, 4096)
	}
	w.snap(p)
	measure("256 MiB dense", p, "", int64(p.size))
	measure("256 MiB dense", p, "s1", 64*4096)

	// The worst case for candidates by existence: everything allocated,
	// one object changed.
	p = newCostImage(t, ioctx, "precise-dense-one", 512*harness.MiB, w.dataPool)
	for off := uint64(0); off < p.size; off += p.objSize {
		write(p, off, p.objSize)
	}
	w.snap(p)
	write(p, 77*p.objSize+w.rng.Uint64N(1023)*4096, 4096)
	w.snap(p)
	measure("512 MiB dense, 1 object changed", p, "s1", 4096)
	t.Log("\n" + b.String())
}

// newCostImage creates an open image of 4 MiB objects for TestPreciseCost,
// with its data in dataPool when set, closed and removed when the test
// ends.
func newCostImage(t *testing.T, ioctx *rados.IOContext, prefix string, size uint64, dataPool string) *preciseImage {
	t.Helper()
	p := &preciseImage{name: harness.UniqueName(t, prefix), objSize: 4 * harness.MiB, size: size}
	opts := harness.ImageOptions(t, false)
	if dataPool != "" {
		if err := opts.SetString(rbd.ImageOptionDataPool, dataPool); err != nil {
			t.Fatal(err)
		}
	}
	if err := rbd.CreateImage(ioctx, p.name, p.size, opts); err != nil {
		t.Fatal(err)
	}
	harness.RemoveImageOnCleanup(t, ioctx, p.name)
	img, err := rbd.OpenImage(ioctx, p.name, rbd.NoSnapshot)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { img.Close() })
	p.img = img
	return p
}
