//go:build e2e

package e2e

// Cancellation, leaks and panics, in process: the test runs the server
// (rbd.Source + rbddriver + driver + server.Run) itself, so that it sees
// how each handler returned, whether every Diff was closed (the source's
// connection references), and every goroutine (goleak).

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/driver"
	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/e2e/harness"
	rsm "github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/rbd"
)

// relModes are the rbd options of the precision modes the in-process
// tests run: librbd's exact diff, and precise mode (the server's default).
var relModes = []struct {
	name string
	opts rsm.Options
}{
	{"exact", rsm.Options{}},
	{"precise", rsm.Options{Precise: true}},
}

// TestReliabilityCancelLeaks cancels streams at their first page, in the
// middle and at their last page. Each time the handler must return
// non-OK unless it had sent every tuple, the Diff must be closed (the
// source holds no reference, the connection stays cached), the server
// must serve the same request in full right after, and once the server
// is stopped and the source closed, no goroutine may be left over.
func TestReliabilityCancelLeaks(t *testing.T) {
	v, _ := harness.SharedManyWrites(t, 16384)
	baseline := goleak.IgnoreCurrent()
	const pageMax = 100
	for _, mode := range relModes {
		t.Run(mode.name, func(t *testing.T) {
			p := harness.StartInProc(t, mode.opts, nil, driver.Options{})
			for _, q := range []harness.MetaReq{{Target: v.ID("s2"), Max: pageMax}, {Base: v.ID("s1"), Target: v.ID("s2"), Max: pageMax}} {
				q.Secrets = harness.CSISecrets(t)
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
				full := p.Call(ctx, q)
				cancel()
				if full.Err != nil {
					t.Fatalf("%v: %v", q, full.Err)
				}
				p.Svc.Next(t, 10*time.Second)
				want := full.Tuples()
				pages := len(full.Pages)
				if pages < 10 {
					// exact mode reports this volume's allocated data as
					// whole objects, merged into one tuple.
					t.Logf("%v: %d pages; too few to cancel in the middle", q, pages)
					continue
				}
				p.WaitRefs(t)
				for _, at := range []struct {
					name string
					page int
				}{{"first page", 1}, {"mid-stream", pages / 2}, {"last page", pages}} {
					t.Run(fmt.Sprintf("%s/%s", map[bool]string{true: "allocated", false: "delta"}[q.Base == ""], at.name), func(t *testing.T) {
						cancelAt(t, p, q, at.page, want)
						// The connection went back to the cache, and serves again.
						if st := p.Src.Stats(); st.Conns == 0 {
							t.Errorf("no cached connection after the cancel: %+v", st)
						}
						ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
						again := p.Call(ctx, q)
						cancel()
						p.Svc.Next(t, 10*time.Second)
						if again.Err != nil {
							t.Fatalf("the request after the cancel: %v", again.Err)
						}
						if diff := harness.DiffSpans(want, again.Tuples()); diff != "" {
							t.Errorf("the request after the cancel: %s", diff)
						}
						p.WaitRefs(t)
					})
				}
			}
			p.Stop(t)
		})
	}
	goleak.VerifyNone(t, baseline)
}

// cancelAt reads page pages of q, cancels the call, and checks the client's
// and the handler's view of the end of the stream.
func cancelAt(t *testing.T, p *harness.InProc, q harness.MetaReq, pages int, want []harness.Span) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	recv, err := p.Open(ctx, q)
	if err != nil {
		t.Fatal(err)
	}
	var got []harness.Span
	for i := 0; i < pages; i++ {
		resp, err := recv()
		if err != nil {
			t.Fatalf("page %d: %v", i, err)
		}
		got = append(got, harness.ToPage(resp).Tuples...)
	}
	cancel()
	for {
		resp, err2 := recv()
		if err2 != nil {
			err = err2
			break
		}
		got = append(got, harness.ToPage(resp).Tuples...)
	}
	// The client: CANCELLED, or, when the whole stream was in before the
	// cancel, its end. Never OK with less than everything.
	switch {
	case errors.Is(err, io.EOF):
		if diff := harness.DiffSpans(want, got); diff != "" {
			t.Errorf("a cancelled stream ended with OK but is not complete: %s", diff)
		}
	case status.Code(err) != codes.Canceled:
		t.Errorf("cancelled stream: %v, want CANCELLED", err)
	}
	if diff := harness.DiffSpans(want[:min(len(got), len(want))], got); diff != "" {
		t.Errorf("the tuples before the cancel are not a prefix of the stream: %s", diff)
	}
	// The handler: non-OK, unless it had sent every tuple.
	h := p.Svc.Next(t, 30*time.Second)
	switch {
	case h.Panicked != nil:
		t.Errorf("the handler panicked: %v", h.Panicked)
	case h.Err == nil && h.Tuples != len(want):
		t.Errorf("the handler returned OK after sending %d of %d tuples", h.Tuples, len(want))
	case h.Err != nil && status.Code(h.Err) != codes.Canceled:
		t.Errorf("the handler returned %v, want CANCELLED", h.Err)
	}
	if pages == 1 && h.Tuples >= len(want) {
		t.Errorf("cancelled at the first page, the handler still sent all %d tuples: the diff did not stop", h.Tuples)
	}
	p.WaitRefs(t)
	t.Logf("cancelled after %d pages (%d tuples of %d); client: %v; handler: %v after sending %d tuples",
		pages, len(got), len(want), err, h.Err, h.Tuples)
}

