package precise

import (
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
)

const mb = 1 << 20

// clone builds a cloneInfo; overlap alternates offsets and lengths.
func clone(id uint64, size int64, snaps []uint64, overlap ...int64) cloneInfo {
	c := cloneInfo{id: id, size: size, snaps: snaps}
	for i := 0; i+1 < len(overlap); i += 2 {
		c.overlap = append(c.overlap, span{overlap[i], overlap[i+1]})
	}
	return c
}

func head(size int64) cloneInfo { return cloneInfo{id: snapHead, size: size} }

// TestDiffSnapSet checks the restatement of calc_snap_set_diff on hand-made
// snap sets, between snapshots 10 and 20.
func TestDiffSnapSet(t *testing.T) {
	for _, tc := range []struct {
		name string
		ss   snapSet
		want objDiff
	}{{
		name: "created after s2: absent at both",
		ss:   snapSet{seq: 20, clones: []cloneInfo{head(4 * mb)}},
		want: objDiff{},
	}, {
		name: "created between: absent at s1",
		ss:   snapSet{seq: 10, clones: []cloneInfo{head(1 * mb)}},
		want: objDiff{exists2: true, size2: 1 * mb},
	}, {
		name: "untouched since before s1",
		ss:   snapSet{seq: 3, clones: []cloneInfo{head(4 * mb)}},
		want: objDiff{exists1: true, exists2: true, size1: 4 * mb, size2: 4 * mb},
	}, {
		name: "rewritten between: overlap diff",
		ss: snapSet{seq: 10, clones: []cloneInfo{
			clone(10, 4*mb, []uint64{10}, 0, 8192, 12288, 4*mb-12288),
			head(4 * mb),
		}},
		want: objDiff{exists1: true, exists2: true, size1: 4 * mb, size2: 4 * mb, changed: []span{{8192, 4096}}},
	}, {
		name: "grown between",
		ss: snapSet{seq: 10, clones: []cloneInfo{
			clone(10, 1*mb, []uint64{10}, 0, 1*mb),
			head(3 * mb),
		}},
		want: objDiff{exists1: true, exists2: true, size1: 1 * mb, size2: 3 * mb, changed: []span{{1 * mb, 2 * mb}}},
	}, {
		name: "truncated between",
		ss: snapSet{seq: 10, clones: []cloneInfo{
			clone(10, 3*mb, []uint64{10}, 0, 1*mb),
			head(1 * mb),
		}},
		want: objDiff{exists1: true, exists2: true, size1: 3 * mb, size2: 1 * mb, changed: []span{{1 * mb, 2 * mb}}},
	}, {
		name: "removed between",
		ss:   snapSet{seq: 10, clones: []cloneInfo{clone(10, 2*mb, []uint64{5, 10})}},
		want: objDiff{exists1: true, size1: 2 * mb, changed: []span{{0, 2 * mb}}},
	}, {
		name: "two versions between s1 and s2, then the head",
		ss: snapSet{seq: 20, clones: []cloneInfo{
			clone(10, 4*mb, []uint64{10}, 0, 1*mb, 2*mb, 2*mb), // [1, 2) MiB rewritten
			clone(20, 4*mb, []uint64{15, 20}, 0, 3*mb),         // [3, 4) MiB after s2
			head(4 * mb),
		}},
		want: objDiff{exists1: true, exists2: true, size1: 4 * mb, size2: 4 * mb, changed: []span{{1 * mb, 1 * mb}}},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := diffSnapSet(tc.ss, 10, 20)
			if err != nil {
				t.Fatal(err)
			}
			if d := cmp.Diff(tc.want, got, cmp.AllowUnexported(objDiff{}, span{})); d != "" {
				t.Errorf("diffSnapSet (-want +got):\n%s", d)
			}
		})
	}
	if _, err := diffSnapSet(snapSet{clones: []cloneInfo{clone(12, 1, nil)}}, 10, 20); err == nil {
		t.Error("a clone without snapshots: want an error (fall back), got none")
	}
}

