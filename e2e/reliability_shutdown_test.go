//go:build e2e

package e2e

import (
	"context"
	"errors"
	"io"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/e2e/harness"
)

// The grace period of TestReliabilityShutdown's server, and how many
// streams run at SIGTERM.
const (
	shutdownGrace   = 3 * time.Second
	shutdownStreams = 12
)

// TestReliabilityShutdown sends SIGTERM to the server binary while
// streams run: readers that keep up and can finish within the grace
// period, and slow readers that cannot. Each stream must either end OK
// with every tuple, or end non-OK with a prefix of them: never a
// truncated OK. New requests are refused, the server exits with 0 and
// removes its socket.
func TestReliabilityShutdown(t *testing.T) {
	r := startShutdown(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute) // a hang guard
	defer cancel()
	t0 := r.sigtermUnderStreams(t, ctx)
	r.exitsClean(t)
	r.checkStreams(t, t0)
}

// shutdownResult is how one stream of TestReliabilityShutdown ended.
type shutdownResult struct {
	slow bool
	q    int
	got  []harness.Span
	err  error
}

// shutdownRun is what TestReliabilityShutdown's steps share: the server
// and its slow readers' connection, the requests and their answers, and
// the streams' results.
type shutdownRun struct {
	srv, slowSrv *harness.Server
	qs           []harness.MetaReq
	want         [][]harness.Span
	results      []shutdownResult
}

// startShutdown: the server with the grace period, the answers of an
// Allocated and a Delta, and the slow readers' connection.
func startShutdown(t *testing.T) *shutdownRun {
	v, _ := harness.SharedManyWrites(t, 16384)
	srv := harness.StartServer(t, "--grace-period="+shutdownGrace.String())
	qs := []harness.MetaReq{{Target: v.ID("s2")}, {Base: v.ID("s1"), Target: v.ID("s2")}}
	want := make([][]harness.Span, len(qs))
	for i := range qs {
		qs[i].Secrets = harness.CSISecrets(t)
		want[i] = srv.Get(t, qs[i]).Tuples()
	}

	// Slow readers use a connection of their own, with a fixed 64 KiB flow
	// control window (no BDP growth), and pages of one tuple: the server
	// can send only a few thousand of the 16k before it waits for them.
	slowSrv := harness.SlowReader(t, srv.Sock)
	return &shutdownRun{srv: srv, slowSrv: slowSrv, qs: qs, want: want, results: make([]shutdownResult, shutdownStreams)}
}

// sigtermUnderStreams starts the streams, half of them slow readers, sends
// SIGTERM once each has its first page, checks that a new request is then
// refused, and returns when the SIGTERM was sent, once every stream ended.
func (r *shutdownRun) sigtermUnderStreams(t *testing.T, ctx context.Context) (t0 time.Time) {
	started := make(chan struct{}, shutdownStreams)
	term := make(chan struct{})
	var wg sync.WaitGroup
	for i := 0; i < shutdownStreams; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r.stream(ctx, i, started, term)
		}()
	}
	for i := 0; i < shutdownStreams; i++ {
		<-started
	}
	t0 = time.Now()
	r.srv.Sigterm(t)
	close(term)
	r.lateRefused(t, ctx)
	wg.Wait()
	return t0
}

// stream runs stream i to its end into its result: it signals started
// once it has its first page (or has ended), and reads on once term is
// closed.
func (r *shutdownRun) stream(ctx context.Context, i int, started chan<- struct{}, term <-chan struct{}) {
	res := &r.results[i]
	res.slow, res.q = i%2 == 1, i%len(r.qs)
	q, s := r.qs[res.q], r.srv
	q.Max = 50
	if res.slow {
		q.Max, s = 1, r.slowSrv
	}
	recv, err := s.Open(ctx, q)
	if err != nil {
		res.err = err
		started <- struct{}{}
		return
	}
	for n := 0; ; n++ {
		resp, err := recv()
		if err != nil {
			res.err = err
			if n == 0 {
				started <- struct{}{}
			}
			return
		}
		res.got = append(res.got, harness.ToPage(resp).Tuples...)
		if n == 0 {
			started <- struct{}{}
			<-term // every stream is under way at SIGTERM
		}
		if res.slow {
			time.Sleep(2 * time.Millisecond) // 16k pages: far longer than the grace period
		}
	}
}

// lateRefused checks that a new request is refused within the grace
// period after SIGTERM.
func (r *shutdownRun) lateRefused(t *testing.T, ctx context.Context) {
	// New requests are refused while the old ones end: once the server
	// has taken the signal (its "Stopping" line), and its gRPC server has
	// stopped taking streams (GracefulStop, a moment later).
	harness.WaitFor(t, "the server's Stopping line", 30*time.Second, func() bool { return strings.Contains(r.srv.Log(), `"Stopping"`) })
	late := r.srv.Call(ctx, r.qs[0])
	for t1 := time.Now(); late.Err == nil && time.Since(t1) < shutdownGrace; {
		time.Sleep(20 * time.Millisecond)
		late = r.srv.Call(ctx, r.qs[0])
	}
	if late.Err == nil {
		t.Errorf("a request after SIGTERM was served: %d tuples", len(late.Tuples()))
	}
}

// exitsClean checks that the server exits with status 0 and removes its
// socket.
func (r *shutdownRun) exitsClean(t *testing.T) {
	exitErr, exited := r.srv.Wait(shutdownGrace + 20*time.Second)
	if !exited || exitErr != nil {
		t.Errorf("after SIGTERM: exited %t, %v; want exit status 0", exited, exitErr)
	}
	if _, err := os.Lstat(r.srv.Sock); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the socket %s is still there after the exit (%v)", r.srv.Sock, err)
	}
}

// checkStreams checks that every stream ended OK with every tuple, or
// non-OK with a prefix of them, and that a slow one at least was cut; it
// logs the count since SIGTERM at t0.
func (r *shutdownRun) checkStreams(t *testing.T, t0 time.Time) {
	var ok, failed, slowFailed int
	for i, res := range r.results {
		w := r.want[res.q]
		if diff := harness.DiffSpans(w[:min(len(res.got), len(w))], res.got); diff != "" {
			t.Errorf("stream %d: the tuples are not a prefix of the answer: %s", i, diff)
		}
		switch {
		case errors.Is(res.err, io.EOF):
			ok++
			if len(res.got) != len(w) {
				t.Errorf("stream %d (slow %t) ended OK after %d of %d tuples: a truncated OK", i, res.slow, len(res.got), len(w))
			}
		case res.err == nil:
			t.Errorf("stream %d: no end", i)
		default:
			failed++
			if res.slow {
				slowFailed++
			}
		}
		t.Logf("stream %d (slow %t): %d of %d tuples, then %v", i, res.slow, len(res.got), len(w), res.err)
	}
	if slowFailed == 0 {
		t.Errorf("no slow stream was cut by the end of the grace period: the test proves less than it should")
	}
	t.Logf("SIGTERM with %d streams under way: %d finished OK and complete, %d ended non-OK with a prefix; exit after %v (grace %v)",
		shutdownStreams, ok, failed, time.Since(t0).Round(time.Millisecond), shutdownGrace)
}
