package rbd

import (
	"errors"
	"fmt"
	"slices"
	"testing"
)

const testUnit = 4 << 20

// failedDiff plays librbd's diff-iterate of objects, each holding the
// extents of extentsOf, as it behaves when requests fail: requests go out
// in object order with at most ops in flight, complete in order, and a
// failed one delivers nothing; after the first failure, the requests in
// flight and the one sent next still deliver (those in failed do not),
// then the error is returned. It returns what passed the holdback.
func failedDiff(t *testing.T, objects, ops, firstFail int, failed map[int]bool, extentsOf func(o int) []heldExtent) (passed []heldExtent, err error) {
	t.Helper()
	s := newSettle(testUnit, int64(ops)+1, func(off, length int64, exists bool) error {
		passed = append(passed, heldExtent{off, length, exists})
		return nil
	})
	errTimedOut := errors.New("ETIMEDOUT")
	last := min(objects-1, firstFail+ops) // the last request completed
	for o := 0; o <= last; o++ {
		if o == firstFail || (o > firstFail && failed[o]) {
			continue
		}
		for _, e := range extentsOf(o) {
			if err := s.add(e.off, e.length, e.exists); err != nil {
				t.Fatal(err)
			}
		}
	}
	if firstFail >= objects {
		return passed, s.flush()
	}
	return passed, errTimedOut
}

// every4K: 64 writes of 4 KiB in each object, one every 64 KiB.
func every4K(o int) []heldExtent {
	var es []heldExtent
	for k := int64(0); k < 64; k++ {
		es = append(es, heldExtent{int64(o)*testUnit + k<<16, 4096, true})
	}
	return es
}

// TestSettlePrefix: whatever requests fail, what passed the holdback is
// every extent of the objects before some point, and nothing after it: a
// stream resumed at its end misses nothing. Without the holdback (window
// 0), the same failures leave a hole, as in issue 27.
func TestSettlePrefix(t *testing.T) {
	for _, ops := range []int{1, 2, 10, 16} {
		for _, firstFail := range []int{0, 1, 5, 30, 63} {
			for _, pattern := range []string{"all in flight", "first only", "every other"} {
				failed := map[int]bool{}
				for o := firstFail + 1; o < firstFail+ops; o++ {
					switch pattern {
					case "all in flight":
						failed[o] = true
					case "every other":
						failed[o] = (o-firstFail)%2 == 0
					}
				}
				name := fmt.Sprintf("ops=%d/fail=%d/%s", ops, firstFail, pattern)
				passed, err := failedDiff(t, 64, ops, firstFail, failed, every4K)
				if err == nil {
					t.Fatalf("%s: no error", name)
				}
				var want []heldExtent
				for o := 0; len(want) < len(passed); o++ {
					want = append(want, every4K(o)...)
				}
				if !slices.Equal(passed, want) {
					t.Errorf("%s: %d extents passed, not a prefix of the answer", name, len(passed))
				}
				if end := passed; len(end) > 0 && end[len(end)-1].off >= int64(firstFail)*testUnit {
					t.Errorf("%s: passed an extent at %d, in or after the failed object %d", name, end[len(end)-1].off, firstFail)
				}
			}
		}
	}
}

// TestSettleHolePlayed checks the player: without the holdback, the
// extents delivered after a failure leave a hole before the last one.
func TestSettleHolePlayed(t *testing.T) {
	var got []heldExtent
	s := newSettle(testUnit, 0, func(off, length int64, exists bool) error {
		got = append(got, heldExtent{off, length, exists})
		return nil
	})
	failed := map[int]bool{}
	for o := 21; o < 30; o++ {
		failed[o] = true
	}
	for o := 0; o <= 30; o++ {
		if o == 20 || failed[o] {
			continue
		}
		for _, e := range every4K(o) {
			if err := s.add(e.off, e.length, e.exists); err != nil {
				t.Fatal(err)
			}
		}
	}
	if n, want := len(got), 21*64; n != want {
		t.Fatalf("%d extents, want %d", n, want)
	}
	if last := got[len(got)-1].off / testUnit; last != 30 {
		t.Fatalf("last extent in object %d, want 30: the hole is 20..29", last)
	}
}

// TestSettleComplete: a diff that succeeds passes every extent, in order,
// sparse ones and exists=false ones included.
func TestSettleComplete(t *testing.T) {
	var want, got []heldExtent
	s := newSettle(testUnit, 11, func(off, length int64, exists bool) error {
		got = append(got, heldExtent{off, length, exists})
		return nil
	})
	for _, o := range []int64{0, 1, 2, 40, 41, 100, 1000, 1001} {
		e := heldExtent{o*testUnit + 512, testUnit - 512, o%2 == 0}
		want = append(want, e)
		if err := s.add(e.off, e.length, e.exists); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.flush(); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
}

// TestSettleHolds: an extent passes only once an extent 11 units further
// came; the held ones stay bounded by the window.
func TestSettleHolds(t *testing.T) {
	var got []int64
	s := newSettle(testUnit, 11, func(off, _ int64, _ bool) error {
		got = append(got, off/testUnit)
		return nil
	})
	for o := int64(0); o < 100; o++ {
		if err := s.add(o*testUnit, 1, true); err != nil {
			t.Fatal(err)
		}
		if want := max(o-11, 0); int64(len(got)) != want {
			t.Fatalf("after object %d: %d passed, want %d", o, len(got), want)
		}
		if len(s.held) > 12 {
			t.Fatalf("after object %d: %d held", o, len(s.held))
		}
	}
}

// TestSettleError: emit's error stops the release and comes back from add
// or flush.
func TestSettleError(t *testing.T) {
	boom := errors.New("boom")
	n := 0
	s := newSettle(testUnit, 1, func(int64, int64, bool) error {
		if n++; n == 2 {
			return boom
		}
		return nil
	})
	for o := int64(0); o < 3; o++ {
		if err := s.add(o*testUnit, 1, true); err != nil {
			t.Fatalf("add %d: %v", o, err)
		}
	}
	if err := s.add(3*testUnit, 1, true); !errors.Is(err, boom) {
		t.Fatalf("add: %v, want boom", err)
	}
}

// TestSetting: the levels of rbd_concurrent_management_ops.
func TestSetting(t *testing.T) {
	for _, c := range []struct {
		v    string
		err  error
		want int64
	}{
		{"10", nil, 10},
		{"64", nil, 64},
		{"x", nil, unknownConcurrentOps},
		{"-1", nil, unknownConcurrentOps},
		{"", errors.New("no idea"), unknownConcurrentOps},
		{"99999", nil, unknownConcurrentOps},
	} {
		if got := setting(c.v, c.err); got != c.want {
			t.Errorf("setting(%q, %v) = %d, want %d", c.v, c.err, got, c.want)
		}
	}
}

// BenchmarkSettle is the holdback's cost per extent: 256 extents an
// object, held 11 objects back, against passing them straight on.
func BenchmarkSettle(b *testing.B) {
	for _, window := range []int64{0, 11} {
		b.Run(fmt.Sprintf("window=%d", window), func(b *testing.B) {
			var n int64
			s := newSettle(testUnit, window, func(int64, int64, bool) error { n++; return nil })
			for i := range int64(b.N) {
				if err := s.add(i*16384, 512, true); err != nil {
					b.Fatal(err)
				}
			}
			if err := s.flush(); err != nil || n != int64(b.N) {
				b.Fatalf("%d of %d passed: %v", n, b.N, err)
			}
		})
	}
}