// TestDeltaSpans checks the per-object rules, the traps included.
func TestDeltaSpans(t *testing.T) {
	both := func(size1, size2 int64, changed ...span) objDiff {
		return objDiff{exists1: true, exists2: true, size1: size1, size2: size2, changed: changed}
	}
	for _, tc := range []struct {
		name                   string
		d                      objDiff
		own1, own2, par1, par2 []span
		want                   []span
		needs                  deltaInputs
	}{{
		name:  "new since s1: its extents at s2, not the whole object",
		d:     objDiff{exists2: true, size2: 4 * mb},
		own2:  []span{{4*mb - 4096, 4096}},
		want:  []span{{4*mb - 4096, 4096}},
		needs: deltaInputs{own2: true, parent1: true},
	}, {
		name:  "new since s1 in a clone: plus what the parent had at s1",
		d:     objDiff{exists2: true, size2: 4 * mb},
		own2:  []span{{0, 4 * mb}},
		par1:  []span{{mb, 4096}},
		want:  []span{{0, 4 * mb}},
		needs: deltaInputs{own2: true, parent1: true},
	}, {
		name:  "new since s1 in a clone, sparse copy-up",
		d:     objDiff{exists2: true, size2: 8192},
		own2:  []span{{0, 8192}},
		par1:  []span{{mb, 4096}},
		want:  []span{{0, 8192}, {mb, 4096}},
		needs: deltaInputs{own2: true, parent1: true},
	}, {
		name: "discard inside an object at both: the overlap diff sees the hole",
		d:    both(4*mb, 4*mb, span{mb, 64 << 10}),
		// The allocated extents at s2 do not show the punched hole.
		own2:  []span{{0, mb}, {mb + 64<<10, 3*mb - 64<<10}},
		want:  []span{{mb, 64 << 10}},
		needs: deltaInputs{},
	}, {
		name:  "grown: only the extents written beyond the old size",
		d:     both(mb, 4*mb, span{mb, 3 * mb}),
		own2:  []span{{0, mb}, {3 * mb, 4096}},
		want:  []span{{3 * mb, 4096}},
		needs: deltaInputs{own2: true},
	}, {
		name:  "shrunk: the data cut off at s1 (the shrink branch)",
		d:     both(4*mb, mb, span{mb, 3 * mb}),
		own1:  []span{{0, mb + 64<<10}, {2 * mb, 4096}},
		want:  []span{{mb, 64 << 10}, {2 * mb, 4096}},
		needs: deltaInputs{own1: true},
	}, {
		name:  "shrunk and rewritten",
		d:     both(4*mb, mb, span{0, 4096}, span{mb, 3 * mb}),
		own1:  []span{{0, 4 * mb}},
		want:  []span{{0, 4096}, {mb, 3 * mb}},
		needs: deltaInputs{own1: true},
	}, {
		name:  "gone since s1: its extents at s1",
		d:     objDiff{exists1: true, size1: 4 * mb, changed: []span{{0, 4 * mb}}},
		own1:  []span{{4096, 4096}},
		want:  []span{{4096, 4096}},
		needs: deltaInputs{own1: true, parent2: true},
	}, {
		name:  "gone since s1 in a clone: plus the parent's at s2",
		d:     objDiff{exists1: true, size1: 4 * mb},
		own1:  []span{{4096, 4096}},
		par2:  []span{{0, 8192}},
		want:  []span{{0, 8192}},
		needs: deltaInputs{own1: true, parent2: true},
	}, {
		name:  "absent at both, parent overlap changed",
		d:     objDiff{},
		par1:  []span{{0, mb}},
		par2:  []span{{0, 4096}},
		want:  []span{{0, mb}},
		needs: deltaInputs{parent1: true, parent2: true},
	}, {
		name:  "written zeros are extents: a safe over-report",
		d:     objDiff{exists2: true, size2: 8192},
		own2:  []span{{0, 8192}},
		want:  []span{{0, 8192}},
		needs: deltaInputs{own2: true, parent1: true},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.d.needs(); got != tc.needs {
				t.Errorf("needs() = %+v, want %+v", got, tc.needs)
			}
			got := deltaSpans(tc.d, tc.own1, tc.own2, tc.par1, tc.par2)
			if d := cmp.Diff(tc.want, got, cmp.AllowUnexported(span{})); d != "" {
				t.Errorf("deltaSpans (-want +got):\n%s", d)
			}
		})
	}
}

func TestParse(t *testing.T) {
	ss, err := parseSnapSet([]uint64{20, 2, 10, 4096, 2, 5, 10, 1, 0, 1024, snapHead, 8192, 0, 0})
	if err != nil {
		t.Fatal(err)
	}
	want := snapSet{seq: 20, clones: []cloneInfo{clone(10, 4096, []uint64{5, 10}, 0, 1024), {id: snapHead, size: 8192, snaps: []uint64{}}}}
	if d := cmp.Diff(want, ss, cmp.AllowUnexported(snapSet{}, cloneInfo{}, span{})); d != "" {
		t.Errorf("parseSnapSet (-want +got):\n%s", d)
	}
	for _, bad := range [][]uint64{{}, {1}, {1, 1}, {1, 1, 2, 3, 5}, {1, 0, 7}} {
		if _, err := parseSnapSet(bad); err == nil {
			t.Errorf("parseSnapSet(%v): want an error", bad)
		}
	}
	if _, err := parseSpans([]uint64{1, 2, 3}); err == nil {
		t.Error("parseSpans of an odd count: want an error")
	}
}