// panicSource wraps a source so that its diffs' callback panics at the
// extent number at, inside rbd's diff callback, which runs under librbd.
type panicSource struct {
	driver.Source
	at     atomic.Int64
	armed  atomic.Bool
	opened atomic.Int64
	closed atomic.Int64
}

func (s *panicSource) Open(ctx context.Context, req driver.OpenRequest) (driver.Diff, error) {
	d, err := s.Source.Open(ctx, req)
	if err != nil {
		return nil, err
	}
	s.opened.Add(1)
	return &panicDiff{Diff: d, s: s}, nil
}

type panicDiff struct {
	driver.Diff
	s *panicSource
}

func (d *panicDiff) Iterate(ctx context.Context, off int64, emit func(driver.Extent) error) error {
	var n int64
	return d.Diff.Iterate(ctx, off, func(e driver.Extent) error {
		n++
		if n == d.s.at.Load() && d.s.armed.CompareAndSwap(true, false) {
			panic(fmt.Sprintf("e2e: injected panic at extent %d", n))
		}
		return emit(e)
	})
}

func (d *panicDiff) Close() error {
	d.s.closed.Add(1)
	return d.Diff.Close()
}

// TestReliabilityPanic makes the diff callback panic, under librbd, in the
// middle of a real stream: rbd stops librbd, panics again once librbd has
// returned, the driver closes the Diff, and the server answers INTERNAL
// and lives on: the same request then streams in full. The panic, logged
// at -v=10, must not carry the key; no goroutine is left over.
func TestReliabilityPanic(t *testing.T) {
	v, _ := harness.ManyWrites(t, 4096)
	baseline := goleak.IgnoreCurrent()
	key := harness.ClusterEnv(t, "CEPH_CSI_KEY")
	for _, mode := range relModes {
		t.Run(mode.name, func(t *testing.T) {
			var ps *panicSource
			p := harness.StartInProc(t, mode.opts, func(s driver.Source) driver.Source {
				ps = &panicSource{Source: s}
				return ps
			}, driver.Options{})
			for _, q := range []harness.MetaReq{{Target: v.ID("s2"), Max: 64}, {Base: v.ID("s1"), Target: v.ID("s2"), Max: 64}} {
				q.Secrets = harness.CSISecrets(t)
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
				want := p.Call(ctx, q)
				cancel()
				p.Svc.Next(t, 10*time.Second)
				if want.Err != nil {
					t.Fatalf("%v: %v", q, want.Err)
				}

				// In the middle of the stream (exact mode's allocated
				// answer here is one tuple: at the first).
				ps.at.Store(max(1, int64(len(want.Tuples())/2)))
				ps.armed.Store(true)
				ctx, cancel = context.WithTimeout(context.Background(), 2*time.Minute)
				m := p.Call(ctx, q)
				cancel()
				h := p.Svc.Next(t, 10*time.Second)
				if status.Code(m.Err) != codes.Internal {
					t.Errorf("%v with a panicking callback: %v after %d tuples, want INTERNAL", q, m.Err, len(m.Tuples()))
				}
				if len(m.Tuples()) >= len(want.Tuples()) && len(want.Tuples()) > 1 {
					t.Errorf("%v: the panicking stream still delivered all %d tuples", q, len(m.Tuples()))
				}
				if h.Panicked == nil {
					t.Errorf("%v: the handler did not panic (returned %v)", q, h.Err)
				} else if !strings.Contains(fmt.Sprint(h.Panicked), "callback stack") {
					// rbd's callbackPanic: recovered inside the cgo
					// callback, raised again after librbd returned.
					t.Errorf("%v: the panic did not come through rbd's diff callback: %v", q, h.Panicked)
				}
				p.WaitRefs(t)
				if o, c := ps.opened.Load(), ps.closed.Load(); o != c {
					t.Errorf("%d diffs opened, %d closed", o, c)
				}

				ctx, cancel = context.WithTimeout(context.Background(), 2*time.Minute)
				again := p.Call(ctx, q)
				cancel()
				p.Svc.Next(t, 10*time.Second)
				if again.Err != nil {
					t.Fatalf("%v after the panic: %v", q, again.Err)
				}
				if diff := harness.DiffSpans(want.Tuples(), again.Tuples()); diff != "" {
					t.Errorf("%v after the panic: %s", q, diff)
				}
				t.Logf("%v: panic at extent %d → %v after %d tuples; then %d tuples OK", q, ps.at.Load(), status.Code(m.Err), len(m.Tuples()), len(again.Tuples()))
			}
			p.Stop(t)
			log := p.Logs.String()
			if !strings.Contains(log, "Handler panicked") || !strings.Contains(log, `"Request"`) {
				t.Errorf("the -v=10 log lacks the panic or the requests; the secret check proves nothing")
			}
			if strings.Contains(log, key) {
				t.Errorf("the server log (-v=10, with a panic) contains the userKey")
			}
		})
	}
	goleak.VerifyNone(t, baseline)
}
