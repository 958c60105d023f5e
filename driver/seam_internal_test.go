package driver

import (
	"context"
	"testing"
)

// TestSeamCovered: only bytes of the resumed diff that the stream did not
// receive fail the check; receiving more is no hole.
func TestSeamCovered(t *testing.T) {
	recv := []Extent{{100, 100}, {150, 100}, {300, 50}, {400, 4096}}
	for _, c := range []struct {
		name string
		got  []Extent
		ok   bool
	}{
		{"same", recv, true},
		{"less", []Extent{{100, 50}, {420, 10}}, true},
		{"merged", []Extent{{100, 150}, {300, 50}}, true},
		{"overlapping", []Extent{{100, 150}, {120, 20}, {200, 50}, {400, 100}}, true},
		{"a byte before", []Extent{{99, 10}}, false},
		{"in the gap", []Extent{{100, 150}, {260, 10}}, false},
		{"across the gap", []Extent{{240, 70}}, false},
		{"past the last", []Extent{{4490, 10}}, false},
		{"a missing object", []Extent{{100, 150}, {300, 50}, {360, 10}, {400, 4096}}, false},
	} {
		s := seam{recent: recv}
		if from := s.begin(checkerAt(0), 0, 8192, 8192); from != 0 {
			t.Fatalf("begin: from %d, want 0", from)
		}
		if ok := checks(&s, c.got); ok != c.ok {
			t.Errorf("%s: covered %v, want %v", c.name, ok, c.ok)
		}
	}
}

// checks runs the extents of a resumed diff through a seam's check, and
// reports whether it passed.
func checks(s *seam, got []Extent) bool {
	for _, e := range got {
		if _, err := s.check(e); err != nil {
			return false
		}
	}
	return true
}

// checkerAt is a Diff whose seam check starts at a fixed offset.
type checkerAt int64

func (c checkerAt) CheckFrom(int64) int64 { return int64(c) }
func (checkerAt) Capacity() int64         { return 1 << 20 }
func (checkerAt) Close() error            { return nil }
func (checkerAt) Iterate(ctx context.Context, _ int64, _ func(Extent) error) error {
	return nil
}

// TestSeamBound: a check range of more extents than the bound keeps at
// most the bound (plus one trim's worth), and is then not checked rather
// than checked against a part.
func TestSeamBound(t *testing.T) {
	var s seam
	for i := int64(0); i < 3*maxSeamExtents; i++ {
		s.record(checkerAt(0), Extent{Offset: i * 10, Length: 5})
		if len(s.recent) > maxSeamExtents+trimEvery {
			t.Fatalf("after %d extents, %d kept", i+1, len(s.recent))
		}
	}
	if s.dropped == 0 {
		t.Fatal("nothing dropped")
	}
	end := int64(3*maxSeamExtents) * 10
	if from := s.begin(checkerAt(0), 0, end, end-5); from != end-5 || s.checking {
		t.Fatalf("begin: from %d, checking %v; want no check", from, s.checking)
	}
	// A check range inside what is kept is checked.
	if from := s.begin(checkerAt(end-100), 0, end, end-5); from != end-100 || !s.checking {
		t.Fatalf("begin: from %d, checking %v; want a check from %d", from, s.checking, end-100)
	}
}

// BenchmarkSeamRecord is the seam check's cost per extent on a stream
// that never resumes: 256 extents an object, a check range of 22 objects.
func BenchmarkSeamRecord(b *testing.B) {
	var s seam
	c := objectChecker{obj: 4 << 20, back: 22}
	for i := range int64(b.N) {
		s.record(c, Extent{Offset: i * 16384, Length: 512})
	}
}

// objectChecker checks back objects of obj bytes.
type objectChecker struct{ obj, back int64 }

func (c objectChecker) CheckFrom(off int64) int64 { return max(off-off%c.obj-c.back*c.obj, 0) }
func (objectChecker) Capacity() int64             { return 1 << 62 }
func (objectChecker) Close() error                { return nil }
func (objectChecker) Iterate(context.Context, int64, func(Extent) error) error {
	return nil
}

// unitChecker is a Diff of units of 1000 bytes whose seam check starts
// at 0.
type unitChecker struct{ checkerAt }

func (unitChecker) ResumeFrom(off int64) int64 { return off - off%1000 }

// TestSeamUnits: with a Resumer, a byte the stream lacks in a unit of
// which it received something is a difference of precision (a fallback
// in the re-read), not a hole; a unit it received nothing of is a hole.
func TestSeamUnits(t *testing.T) {
	recv := []Extent{{100, 50}, {2100, 50}, {4000, 1000}}
	for _, c := range []struct {
		name string
		got  []Extent
		ok   bool
	}{
		{"same", recv, true},
		{"a fallback to whole units", []Extent{{0, 1000}, {2000, 1000}, {4000, 1000}}, true},
		{"a fallback across two received units", []Extent{{0, 1000}, {1000, 0}, {2000, 1000}}, true},
		{"a unit never received", []Extent{{100, 50}, {1100, 10}, {2100, 50}}, false},
		{"the whole of a missing unit", []Extent{{100, 50}, {3000, 1000}, {4000, 1000}}, false},
		{"a fallback then a missing unit", []Extent{{0, 1000}, {2000, 2000}}, false},
	} {
		s := seam{recent: recv}
		if from := s.begin(unitChecker{}, 0, 8192, 8192); from != 0 {
			t.Fatalf("begin: from %d, want 0", from)
		}
		if ok := checks(&s, c.got); ok != c.ok {
			t.Errorf("%s: covered %v, want %v", c.name, ok, c.ok)
		}
	}
}
