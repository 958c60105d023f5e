//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/e2e/harness"
)

// relLoadStreams is the number of concurrent streams of the load test.
const relLoadStreams = 64

// relLoadDuration is how long each load round runs; RSM_E2E_LOAD_SECONDS
// overrides it.
func relLoadDuration(t testing.TB, def time.Duration) time.Duration {
	if s := os.Getenv("RSM_E2E_LOAD_SECONDS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			t.Fatalf("RSM_E2E_LOAD_SECONDS=%q: want a positive number", s)
		}
		return time.Duration(n) * time.Second
	}
	return def
}

// loadRound is what one round of load did.
type loadRound struct {
	streams, errors, mismatches int64
	tuples                      int64
	elapsed                     time.Duration
	peakRSS                     int64 // KiB
	firstErr                    string
}

// runLoad runs relLoadStreams workers against srv for d, each calling the
// requests in turn and comparing every answer with want.
func runLoad(t *testing.T, srv *harness.Server, reqs []harness.MetaReq, want [][]harness.Span, d time.Duration) loadRound {
	t.Helper()
	mem := harness.SampleMemory(t, srv.PID())
	var (
		r        loadRound
		wg       sync.WaitGroup
		streams  atomic.Int64
		errs     atomic.Int64
		mism     atomic.Int64
		tuples   atomic.Int64
		firstErr sync.Once
	)
	ctx, cancel := context.WithTimeout(context.Background(), d+2*time.Minute) // a hang guard
	defer cancel()
	t0 := time.Now()
	deadline := t0.Add(d)
	for w := 0; w < relLoadStreams; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; time.Now().Before(deadline); i++ {
				k := i % len(reqs)
				m := srv.Call(ctx, reqs[k])
				streams.Add(1)
				got := m.Tuples()
				tuples.Add(int64(len(got)))
				if m.Err != nil {
					errs.Add(1)
					firstErr.Do(func() { r.firstErr = fmt.Sprintf("%v: %v", reqs[k], m.Err) })
					continue
				}
				if diff := harness.DiffSpans(want[k], got); diff != "" {
					mism.Add(1)
					firstErr.Do(func() { r.firstErr = fmt.Sprintf("%v: %s", reqs[k], diff) })
				}
			}
		}()
	}
	wg.Wait()
	r.elapsed = time.Since(t0)
	peak, hwm := mem.Finish(t)
	r.peakRSS = max(peak, hwm)
	r.streams, r.errors, r.mismatches, r.tuples = streams.Load(), errs.Load(), mism.Load(), tuples.Load()
	return r
}

