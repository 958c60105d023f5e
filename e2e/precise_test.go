//go:build e2e

package e2e

// Precise mode against a byte-level oracle. Each seed builds a random
// history on a real image (writes into new, existing and parent-only
// objects, zero writes, whole and partial discards, growth and shrink,
// clones of clones, snapshots in between, and the scenarios of e2e/oracle
// (oracle.Shapes, oracle.Steps): write-zeroes, re-created objects,
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
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ceph/go-ceph/rados"
	"github.com/ceph/go-ceph/rbd"

	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/e2e/harness"
	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/e2e/oracle"
	rsm "github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/rbd"
)

// TestPreciseOracle runs random histories and checks every mode against
// the byte oracle; precise mode must miss nothing and fall back nowhere.
// Each history is of one or more kinds (oracle.Shapes, oracle.Steps), and the
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
	srcs := oracle.Sources(t)
	tot := oracle.NewTotals()
	// After the seeds, which run two at a time (oracle.Parallel).
	t.Cleanup(func() { t.Log("\n" + tot.Table()) })
	for _, seed := range oracle.Seeds(t) {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			oracle.Parallel(t)
			w := oracle.NewWorkload(t, ioctx, seed)
			// Registered first, so it runs after the images' cleanups,
			// whose failures it explains too.
			t.Cleanup(func() {
				if t.Failed() {
					t.Logf("replay with RSM_E2E_SEED=%d; kinds %v; history:\n%s", seed, w.KindList(), strings.Join(w.Log, "\n"))
				}
			})
			w.Features = features
			w.Walks = features&rbd.FeatureFastDiff == 0
			w.Zero = zero
			start := time.Now()
			w.Run()
			built := time.Now()
			mine := oracle.NewTotals()
			h := w.Check(srcs, mine)
			w.Migrate(srcs, mine)
			w.RemoveDuring(srcs, mine)
			tot.Add(mine)
			p := w.Images[len(w.Images)-1]
			t.Logf("%v: %d images, the last of %d objects of %d KiB, %d snapshots, %d queries per mode; history %v, checks %v; Allocated / Delta ratio: %s",
				w.KindList(), len(w.Images), (p.Size+p.ObjSize-1)/p.ObjSize, p.ObjSize>>10, len(p.Snaps), h.Queries[0]+h.Queries[1],
				built.Sub(start).Round(time.Millisecond), time.Since(built).Round(time.Millisecond), h.Ratios())
		})
	}
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

// TestPreciseFallsBackAndStops covers what the random histories do not:
// an image precise mode must not refine (non-default striping) answers
// exactly as librbd's exact diff; a cancelled or failing callback stops
// the refinement with its error.
func TestPreciseFallsBackAndStops(t *testing.T) {
	conn := harness.ConnectAdmin(t)
	ioctx := harness.OpenIOContext(t, conn, harness.Pool, "")
	srcs := oracle.Sources(t)
	w := oracle.NewWorkload(t, ioctx, 1)

	t.Run("striping", func(t *testing.T) {
		w.T = t
		p := &oracle.Image{Name: harness.UniqueName(t, "precise-striped"), ObjSize: 4 * harness.MiB, Size: 32 * harness.MiB}
		opts := harness.ImageOptions(t, false)
		for _, o := range []struct {
			opt rbd.ImageOption
			v   uint64
		}{{rbd.ImageOptionFeatures, harness.ImageFeatures | rbd.FeatureStripingV2}, {rbd.ImageOptionStripeUnit, 64 * oracle.KiB}, {rbd.ImageOptionStripeCount, 4}} {
			if err := opts.SetUint64(o.opt, o.v); err != nil {
				t.Fatal(err)
			}
		}
		if err := rbd.CreateImage(ioctx, p.Name, p.Size, opts); err != nil {
			t.Fatalf("create striped image: %v", err)
		}
		harness.RemoveImageOnCleanup(t, ioctx, p.Name)
		img, err := rbd.OpenImage(ioctx, p.Name, rbd.NoSnapshot)
		if err != nil {
			t.Fatal(err)
		}
		defer img.Close()
		p.Img = img
		harness.WriteAt(t, img, 5*harness.MiB+100, 70*oracle.KiB)
		w.Snap(p)
		harness.WriteAt(t, img, 20*harness.MiB, 4*oracle.KiB)
		w.Snap(p)
		for _, base := range []string{"", "s1"} {
			want, _, _ := w.Query(srcs["exact"], p, base, "s2", "exact")
			got, _, st := w.Query(srcs["precise"], p, base, "s2", "precise")
			if !strings.Contains(st.ImageFallbackDetail, "striping") {
				t.Errorf("base %q: precise stats %+v, want unrefined for striping", base, st)
			}
			if !slices.Equal(got[0], want[0]) {
				t.Errorf("base %q: precise gave %v, exact %v", base, got, want)
			}
		}
	})

	t.Run("stop", func(t *testing.T) {
		w.T = t
		p := w.Create(nil, 22)
		for i := uint64(0); i < p.Size; i += p.ObjSize {
			harness.WriteAt(t, p.Img, i+p.ObjSize/2, 4*oracle.KiB)
		}
		w.Snap(p)
		id := "rsm-e2e/" + harness.Pool + "/" + p.Name + "@s1"
		d, err := srcs["precise"].Open(context.Background(), rsm.Request{Target: id, Secrets: oracle.Secrets(t)})
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
		if err := d.Iterate(context.Background(), 0, func(off, length int64) error { n++; return nil }); err != nil || uint64(n) != p.Size/p.ObjSize {
			t.Errorf("after the stops: %d extents, %v; want %d", n, err, p.Size/p.ObjSize)
		}
	})
}

// TestPreciseCost measures the three modes on a large, sparsely changed
// image and on a dense one: the time of one Open plus Iterate (median of
// five) and the bytes reported, against the bytes written.
func TestPreciseCost(t *testing.T) {
	conn := harness.ConnectAdmin(t)
	ioctx := harness.OpenIOContext(t, conn, harness.Pool, "")
	oracle.Cost(t, oracle.NewWorkload(t, ioctx, 7), oracle.Sources(t))
}
