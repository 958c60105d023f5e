package precise

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// fakeRefine refines candidate c to its first quarter after a random
// delay, and fails for the objects in fail.
func fakeRefine(fail map[int64]bool, inFlight, peak *atomic.Int64) func(context.Context, candidate) ([]span, error) {
	return func(ctx context.Context, c candidate) ([]span, error) {
		n := inFlight.Add(1)
		defer inFlight.Add(-1)
		for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
		}
		time.Sleep(time.Duration(rand.IntN(300)) * time.Microsecond)
		if fail[c.off/100] {
			return nil, errors.New("boom")
		}
		return []span{{c.off, max(c.len/4, 1)}}, nil
	}
}

// runPipeline feeds extents as librbd would and collects what reaches emit.
func runPipeline(ctx context.Context, p *pipeline, extents []span, emitErrAt int) ([]span, error) {
	var got []span
	p.emit = func(off, length int64) error {
		if len(got) == emitErrAt {
			return errors.New("emit failed")
		}
		got = append(got, span{off, length})
		return nil
	}
	var err error
	for _, e := range extents {
		if p.feed(e.off, e.len, true) != nil {
			err = errors.New("stopped")
			break
		}
	}
	return got, p.finish(err)
}

// TestPipelineOrder: refined extents arrive in image order, whatever the
// order the jobs finish in; the window bounds the jobs in flight; a failed
// job falls back to its whole candidate; forced candidates are merged in.
func TestPipelineOrder(t *testing.T) {
	var inFlight, peak, fellBack atomic.Int64
	fail := map[int64]bool{7: true}
	p := newPipeline(context.Background(), 100, 4, false, fakeRefine(fail, &inFlight, &peak), nil,
		func(error) { fellBack.Add(1) })
	p.forced = []span{{200, 100}, {1500, 100}, {5000, 100}}
	var in []span
	for i := int64(0); i < 40; i++ {
		if i%3 != 0 {
			in = append(in, span{i * 100, 100})
		}
	}
	in = append(in, span{4000, 250}) // across objects: split
	got, err := runPipeline(context.Background(), p, in, -1)
	if err != nil {
		t.Fatal(err)
	}
	var want []span
	for i := int64(0); i < 40; i++ {
		switch {
		case i == 7:
			want = append(want, span{700, 100})
		case i%3 != 0 || i == 15:
			want = append(want, span{i * 100, 25})
		}
	}
	want = append(want, span{4000, 25}, span{4100, 25}, span{4200, 12}, span{5000, 25})
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("got  %v\nwant %v", got, want)
	}
	if peak.Load() > 4 {
		t.Errorf("%d jobs in flight, window is 4", peak.Load())
	}
	if fellBack.Load() != 1 {
		t.Errorf("%d fallbacks, want 1", fellBack.Load())
	}
}

// TestPipelineStops: an emit failure or a cancelled context stops feeding,
// and finish waits for every job (TestMain checks for leaks).
func TestPipelineStops(t *testing.T) {
	var inFlight, peak atomic.Int64
	in := make([]span, 100)
	for i := range in {
		in[i] = span{int64(i) * 100, 100}
	}

	p := newPipeline(context.Background(), 100, 8, false, fakeRefine(nil, &inFlight, &peak), nil, func(error) {})
	got, err := runPipeline(context.Background(), p, in, 5)
	if err == nil || len(got) != 5 {
		t.Errorf("emit failing at 5: got %d extents, %v", len(got), err)
	}
	if n := inFlight.Load(); n != 0 {
		t.Errorf("%d jobs still running after finish", n)
	}

	ctx, cancel := context.WithCancel(context.Background())
	p = newPipeline(ctx, 100, 8, false, fakeRefine(nil, &inFlight, &peak), nil, func(error) {})
	var emitted int
	p.emit = func(off, length int64) error {
		if emitted++; emitted == 3 {
			cancel()
		}
		return nil
	}
	var stop error
	for _, e := range in {
		if p.feed(e.off, e.len, true) != nil {
			stop = errors.New("stopped")
			break
		}
	}
	if err := p.finish(stop); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled: finish returned %v, want context.Canceled", err)
	}
	if n := inFlight.Load(); n != 0 {
		t.Errorf("%d jobs still running after finish", n)
	}
	if p.feed(0, 100, true) == nil {
		t.Error("feed after a stop: want an error")
	}
}