// settled waits until the server has no stream in flight and its
// goroutines stop falling, and returns them and its RSS (KiB).
func settled(t *testing.T, srv *harness.Server, addr string, want float64) (goroutines float64, rss int64) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		body := harness.Scrape(t, addr)
		inflight := 0.0
		for _, m := range []string{"GetMetadataAllocated", "GetMetadataDelta"} {
			v, _ := harness.MetricValue(body, `rbd_snapshot_metadata_streams_in_flight{method="`+m+`"}`)
			inflight += v
		}
		g, ok := harness.MetricValue(body, "go_goroutines")
		if !ok {
			t.Fatalf("/metrics has no go_goroutines")
		}
		if (inflight == 0 && g <= want) || time.Now().After(deadline) {
			return g, harness.ProcStatus(t, srv.PID())["VmRSS"]
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestReliabilityLoad runs 64 concurrent streams, again and again for a
// bounded time, against one server: Allocated and Delta, with several
// max_results and starting offsets, VARIABLE_LENGTH and then
// FIXED_LENGTH. Every stream must succeed with exactly the answer of a
// single stream; afterwards the server's goroutines must be back where
// they were and its RSS must not grow from one round to the next.
func TestReliabilityLoad(t *testing.T) {
	v, _ := harness.ManyWrites(t, 2048)
	round := relLoadDuration(t, 8*time.Second)
	for _, bt := range []struct {
		name   string
		flags  []string
		rounds int
	}{
		{"VARIABLE_LENGTH", nil, 2},
		{"FIXED_LENGTH", []string{"--block-metadata-type", "FIXED_LENGTH", "--fixed-block-size", "65536"}, 1},
	} {
		t.Run(bt.name, func(t *testing.T) {
			addr := harness.FreeTCPAddr(t)
			// As many streams as the load runs: the default --max-streams is lower.
			srv := harness.StartServer(t, append([]string{"--metrics-address=" + addr, fmt.Sprintf("--max-streams=%d", relLoadStreams)}, bt.flags...)...)
			reqs := []harness.MetaReq{
				{Target: v.ID("s2")},
				{Base: v.ID("s1"), Target: v.ID("s2")},
				{Target: v.ID("s2"), Max: 100},
				{Base: v.ID("s1"), Target: v.ID("s2"), Max: 7},
				{Base: v.ID("s1"), Target: v.ID("s2"), Start: 3*int64(harness.ObjSize) + 12345, Max: 1000},
				{Target: v.ID("s2"), Start: 5 * int64(harness.ObjSize), Max: 1},
			}
			want := make([][]harness.Span, len(reqs))
			for i := range reqs {
				reqs[i].Secrets = harness.CSISecrets(t)
				want[i] = srv.Get(t, reqs[i]).Tuples()
			}
			g0, rss0 := settled(t, srv, addr, 1e9)
			t.Logf("before: %.0f goroutines, RSS %s", g0, harness.FmtKiB(rss0))
			var rss []int64
			for i := 0; i < bt.rounds; i++ {
				r := runLoad(t, srv, reqs, want, round)
				g, after := settled(t, srv, addr, g0)
				rss = append(rss, after)
				t.Logf("round %d: %d streams (%d concurrent) in %v, %d errors, %d wrong answers, %d tuples (%.0f tuples/s, %.0f streams/s); "+
					"server RSS %s before, peak %s, after %s; goroutines %.0f before, %.0f after",
					i+1, r.streams, relLoadStreams, r.elapsed.Round(time.Millisecond), r.errors, r.mismatches, r.tuples,
					float64(r.tuples)/r.elapsed.Seconds(), float64(r.streams)/r.elapsed.Seconds(),
					harness.FmtKiB(rss0), harness.FmtKiB(r.peakRSS), harness.FmtKiB(after), g0, g)
				if r.errors > 0 || r.mismatches > 0 {
					t.Errorf("round %d: %d errors and %d wrong answers in %d streams; first: %s", i+1, r.errors, r.mismatches, r.streams, r.firstErr)
				}
				if r.streams < relLoadStreams {
					t.Errorf("round %d: only %d streams", i+1, r.streams)
				}
				// gRPC keeps a few goroutines per connection; the streams'
				// own must all be gone.
				if g > g0+5 {
					t.Errorf("round %d: %.0f goroutines after the load, %.0f before: streams left goroutines behind", i+1, g, g0)
				}
			}
			// RSS: generous bounds. Go and glibc keep freed memory for a
			// while, so the first round may grow it; later rounds must not.
			const slackKiB = 256 << 10
			if last := rss[len(rss)-1]; last > rss0+slackKiB {
				t.Errorf("RSS %s after the load, %s before", harness.FmtKiB(last), harness.FmtKiB(rss0))
			}
			if len(rss) > 1 && rss[len(rss)-1] > rss[0]+64<<10 {
				t.Errorf("RSS grows round after round: %s after the first, %s after the last", harness.FmtKiB(rss[0]), harness.FmtKiB(rss[len(rss)-1]))
			}
			if c, _ := harness.MetricValue(harness.Scrape(t, addr), "rbd_snapshot_metadata_cached_connections"); c != 1 {
				t.Errorf("%v cached connections, want 1: all streams use the same user and key", c)
			}
		})
	}
}
