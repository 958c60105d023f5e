//go:build e2e

package e2e

import (
	"fmt"
	"testing"

	"github.com/ceph/go-ceph/rados"
	"github.com/ceph/go-ceph/rbd"
	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/e2e/harness"
)

// A scenario builds one volume with a history of snapshots.
type diffScenario struct {
	name  string
	build func(t testing.TB, conn *rados.Conn) builtScenario
}

type builtScenario struct {
	vol   harness.RbdVolume
	snaps []string // oldest first
	// must lists ranges that a query has to report on top of what the
	// byte oracle demands (data that reads as zeros, like written zeros).
	must []mustReport
	// straddle lists the deltas with a snapshot between them smaller than
	// both: --precision=object takes librbd's exact walk for those.
	straddle []diffQuery
}

func (b builtScenario) shrinkRegrow(q diffQuery) bool {
	for _, s := range b.straddle {
		if s == q {
			return true
		}
	}
	return false
}

type mustReport struct {
	from, to string // from empty: Allocated(to)
	spans    []harness.Span
	why      string
}

// Ceph-CSI's snapshot images are clones with only these features: the slow
// diff path, without object map.
const cephCSISnapFeatures = rbd.FeatureLayering | rbd.FeatureDeepFlatten

var diffScenarios = []diffScenario{
	{"scattered", func(t testing.TB, conn *rados.Conn) builtScenario {
		v, img := harness.CreateVolume(t, conn, "", "scattered", 64*harness.MiB, harness.ImageFeatures)
		for _, w := range [][2]uint64{{0, 4 * harness.KiB}, {5*harness.MiB + 12*harness.KiB, 4 * harness.KiB}, {33 * harness.MiB, 64 * harness.KiB}, {40*harness.MiB + 7, 100}, {64*harness.MiB - 4*harness.KiB, 4 * harness.KiB}} {
			harness.FillAt(t, img, w[0], w[1])
		}
		harness.Snapshot(t, img, "s1")
		// next to the first write; across an object boundary; unaligned;
		// a rewrite inside an earlier write
		for _, w := range [][2]uint64{{4 * harness.KiB, 8 * harness.KiB}, {16*harness.MiB - 2*harness.KiB, 4 * harness.KiB}, {50*harness.MiB + 512, 512}, {33*harness.MiB + 16*harness.KiB, 4 * harness.KiB}} {
			harness.FillAt(t, img, w[0], w[1])
		}
		harness.Snapshot(t, img, "s2")
		harness.FillAt(t, img, 5*harness.MiB+12*harness.KiB, 4*harness.KiB)
		harness.FillAt(t, img, 60*harness.MiB, harness.MiB)
		harness.Snapshot(t, img, "s3")
		return builtScenario{vol: v, snaps: []string{"s1", "s2", "s3"}}
	}},
	{"extend-past-written-end", func(t testing.TB, conn *rados.Conn) builtScenario {
		v, img := harness.CreateVolume(t, conn, "", "extend", 32*harness.MiB, harness.ImageFeatures)
		harness.FillAt(t, img, 0, 64*harness.KiB)
		harness.FillAt(t, img, 8*harness.MiB, 4*harness.KiB)
		harness.Snapshot(t, img, "s1")
		harness.FillAt(t, img, 64*harness.KiB-harness.KiB, 4*harness.KiB)               // straddles the written end
		harness.FillAt(t, img, harness.MiB, 4*harness.KiB)                              // past it, same object
		harness.FillAt(t, img, 8*harness.MiB+3*harness.MiB, 4*harness.KiB)              // far past it
		harness.FillAt(t, img, 20*harness.MiB+harness.MiB-4*harness.KiB, 4*harness.KiB) // a new object, written at its end only
		harness.Snapshot(t, img, "s2")
		return builtScenario{vol: v, snaps: []string{"s1", "s2"}}
	}},
	{"discards", func(t testing.TB, conn *rados.Conn) builtScenario {
		v, img := harness.CreateVolume(t, conn, "", "discard", 32*harness.MiB, harness.ImageFeatures)
		harness.FillAt(t, img, 0, 16*harness.MiB)
		harness.Snapshot(t, img, "s1")
		harness.Discard(t, img, 4*harness.MiB, harness.ObjSize)                // a whole object: exists=false in the diff
		harness.Discard(t, img, 8*harness.MiB+64*harness.KiB, 256*harness.KiB) // aligned, inside an object
		harness.Discard(t, img, 12*harness.MiB+1000, 3000)                     // small and unaligned
		harness.Discard(t, img, 3*harness.MiB, harness.MiB)                    // the tail of an object
		harness.Discard(t, img, 14*harness.MiB+4*harness.KiB, 20*harness.KiB)  // 4 KiB aligned, below the discard granularity
		harness.Snapshot(t, img, "s2")
		harness.FillAt(t, img, 4*harness.MiB+4*harness.KiB, 4*harness.KiB) // the discarded object again
		harness.Discard(t, img, 0, harness.MiB)
		harness.Snapshot(t, img, "s3")
		return builtScenario{vol: v, snaps: []string{"s1", "s2", "s3"}}
	}},
	{"zero-writes", func(t testing.TB, conn *rados.Conn) builtScenario {
		v, img := harness.CreateVolume(t, conn, "", "zeros", 32*harness.MiB, harness.ImageFeatures)
		harness.FillAt(t, img, 0, harness.MiB)
		harness.Snapshot(t, img, "s1")
		harness.ZeroAt(t, img, 0, 64*harness.KiB)              // over data: the oracle sees it
		harness.ZeroAt(t, img, 20*harness.MiB, 64*harness.KiB) // over nothing: only a write
		harness.ZeroAt(t, img, 8*harness.MiB, harness.ObjSize) // a whole object of zeros
		harness.Snapshot(t, img, "s2")
		zeros := []harness.Span{{Offset: int64(20 * harness.MiB), Length: int64(64 * harness.KiB)}, {Offset: int64(8 * harness.MiB), Length: int64(harness.ObjSize)}}
		return builtScenario{vol: v, snaps: []string{"s1", "s2"}, must: []mustReport{
			{"s1", "s2", zeros, "written zeros are data in a delta"},
			{"", "s2", zeros, "written zeros are allocated"},
		}}
	}},
	cloneScenario("clone-fast-diff", harness.ImageFeatures),
	cloneScenario("clone-ceph-csi-features", cephCSISnapFeatures),
	{"grow-and-shrink", func(t testing.TB, conn *rados.Conn) builtScenario {
		v, img := harness.CreateVolume(t, conn, "", "resize", 64*harness.MiB, harness.ImageFeatures)
		harness.FillAt(t, img, 0, 4*harness.KiB)
		harness.FillAt(t, img, 30*harness.MiB, 4*harness.KiB)
		harness.FillAt(t, img, 40*harness.MiB+4*harness.KiB, 8*harness.KiB) // cut in the middle by the shrink below
		harness.FillAt(t, img, 60*harness.MiB, 4*harness.KiB)
		harness.Snapshot(t, img, "s1")
		harness.ResizeImage(t, img, 128*harness.MiB)
		harness.FillAt(t, img, 64*harness.MiB, 4*harness.KiB) // at the old end
		harness.FillAt(t, img, 100*harness.MiB, 4*harness.KiB)
		harness.Snapshot(t, img, "s2")
		harness.ResizeImage(t, img, 40*harness.MiB+6000) // an unaligned size
		harness.Snapshot(t, img, "s3")
		return builtScenario{vol: v, snaps: []string{"s1", "s2", "s3"}}
	}},
	{"shrink-then-regrow", func(t testing.TB, conn *rados.Conn) builtScenario {
		// What a shrink cuts off reads as zeros once the image grows
		// again: a change from s1 to s3, with snapshot s2 at the small
		// size in between.
		v, img := harness.CreateVolume(t, conn, "", "regrow", 64*harness.MiB, harness.ImageFeatures)
		harness.FillAt(t, img, 0, 4*harness.KiB)
		harness.FillAt(t, img, 40*harness.MiB+4*harness.KiB, 8*harness.KiB) // cut in the middle by the shrink
		harness.FillAt(t, img, 60*harness.MiB, 4*harness.KiB)               // cut off entirely
		harness.Snapshot(t, img, "s1")
		harness.ResizeImage(t, img, 40*harness.MiB+6000)
		harness.Snapshot(t, img, "s2")
		harness.ResizeImage(t, img, 96*harness.MiB)
		harness.FillAt(t, img, 80*harness.MiB, 4*harness.KiB)
		harness.Snapshot(t, img, "s3")
		return builtScenario{vol: v, snaps: []string{"s1", "s2", "s3"}, straddle: []diffQuery{{"s1", "s3"}}}
	}},
	{"namespace", func(t testing.TB, conn *rados.Conn) builtScenario {
		v, img := harness.CreateVolume(t, conn, harness.Namespace, "ns", 32*harness.MiB, harness.ImageFeatures)
		harness.FillAt(t, img, 0, 4*harness.KiB)
		harness.FillAt(t, img, 9*harness.MiB, 64*harness.KiB)
		harness.Snapshot(t, img, "s1")
		harness.FillAt(t, img, 9*harness.MiB+32*harness.KiB, 64*harness.KiB)
		harness.Discard(t, img, 0, harness.ObjSize)
		harness.FillAt(t, img, 31*harness.MiB, harness.MiB)
		harness.Snapshot(t, img, "s2")
		return builtScenario{vol: v, snaps: []string{"s1", "s2"}}
	}},
	{"no-fast-diff", func(t testing.TB, conn *rados.Conn) builtScenario {
		v, img := harness.CreateVolume(t, conn, "", "slow", 32*harness.MiB, rbd.FeatureLayering)
		harness.FillAt(t, img, 0, 4*harness.KiB)
		harness.FillAt(t, img, 4*harness.MiB, harness.ObjSize)
		harness.FillAt(t, img, 17*harness.MiB+100, 5000)
		harness.Snapshot(t, img, "s1")
		harness.FillAt(t, img, 2*harness.KiB, 4*harness.KiB)
		harness.Discard(t, img, 4*harness.MiB, harness.ObjSize)
		harness.ZeroAt(t, img, 25*harness.MiB, 8*harness.KiB)
		harness.Snapshot(t, img, "s2")
		harness.FillAt(t, img, 4*harness.MiB+harness.MiB, 4*harness.KiB)
		harness.Snapshot(t, img, "s3")
		return builtScenario{vol: v, snaps: []string{"s1", "s2", "s3"}}
	}},
	{"striped", func(t testing.TB, conn *rados.Conn) builtScenario {
		// Fancy striping: 64 KiB stripe units over 4 objects, so one
		// object's changes are many extents of the image, and librbd must
		// put the extents of several objects back in order.
		v, img := harness.CreateVolume(t, conn, "", "striped", 32*harness.MiB, rbd.FeatureLayering|rbd.FeatureStripingV2, func(o *rbd.ImageOptions) {
			if err := o.SetUint64(rbd.ImageOptionStripeUnit, 64*harness.KiB); err != nil {
				t.Fatal(err)
			}
			if err := o.SetUint64(rbd.ImageOptionStripeCount, 4); err != nil {
				t.Fatal(err)
			}
		})
		harness.FillAt(t, img, 0, 4*harness.KiB)
		harness.FillAt(t, img, 100*harness.KiB, 200*harness.KiB) // across stripe units and objects
		harness.FillAt(t, img, 20*harness.MiB+3*harness.KiB, 1000)
		harness.Snapshot(t, img, "s1")
		harness.FillAt(t, img, 64*harness.KiB, 4*harness.KiB)
		harness.FillAt(t, img, 5*harness.MiB, 640*harness.KiB)
		harness.Discard(t, img, 16*harness.MiB, 16*harness.MiB) // a whole object set
		harness.Snapshot(t, img, "s2")
		return builtScenario{vol: v, snaps: []string{"s1", "s2"}}
	}},
}

