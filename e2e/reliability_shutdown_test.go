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

// TestReliabilityShutdown sends SIGTERM to the server binary while
// streams run: readers that keep up and can finish within the grace
// period, and slow readers that cannot. Each stream must either end OK
// with every tuple, or end non-OK with a prefix of them: never a
// truncated OK. New requests are refused, the server exits with 0 and
// removes its socket.
func TestReliabilityShutdown(t *testing.T) {
	v, _ := harness.SharedManyWrites(t, 16384)
	const grace = 3 * time.Second
	srv := harness.StartServer(t, "--grace-period="+grace.String())
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

	type result struct {
		slow bool
		q    int
		got  []harness.Span
		err  error
	}
	const streams = 12
	results := make([]result, streams)
	started := make(chan struct{}, streams)
	term := make(chan struct{})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute) // a hang guard
	defer cancel()
	var wg sync.WaitGroup
	for i := 0; i < streams; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res := &results[i]
			res.slow, res.q = i%2 == 1, i%len(qs)
			q, s := qs[res.q], srv
			q.Max = 50
			if res.slow {
				q.Max, s = 1, slowSrv
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
		}()
	}
	for i := 0; i < streams; i++ {
		<-started
	}
	t0 := time.Now()
	srv.Sigterm(t)
	close(term)
	// New requests are refused while the old ones end: once the server
	// has taken the signal (its "Stopping" line), and its gRPC server has
	// stopped taking streams (GracefulStop, a moment later).
	harness.WaitFor(t, "the server's Stopping line", 30*time.Second, func() bool { return strings.Contains(srv.Log(), `"Stopping"`) })
	late := srv.Call(ctx, qs[0])
	for t1 := time.Now(); late.Err == nil && time.Since(t1) < grace; {
		time.Sleep(20 * time.Millisecond)
		late = srv.Call(ctx, qs[0])
	}
	if late.Err == nil {
		t.Errorf("a request after SIGTERM was served: %d tuples", len(late.Tuples()))
	}
	wg.Wait()
	exitErr, exited := srv.Wait(grace + 20*time.Second)
	if !exited || exitErr != nil {
		t.Errorf("after SIGTERM: exited %t, %v; want exit status 0", exited, exitErr)
	}
	if _, err := os.Lstat(srv.Sock); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the socket %s is still there after the exit (%v)", srv.Sock, err)
	}
	var ok, failed, slowFailed int
	for i, r := range results {
		w := want[r.q]
		if diff := harness.DiffSpans(w[:min(len(r.got), len(w))], r.got); diff != "" {
			t.Errorf("stream %d: the tuples are not a prefix of the answer: %s", i, diff)
		}
		switch {
		case errors.Is(r.err, io.EOF):
			ok++
			if len(r.got) != len(w) {
				t.Errorf("stream %d (slow %t) ended OK after %d of %d tuples: a truncated OK", i, r.slow, len(r.got), len(w))
			}
		case r.err == nil:
			t.Errorf("stream %d: no end", i)
		default:
			failed++
			if r.slow {
				slowFailed++
			}
		}
		t.Logf("stream %d (slow %t): %d of %d tuples, then %v", i, r.slow, len(r.got), len(w), r.err)
	}
	if slowFailed == 0 {
		t.Errorf("no slow stream was cut by the end of the grace period: the test proves less than it should")
	}
	t.Logf("SIGTERM with %d streams under way: %d finished OK and complete, %d ended non-OK with a prefix; exit after %v (grace %v)",
		streams, ok, failed, time.Since(t0).Round(time.Millisecond), grace)
}