// TestPipelineSkipsGone: allocated candidates librbd marks as not existing
// hold no data and are not refined.
func TestPipelineSkipsGone(t *testing.T) {
	var inFlight, peak atomic.Int64
	p := newPipeline(context.Background(), 100, 2, true, fakeRefine(nil, &inFlight, &peak), nil, func(error) {})
	var got []span
	p.emit = func(off, length int64) error {
		got = append(got, span{off, length})
		return nil
	}
	p.feed(0, 100, false)
	p.feed(100, 100, true)
	if err := p.finish(nil); err != nil || fmt.Sprint(got) != fmt.Sprint([]span{{100, 25}}) {
		t.Errorf("got %v, %v; want [{100 25}]", got, err)
	}
}

// TestPipelineTimeoutIsFatal: a refinement that times out (the cluster did
// not answer) stops the stream with that error, rather than fall back to
// whole objects and end with OK while the OSDs are gone.
func TestPipelineTimeoutIsFatal(t *testing.T) {
	var fellBack atomic.Int64
	refine := func(ctx context.Context, c candidate) ([]span, error) {
		if c.off >= 500 {
			return nil, fmt.Errorf("mapext obj: %w", radosErr(-int(syscall.ETIMEDOUT)))
		}
		return []span{{c.off, 10}}, nil
	}
	p := newPipeline(context.Background(), 100, 4, false, refine, nil, func(error) { fellBack.Add(1) })
	var in []span
	for i := int64(0); i < 20; i++ {
		in = append(in, span{i * 100, 100})
	}
	got, err := runPipeline(context.Background(), p, in, -1)
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("finish: %v, want a timeout", err)
	}
	if fellBack.Load() != 0 {
		t.Errorf("%d fallbacks for timeouts", fellBack.Load())
	}
	for _, s := range got {
		if s.off >= 500 {
			t.Errorf("delivered %v, past the timeout", s)
		}
	}
}

// TestPipelineUnsupportedFallsBack: a query that the pool does not serve
// (EOPNOTSUPP, as erasure-coded pools answer some) falls back to the whole
// object, although the same errno from an open is UNAVAILABLE.
func TestPipelineUnsupportedFallsBack(t *testing.T) {
	var fellBack atomic.Int64
	refine := func(ctx context.Context, c candidate) ([]span, error) {
		if c.off == 500 {
			return nil, fmt.Errorf("mapext obj: %w", radosErr(-int(syscall.EOPNOTSUPP)))
		}
		return []span{{c.off, 10}}, nil
	}
	p := newPipeline(context.Background(), 100, 4, false, refine, nil, func(error) { fellBack.Add(1) })
	var in []span
	for i := int64(0); i < 10; i++ {
		in = append(in, span{i * 100, 100})
	}
	got, err := runPipeline(context.Background(), p, in, -1)
	if err != nil {
		t.Fatalf("finish: %v, want a fallback", err)
	}
	if fellBack.Load() != 1 || len(got) != 10 || got[5] != (span{500, 100}) {
		t.Errorf("%d fallbacks, delivered %v; want the object at 500 whole", fellBack.Load(), got)
	}
}

// TestPipelineForcedRange: every object of a forced range is refined, in
// order, merged with what librbd reports, each once.
func TestPipelineForcedRange(t *testing.T) {
	var inFlight, peak atomic.Int64
	p := newPipeline(context.Background(), 100, 4, false, fakeRefine(nil, &inFlight, &peak), nil, func(error) {})
	p.forced = []span{{250, 1000}} // objects 2 (from 250) to 12 (to 1250)
	got, err := runPipeline(context.Background(), p, []span{{500, 100}, {2000, 100}}, -1)
	if err != nil {
		t.Fatal(err)
	}
	want := []span{{250, 12}}
	for o := int64(300); o < 1200; o += 100 {
		want = append(want, span{o, 25})
	}
	want = append(want, span{1200, 12}, span{2000, 25})
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("got  %v\nwant %v", got, want)
	}
}

// TestPipelineFeedPanic: a panic inside librbd's callback must not unwind
// through librbd (which aborts the process): feed stops librbd, and
// finish returns an error, so that the stream ends non-OK.
func TestPipelineFeedPanic(t *testing.T) {
	var inFlight, peak atomic.Int64
	p := newPipeline(context.Background(), 100, 1, false, fakeRefine(nil, &inFlight, &peak), nil, func(error) {})
	p.emit = func(int64, int64) error { panic("bug in the callback") }
	var ret error
	for _, e := range []span{{0, 100}, {100, 100}, {200, 100}} {
		if ret = p.feed(e.off, e.len, true); ret != nil {
			break
		}
	}
	if ret == nil {
		t.Fatal("feed returned nil after a panic, want an error that stops the diff")
	}
	if got := p.feed(300, 100, true); got == nil {
		t.Error("feed after the panic returned nil, want an error")
	}
	err := p.finish(nil)
	if err == nil || !strings.Contains(err.Error(), "panicked") {
		t.Errorf("finish: %v, want the panic as an error", err)
	}
}