// cloneScenario: a parent with data and a format 2 clone of its snapshot,
// with the given features. s1 has only the parent's data; s2 adds copy-ups
// and new objects; s3 follows a shrink (which cuts the parent overlap) and
// a grow.
func cloneScenario(name string, features uint64) diffScenario {
	return diffScenario{name, func(t testing.TB, conn *rados.Conn) builtScenario {
		pv, parent := harness.CreateVolume(t, conn, "", name+"-parent", 64*harness.MiB, harness.ImageFeatures)
		harness.FillAt(t, parent, 0, 4*harness.KiB)
		harness.FillAt(t, parent, 4*harness.MiB, harness.MiB)
		harness.FillAt(t, parent, 20*harness.MiB, 4*harness.KiB)
		harness.FillAt(t, parent, 40*harness.MiB, 2*harness.ObjSize)
		harness.FillAt(t, parent, 60*harness.MiB, 4*harness.KiB)
		harness.Snapshot(t, parent, "base")
		harness.FillAt(t, parent, 30*harness.MiB, 4*harness.KiB) // after the clone's snapshot: not the clone's

		child := harness.UniqueName(t, name)
		opts := rbd.NewRbdImageOptions()
		defer opts.Destroy()
		if err := opts.SetUint64(rbd.ImageOptionFeatures, features); err != nil {
			t.Fatal(err)
		}
		if err := opts.SetUint64(rbd.ImageOptionCloneFormat, 2); err != nil {
			t.Fatal(err)
		}
		if err := rbd.CloneImage(pv.IOCtx, pv.Name, "base", pv.IOCtx, child, opts); err != nil {
			t.Fatalf("clone %s@base: %v", pv.Name, err)
		}
		harness.RemoveImageOnCleanup(t, pv.IOCtx, child)
		img, err := rbd.OpenImage(pv.IOCtx, child, rbd.NoSnapshot)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = img.Close() })
		v := harness.RbdVolume{IOCtx: pv.IOCtx, Name: child}

		harness.Snapshot(t, img, "s1")
		harness.FillAt(t, img, 4*harness.MiB+512*harness.KiB, 4*harness.KiB) // copy-up of a parent object
		harness.FillAt(t, img, 10*harness.MiB, 4*harness.KiB)                // where the parent has nothing
		harness.FillAt(t, img, 40*harness.MiB+8*harness.KiB, 4*harness.KiB)
		harness.Snapshot(t, img, "s2")
		harness.ResizeImage(t, img, 22*harness.MiB) // the parent overlap shrinks to 22 MiB
		harness.ResizeImage(t, img, 64*harness.MiB)
		harness.FillAt(t, img, 50*harness.MiB, 4*harness.KiB)
		harness.Snapshot(t, img, "s3")
		return builtScenario{vol: v, snaps: []string{"s1", "s2", "s3"}}
	}}
}

