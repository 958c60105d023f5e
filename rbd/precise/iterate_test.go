package precise

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
)

// fakeScanner answers ScanObjects from a table: per query (by At and From),
// the objects it names, and records every query.
type fakeScanner struct {
	answers map[[2]uint64][]object
	err     error // returned after the answers, when set
	asked   []Objects
}

// object is one answer of a fakeScanner: a range of whole objects.
type object struct {
	off, len int64
	exists   bool
}

func (f *fakeScanner) ScanObjects(ctx context.Context, q Objects, emit func(off, length int64, exists bool) error) error {
	f.asked = append(f.asked, q)
	for _, o := range f.answers[[2]uint64{q.At, q.From}] {
		// librbd reports within the range asked for.
		off, end := max(o.off, q.Off), min(o.off+o.len, q.Off+q.Len)
		if off >= end {
			continue
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := emit(off, end-off, o.exists); err != nil {
			return err
		}
	}
	return f.err
}

// watched returns a Refiner of objects of 100 bytes at snapshot 20 (and
// base 10 when delta) whose refinement records each candidate and answers
// its first 10 bytes.
func watched(delta bool) (*Refiner, func() []string) {
	var (
		mu    sync.Mutex
		cands []candidate
	)
	r := &Refiner{s2: 20, top: &layer{objSize: 100}}
	if delta {
		r.s1, r.base = 10, &layer{objSize: 100}
	}
	r.refineHook = func(_ context.Context, c candidate) ([]span, error) {
		mu.Lock()
		cands = append(cands, c)
		mu.Unlock()
		return []span{{c.off, 10}}, nil
	}
	return r, func() []string {
		mu.Lock()
		defer mu.Unlock()
		slices.SortFunc(cands, func(a, b candidate) int { return int(a.off - b.off) })
		var out []string
		for _, c := range cands {
			out = append(out, fmt.Sprintf("%d+%d fresh=%v objs=%v", c.off, c.len, c.fresh, c.objs))
		}
		return out
	}
}

// collect runs r.Iterate over [off, off+length) and returns what reached
// emit.
func collect(t *testing.T, r *Refiner, d ObjectScanner, off, length int64) []span {
	t.Helper()
	var got []span
	if err := r.Iterate(context.Background(), d, off, length, func(off, length int64) error {
		got = append(got, span{off, length})
		return nil
	}); err != nil {
		t.Fatalf("Iterate: %v", err)
	}
	return got
}

func check(t *testing.T, what string, got, want any) {
	t.Helper()
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("%s:\ngot  %v\nwant %v", what, got, want)
	}
}

// TestIterateAllocatedAsks: allocated extents ask librbd once for the
// objects that hold data at the target, from the beginning, parent
// included; objects librbd says do not exist are not refined.
func TestIterateAllocatedAsks(t *testing.T) {
	r, cands := watched(false)
	d := &fakeScanner{answers: map[[2]uint64][]object{
		{20, 0}: {{100, 200, true}, {300, 100, false}, {500, 100, true}},
	}}
	got := collect(t, r, d, 150, 400)
	check(t, "asked", d.asked, []Objects{{At: 20, Parent: true, Off: 150, Len: 400}})
	check(t, "candidates", cands(), []string{"150+50 fresh=false objs=[]", "200+100 fresh=false objs=[]", "500+50 fresh=false objs=[]"})
	check(t, "emitted", got, []span{{150, 10}, {200, 10}, {500, 10}})
}

// TestIterateDeltaByObjectMapAsks: with TrustObjectMap a delta asks librbd
// once, from the base by snapshot ID with the parent; objects gone at the
// target are refined (a discard), and the range a shrink cut off is
// refined whether librbd names it or not.
func TestIterateDeltaByObjectMapAsks(t *testing.T) {
	r, cands := watched(true)
	r.shrunk = span{700, 150}
	d := &fakeScanner{answers: map[[2]uint64][]object{
		{20, 10}: {{100, 100, true}, {300, 100, false}},
	}}
	got := collect(t, r, d, 0, 1000)
	check(t, "asked", d.asked, []Objects{{At: 20, From: 10, Parent: true, Off: 0, Len: 1000}})
	check(t, "candidates", cands(), []string{"100+100 fresh=false objs=[]", "300+100 fresh=false objs=[]", "700+100 fresh=false objs=[]", "800+100 fresh=false objs=[]"})
	check(t, "emitted", got, []span{{100, 10}, {300, 10}, {700, 10}, {800, 10}})
}