// TestPipelineRefineSlots: refinements across all pipelines never exceed
// maxRefining at once, and a pipeline waiting for a slot stops with its
// context.
func TestPipelineRefineSlots(t *testing.T) {
	var inFlight, peak atomic.Int64
	gate := make(chan struct{})
	refine := func(ctx context.Context, c candidate) ([]span, error) {
		n := inFlight.Add(1)
		defer inFlight.Add(-1)
		for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
		}
		<-gate
		return []span{{c.off, 1}}, nil
	}
	const pipes = maxRefining/16 + 3
	done := make(chan error, pipes)
	for range pipes {
		go func() {
			p := newPipeline(context.Background(), 100, 16, false, refine, nil, func(error) {})
			var in []span
			for i := range int64(16) {
				in = append(in, span{i * 100, 100})
			}
			_, err := runPipeline(context.Background(), p, in, -1)
			done <- err
		}()
	}
	deadline := time.Now().Add(5 * time.Second)
	for inFlight.Load() < maxRefining && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	time.Sleep(50 * time.Millisecond)
	if n := inFlight.Load(); n != maxRefining {
		t.Errorf("%d refinements in flight, want the bound %d", n, maxRefining)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	p := newPipeline(ctx, 100, 4, false, refine, nil, func(error) {})
	if _, err := runPipeline(ctx, p, []span{{0, 100}, {100, 100}}, -1); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("pipeline waiting for slots: %v, want its context's error", err)
	}
	close(gate)
	for range pipes {
		if err := <-done; err != nil {
			t.Error(err)
		}
	}
	if peak.Load() > maxRefining {
		t.Errorf("peak %d refinements, bound %d", peak.Load(), maxRefining)
	}
}

// TestPipelineExistence: a delta by existence refines the objects that
// exist at the target (librbd's exists = 1) and, forced, those that
// existed at the base, gone at the target included; each once, in order.
func TestPipelineExistence(t *testing.T) {
	var inFlight, peak atomic.Int64
	p := newPipeline(context.Background(), 100, 4, true, fakeRefine(nil, &inFlight, &peak), nil, func(error) {})
	// At the base: objects 0, 1 and 5; at the target: 1, 3 (and 5 gone).
	p.forced = forcedRanges(100, 0, 1000, []span{{0, 200}, {500, 100}})
	var got []span
	p.emit = func(off, length int64) error {
		got = append(got, span{off, length})
		return nil
	}
	for _, f := range []struct {
		off    int64
		exists bool
	}{{100, true}, {300, true}, {500, false}} {
		if p.feed(f.off, 100, f.exists) != nil {
			t.Fatal("stopped")
		}
	}
	if err := p.finish(nil); err != nil {
		t.Fatal(err)
	}
	want := []span{{0, 25}, {100, 25}, {300, 25}, {500, 25}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("got  %v\nwant %v", got, want)
	}
}

// TestPipelineWalk: the walk makes every object of the range a candidate,
// from an offset inside an object, in image order, with the window bounding
// the jobs in flight; an object refined to nothing yields nothing; a
// cancel stops it with the context's error.
func TestPipelineWalk(t *testing.T) {
	var inFlight, peak, fellBack atomic.Int64
	inner := fakeRefine(map[int64]bool{9: true}, &inFlight, &peak)
	refine := func(ctx context.Context, c candidate) ([]span, error) {
		if (c.off/100)%5 == 0 { // absent at both snapshots
			return nil, nil
		}
		return inner(ctx, c)
	}
	var got []span
	p := newPipeline(context.Background(), 100, 6, false, refine, func(off, length int64) error {
		got = append(got, span{off, length})
		return nil
	}, func(error) { fellBack.Add(1) })
	p.every([]span{{250, 4030 - 250}})
	if err := p.finish(nil); err != nil {
		t.Fatal(err)
	}
	want := []span{{250, 12}} // the candidate [250, 300), refined to its quarter
	for i := int64(3); i <= 40; i++ {
		switch {
		case i%5 == 0:
		case i == 9:
			want = append(want, span{900, 100})
		case i == 40:
			want = append(want, span{4000, 7})
		default:
			want = append(want, span{i * 100, 25})
		}
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("got  %v\nwant %v", got, want)
	}
	if peak.Load() > 6 {
		t.Errorf("%d jobs at once, window 6", peak.Load())
	}
	if fellBack.Load() != 1 {
		t.Errorf("%d fallbacks, want 1", fellBack.Load())
	}

	ctx, cancel := context.WithCancel(context.Background())
	n := 0
	p = newPipeline(ctx, 100, 4, false, refine, func(int64, int64) error {
		if n++; n == 3 {
			cancel()
		}
		return nil
	}, func(error) {})
	p.every([]span{{0, 1 << 40}})
	if err := p.finish(nil); !errors.Is(err, context.Canceled) {
		t.Errorf("after a cancel: %v, want context.Canceled", err)
	}
}

