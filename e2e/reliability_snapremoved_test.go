//go:build e2e

package e2e

import (
	"context"
	"errors"
	"io"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/e2e/harness"
)

// relResumeBudget is the server's default --resume-budget, and
// relMaxBackOff its longest backoff between re-opens (driver/resume.go).
const (
	relResumeBudget = 2 * time.Minute
	relMaxBackOff   = 10 * time.Second
)

// TestReliabilityResumeSnapRemoved removes the base snapshot of an exact
// and a precise Delta while the OSD is stopped in the middle of them: each
// stream must end NOT_FOUND naming the base snapshot, within the resume
// budget and one backoff, never OK and never UNAVAILABLE after retrying
// until the budget is spent; and its server then answers at once.
//
// On the harness's single OSD, `rbd snap rm` cannot run while the OSD is
// stopped: started during the outage, it waits for the OSD and then races
// the server's re-open. Whichever wins, the stream must end NOT_FOUND: the
// re-open finds the snapshot gone, or the resumed diff's check at its end
// (rbd/lineage.go) does. The client, a slow reader, takes no page from the
// time the OSD continues until the removal is done, so that the resumed
// diff cannot end before it (a removal after the diff's end rightly leaves
// the stream OK). Both streams run during one outage.
func TestReliabilityResumeSnapRemoved(t *testing.T) {
	if !harness.ServerHasPrecision(t, "precise") {
		t.Skip("the server binary has no --precision=precise")
	}
	v, _ := harness.ManyWrites(t, 16384)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute) // a hang guard
	defer cancel()
	r := &snapRemovedRun{v: v}
	r.openStreams(t, ctx)
	r.outage(t)
	r.removalDone(t)
	r.checkStreams(t)
	harness.WaitClusterIO(t)
	r.serversAnswer(t, ctx)
}

// snapRemovedStream is one stream of TestReliabilityResumeSnapRemoved.
type snapRemovedStream struct {
	mode  string
	srv   *harness.Server
	alloc []harness.Span // the target's allocated blocks, before the outage
	recv  func() (harness.MetaResponse, error)
	n     int
	err   error
	ended time.Time
}

// snapRemovedRun is what TestReliabilityResumeSnapRemoved's steps share:
// the volume, the streams, when the OSD stopped (t0) and came back, and
// the removal of the base snapshot: its output, error and end.
type snapRemovedRun struct {
	v        harness.RbdVolume
	streams  []*snapRemovedStream
	t0, back time.Time
	rmErr    error
	rmOut    []byte
	rmDone   time.Time
}

// openStreams: an exact and a precise server, the target's allocated
// blocks, and a Delta from s1 to s2 on each, opened on a slow reader with
// its first page read.
func (r *snapRemovedRun) openStreams(t *testing.T, ctx context.Context) {
	for _, mode := range []string{"exact", "precise"} {
		srv := harness.StartServer(t, "--ceph-op-timeout="+relOpTimeout.String(), "--precision="+mode)
		s := &snapRemovedStream{mode: mode, srv: srv, alloc: srv.Get(t, harness.MetaReq{Target: r.v.ID("s2")}).Tuples()}
		q := harness.MetaReq{Base: r.v.ID("s1"), Target: r.v.ID("s2"), Max: 1, Secrets: harness.CSISecrets(t)}
		var err error
		if s.recv, err = harness.SlowReader(t, srv.Sock).Open(ctx, q); err != nil {
			t.Fatal(err)
		}
		if _, err := s.recv(); err != nil {
			t.Fatalf("%s: first page: %v", mode, err)
		}
		s.n = 1
		r.streams = append(r.streams, s)
	}
}

// outage stops the OSD for relOutage, removes the base snapshot during it,
// and reads the streams to their end, taking no page from the time the
// OSD continues until the removal is done; it returns once the streams
// and the removal ended.
func (r *snapRemovedRun) outage(t *testing.T) {
	time.Sleep(500 * time.Millisecond)
	osd := harness.PauseOSD(t)
	r.t0 = time.Now()

	// The removal, started during the outage: it waits for the OSD.
	removed := make(chan struct{})
	go func() {
		defer close(removed)
		rctx, rcancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer rcancel()
		r.rmOut, r.rmErr = exec.CommandContext(rctx, "rbd", "snap", "rm", "--no-progress", r.v.Spec()+"@s1").CombinedOutput()
		r.rmDone = time.Now()
	}()

	cont := make(chan struct{}) // closed when the OSD continues
	var wg sync.WaitGroup
	for _, s := range r.streams {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-cont:
					<-removed
				default:
				}
				_, err := s.recv()
				if err != nil {
					s.err, s.ended = err, time.Now()
					return
				}
				s.n++
			}
		}()
	}
	osd.Outage(relOutage)
	r.back = time.Now()
	close(cont)
	wg.Wait()
	<-removed
}

