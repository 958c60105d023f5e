package precise

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestKeepChunks: the parts of the spans in kept chunks, cut at chunk
// boundaries, merged again where neighbours are both kept.
func TestKeepChunks(t *testing.T) {
	const c = dataChunk
	for _, tc := range []struct {
		name string
		in   []span
		keep []int // chunk indexes kept, from the envelope's start
		want []span
	}{{
		name: "all kept, unaligned ends survive",
		in:   []span{{c + 100, 2*c + 1}},
		keep: []int{0, 1, 2},
		want: []span{{c + 100, 2*c + 1}},
	}, {
		name: "a middle chunk dropped",
		in:   []span{{0, 3 * c}},
		keep: []int{0, 2},
		want: []span{{0, c}, {2 * c, c}},
	}, {
		name: "nothing kept",
		in:   []span{{0, 4 * c}},
		want: nil,
	}, {
		name: "two spans in one chunk, and one far away",
		in:   []span{{10, 10}, {100, 10}, {5*c + 1, 1}},
		keep: []int{5},
		want: []span{{5*c + 1, 1}},
	}, {
		name: "a span across a dropped chunk keeps its unaligned edges",
		in:   []span{{c - 10, c + 20}},
		keep: []int{0, 2},
		want: []span{{c - 10, 10}, {2 * c, 10}},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			lo, _ := chunkEnvelope(tc.in)
			kept := map[int]bool{}
			for _, i := range tc.keep {
				kept[i] = true
			}
			got := keepChunks(tc.in, lo, func(i int) bool { return kept[i] })
			if diff := cmp.Diff(tc.want, got, cmp.AllowUnexported(span{})); diff != "" {
				t.Errorf("keepChunks(%v, keep %v) (-want +got):\n%s", tc.in, tc.keep, diff)
			}
		})
	}
}

// TestChunkEnvelope: the envelope is chunk aligned and holds every span.
func TestChunkEnvelope(t *testing.T) {
	const c = dataChunk
	for _, tc := range []struct {
		in     []span
		lo, hi int64
	}{
		{[]span{{0, 1}}, 0, c},
		{[]span{{c, c}}, c, 2 * c},
		{[]span{{c - 1, 2}}, 0, 2 * c},
		{[]span{{3*c + 5, 1}, {9 * c, c + 1}}, 3 * c, 11 * c},
	} {
		if lo, hi := chunkEnvelope(tc.in); lo != tc.lo || hi != tc.hi {
			t.Errorf("chunkEnvelope(%v) = [%d, %d), want [%d, %d)", tc.in, lo, hi, tc.lo, tc.hi)
		}
	}
}

// TestWithoutHoles: a change counts only where either snapshot has data,
// and everything from lo on is left alone.
func TestWithoutHoles(t *testing.T) {
	for _, tc := range []struct {
		name                string
		changed, own1, own2 []span
		lo                  int64
		want                []span
	}{{
		name:    "a discard of never-written bytes",
		changed: []span{{0, 256 << 10}},
		lo:      4 << 20,
		want:    nil,
	}, {
		name:    "a discard of data written before s1",
		changed: []span{{0, 256 << 10}},
		own1:    []span{{4096, 8192}},
		lo:      4 << 20,
		want:    []span{{4096, 8192}},
	}, {
		name:    "a write after s1 counts from s2's data",
		changed: []span{{0, 1 << 20}},
		own2:    []span{{100, 50}, {1 << 19, 4096}},
		lo:      4 << 20,
		want:    []span{{100, 50}, {1 << 19, 4096}},
	}, {
		name:    "growth past lo is kept whole",
		changed: []span{{0, 8192}, {1 << 20, 1 << 20}},
		own2:    []span{{0, 4096}},
		lo:      1 << 20,
		want:    []span{{0, 4096}, {1 << 20, 1 << 20}},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			got := withoutHoles(tc.changed, tc.own1, tc.own2, tc.lo)
			if diff := cmp.Diff(tc.want, got, cmp.AllowUnexported(span{})); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}
