//go:build e2e

package e2e

import (
	"fmt"
	"testing"

	"github.com/ceph/go-ceph/rados"
	"github.com/ceph/go-ceph/rbd"
	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

// A scenario builds one volume with a history of snapshots.
type diffScenario struct {
	name  string
	build func(t testing.TB, conn *rados.Conn) builtScenario
}

type builtScenario struct {
	vol   rbdVolume
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
	spans    []span
	why      string
}

const kib = uint64(1) << 10

// Ceph-CSI's snapshot images are clones with only these features: the slow
// diff path, without object map.
const cephCSISnapFeatures = rbd.FeatureLayering | rbd.FeatureDeepFlatten

var diffScenarios = []diffScenario{
	{"scattered", func(t testing.TB, conn *rados.Conn) builtScenario {
		v, img := createVolume(t, conn, "", "scattered", 64*mib, imageFeatures)
		for _, w := range [][2]uint64{{0, 4 * kib}, {5*mib + 12*kib, 4 * kib}, {33 * mib, 64 * kib}, {40*mib + 7, 100}, {64*mib - 4*kib, 4 * kib}} {
			fillAt(t, img, w[0], w[1])
		}
		snapshot(t, img, "s1")
		// next to the first write; across an object boundary; unaligned;
		// a rewrite inside an earlier write
		for _, w := range [][2]uint64{{4 * kib, 8 * kib}, {16*mib - 2*kib, 4 * kib}, {50*mib + 512, 512}, {33*mib + 16*kib, 4 * kib}} {
			fillAt(t, img, w[0], w[1])
		}
		snapshot(t, img, "s2")
		fillAt(t, img, 5*mib+12*kib, 4*kib)
		fillAt(t, img, 60*mib, mib)
		snapshot(t, img, "s3")
		return builtScenario{vol: v, snaps: []string{"s1", "s2", "s3"}}
	}},
	{"extend-past-written-end", func(t testing.TB, conn *rados.Conn) builtScenario {
		v, img := createVolume(t, conn, "", "extend", 32*mib, imageFeatures)
		fillAt(t, img, 0, 64*kib)
		fillAt(t, img, 8*mib, 4*kib)
		snapshot(t, img, "s1")
		fillAt(t, img, 64*kib-kib, 4*kib)       // straddles the written end
		fillAt(t, img, mib, 4*kib)              // past it, same object
		fillAt(t, img, 8*mib+3*mib, 4*kib)      // far past it
		fillAt(t, img, 20*mib+mib-4*kib, 4*kib) // a new object, written at its end only
		snapshot(t, img, "s2")
		return builtScenario{vol: v, snaps: []string{"s1", "s2"}}
	}},
	{"discards", func(t testing.TB, conn *rados.Conn) builtScenario {
		v, img := createVolume(t, conn, "", "discard", 32*mib, imageFeatures)
		fillAt(t, img, 0, 16*mib)
		snapshot(t, img, "s1")
		discard(t, img, 4*mib, objSize)        // a whole object: exists=false in the diff
		discard(t, img, 8*mib+64*kib, 256*kib) // aligned, inside an object
		discard(t, img, 12*mib+1000, 3000)     // small and unaligned
		discard(t, img, 3*mib, mib)            // the tail of an object
		discard(t, img, 14*mib+4*kib, 20*kib)  // 4 KiB aligned, below the discard granularity
		snapshot(t, img, "s2")
		fillAt(t, img, 4*mib+4*kib, 4*kib) // the discarded object again
		discard(t, img, 0, mib)
		snapshot(t, img, "s3")
		return builtScenario{vol: v, snaps: []string{"s1", "s2", "s3"}}
	}},
	{"zero-writes", func(t testing.TB, conn *rados.Conn) builtScenario {
		v, img := createVolume(t, conn, "", "zeros", 32*mib, imageFeatures)
		fillAt(t, img, 0, mib)
		snapshot(t, img, "s1")
		zeroAt(t, img, 0, 64*kib)      // over data: the oracle sees it
		zeroAt(t, img, 20*mib, 64*kib) // over nothing: only a write
		zeroAt(t, img, 8*mib, objSize) // a whole object of zeros
		snapshot(t, img, "s2")
		zeros := []span{{Offset: int64(20 * mib), Length: int64(64 * kib)}, {Offset: int64(8 * mib), Length: int64(objSize)}}
		return builtScenario{vol: v, snaps: []string{"s1", "s2"}, must: []mustReport{
			{"s1", "s2", zeros, "written zeros are data in a delta"},
			{"", "s2", zeros, "written zeros are allocated"},
		}}
	}},
	cloneScenario("clone-fast-diff", imageFeatures),
	cloneScenario("clone-ceph-csi-features", cephCSISnapFeatures),
	{"grow-and-shrink", func(t testing.TB, conn *rados.Conn) builtScenario {
		v, img := createVolume(t, conn, "", "resize", 64*mib, imageFeatures)
		fillAt(t, img, 0, 4*kib)
		fillAt(t, img, 30*mib, 4*kib)
		fillAt(t, img, 40*mib+4*kib, 8*kib) // cut in the middle by the shrink below
		fillAt(t, img, 60*mib, 4*kib)
		snapshot(t, img, "s1")
		resizeImage(t, img, 128*mib)
		fillAt(t, img, 64*mib, 4*kib) // at the old end
		fillAt(t, img, 100*mib, 4*kib)
		snapshot(t, img, "s2")
		resizeImage(t, img, 40*mib+6000) // an unaligned size
		snapshot(t, img, "s3")
		return builtScenario{vol: v, snaps: []string{"s1", "s2", "s3"}}
	}},
	{"shrink-then-regrow", func(t testing.TB, conn *rados.Conn) builtScenario {
		// What a shrink cuts off reads as zeros once the image grows
		// again: a change from s1 to s3, with snapshot s2 at the small
		// size in between.
		v, img := createVolume(t, conn, "", "regrow", 64*mib, imageFeatures)
		fillAt(t, img, 0, 4*kib)
		fillAt(t, img, 40*mib+4*kib, 8*kib) // cut in the middle by the shrink
		fillAt(t, img, 60*mib, 4*kib)       // cut off entirely
		snapshot(t, img, "s1")
		resizeImage(t, img, 40*mib+6000)
		snapshot(t, img, "s2")
		resizeImage(t, img, 96*mib)
		fillAt(t, img, 80*mib, 4*kib)
		snapshot(t, img, "s3")
		return builtScenario{vol: v, snaps: []string{"s1", "s2", "s3"}, straddle: []diffQuery{{"s1", "s3"}}}
	}},
	{"namespace", func(t testing.TB, conn *rados.Conn) builtScenario {
		v, img := createVolume(t, conn, namespace, "ns", 32*mib, imageFeatures)
		fillAt(t, img, 0, 4*kib)
		fillAt(t, img, 9*mib, 64*kib)
		snapshot(t, img, "s1")
		fillAt(t, img, 9*mib+32*kib, 64*kib)
		discard(t, img, 0, objSize)
		fillAt(t, img, 31*mib, mib)
		snapshot(t, img, "s2")
		return builtScenario{vol: v, snaps: []string{"s1", "s2"}}
	}},
	{"no-fast-diff", func(t testing.TB, conn *rados.Conn) builtScenario {
		v, img := createVolume(t, conn, "", "slow", 32*mib, rbd.FeatureLayering)
		fillAt(t, img, 0, 4*kib)
		fillAt(t, img, 4*mib, objSize)
		fillAt(t, img, 17*mib+100, 5000)
		snapshot(t, img, "s1")
		fillAt(t, img, 2*kib, 4*kib)
		discard(t, img, 4*mib, objSize)
		zeroAt(t, img, 25*mib, 8*kib)
		snapshot(t, img, "s2")
		fillAt(t, img, 4*mib+mib, 4*kib)
		snapshot(t, img, "s3")
		return builtScenario{vol: v, snaps: []string{"s1", "s2", "s3"}}
	}},
	{"striped", func(t testing.TB, conn *rados.Conn) builtScenario {
		// Fancy striping: 64 KiB stripe units over 4 objects, so one
		// object's changes are many extents of the image, and librbd must
		// put the extents of several objects back in order.
		v, img := createVolume(t, conn, "", "striped", 32*mib, rbd.FeatureLayering|rbd.FeatureStripingV2, func(o *rbd.ImageOptions) {
			if err := o.SetUint64(rbd.ImageOptionStripeUnit, 64*kib); err != nil {
				t.Fatal(err)
			}
			if err := o.SetUint64(rbd.ImageOptionStripeCount, 4); err != nil {
				t.Fatal(err)
			}
		})
		fillAt(t, img, 0, 4*kib)
		fillAt(t, img, 100*kib, 200*kib) // across stripe units and objects
		fillAt(t, img, 20*mib+3*kib, 1000)
		snapshot(t, img, "s1")
		fillAt(t, img, 64*kib, 4*kib)
		fillAt(t, img, 5*mib, 640*kib)
		discard(t, img, 16*mib, 16*mib) // a whole object set
		snapshot(t, img, "s2")
		return builtScenario{vol: v, snaps: []string{"s1", "s2"}}
	}},
}

// cloneScenario: a parent with data and a format 2 clone of its snapshot,
// with the given features. s1 has only the parent's data; s2 adds copy-ups
// and new objects; s3 follows a shrink (which cuts the parent overlap) and
// a grow.
func cloneScenario(name string, features uint64) diffScenario {
	return diffScenario{name, func(t testing.TB, conn *rados.Conn) builtScenario {
		pv, parent := createVolume(t, conn, "", name+"-parent", 64*mib, imageFeatures)
		fillAt(t, parent, 0, 4*kib)
		fillAt(t, parent, 4*mib, mib)
		fillAt(t, parent, 20*mib, 4*kib)
		fillAt(t, parent, 40*mib, 2*objSize)
		fillAt(t, parent, 60*mib, 4*kib)
		snapshot(t, parent, "base")
		fillAt(t, parent, 30*mib, 4*kib) // after the clone's snapshot: not the clone's

		child := uniqueName(t, name)
		opts := rbd.NewRbdImageOptions()
		defer opts.Destroy()
		if err := opts.SetUint64(rbd.ImageOptionFeatures, features); err != nil {
			t.Fatal(err)
		}
		if err := opts.SetUint64(rbd.ImageOptionCloneFormat, 2); err != nil {
			t.Fatal(err)
		}
		if err := rbd.CloneImage(pv.ioctx, pv.name, "base", pv.ioctx, child, opts); err != nil {
			t.Fatalf("clone %s@base: %v", pv.name, err)
		}
		removeImageOnCleanup(t, pv.ioctx, child)
		img, err := rbd.OpenImage(pv.ioctx, child, rbd.NoSnapshot)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = img.Close() })
		v := rbdVolume{ioctx: pv.ioctx, name: child}

		snapshot(t, img, "s1")
		fillAt(t, img, 4*mib+512*kib, 4*kib) // copy-up of a parent object
		fillAt(t, img, 10*mib, 4*kib)        // where the parent has nothing
		fillAt(t, img, 40*mib+8*kib, 4*kib)
		snapshot(t, img, "s2")
		resizeImage(t, img, 22*mib) // the parent overlap shrinks to 22 MiB
		resizeImage(t, img, 64*mib)
		fillAt(t, img, 50*mib, 4*kib)
		snapshot(t, img, "s3")
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
	exact, object, fixed64k, fixed4k *rsmServer
	// precise is nil when the server binary has no --precision=precise.
	precise *rsmServer
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
	conn := connectAdmin(t)
	srv := compareServers{
		exact:    startServer(t, "--precision=exact"),
		object:   startServer(t, "--precision=object"),
		fixed64k: startServer(t, "--precision=exact", "--block-metadata-type", "FIXED_LENGTH", "--fixed-block-size", "65536"),
		fixed4k:  startServer(t, "--precision=exact", "--block-metadata-type", "FIXED_LENGTH", "--fixed-block-size", "4096"),
	}
	if serverHasPrecision(t, "precise") {
		srv.precise = startServer(t, "--precision=precise")
	} else {
		t.Logf("the server binary has no --precision=precise: not checked")
	}
	for _, sc := range diffScenarios {
		t.Run(sc.name, func(t *testing.T) {
			b := sc.build(t, conn)
			t.Logf("volume %s, snapshots %v", b.vol.spec(), b.snaps)
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
	req := func(id func(string) string) metaReq {
		r := metaReq{target: id(q.to)}
		if delta {
			r.base = id(q.from)
		}
		return r
	}
	capacity := openSnap(t, v, q.to).size

	// VARIABLE_LENGTH, exact, against rbd diff, with every form of ID.
	want := wantFromRbdDiff(rbdDiffOf(t, v, q.from, q.to, false), delta)
	var exact []span
	for i := range v.ids(q.to) {
		r := req(func(s string) string { return v.ids(s)[i] })
		m := srv.exact.get(t, r)
		if m.capacity() != capacity && len(m.pages) > 0 {
			t.Errorf("%v: capacity %d, want the target snapshot's size %d", r, m.capacity(), capacity)
		}
		got := m.tuples()
		if diff := cmp.Diff(want, got, cmpopts.EquateEmpty()); diff != "" {
			t.Errorf("%v: tuples differ from rbd diff (-rbd diff +server):\n%s", r, diff)
		}
		if i == 0 {
			exact = got
		} else if diff := cmp.Diff(exact, got, cmpopts.EquateEmpty()); diff != "" {
			t.Errorf("%v: differs from %s (-first ID form +this one):\n%s", r, v.ids(q.to)[0], diff)
		}
	}

	// --precision=object against rbd diff --whole-object, unless a
	// shrink-snapshot-grow lies between the snapshots: reef's fast-diff
	// can miss changes then, and the server takes librbd's exact walk.
	changed := changedBytes(t, v, q.from, q.to)
	wantWhole := wantFromRbdDiff(rbdDiffOf(t, v, q.from, q.to, true), delta)
	whole := srv.object.get(t, req(v.id)).tuples()
	want, from := wantWhole, "rbd diff --whole-object"
	if delta && b.shrinkRegrow(q) {
		want, from = exact, "the exact answer (the snapshots straddle a shrink and a regrow)"
	}
	if diff := cmp.Diff(want, whole, cmpopts.EquateEmpty()); diff != "" {
		t.Errorf("--precision=object: tuples differ from %s (-want +server):\n%s", from, diff)
	}

	// FIXED_LENGTH: the exact answer rounded out to blocks.
	fixed := map[int64][]span{}
	for _, f := range []struct {
		s    *rsmServer
		size int64
	}{{srv.fixed64k, 64 << 10}, {srv.fixed4k, 4 << 10}} {
		m := f.s.get(t, req(v.id))
		got := m.tuples()
		if diff := cmp.Diff(roundOut(exact, f.size), got, cmpopts.EquateEmpty()); diff != "" {
			t.Errorf("FIXED_LENGTH %d: not the VARIABLE_LENGTH answer rounded out to blocks (-want +got):\n%s", f.size, diff)
		}
		if len(m.pages) > 0 && m.capacity() != capacity {
			t.Errorf("FIXED_LENGTH %d: capacity %d, want %d", f.size, m.capacity(), capacity)
		}
		fixed[f.size] = got
	}

	// --precision=precise: only the oracle can judge it.
	var precise []span
	answers := map[string][]span{
		"exact": exact, "object": whole, "FIXED 64 KiB": fixed[64<<10], "FIXED 4 KiB": fixed[4<<10],
	}
	if srv.precise != nil {
		precise = srv.precise.get(t, req(v.id)).tuples()
		answers["precise"] = precise
	}

	// The byte oracle, for every answer.
	for name, got := range answers {
		if miss := oracleMisses(changed, got); len(miss) > 0 {
			why := ""
			if name == "object" && len(uncovered(uncovered(changed, mergeSpans(got)), wantWhole)) > 0 {
				why = " (librbd's own `rbd diff --whole-object` misses them too)"
			}
			t.Errorf("%s: %d changed bytes are in no tuple%s; missed blocks of %d bytes: %v",
				name, totalBytes(uncovered(changed, mergeSpans(got))), why, oracleBlock, miss)
		}
	}
	for _, m := range b.must {
		if m.from != q.from || m.to != q.to {
			continue
		}
		if miss := uncovered(m.spans, mergeSpans(exact)); len(miss) > 0 {
			t.Errorf("%s: %v not reported", m.why, miss)
		}
	}
	t.Logf("capacity %d; changed bytes %d in %d ranges; exact %d tuples, %d bytes (%s); object %d bytes; fixed 64K %d, 4K %d tuples; precise %d tuples, %d bytes",
		capacity, totalBytes(changed), len(changed), len(exact), totalBytes(exact), reportRatio(totalBytes(exact), totalBytes(changed)),
		totalBytes(whole), len(fixed[64<<10]), len(fixed[4<<10]), len(precise), totalBytes(precise))
}

func reportRatio(reported, changed int64) string {
	if changed == 0 {
		return "nothing changed"
	}
	return fmt.Sprintf("%.1fx the changed bytes", float64(reported)/float64(changed))
}