// A query is one Allocated (from empty) or Delta call.
type diffQuery struct{ from, to string }

func (q diffQuery) String() string {
	if q.from == "" {
		return "allocated-" + q.to
	}
	return "delta-" + q.from + "-" + q.to
}

// queries returns Allocated of every snapshot, Delta of every consecutive
// pair, and Delta from the first to the last.
func diffQueries(snaps []string) []diffQuery {
	var q []diffQuery
	for _, s := range snaps {
		q = append(q, diffQuery{"", s})
	}
	for i := 1; i < len(snaps); i++ {
		q = append(q, diffQuery{snaps[i-1], snaps[i]})
	}
	if len(snaps) > 2 {
		q = append(q, diffQuery{snaps[0], snaps[len(snaps)-1]})
	}
	return q
}

// The servers of TestServerMatchesRbdDiff.
type compareServers struct {
	exact, object, fixed64k, fixed4k *harness.Server
	// precise is nil when the server binary has no --precision=precise.
	precise *harness.Server
}

// TestServerMatchesRbdDiff runs both RPCs through the real server on
// volumes with varied histories and checks every answer three ways:
//   - VARIABLE_LENGTH equals `rbd diff` merged: exactly with
//     --precision=exact, and `rbd diff --whole-object` with
//     --precision=object; the capacity is the target snapshot's size;
//     every ID form agrees;
//   - FIXED_LENGTH (64 KiB and 4 KiB) equals the exact VARIABLE_LENGTH
//     answer rounded out to blocks;
//   - the byte oracle: every byte that differs between the snapshots (or,
//     for Allocated, is not zero), read through librbd, lies in a tuple of
//     every server, --precision=precise included.

