//go:build e2e

package e2e

import (
	"context"
	"encoding/base64"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/e2e/harness"
)

// threads is the number of OS threads of process pid.
func threads(t testing.TB, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatalf("read /proc/%d/status: %v", pid, err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "Threads:"); ok {
			n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			if err != nil {
				t.Fatalf("/proc/%d/status: %q", pid, line)
			}
			return n
		}
	}
	t.Fatalf("/proc/%d/status has no Threads", pid)
	return 0
}

// heapInuse is the server's Go heap in use, in KiB.
func heapInuse(t testing.TB, addr string) int64 {
	v, ok := harness.MetricValue(harness.Scrape(t, addr), "go_memstats_heap_inuse_bytes")
	if !ok {
		t.Fatalf("/metrics has no go_memstats_heap_inuse_bytes")
	}
	return int64(v) / 1024
}

// inFlight is the server's streams_in_flight, both RPCs.
func inFlight(t testing.TB, addr string) float64 {
	body := harness.Scrape(t, addr)
	n := 0.0
	for _, m := range []string{"GetMetadataAllocated", "GetMetadataDelta"} {
		v, _ := harness.MetricValue(body, `rbd_snapshot_metadata_streams_in_flight{method="`+m+`"}`)
		n += v
	}
	return n
}

// stallRound is what one round of never-reading streams did.
type stallRound struct {
	full, released, refused time.Duration // since the streams opened; the refusal's own
	heldThreads             int64
	goroutines              float64
	threads, rss, heap      int64 // after; KiB but threads
}

// The limits of TestReliabilityLimits' server: --max-streams, which its
// stalled client fills, and --stall-timeout, at which they must end.
const (
	relMaxStreams   = 40
	relStallTimeout = 5 * time.Second
)