func TestSpanOps(t *testing.T) {
	got := normalize([]span{{10, 5}, {0, 3}, {3, 2}, {12, 10}, {30, 0}})
	if d := cmp.Diff([]span{{0, 5}, {10, 12}}, got, cmp.AllowUnexported(span{})); d != "" {
		t.Errorf("normalize (-want +got):\n%s", d)
	}
	got = subtract([]span{{0, 100}}, []span{{0, 10}, {20, 10}, {90, 20}})
	if d := cmp.Diff([]span{{10, 10}, {30, 60}}, got, cmp.AllowUnexported(span{})); d != "" {
		t.Errorf("subtract (-want +got):\n%s", d)
	}
}

// TestDataObject: object names as librbd forms them, in both formats.
func TestDataObject(t *testing.T) {
	for _, c := range []struct {
		prefix string
		old    bool
		objno  int64
		want   string
	}{
		{"rbd_data.10226b8b4567", false, 0, "rbd_data.10226b8b4567.0000000000000000"},
		{"rbd_data.10226b8b4567", false, 0x1a2b, "rbd_data.10226b8b4567.0000000000001a2b"},
		{"rb.0.1014.6b8b4567", true, 0, "rb.0.1014.6b8b4567.000000000000"},
		{"rb.0.1014.6b8b4567", true, 0x1a2b, "rb.0.1014.6b8b4567.000000001a2b"},
	} {
		if got := dataObject(c.prefix, c.old, c.objno); got != c.want {
			t.Errorf("dataObject(%q, %v, %#x) = %q, want %q", c.prefix, c.old, c.objno, got, c.want)
		}
	}
}

// TestForcedRanges: ranges are rounded out to whole objects, clipped to
// the iteration, merged and sorted.
func TestForcedRanges(t *testing.T) {
	got := forcedRanges(100, 50, 1000, []span{
		{850, 10},  // inside one object
		{0, 0},     // empty: ignored
		{120, 100}, // across objects 1 and 2
		{10, 20},   // object 0, clipped at 50
		{300, 100}, // object 3, adjacent to 1-2: merged
		{990, 500}, // beyond the end: clipped
	})
	want := []span{{50, 350}, {800, 200}}
	if !slices.Equal(got, want) {
		t.Errorf("forcedRanges = %v, want %v", got, want)
	}
}

// TestReasonOf: fallbacks are counted under their reason, whatever wraps
// them.
func TestReasonOf(t *testing.T) {
	for _, c := range []struct {
		err  error
		want string
	}{
		{reasoned{ReasonListSnaps, errors.New("x")}, ReasonListSnaps},
		{fmt.Errorf("refine: %w", reasoned{ReasonMapext, errors.New("x")}), ReasonMapext},
		{unrefinable{ReasonStriping, "x"}, ReasonStriping},
		{errors.New("x"), ReasonError},
	} {
		if got := reasonOf(c.err); got != c.want {
			t.Errorf("reasonOf(%v) = %q, want %q", c.err, got, c.want)
		}
	}
}

// TestParseSnapSetBatch: per object, its snap set or its error, in order.
func TestParseSnapSetBatch(t *testing.T) {
	enoent := uint64(1<<64 - 2) // -2 as an int64
	w := []uint64{
		0, 6, 7, 1, snapHead, 4096, 0, 0, // a head only
		enoent, 0, // no such object
		0, 3, 1, 1, 2, // a malformed snap set: that object alone fails
	}
	sss, errs, err := parseSnapSetBatch(w, 3)
	if err != nil {
		t.Fatal(err)
	}
	want := snapSet{seq: 7, clones: []cloneInfo{{id: snapHead, size: 4096, snaps: []uint64{}}}}
	if d := cmp.Diff(want, sss[0], cmp.AllowUnexported(snapSet{}, cloneInfo{}, span{})); d != "" || errs[0] != nil {
		t.Errorf("object 0 (-want +got):\n%s%v", d, errs[0])
	}
	if !isNoEnt(errs[1]) {
		t.Errorf("object 1: %v, want ENOENT", errs[1])
	}
	if errs[2] == nil {
		t.Error("object 2: want an error")
	}
	for _, bad := range [][]uint64{{}, {0, 3, 1}, append(slices.Clone(w), 9)} {
		if _, _, err := parseSnapSetBatch(bad, 3); err == nil {
			t.Errorf("parseSnapSetBatch(%v): want an error", bad)
		}
	}
}