// TestIterateDeltaByExistenceAsks: by default (existence) a delta asks
// librbd twice, both from the beginning without the parent: first the
// objects the image holds at the base, then at the target. Objects at the
// base are refined whatever the target says; one at the target only is
// fresh; one gone at the target is refined only if it was at the base.
func TestIterateDeltaByExistenceAsks(t *testing.T) {
	r, cands := watched(true)
	r.existence = true
	d := &fakeScanner{answers: map[[2]uint64][]object{
		{10, 0}: {{0, 100, true}, {200, 200, true}},
		{20, 0}: {{100, 100, true}, {300, 100, true}, {500, 100, false}, {600, 100, true}},
	}}
	got := collect(t, r, d, 0, 1000)
	check(t, "asked", d.asked, []Objects{{At: 10, Off: 0, Len: 1000}, {At: 20, Off: 0, Len: 1000}})
	check(t, "candidates", cands(), []string{
		"0+100 fresh=false objs=[]", "100+100 fresh=true objs=[]", "200+100 fresh=false objs=[]",
		"300+100 fresh=false objs=[]", "600+100 fresh=true objs=[]",
	})
	check(t, "emitted", got, []span{{0, 10}, {100, 10}, {200, 10}, {300, 10}, {600, 10}})
}

// TestIterateWalkAsksNothing: without a usable object map precise mode
// asks librbd for nothing: probing, every object of the range is a
// candidate, batched for a delta.
func TestIterateWalkAsksNothing(t *testing.T) {
	for _, delta := range []bool{false, true} {
		r, cands := watched(delta)
		r.unmapped, r.walkMode = true, WalkProbe
		d := &fakeScanner{}
		got := collect(t, r, d, 50, 300)
		check(t, fmt.Sprintf("delta %v: asked", delta), len(d.asked), 0)
		want := []string{"50+50 fresh=false objs=[0]", "100+100 fresh=false objs=[1]", "200+100 fresh=false objs=[2]", "300+50 fresh=false objs=[3]"}
		if delta {
			want = []string{"50+300 fresh=false objs=[0 1 2 3]"}
		}
		check(t, fmt.Sprintf("delta %v: candidates", delta), cands(), want)
		if len(got) == 0 {
			t.Errorf("delta %v: nothing emitted", delta)
		}
		if st := r.Refinement(); st.Candidates != "walk" {
			t.Errorf("delta %v: Refinement().Candidates %q, want walk", delta, st.Candidates)
		}
	}
}

// TestIterateErrors: an error of the ObjectScanner, and one of emit, come back
// from Iterate unchanged, and no refinement outlives it (TestMain).
func TestIterateErrors(t *testing.T) {
	r, _ := watched(false)
	boom := errors.New("librbd said no")
	d := &fakeScanner{answers: map[[2]uint64][]object{{20, 0}: {{0, 300, true}}}, err: boom}
	err := r.Iterate(context.Background(), d, 0, 1000, func(int64, int64) error { return nil })
	if err != boom {
		t.Errorf("ObjectScanner failing: %v, want %v", err, boom)
	}

	full := errors.New("the caller is full")
	n := 0
	err = r.Iterate(context.Background(), &fakeScanner{answers: map[[2]uint64][]object{{20, 0}: {{0, 1000, true}}}}, 0, 1000,
		func(int64, int64) error {
			if n++; n == 2 {
				return full
			}
			return nil
		})
	if err != full || n != 2 {
		t.Errorf("emit failing at the second extent: %v after %d extents, want %v after 2", err, n, full)
	}

	r, _ = watched(true)
	r.existence = true
	d = &fakeScanner{err: boom}
	if err := r.Iterate(context.Background(), d, 0, 1000, func(int64, int64) error { return nil }); err != boom || len(d.asked) != 1 {
		t.Errorf("listing the base failing: %v after %d queries, want %v after 1", err, len(d.asked), boom)
	}
}

// TestIteratePanicEndsJobs: emit panicking (a bug of the caller) either
// fails Iterate (emit called from the diff's callback, where the pipeline
// turns the panic into an error) or unwinds through it (emit called once
// the diff returned); either way, no refinement outlives Iterate: the image
// handles they read are closed right after (Refiner.Close).
func TestIteratePanicEndsJobs(t *testing.T) {
	for range 50 {
		r, _ := watched(false)
		var live sync.Map
		r.refineHook = func(ctx context.Context, c candidate) ([]span, error) {
			live.Store(c.off, true)
			defer live.Delete(c.off)
			if c.off > 0 {
				<-ctx.Done() // still refining when the panic comes
				return nil, ctx.Err()
			}
			return []span{{c.off, 10}}, nil
		}
		d := &fakeScanner{answers: map[[2]uint64][]object{{20, 0}: {{0, 1000, true}}}}
		func() {
			defer func() {
				if v := recover(); v != nil && v != "emit bug" {
					t.Errorf("recovered %v, want the panic of emit", v)
				}
			}()
			err := r.Iterate(context.Background(), d, 0, 1000, func(int64, int64) error { panic("emit bug") })
			if err == nil || !strings.Contains(err.Error(), "emit bug") {
				t.Errorf("Iterate returned %v, want the panic of emit", err)
			}
		}()
		live.Range(func(k, _ any) bool {
			t.Fatalf("the refinement of %v still runs after Iterate ended", k)
			return true
		})
	}
}