func TestServerMatchesRbdDiff(t *testing.T) {
	conn := harness.ConnectAdmin(t)
	srv := compareServers{
		exact:    harness.StartServer(t, "--precision=exact"),
		object:   harness.StartServer(t, "--precision=object"),
		fixed64k: harness.StartServer(t, "--precision=exact", "--block-metadata-type", "FIXED_LENGTH", "--fixed-block-size", "65536"),
		fixed4k:  harness.StartServer(t, "--precision=exact", "--block-metadata-type", "FIXED_LENGTH", "--fixed-block-size", "4096"),
	}
	if harness.ServerHasPrecision(t, "precise") {
		srv.precise = harness.StartServer(t, "--precision=precise")
	} else {
		t.Logf("the server binary has no --precision=precise: not checked")
	}
	for _, sc := range diffScenarios {
		t.Run(sc.name, func(t *testing.T) {
			// Each scenario has its own volume, the servers take
			// concurrent calls: two or more at once (go test's
			// -parallel, one per core).
			t.Parallel()
			b := sc.build(t, conn)
			t.Logf("volume %s, snapshots %v", b.vol.Spec(), b.snaps)
			for _, q := range diffQueries(b.snaps) {
				t.Run(q.String(), func(t *testing.T) { checkQuery(t, srv, b, q) })
			}
		})
	}
}