// TestPipelineWalkListed: a walk over listed ranges with gaps, batch 3:
// each candidate holds up to three objects, not necessarily adjacent,
// spans from its first to its last, and is clipped at the range's ends.
func TestPipelineWalkListed(t *testing.T) {
	var cands []candidate
	refine := func(_ context.Context, c candidate) ([]span, error) {
		cands = append(cands, c)
		var out []span
		for _, o := range c.objs {
			out = append(out, span{o*100 + 10, 5})
		}
		return out, nil
	}
	var got []span
	p := newPipeline(context.Background(), 100, 1, false, refine, func(off, length int64) error {
		got = append(got, span{off, length})
		return nil
	}, func(error) {})
	p.batch = 3
	p.every([]span{{150, 50}, {500, 200}, {1200, 100}, {4000, 20}})
	if err := p.finish(nil); err != nil {
		t.Fatal(err)
	}
	want := []string{"{150 550 true [1 5 6] false}", "{1200 2820 true [12 40] false}"}
	if len(cands) != 2 || fmt.Sprint(cands[0]) != want[0] || fmt.Sprint(cands[1]) != want[1] {
		t.Errorf("candidates %v, want %v", cands, want)
	}
	// Object 1's extent at 110 lies before the candidate's start (150):
	// clipped away; object 40's at 4010 within [4000, 4020).
	if w := "[{510 5} {610 5} {1210 5} {4010 5}]"; fmt.Sprint(got) != w {
		t.Errorf("got %v, want %s", got, w)
	}
}

// TestObjectNumber: the inverse of dataObject, and nothing else.
func TestObjectNumber(t *testing.T) {
	for _, c := range []struct {
		name, prefix string
		old          bool
		want         int64
		ok           bool
	}{
		{"rbd_data.abc.000000000000002a", "rbd_data.abc", false, 42, true},
		{"rbd_data.abc.000000000000002A", "rbd_data.abc", false, 0, false},
		{"rbd_data.abc.00000000002a", "rbd_data.abc", false, 0, false},
		{"rbd_data.abcd.000000000000002a", "rbd_data.abc", false, 0, false},
		{"rbd_header.abc", "rbd_data.abc", false, 0, false},
		{"rb.0.1.2.00000000002a", "rb.0.1.2", true, 42, true},
		{"rb.0.1.2.000000000000002a", "rb.0.1.2", true, 0, false},
		{"rbd_data.abc.ffffffffffffffff", "rbd_data.abc", false, 0, false},
	} {
		got, ok := objectNumber(c.name, c.prefix, c.old)
		if got != c.want || ok != c.ok {
			t.Errorf("objectNumber(%q, %q, %v) = %d, %v; want %d, %v", c.name, c.prefix, c.old, got, ok, c.want, c.ok)
		}
	}
	if got := fmt.Sprint(objectSpans([]int64{0, 1, 3, 7, 8}, 10, 75)); got != "[{0 20} {30 10} {70 10}]" {
		t.Errorf("objectSpans: %s", got)
	}
}

// TestPipelineFresh: with the base's existing objects known, a candidate
// that exists at the target outside them is fresh; one inside them, one
// forced, or one that does not exist at the target is not.
func TestPipelineFresh(t *testing.T) {
	var mu sync.Mutex
	fresh := map[int64]bool{}
	refine := func(_ context.Context, c candidate) ([]span, error) {
		mu.Lock()
		fresh[c.off/100] = c.fresh
		mu.Unlock()
		return nil, nil
	}
	p := newPipeline(context.Background(), 100, 4, false, refine, func(int64, int64) error { return nil }, func(error) {})
	p.before, p.hasBefore = []span{{200, 200}, {900, 100}}, true
	p.forced = []span{{700, 100}}
	p.feed(0, 300, true)    // objects 0, 1: fresh; 2: existed
	p.feed(300, 200, true)  // 3: existed; 4: fresh
	p.feed(500, 100, false) // 5: gone at the target
	p.feed(900, 200, true)  // 7 forced before it; 9 existed; 10 fresh
	if err := p.finish(nil); err != nil {
		t.Fatal(err)
	}
	want := map[int64]bool{0: true, 1: true, 2: false, 3: false, 4: true, 5: false, 7: false, 9: false, 10: true}
	if fmt.Sprint(fresh) != fmt.Sprint(want) {
		t.Errorf("fresh %v\nwant  %v", fresh, want)
	}
}