// removalDone logs the outage and the removal; the test ends here if the
// removal failed.
func (r *snapRemovedRun) removalDone(t *testing.T) {
	t.Logf("OSD stopped for %v; rbd snap rm %s@s1 done %v after the fault (%v after the OSD came back): %v %s",
		r.back.Sub(r.t0).Round(time.Millisecond), r.v.Spec(), r.rmDone.Sub(r.t0).Round(time.Millisecond),
		r.rmDone.Sub(r.back).Round(time.Millisecond), r.rmErr, strings.TrimSpace(string(r.rmOut)))
	if r.rmErr != nil {
		t.Fatalf("rbd snap rm %s@s1: %v", r.v.Spec(), r.rmErr)
	}
}

// checkStreams checks that each stream that met the outage ended
// NOT_FOUND naming the base snapshot, within the op timeouts, the resume
// budget and one backoff, and that one at least met it.
func (r *snapRemovedRun) checkStreams(t *testing.T) {
	bound := 2*relOpTimeout + relResumeBudget + relMaxBackOff
	met := 0
	for _, s := range r.streams {
		took := s.ended.Sub(r.t0)
		log := s.srv.Log()
		resumed := strings.Count(log, `"Resumed stream"`)
		path := "the re-open found the snapshot gone"
		if resumed > 0 {
			path = "the resumed diff's end check found the snapshot gone"
		}
		t.Logf("%s: %d pages, ended %v after the fault (%v after the OSD came back, %v after the removal): %v; %d resumes logged: %s",
			s.mode, s.n, took.Round(time.Millisecond), s.ended.Sub(r.back).Round(time.Millisecond),
			s.ended.Sub(r.rmDone).Round(time.Millisecond), s.err, resumed, path)
		for _, l := range strings.Split(log, "\n") {
			if strings.Contains(l, `"Resumed stream"`) || strings.Contains(l, `"Stream finished"`) && strings.Contains(l, `code="NotFound"`) {
				t.Logf("  %s", l)
			}
		}
		if s.ended.Before(r.back) {
			t.Logf("%s: ended before the OSD came back: its diff had no Ceph work left; it proves nothing", s.mode)
			continue
		}
		met++
		msg := status.Convert(s.err).Message()
		switch {
		case errors.Is(s.err, io.EOF):
			t.Errorf("%s: the stream ended OK although its base snapshot was removed before its end", s.mode)
		case status.Code(s.err) != codes.NotFound:
			t.Errorf("%s: %v; want NOT_FOUND", s.mode, s.err)
		case !strings.Contains(msg, r.v.Spec()+"@s1"):
			t.Errorf("%s: %q does not name the base snapshot %s@s1", s.mode, msg, r.v.Spec())
		}
		if took > bound {
			t.Errorf("%s: ended %v after the fault, want within %v (op timeouts, the resume budget and one backoff)", s.mode, took, bound)
		}
	}
	if met == 0 {
		t.Errorf("no stream met the outage")
	}
}

// serversAnswer checks that each server then answers at once: a new Delta
// from the removed snapshot NOT_FOUND, a new Allocated of the target as
// before the outage.
func (r *snapRemovedRun) serversAnswer(t *testing.T, ctx context.Context) {
	for _, s := range r.streams {
		t1 := time.Now()
		d := s.srv.Call(ctx, harness.MetaReq{Base: r.v.ID("s1"), Target: r.v.ID("s2"), Secrets: harness.CSISecrets(t)})
		t.Logf("%s: a new Delta from the removed snapshot: %v in %v", s.mode, d.Err, time.Since(t1).Round(time.Millisecond))
		if status.Code(d.Err) != codes.NotFound {
			t.Errorf("%s: a new Delta from the removed snapshot: %v; want NOT_FOUND", s.mode, d.Err)
		}
		t1 = time.Now()
		a := s.srv.Call(ctx, harness.MetaReq{Target: r.v.ID("s2"), Secrets: harness.CSISecrets(t)})
		t.Logf("%s: a new Allocated of the target: %d tuples, %v in %v", s.mode, len(a.Tuples()), a.Err, time.Since(t1).Round(time.Millisecond))
		if a.Err != nil || harness.DiffSpans(s.alloc, a.Tuples()) != "" {
			t.Errorf("%s: a new Allocated of the target after the outage: %d of %d tuples, %v", s.mode, len(a.Tuples()), len(s.alloc), a.Err)
		}
	}
}