// checkQuery checks one Allocated or Delta query of a scenario on all the
// servers, as TestServerMatchesRbdDiff describes.
func checkQuery(t testing.TB, srv compareServers, b builtScenario, q diffQuery) {
	t.Helper()
	v := b.vol
	delta := q.from != ""
	req := func(id func(string) string) harness.MetaReq {
		r := harness.MetaReq{Target: id(q.to)}
		if delta {
			r.Base = id(q.from)
		}
		return r
	}
	capacity := harness.OpenSnap(t, v, q.to).Size

	// VARIABLE_LENGTH, exact, against rbd diff, with every form of ID.
	want := harness.WantFromRbdDiff(harness.RbdDiffOf(t, v, q.from, q.to, false), delta)
	var exact []harness.Span
	for i := range v.IDs(q.to) {
		r := req(func(s string) string { return v.IDs(s)[i] })
		m := srv.exact.Get(t, r)
		if m.Capacity() != capacity && len(m.Pages) > 0 {
			t.Errorf("%v: capacity %d, want the target snapshot's size %d", r, m.Capacity(), capacity)
		}
		got := m.Tuples()
		if diff := cmp.Diff(want, got, cmpopts.EquateEmpty()); diff != "" {
			t.Errorf("%v: tuples differ from rbd diff (-rbd diff +server):\n%s", r, diff)
		}
		if i == 0 {
			exact = got
		} else if diff := cmp.Diff(exact, got, cmpopts.EquateEmpty()); diff != "" {
			t.Errorf("%v: differs from %s (-first ID form +this one):\n%s", r, v.IDs(q.to)[0], diff)
		}
	}

	// --precision=object against rbd diff --whole-object, unless a
	// shrink-snapshot-grow lies between the snapshots: reef's fast-diff
	// can miss changes then, and the server takes librbd's exact walk.
	changed := harness.ChangedBytes(t, v, q.from, q.to)
	wantWhole := harness.WantFromRbdDiff(harness.RbdDiffOf(t, v, q.from, q.to, true), delta)
	whole := srv.object.Get(t, req(v.ID)).Tuples()
	want, from := wantWhole, "rbd diff --whole-object"
	if delta && b.shrinkRegrow(q) {
		want, from = exact, "the exact answer (the snapshots straddle a shrink and a regrow)"
	}
	if diff := cmp.Diff(want, whole, cmpopts.EquateEmpty()); diff != "" {
		t.Errorf("--precision=object: tuples differ from %s (-want +server):\n%s", from, diff)
	}

	// FIXED_LENGTH: the exact answer rounded out to blocks.
	fixed := map[int64][]harness.Span{}
	for _, f := range []struct {
		s    *harness.Server
		size int64
	}{{srv.fixed64k, 64 << 10}, {srv.fixed4k, 4 << 10}} {
		m := f.s.Get(t, req(v.ID))
		got := m.Tuples()
		if diff := cmp.Diff(harness.RoundOut(exact, f.size), got, cmpopts.EquateEmpty()); diff != "" {
			t.Errorf("FIXED_LENGTH %d: not the VARIABLE_LENGTH answer rounded out to blocks (-want +got):\n%s", f.size, diff)
		}
		if len(m.Pages) > 0 && m.Capacity() != capacity {
			t.Errorf("FIXED_LENGTH %d: capacity %d, want %d", f.size, m.Capacity(), capacity)
		}
		fixed[f.size] = got
	}

	// --precision=precise: only the oracle can judge it.
	var precise []harness.Span
	answers := map[string][]harness.Span{
		"exact": exact, "object": whole, "FIXED 64 KiB": fixed[64<<10], "FIXED 4 KiB": fixed[4<<10],
	}
	if srv.precise != nil {
		precise = srv.precise.Get(t, req(v.ID)).Tuples()
		answers["precise"] = precise
	}

	// The byte oracle, for every answer.
	for name, got := range answers {
		if miss := harness.OracleMisses(changed, got); len(miss) > 0 {
			why := ""
			if name == "object" && len(harness.Uncovered(harness.Uncovered(changed, harness.MergeSpans(got)), wantWhole)) > 0 {
				why = " (librbd's own `rbd diff --whole-object` misses them too)"
			}
			t.Errorf("%s: %d changed bytes are in no tuple%s; missed blocks of %d bytes: %v",
				name, harness.TotalBytes(harness.Uncovered(changed, harness.MergeSpans(got))), why, harness.OracleBlock, miss)
		}
	}
	for _, m := range b.must {
		if m.from != q.from || m.to != q.to {
			continue
		}
		if miss := harness.Uncovered(m.spans, harness.MergeSpans(exact)); len(miss) > 0 {
			t.Errorf("%s: %v not reported", m.why, miss)
		}
	}
	t.Logf("capacity %d; changed bytes %d in %d ranges; exact %d tuples, %d bytes (%s); object %d bytes; fixed 64K %d, 4K %d tuples; precise %d tuples, %d bytes",
		capacity, harness.TotalBytes(changed), len(changed), len(exact), harness.TotalBytes(exact), reportRatio(harness.TotalBytes(exact), harness.TotalBytes(changed)),
		harness.TotalBytes(whole), len(fixed[64<<10]), len(fixed[4<<10]), len(precise), harness.TotalBytes(precise))
}

func reportRatio(reported, changed int64) string {
	if changed == 0 {
		return "nothing changed"
	}
	return fmt.Sprintf("%.1fx the changed bytes", float64(reported)/float64(changed))
}