// TestReliabilityLimits holds --max-streams streams whose client never
// reads (a stalled backup tool), twice: one more stream is refused at once
// with ABORTED; the stalled ones end with DEADLINE_EXCEEDED at
// --stall-timeout and release their images, threads and memory (the second
// round ends where the first did); then a burst of requests with distinct
// wrong keys is answered without piling up threads.
func TestReliabilityLimits(t *testing.T) {
	lr := startLimits(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	lr.ctx = ctx
	r1 := lr.round(t)
	r2 := lr.round(t)
	lr.noGrowth(t, r1, r2)
	t.Run("connect-burst", lr.connectBurst)
}

// limitsRun is what TestReliabilityLimits' steps share: the server and its
// metrics address, the request the streams make and its whole answer, the
// server's baseline (goroutines, RSS and Go heap in use, KiB) and the
// test's context.
type limitsRun struct {
	srv         *harness.Server
	addr        string
	req         harness.MetaReq
	want        []harness.Span
	g0          float64
	rss0, heap0 int64
	ctx         context.Context
}

// startLimits: a 64 MiB image written in full and its snapshot, and a
// server with the limits whose Allocated of it is 65536 tuples; the
// server's baseline once it settled.
func startLimits(t *testing.T) *limitsRun {
	conn := harness.ConnectAdmin(t)
	// 64 MiB written in full: 65536 FIXED_LENGTH 1 KiB tuples, 64 pages
	// of 1024 tuples (about 10 KiB encoded): gRPC's windows (64 KiB on the
	// client, 64 KiB of the server's write quota) hold about 13, so a
	// stream that is not read blocks at about its 16th page. --precision
	// exact: the diffs themselves take milliseconds, so the stall timer
	// starts right after the streams open.
	v, img := harness.CreateVolume(t, conn, "", "stall", 64*harness.MiB, harness.ImageFeatures)
	for off := uint64(0); off < 64*harness.MiB; off += 4 * harness.MiB {
		harness.FillAt(t, img, off, 4*harness.MiB)
	}
	harness.Snapshot(t, img, "s1")
	addr := harness.FreeTCPAddr(t)
	srv := harness.StartServer(t, "--metrics-address="+addr, fmt.Sprintf("--max-streams=%d", relMaxStreams),
		"--stall-timeout="+relStallTimeout.String(), "--block-metadata-type", "FIXED_LENGTH", "--fixed-block-size", "1024", "--precision=exact")
	req := harness.MetaReq{Target: v.ID("s1"), Max: 1024, Secrets: harness.CSISecrets(t)}
	want := srv.Get(t, req).Tuples()
	if len(want) != 65536 {
		t.Fatalf("%d tuples, want 65536", len(want))
	}
	g0, rss0 := settled(t, srv, addr, 1e9)
	th0, heap0 := threads(t, srv.PID()), heapInuse(t, addr)
	t.Logf("baseline: %.0f goroutines, %d threads, RSS %s, Go heap in use %s", g0, th0, harness.FmtKiB(rss0), harness.FmtKiB(heap0))
	return &limitsRun{srv: srv, addr: addr, req: req, want: want, g0: g0, rss0: rss0, heap0: heap0}
}

// round: a client that never reads fills --max-streams with streams (all
// of them in flight at the server); one more is refused
// (refuseOneMore); the stalled ones end at --stall-timeout
// (stalledStreamsEnd); the server settles back (afterRound).
func (lr *limitsRun) round(t *testing.T) stallRound {
	// The stalled client: its own connection, with gRPC's fixed
	// 64 KiB windows (no BDP growth), that never reads.
	stalled, err := grpc.NewClient("unix://"+lr.srv.Sock, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithInitialWindowSize(64<<10), grpc.WithInitialConnWindowSize(64<<10))
	if err != nil {
		t.Fatal(err)
	}
	defer stalled.Close()
	sm := csi.NewSnapshotMetadataClient(stalled)
	var r stallRound
	t0 := time.Now()
	held := make([]csi.SnapshotMetadata_GetMetadataAllocatedClient, relMaxStreams)
	for i := range held {
		if held[i], err = sm.GetMetadataAllocated(lr.ctx, &csi.GetMetadataAllocatedRequest{
			SnapshotId: lr.req.Target, MaxResults: lr.req.Max, Secrets: lr.req.Secrets}); err != nil {
			t.Fatal(err)
		}
	}
	for inFlight(t, lr.addr) < relMaxStreams {
		if time.Since(t0) > relStallTimeout {
			t.Fatalf("only %.0f of %d streams in flight after %v", inFlight(t, lr.addr), relMaxStreams, time.Since(t0))
		}
		time.Sleep(20 * time.Millisecond)
	}
	r.full = time.Since(t0)
	r.heldThreads = threads(t, lr.srv.PID())
	lr.refuseOneMore(t, &r)
	lr.stalledStreamsEnd(t, held, t0, &r)
	stalled.Close()
	lr.afterRound(t, &r)
	return r
}

// refuseOneMore: the limit holds: one more stream is refused at once,
// with ABORTED naming --max-streams, and does no work.
func (lr *limitsRun) refuseOneMore(t *testing.T, r *stallRound) {
	began := time.Now()
	m := lr.srv.Call(lr.ctx, lr.req)
	r.refused = time.Since(began)
	if status.Code(m.Err) != codes.Aborted || !strings.Contains(m.Err.Error(), "--max-streams") || len(m.Pages) != 0 {
		t.Errorf("stream %d: %d pages, %v; want ABORTED naming --max-streams", relMaxStreams+1, len(m.Pages), m.Err)
	}
	if r.refused > time.Second {
		t.Errorf("the refusal took %v", r.refused)
	}
}

// stalledStreamsEnd: the stalled streams, opened at t0, end on time:
// all are released within 3 s of --stall-timeout, each with
// DEADLINE_EXCEEDED naming --stall-timeout before its last tuple.
func (lr *limitsRun) stalledStreamsEnd(t *testing.T, held []csi.SnapshotMetadata_GetMetadataAllocatedClient, t0 time.Time, r *stallRound) {
	for inFlight(t, lr.addr) > 0 {
		if time.Since(t0) > 3*relStallTimeout+10*time.Second {
			t.Fatalf("%.0f streams still in flight %v after they opened (--stall-timeout=%v)", inFlight(t, lr.addr), time.Since(t0), relStallTimeout)
		}
		time.Sleep(50 * time.Millisecond)
	}
	r.released = time.Since(t0)
	if r.released > relStallTimeout+3*time.Second {
		t.Errorf("stalled streams released %v after they opened, want about %v", r.released, relStallTimeout)
	}
	for i, h := range held {
		var n int
		for {
			resp, err := h.Recv()
			if err != nil {
				if status.Code(err) != codes.DeadlineExceeded || !strings.Contains(err.Error(), "--stall-timeout") {
					t.Errorf("stalled stream %d: %v after %d tuples, want DEADLINE_EXCEEDED naming --stall-timeout", i, err, n)
				}
				break
			}
			n += len(resp.GetBlockMetadata())
		}
		if n >= len(lr.want) {
			t.Errorf("stalled stream %d got all %d tuples", i, n)
		}
	}
}

// afterRound: with the stalled client gone the server settles back to
// its baseline's goroutines and Go heap (logging the round), and answers
// the whole stream again.
func (lr *limitsRun) afterRound(t *testing.T, r *stallRound) {
	r.goroutines, r.rss = settled(t, lr.srv, lr.addr, lr.g0)
	r.threads, r.heap = threads(t, lr.srv.PID()), heapInuse(t, lr.addr)
	t.Logf("%d never-reading streams: all in flight after %v, %d threads; stream %d refused with ABORTED in %v; "+
		"all released %v after they opened (--stall-timeout=%v); after: %.0f goroutines, %d threads, RSS %s, Go heap in use %s",
		relMaxStreams, r.full.Round(time.Millisecond), r.heldThreads, relMaxStreams+1, r.refused.Round(time.Microsecond),
		r.released.Round(time.Millisecond), relStallTimeout, r.goroutines, r.threads, harness.FmtKiB(r.rss), harness.FmtKiB(r.heap))
	if r.goroutines > lr.g0+5 {
		t.Errorf("%.0f goroutines after, %.0f before", r.goroutines, lr.g0)
	}
	if r.heap > lr.heap0+32<<10 {
		t.Errorf("Go heap in use %s after, %s before", harness.FmtKiB(r.heap), harness.FmtKiB(lr.heap0))
	}
	if m := lr.srv.Call(lr.ctx, lr.req); m.Err != nil || harness.DiffSpans(lr.want, m.Tuples()) != "" {
		t.Errorf("after the stalled streams: %v", m.Err)
	}
}

// noGrowth: the second round ends where the first did: threads within 4,
// RSS within 16 MiB, and RSS within 64 MiB of the baseline.
func (lr *limitsRun) noGrowth(t *testing.T, r1, r2 stallRound) {
	// Go keeps the threads and pages it once used (idle threads are
	// parked, freed pages go back to the OS lazily): the first round may
	// grow them, the second must not.
	if r2.threads > r1.threads+4 {
		t.Errorf("threads grow round after round: %d, then %d", r1.threads, r2.threads)
	}
	if r2.rss > r1.rss+16<<10 || r2.rss > lr.rss0+64<<10 {
		t.Errorf("RSS grows: %s before, %s after round 1, %s after round 2", harness.FmtKiB(lr.rss0), harness.FmtKiB(r1.rss), harness.FmtKiB(r2.rss))
	}
}

// connectBurst: a burst of requests with distinct wrong keys, the
// server's threads sampled meanwhile; checkBurst judges the answers.
func (lr *limitsRun) connectBurst(t *testing.T) {
	// Distinct wrong keys: each its own connect attempt, at most a
	// few at once.
	const burst = 40
	th0 := threads(t, lr.srv.PID())
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		answers = map[codes.Code]int{}
		peak    int64
		done    = make(chan struct{})
	)
	go func() {
		for {
			select {
			case <-done:
				return
			case <-time.After(5 * time.Millisecond):
			}
			if n := threads(t, lr.srv.PID()); n > peak {
				mu.Lock()
				peak = n
				mu.Unlock()
			}
		}
	}()
	b, _ := base64.StdEncoding.DecodeString(harness.ClusterEnv(t, "CEPH_CSI_KEY"))
	began := time.Now()
	for i := range burst {
		k := append([]byte(nil), b...)
		k[len(k)-1] ^= byte(i + 1)
		k[len(k)-2] ^= 0x5a
		r := harness.MetaReq{Target: lr.req.Target, Max: 1, Secrets: map[string]string{
			"userID": harness.ClusterEnv(t, "CEPH_CSI_USER"), "userKey": base64.StdEncoding.EncodeToString(k)}}
		wg.Add(1)
		go func() {
			defer wg.Done()
			m := lr.srv.Call(lr.ctx, r)
			mu.Lock()
			answers[status.Code(m.Err)]++
			mu.Unlock()
		}()
	}
	wg.Wait()
	took := time.Since(began)
	close(done)
	time.Sleep(500 * time.Millisecond)
	th := threads(t, lr.srv.PID())
	mu.Lock()
	defer mu.Unlock()
	t.Logf("%d requests with distinct wrong keys: %v in %v; threads %d before, peak %d, %d after",
		burst, answers, took.Round(time.Millisecond), th0, peak, th)
	lr.checkBurst(t, answers, th0, th)
}

// checkBurst: every wrong key was refused as Unauthenticated, the failed
// connects left no threads behind (th0 before the burst, th after), and
// the server still answers.
func (lr *limitsRun) checkBurst(t *testing.T, answers map[codes.Code]int, th0, th int64) {
	for c := range answers {
		// Refused credentials, as the spec's table has them.
		if c != codes.Unauthenticated {
			t.Errorf("wrong keys answered %v", answers)
		}
	}
	// A failed connect's handle is shut down at once: its threads go.
	if th > th0+10 {
		t.Errorf("%d threads after the burst, %d before: failed connects left their threads", th, th0)
	}
	if m := lr.srv.Call(lr.ctx, lr.req); m.Err != nil {
		t.Errorf("after the burst: %v", m.Err)
	}
}
